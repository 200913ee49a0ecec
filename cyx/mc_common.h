/* Shared definitions for modelc's C kernels: type codes, fp16, activation blocks.
 *
 * Weight blocks are GGML's, bit for bit (see ggml-common.h); they are read
 * through byte offsets with memcpy so no alignment is assumed.
 */
#ifndef MC_COMMON_H
#define MC_COMMON_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if !defined(_WIN32)
#include <sys/mman.h>
#include <unistd.h>
#endif

/* Translation units.  setup.py compiles the kernels as several units in parallel
 * (MC_SPLIT): each cyx/mc_unit_*.c sets one MC_UNIT_* to 1 and compiles the kernels of
 * that unit, which the other units see declared only (MC_SHARED: linked between the
 * units, not exported from the module).  Without MC_SPLIT one unit compiles everything,
 * every function static (check_simd_impl.c, a modelc compile project's kernels.pyx).
 *   MC_UNIT_CORE  the entry points of mc_api.h, dispatch, the single-row kernels, the
 *                 float and K-wide GEMMs, ops, attention, the thread pool
 *   MC_UNIT_VNNI  the VNNI kernels on repacked weights (mc_gemm_vnni.h, mc_gemm_kx8.h)
 *   MC_UNIT_AVX2  their AVX2 twins
 *   MC_UNIT_ZMM   the 512-bit kernels (mc_gemm_zmm.h, mc_gemm_zmm41.h) */
#if defined(MC_SPLIT)
#define MC_SHARED __attribute__((visibility("hidden")))
#else
#define MC_SHARED static
#define MC_UNIT_CORE 1
#define MC_UNIT_VNNI 1
#define MC_UNIT_AVX2 1
#define MC_UNIT_ZMM 1
#endif
#ifndef MC_UNIT_CORE
#define MC_UNIT_CORE 0
#endif
#ifndef MC_UNIT_VNNI
#define MC_UNIT_VNNI 0
#endif
#ifndef MC_UNIT_AVX2
#define MC_UNIT_AVX2 0
#endif
#ifndef MC_UNIT_ZMM
#define MC_UNIT_ZMM 0
#endif
/* an entry point of mc_api.h: defined by the core unit, a static copy elsewhere (unused) */
#if MC_UNIT_CORE
#define MC_API MC_SHARED
#else
#define MC_API static
#endif

#if defined(__x86_64__) || defined(_M_X64)
#define MC_X86 1
#include <immintrin.h>
#define MC_AVX2 __attribute__((target("avx2,fma,f16c")))
#define MC_VNNI __attribute__((target("avx2,fma,f16c,avx512vnni,avx512vl")))

