/* MXFP4 (GGML type 39, gpt-oss's experts): per block of 32 weights one E8M0 byte e, then
 * 16 bytes holding weight j in the low nibble and weight j + 16 in the high nibble of
 * byte j, each nibble an E2M1 code.  As ggml, a code indexes the doubled E2M1 values
 * (mc_mxfp4_kvalues, int8) and the scale is 2^(e - 128) (mc_e8m0_half): a weight is
 * kvalue * scale, exactly what ggml's dequantize_row_mxfp4 computes (mc_dequant_row).
 *
 * The kernels read the blocks in place, never a dequantized copy: the fast path's dot
 * against int8 activation blocks (mc_q8: an integer sum of kvalue * q per block, times
 * scale * d, as IQ4_NL's), scalar and AVX2 with the same integer sums and float steps;
 * the exact path's fused AVX2 kernel dequantizes a block in registers with
 * mc_dequant_row's float operations and meets float x (mc_fma_block32, as IQ4_NL's). */
#ifndef MC_MXFP4_H
#define MC_MXFP4_H

#include "mc_blocks.h"
#include "mc_dequant_avx2.h"
#include "mc_dot_avx2_more.h"

static float mc_dot_mxfp4_scalar(int K, const uint8_t *w, const void *xv) {
    const mc_q8 *x = (const mc_q8 *)xv;
    float sum = 0.0f;
    for (int i = 0; i < K / 32; i++) {
        const uint8_t *b = w + 17 * i;
        int s = 0;
        for (int j = 0; j < 16; j++) {
            s += mc_mxfp4_kvalues[b[1 + j] & 0xF] * x[i].qs[j];
            s += mc_mxfp4_kvalues[b[1 + j] >> 4] * x[i].qs[j + 16];
        }
        sum += mc_e8m0_half(b[0]) * x[i].d * (float)s;
    }
    return sum;
}

#if defined(MC_X86)

/* nr (1..4) activation rows `xstride` bytes apart; each row's arithmetic is the scalar
 * kernel's (the same integer sums, then scale * d * s), so every path agrees bit for bit */
MC_AVX2 static inline void mc_dotn_mxfp4_avx2(int K, const uint8_t *w, const void *xv,
                                              size_t xstride, int nr, float *out) {
    float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int i = 0; i < K / 32; i++) {
        const uint8_t *b = w + 17 * i;
        const __m256i qw = mc_mxfp4_levels32(b + 1);
        const float d = mc_e8m0_half(b[0]);
        for (int r = 0; r < nr; r++) {
            const mc_q8 *xb = (const mc_q8 *)((const char *)xv + (size_t)r * xstride) + i;
            const __m256i qx = _mm256_loadu_si256((const __m256i *)xb->qs);
            sum[r] += d * xb->d * (float)mc_hsum256_i32(mc_dot_i8_avx2(qw, qx));
        }
    }
    for (int r = 0; r < nr; r++) out[r] = sum[r];
}

MC_AVX2 static float mc_dot_mxfp4_avx2(int K, const uint8_t *w, const void *xv) {
    float o;
    mc_dotn_mxfp4_avx2(K, w, xv, 0, 1, &o);
    return o;
}

MC_AVX2 static void mc_dot4_mxfp4_avx2(int K, const uint8_t *w, const void *xv, size_t xstride,
                                       float *out) {
    mc_dotn_mxfp4_avx2(K, w, xv, xstride, 4, out);
}

/* the exact path: x (K,) float against the row, each block dequantized in registers */
MC_AVX2 static float mc_fdot_mxfp4_avx2(int K, const uint8_t *w, const void *xv) {
    const float *x = (const float *)xv;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    for (int i = 0; i < K / 32; i++) {
        const uint8_t *b = w + 17 * i;
        mc_fma_block32(mc_mxfp4_levels32(b + 1), _mm256_set1_ps(mc_e8m0_half(b[0])), 0,
                       _mm256_setzero_ps(), x + 32 * i, &a0, &a1);
    }
    return mc_hsum256(_mm256_add_ps(a0, a1));
}

#endif /* MC_X86 */
#endif /* MC_MXFP4_H */
