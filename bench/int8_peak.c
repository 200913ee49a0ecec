/* The int8 dot-product ceiling of one core: independent vpdpbusd (zmm and ymm), vpdpwssd
 * and vpandd chains in inline assembly, instructions per second and GMAC/s.  The K-quant
 * kernels' instruction mix (bench/RESULTS.md) is held against these figures.
 *
 *     gcc -O2 -o /tmp/int8_peak bench/int8_peak.c && taskset -c 1 /tmp/int8_peak
 *
 * Needs AVX512F / BW / VL and VNNI; on a CPU without them it dies of an illegal
 * instruction. */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* 12 independent accumulators: more than latency x throughput on current cores */
#define R12(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) M(10) M(11)

__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"))) int main(void) {
    const long n = 400000000 / 12;
    const __m512i x = _mm512_set1_epi8(1), y = _mm512_set1_epi8(2);
    const __m256i xx = _mm256_set1_epi8(1), yy = _mm256_set1_epi8(2);
#define DZ(i) __m512i a##i = _mm512_set1_epi32(i);
#define DY(i) __m256i b##i = _mm256_set1_epi32(i);
    R12(DZ)
    R12(DY)
    /* times n rounds of 12 of one instruction; macs: multiply-adds per instruction (0: none) */
#define TIME(label, OP, macs)                                                                      \
    do {                                                                                           \
        const double t = now();                                                                    \
        for (long k = 0; k < n; k++) {                                                             \
            R12(OP)                                                                                \
        }                                                                                          \
        const double g = (double)n * 12 / (now() - t) / 1e9;                                       \
        if (macs) printf("%s %.2f G/s = %.1f GMAC/s\n", label, g, g * (macs));                    \
        else printf("%s %.2f G/s\n", label, g);                                                    \
    } while (0)
#define OZ(i) __asm__ volatile("vpdpbusd %1, %2, %0" : "+v"(a##i) : "v"(x), "v"(y));
#define OY(i) __asm__ volatile("vpdpbusd %1, %2, %0" : "+v"(b##i) : "v"(xx), "v"(yy));
#define WZ(i) __asm__ volatile("vpdpwssd %1, %2, %0" : "+v"(a##i) : "v"(x), "v"(y));
#define PZ(i) __asm__ volatile("vpandd %1, %0, %0" : "+v"(a##i) : "v"(x));
    TIME("vpdpbusd zmm:", OZ, 64);
    TIME("vpdpbusd ymm:", OY, 32);
    TIME("vpdpwssd zmm:", WZ, 0);
    TIME("vpandd zmm:  ", PZ, 0);
    int s = 0;
#define SS(i) s += _mm512_reduce_add_epi32(a##i) + _mm256_extract_epi32(b##i, 0);
    R12(SS)
    return s == 12345; /* keeps the chains live */
}