/* horizontal sum / max / int sum of a 256-bit vector */
MC_AVX2 static inline float mc_hsum256(__m256 v) {
    __m128 r = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

MC_AVX2 static inline float mc_hmax256(__m256 v) {
    __m128 r = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    r = _mm_max_ps(r, _mm_movehl_ps(r, r));
    r = _mm_max_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

MC_AVX2 static inline int mc_hsum256_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}
#endif

#if defined(__aarch64__)
#define MC_NEON 1
#include <arm_neon.h>
#endif

/* weight type codes (mirrored in kernels.pyx) */
enum {
    MC_F32 = 0,
    MC_F16 = 1,
    MC_Q4_0 = 2,
    MC_Q4_1 = 3,
    MC_Q5_0 = 4,
    MC_Q8_0 = 5,
    MC_Q4_K = 6,
    MC_Q6_K = 7,
    MC_INT8 = 8,
    MC_Q5_1 = 9,
    MC_Q2_K = 10,
    MC_Q3_K = 11,
    MC_Q5_K = 12,
    MC_BF16 = 13,
    MC_IQ4_NL = 14,
    MC_IQ4_XS = 15,
    MC_MXFP4 = 16,
};

/* weight types whose fast path quantizes x to mc_q8k (256-element) blocks */
static inline int mc_act_q8k(int t) {
    return t == MC_Q2_K || t == MC_Q3_K || t == MC_Q4_K || t == MC_Q5_K || t == MC_Q6_K;
}

/* weight types whose kernels take float x in every mode */
static inline int mc_is_float(int t) { return t == MC_F32 || t == MC_F16 || t == MC_BF16; }

/* SIMD levels; VNNI = AVX2 plus AVX512-VNNI dot products on 256-bit registers */
enum { MC_SIMD_SCALAR = 0, MC_SIMD_AVX2 = 1, MC_SIMD_NEON = 2, MC_SIMD_VNNI = 3 };
#define MC_IS_AVX2(simd) ((simd) == MC_SIMD_AVX2 || (simd) == MC_SIMD_VNNI)

/* Activation block for the 32-element weight types: x ~= d * qs, s = d * sum(qs). */
typedef struct {
    float d;
    float s;
    int8_t qs[32];
} mc_q8;

/* the exact int sum of an activation block's 32 ints */
static inline int mc_q8_isum(const mc_q8 *b) {
    int sum = 0;
    for (int k = 0; k < 32; k++) sum += b->qs[k];
    return sum;
}

/* One block of 8 activation rows, for the batched kernels (mc_quant_x86.h): d, s and
 * cs in lane order 0 2 4 6 1 3 5 7; lo[p] / hi[p]: elements 0-15 / 16-31 of rows
 * 2p and 2p+1 side by side.  Every field is 32-byte aligned when the array is. */
typedef struct {
    float d[8];
    float s[8];
    int32_t cs[8]; /* c * sum(qs): the weight offset c of the kernel times the row's int sum */
    int8_t lo[4][32];
    int8_t hi[4][32];
} mc_q8x8;

/* One block of 8 activation rows for the VNNI GEMM (mc_gemm_vnni.h): q[p] holds
 * elements 4p..4p+3 of rows 0..7, row j in bytes 4j..4j+3; d, s, cs indexed by row. */
typedef struct {
    int8_t q[8][32];
    float d[8];
    float s[8];
    int32_t cs[8]; /* c * sum(qs) for the weight offset c of the type */
    int32_t pad[8];
} mc_q8t8;

/* Q8_0 weights repacked for the VNNI GEMM (mc_gemm_vnni.h), 8 rows interleaved: per
 * block, vector v (32 bytes) holds in dword lane j the ints 4v .. 4v+3 of row j as
 * unsigned q + 128, then the 8 rows' f16 scales (34 bytes a row and block, as the
 * original). */
typedef struct {
    uint8_t qs[256];
    uint16_t d[8];
} mc_q80x8;

/* Q4_1 weights repacked for the VNNI GEMM (mc_gemm_vnni.h), 8 rows interleaved: per
 * block of 32 columns, vector v (32 bytes) holds in dword lane j the 4 bytes 4v .. 4v+3
 * of row j's block (low nibbles: elements 4v + b, high: 16 + 4v + b), then the 8 rows'
 * f16 scales and mins.  20 bytes a row and block, as the original. */
typedef struct {
    uint8_t qs[128];
    uint16_t d[8];
    uint16_t m[8];
} mc_q41x8;

/* Q5_0 weights repacked: per block of 32 columns the nibbles as Q4_1's, the 8 rows'
 * 32-bit high-bit words (dword lane j: row j's qh), then their f16 scales.  22 bytes a
 * row and block, as stored. */
typedef struct {
    uint8_t qs[128];
    uint8_t qh[32];
    uint16_t d[8];
} mc_q50x8;

/* Q5_1 weights repacked as Q5_0's, with the 8 rows' f16 mins after their scales.  24
 * bytes a row and block, as stored. */
typedef struct {
    uint8_t qs[128];
    uint8_t qh[32];
    uint16_t d[8];
    uint16_t m[8];
} mc_q51x8;

/* IQ4_NL weights repacked as Q4_1's (its nibbles index the IQ4 levels): per block of 32
 * columns the 4 vectors of nibbles, then the 8 rows' f16 scales.  18 bytes a row and
 * block, as stored. */
typedef struct {
    uint8_t qs[128];
    uint16_t d[8];
} mc_iq4nlx8;

/* MXFP4 weights repacked as IQ4_NL's (its nibbles index the doubled E2M1 values): per
 * block of 32 columns the 4 vectors of nibbles, then the 8 rows' E8M0 scale bytes.  17
 * bytes a row and block, as stored. */
typedef struct {
    uint8_t qs[128];
    uint8_t e[8];
} mc_mxfp4x8;

/* IQ4_XS weights repacked: per block of 256 columns the 8 rows' f16 d, their 8
 * sub-block scales as int8 ([sub-block][row], unpacked from 6 bits, less 32), and per
 * sub-block the nibbles as mc_iq4nlx8 holds them.  138 bytes a row and block (136
 * stored). */
typedef struct {
    uint16_t d[8];
    int8_t sc[8][8];
    uint8_t qs[8][128];
} mc_iq4xsx8;

/* Q4_K weights repacked for the VNNI and AVX2 kernels (mc_gemm_kx8.h), 8 rows interleaved: per
 * block of 256 columns the 8 rows' f16 d and dmin, their 6-bit sub-block scales and mins
 * unpacked to bytes ([sub-block][row]), then per 64-column chunk c vector v (32 bytes)
 * holds in dword lane j the bytes 4v .. 4v+3 of row j's qs[32c ..] (low nibbles: sub-block
 * 2c, elements 4v + b; high: sub-block 2c + 1).  148 bytes a row and block (144 stored). */
typedef struct {
    uint16_t d[8];
    uint16_t dmin[8];
    uint8_t sc[8][8];
    uint8_t mn[8][8];
    uint8_t qs[4][256];
} mc_q4kx8;

/* Q5_K weights repacked as Q4_K's, with the fifth bits: the 8 rows' f16 d and dmin,
 * scales and mins as bytes, then the high-bit bytes qh (vector v holding in dword lane j
 * row j's qh[4v .. 4v+3]: bit s of qh[l] is element l of sub-block s), then qs as
 * mc_q4kx8's.  180 bytes a row and block (176 stored); every field 32-byte aligned. */
typedef struct {
    uint16_t d[8];
    uint16_t dmin[8];
    uint8_t sc[8][8];
    uint8_t mn[8][8];
    uint8_t qh[256];
    uint8_t qs[4][256];
} mc_q5kx8;

/* Q3_K weights repacked as Q6_K's: per block of 256 columns the 8 rows' f16 d and int8
 * sub-block scales ([sub-block][row], unpacked from 6 bits), then the high bits hmask
 * (vector v holding in dword lane j row j's hmask[4v .. 4v+3]: bit b of hmask[l] is
 * element 32b + l) and per 128-column half n the 2-bit crumbs qs[32n ..] the same way.
 * 114 bytes a row and block (110 stored). */
typedef struct {
    uint16_t d[8];
    int8_t sc[16][8];
    uint8_t hm[256];
    uint8_t qs[2][256];
} mc_q3kx8;

/* Q2_K weights repacked as Q3_K's: per block of 256 columns the 8 rows' f16 d and dmin,
 * their 16 scale bytes as stored ([sub-block][row]: scale in the low nibble, min in the
 * high), and per 128-column half n the 2-bit crumbs qs[32n ..] as mc_q3kx8 holds them.
 * 84 bytes a row and block, as stored. */
typedef struct {
    uint16_t d[8];
    uint16_t dmin[8];
    uint8_t sc[16][8];
    uint8_t qs[2][256];
} mc_q2kx8;

/* Q6_K weights repacked the same way: per block of 256 columns the 8 rows' f16 d and
 * int8 sub-block scales ([sub-block][row]), then per 128-column half n the low-nibble
 * bytes ql[64n ..] (two vector sets h: bytes 32h ..) and the high bits qh[32n ..], vector
 * v holding in dword lane j the bytes 4v .. 4v+3 of row j's.  Within a half, ql's set h = 0
 * and qh alternate vector by vector (lh[v]: ql vector v, then qh vector v), then set h = 1
 * (l1): the kernels first touch a block's bytes in ascending order (columns 128 n + 32 X
 * read ql set X & 1 and all of qh), which the hardware prefetchers follow; with the sets
 * apart a 1-row pass streamed about half as fast as Q4_K's.  MC_Q6_QL / MC_Q6_QH address
 * them.  210 bytes a row and block, as stored. */
typedef struct {
    uint16_t d[8];
    int8_t sc[16][8];
    struct {
        uint8_t lh[8][64];
        uint8_t l1[256];
    } q[2];
} mc_q6kx8;

/* the 32 bytes of ql vector v of set h in half n, and of qh vector v in half n */
#define MC_Q6_QL(b, n, h, v) ((h) ? (b)->q[n].l1 + 32 * (v) : (b)->q[n].lh[v])
#define MC_Q6_QH(b, n, v) ((b)->q[n].lh[v] + 32)

/* Activation block for the K-quants (llama.cpp's block_q8_K, with an f32 d). */
typedef struct {
    float d;
    int8_t qs[256];
    int16_t bsums[16]; /* sum of qs over each 16 elements */
} mc_q8k;

static inline float mc_f32_from_bits(uint32_t w) {
    float f;
    memcpy(&f, &w, 4);
    return f;
}

static inline uint32_t mc_f32_to_bits(float f) {
    uint32_t w;
    memcpy(&w, &f, 4);
    return w;
}

/* IEEE half -> float, exact for every input (normals, subnormals, inf, nan). */
static inline float mc_fp16_to_fp32(uint16_t h) {
    const uint32_t w = (uint32_t)h << 16;
    const uint32_t sign = w & UINT32_C(0x80000000);
    const uint32_t two_w = w + w;
    const uint32_t exp_offset = UINT32_C(0xE0) << 23;
    const float exp_scale = 0x1.0p-112f;
    const float normalized = mc_f32_from_bits((two_w >> 4) + exp_offset) * exp_scale;
    const uint32_t magic_mask = UINT32_C(126) << 23;
    const float denormalized = mc_f32_from_bits((two_w >> 17) | magic_mask) - 0.5f;
    const uint32_t cutoff = UINT32_C(1) << 27;
    const uint32_t result =
        sign | (two_w < cutoff ? mc_f32_to_bits(denormalized) : mc_f32_to_bits(normalized));
    return mc_f32_from_bits(result);
}

/* float -> IEEE half, rounding to nearest even (overflow -> inf, nan kept a nan): the
 * conversion numpy's astype(float16) and F16C's vcvtps2ph make. */
static inline uint16_t mc_fp32_to_fp16(float f) {
    const uint32_t x = mc_f32_to_bits(f);
    const uint16_t sign = (uint16_t)((x & UINT32_C(0x80000000)) >> 16);
    const uint32_t e = x & UINT32_C(0x7f800000);
    uint32_t m = x & UINT32_C(0x007fffff);
    if (e >= UINT32_C(0x47800000)) { /* inf, nan, or too large */
        if (e == UINT32_C(0x7f800000) && m != 0) {
            const uint16_t r = (uint16_t)(0x7c00u + (m >> 13));
            return (uint16_t)(sign | (r == 0x7c00u ? 0x7c01u : r));
        }
        return (uint16_t)(sign | 0x7c00u);
    }
    if (e <= UINT32_C(0x38000000)) { /* a subnormal half, or zero */
        if (e < UINT32_C(0x33000000)) return sign;
        const uint32_t ex = e >> 23;
        uint32_t sig = UINT32_C(0x00800000) + m;
        sig >>= (113 - ex);
        if ((sig & UINT32_C(0x3fff)) != UINT32_C(0x1000) || (x & UINT32_C(0x7ff)))
            sig += UINT32_C(0x1000);
        return (uint16_t)(sign + (uint16_t)(sig >> 13));
    }
    const uint16_t hexp = (uint16_t)((e - UINT32_C(0x38000000)) >> 13);
    if ((m & UINT32_C(0x3fff)) != UINT32_C(0x1000)) m += UINT32_C(0x1000);
    return (uint16_t)(sign + hexp + (uint16_t)(m >> 13)); /* a carry rounds into the exponent */
}

static inline float mc_load_f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return mc_fp16_to_fp32(h);
}

