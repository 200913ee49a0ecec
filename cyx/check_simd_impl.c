/* Stand-alone check: every matmul kernel on the best SIMD path (3 threads) against
 * the portable scalar path (1 thread), fast and exact modes, on random blocks.
 * Exit status 0 when all agree to 1e-5 relative.
 *
 *   cc -O2 -std=gnu11 -ffp-contract=off -Icyx cyx/check_simd_impl.c -o /tmp/check_simd -lm -lpthread
 *   aarch64-linux-gnu-gcc ... && qemu-aarch64 -L /usr/aarch64-linux-gnu /tmp/check_simd  (NEON)
 *
 * tests/test_kernels.py builds and runs it with whichever compilers are present.
 */
#include "mc_quant.h"
#include "mc_ops.h"
#include <stdio.h>
static uint32_t rs = 12345;
static uint32_t rnd(void) { rs = rs * 1664525u + 1013904223u; return rs >> 8; }
static float frnd(void) { return ((float)(rnd() % 20001) - 10000.0f) / 5000.0f; }
int main(void) {
    const int types[] = {MC_F32,  MC_F16,  MC_Q4_0, MC_Q4_1, MC_Q5_0, MC_Q8_0,   MC_Q4_K,  MC_Q6_K,
                         MC_INT8, MC_Q5_1, MC_Q2_K, MC_Q3_K, MC_Q5_K, MC_BF16, MC_IQ4_NL, MC_IQ4_XS,
                         MC_MXFP4};
    const int ntypes = (int)(sizeof types / sizeof types[0]);
    const int M = 37, K = 512, N = 5;
    int bad = 0;
    printf("best simd = %d\n", mc_simd_best());
    for (int ti = 0; ti < ntypes; ti++) {
        int t = types[ti];
        size_t rb = t == MC_INT8 ? 4 + K : (size_t)K / mc_block_elems(t) * mc_block_bytes(t);
        uint8_t *W = malloc(rb * M);
        for (size_t i = 0; i < rb * M; i++) W[i] = (uint8_t)rnd();
        /* sane scales */
        for (int r = 0; r < M; r++) {
            uint8_t *row = W + r * rb;
            uint16_t h02 = 0x2148, h01 = 0x211E, h001 = 0x1419; /* ~0.0102, 0.0098, 0.001 */
            if (t == MC_F32) for (int i = 0; i < K; i++) { float f = frnd(); memcpy(row + 4 * i, &f, 4); }
            else if (t == MC_F16) for (int i = 0; i < K; i++) { uint16_t h = 0x3C00 ^ (rnd() & 0x83FF); memcpy(row + 2 * i, &h, 2); }
            else if (t == MC_BF16) for (int i = 0; i < K; i++) { uint16_t h = 0x3F80 ^ (rnd() & 0x807F); memcpy(row + 2 * i, &h, 2); }
            else if (t == MC_INT8) { float s = 0.01f; memcpy(row, &s, 4); }
            else for (int b = 0; b < K / mc_block_elems(t); b++) {
                uint8_t *blk = row + b * mc_block_bytes(t);
                if (t == MC_Q6_K) memcpy(blk + 208, &h001, 2);
                else if (t == MC_Q2_K) { memcpy(blk + 80, &h02, 2); memcpy(blk + 82, &h01, 2); }
                else if (t == MC_Q3_K) memcpy(blk + 108, &h02, 2);
                else if (t == MC_IQ4_XS) memcpy(blk, &h001, 2);
                else {
                    memcpy(blk, &h02, 2);
                    if (t == MC_Q4_1 || t == MC_Q4_K || t == MC_Q5_1 || t == MC_Q5_K) memcpy(blk + 2, &h01, 2);
                }
            }
        }
        float *x = malloc(sizeof(float) * K * N), *y0 = malloc(4 * M * N), *y1 = malloc(4 * M * N);
        for (int i = 0; i < K * N; i++) x[i] = frnd();
        const int levels[2] = {mc_simd_best(), mc_simd_best() == MC_SIMD_VNNI ? MC_SIMD_AVX2 : -1};
        for (int li = 0; li < 2; li++)
        for (int exact = 0; exact < 2; exact++) {
            if (levels[li] < 0) continue;
            mc_matmul(t, W, rb, M, K, x, N, y0, MC_SIMD_SCALAR, 1, exact ? 0.0f : 1e38f);
            mc_matmul(t, W, rb, M, K, x, N, y1, levels[li], 3, exact ? 0.0f : 1e38f);
            double num = 0, den = 0;
            for (int i = 0; i < M * N; i++) { num += (y0[i] - y1[i]) * (double)(y0[i] - y1[i]); den += (double)y0[i] * y0[i]; }
            double rel = sqrt(num / den);
            printf("type %d simd %d exact %d: rel diff vs scalar %.2e %s\n", t, levels[li], exact, rel,
                   rel < 1e-5 ? "ok" : "BAD");
            bad += !(rel < 1e-5);
        }
        free(W); free(x); free(y0); free(y1);
    }
    return bad;
}