static inline float mc_load_f32(const uint8_t *p) {
    float f;
    memcpy(&f, p, 4);
    return f;
}

static inline int mc_imin(int a, int b) { return a < b ? a : b; }

/* Per-thread scratch that grows and is kept: the decode loop allocates nothing
 * once the buffers have reached their working size.  `slot` keeps a caller's
 * buffer apart from the one the same thread uses while running a chunk. */
#define MC_SCRATCH_SLOTS 3
static _Thread_local void *mc_scratch_buf[MC_SCRATCH_SLOTS];
static _Thread_local size_t mc_scratch_cap[MC_SCRATCH_SLOTS];

static void *mc_scratch(int slot, size_t bytes) {
    if (bytes > mc_scratch_cap[slot]) {
        void *p = realloc(mc_scratch_buf[slot], bytes);
        if (p == NULL) return NULL;
        mc_scratch_buf[slot] = p;
        mc_scratch_cap[slot] = bytes;
    }
    return mc_scratch_buf[slot];
}

/* Best SIMD level this CPU runs. */
MC_API int mc_simd_best(void) {
#if defined(MC_X86)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c")) {
        /* VNNI level: also the 512-bit kernels of mc_gemm_zmm.h (AVX512F, AVX512BW) */
        if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") &&
            __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw"))
            return MC_SIMD_VNNI;
        return MC_SIMD_AVX2;
    }
    return MC_SIMD_SCALAR;
#elif defined(MC_NEON)
    return MC_SIMD_NEON;
#else
    return MC_SIMD_SCALAR;
#endif
}

MC_API int mc_num_procs(void) {
#if defined(_SC_NPROCESSORS_ONLN)
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
#else
    return 1;
#endif
}

/* Ask the kernel to reclaim the whole pages inside [p, p + n) of a file mapping (their
 * contents stay: a later read faults them back in).  For weights that a repacked copy
 * has replaced.  Returns 0, or -1 where not supported or refused. */
MC_API int mc_release_pages(const void *p, size_t n) {
#if defined(MADV_PAGEOUT) && defined(_SC_PAGESIZE)
    const long ps = sysconf(_SC_PAGESIZE);
    if (ps <= 0) return -1;
    const uintptr_t a = ((uintptr_t)p + (uintptr_t)ps - 1) & ~((uintptr_t)ps - 1);
    const uintptr_t b = ((uintptr_t)p + n) & ~((uintptr_t)ps - 1);
    if (b <= a) return 0;
    return madvise((void *)a, (size_t)(b - a), MADV_PAGEOUT) == 0 ? 0 : -1;
#else
    (void)p;
    (void)n;
    return -1;
#endif
}

#endif /* MC_COMMON_H */
