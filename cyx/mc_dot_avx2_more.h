/* AVX2 dot kernels for Q5_1, Q2_K, Q3_K, Q5_K, IQ4_NL, IQ4_XS and BF16, and their AVX2
 * dequantization.  Each quantized kernel computes the integer sums of its scalar twin
 * (mc_dot_scalar.h) and the same float steps, so both paths give the same results; the
 * dequantizers perform mc_dequant_row's float operations (bit-identical). */
#ifndef MC_DOT_AVX2_MORE_H
#define MC_DOT_AVX2_MORE_H

#include "mc_dot_avx2.h"

#if defined(MC_X86)

/* 32 nibbles (16 bytes, low then high) -> their IQ4 levels as int8 */
MC_AVX2 static inline __m256i mc_iq4_levels32(const uint8_t *p) {
    const __m256i tbl = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)mc_iq4_kvalues));
    return _mm256_shuffle_epi8(tbl, mc_nibbles32(p));
}

/* 32 nibbles (16 bytes, low then high) -> their doubled E2M1 values (MXFP4) as int8 */
MC_AVX2 static inline __m256i mc_mxfp4_levels32(const uint8_t *p) {
    const __m256i tbl = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)mc_mxfp4_kvalues));
    return _mm256_shuffle_epi8(tbl, mc_nibbles32(p));
}

/* 32 bytes, 0xFF where bit `bit` of each byte of v is set */
MC_AVX2 static inline __m256i mc_bitmask8(__m256i v, int bit) {
    const __m256i m = _mm256_set1_epi8((char)(1 << bit));
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, m), m);
}

/* 32 2-bit fields: bits 2k..2k+1 of each byte of v */
MC_AVX2 static inline __m256i mc_crumbs(__m256i v, int k) {
    return _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * k)), _mm256_set1_epi8(3));
}

/* 8 int32 sums of u (unsigned, < 128) x y over 16-element halves scaled by a (low) and b */
MC_AVX2 static inline __m256i mc_madd_scaled(__m256i u, __m256i y, int a, int b) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, y),
                             _mm256_set_m128i(_mm_set1_epi16((short)b), _mm_set1_epi16((short)a)));
}

/* Each type's kernel takes nr (1..4) activation rows `xstride` bytes apart: a weight block
 * is unpacked once for all of them, and each row's arithmetic is the single-row one, so
 * mc_dot_* (nr = 1) and mc_dot4_* (nr = 4) give bit-identical results per row. */
#define MC_XROW(T, r) ((const T *)((const char *)xv + (size_t)(r) * xstride))

MC_AVX2 static inline void mc_dotn_q5_1_avx2(int K, const uint8_t *w, const void *xv,
                                             size_t xstride, int nr, float *out) {
    float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int i = 0; i < K / 32; i++) {
        const uint8_t *b = w + 24 * i;
        const __m256i qw = _mm256_or_si256(mc_nibbles32(b + 8),
                                           _mm256_and_si256(mc_bits32(b + 4), _mm256_set1_epi8(0x10)));
        const float d = mc_h16(b), m = mc_h16(b + 2);
        for (int r = 0; r < nr; r++) {
            const mc_q8 *xb = MC_XROW(mc_q8, r) + i;
            const __m256i qx = _mm256_loadu_si256((const __m256i *)xb->qs);
            const int s = mc_hsum256_i32(
                _mm256_madd_epi16(_mm256_maddubs_epi16(qw, qx), _mm256_set1_epi16(1)));
            sum[r] += d * xb->d * (float)s + m * xb->s;
        }
    }
    for (int r = 0; r < nr; r++) out[r] = sum[r];
}

MC_AVX2 static inline void mc_dotn_iq4_nl_avx2(int K, const uint8_t *w, const void *xv,
                                               size_t xstride, int nr, float *out) {
    float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int i = 0; i < K / 32; i++) {
        const uint8_t *b = w + 18 * i;
        const __m256i qw = mc_iq4_levels32(b + 2);
        const float d = mc_h16(b);
        for (int r = 0; r < nr; r++) {
            const mc_q8 *xb = MC_XROW(mc_q8, r) + i;
            const __m256i qx = _mm256_loadu_si256((const __m256i *)xb->qs);
            sum[r] += d * xb->d * (float)mc_hsum256_i32(mc_dot_i8_avx2(qw, qx));
        }
    }
    for (int r = 0; r < nr; r++) out[r] = sum[r];
}

MC_AVX2 static inline void mc_dotn_iq4_xs_avx2(int K, const uint8_t *w, const void *xv,
                                               size_t xstride, int nr, float *out) {
    float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int i = 0; i < K / 256; i++) {
        const uint8_t *b = w + 136 * i;
        const float d = mc_h16(b);
        for (int ib = 0; ib < 8; ib++) {
            const __m256i qw = mc_iq4_levels32(b + 8 + 16 * ib);
            const int ls = mc_iq4xs_scale(b, ib);
            for (int r = 0; r < nr; r++) {
                const mc_q8 *xb = MC_XROW(mc_q8, r) + 8 * i + ib;
                const __m256i qx = _mm256_loadu_si256((const __m256i *)xb->qs);
                sum[r] += d * xb->d * (float)(ls * mc_hsum256_i32(mc_dot_i8_avx2(qw, qx)));
            }
        }
    }
    for (int r = 0; r < nr; r++) out[r] = sum[r];
}

MC_AVX2 static inline void mc_dotn_q2_k_avx2(int K, const uint8_t *w, const void *xv,
                                             size_t xstride, int nr, float *out) {
    float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int i = 0; i < K / 256; i++) {
        const uint8_t *b = w + 84 * i;
        const float d = mc_h16(b + 80), dmin = mc_h16(b + 82);
        __m256i q[8];
        for (int n = 0; n < 2; n++) {
            const __m256i qv = _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * n));
            for (int k = 0; k < 4; k++) q[4 * n + k] = mc_crumbs(qv, k);
        }
        for (int r = 0; r < nr; r++) {
            const mc_q8k *xb = MC_XROW(mc_q8k, r) + i;
            __m256i acc = _mm256_setzero_si256();
            for (int g = 0; g < 8; g++) { /* 32-element group g: scales 2g, 2g + 1 */
                const __m256i yv = _mm256_loadu_si256((const __m256i *)(xb->qs + 32 * g));
                acc = _mm256_add_epi32(
                    acc, mc_madd_scaled(q[g], yv, b[2 * g] & 0xF, b[2 * g + 1] & 0xF));
            }
            int sm = 0;
            for (int j = 0; j < 16; j++) sm += (b[j] >> 4) * xb->bsums[j];
            const int si = mc_hsum256_i32(acc);
            sum[r] += xb->d * (d * (float)si - dmin * (float)sm);
        }
    }
    for (int r = 0; r < nr; r++) out[r] = sum[r];
}

MC_AVX2 static inline void mc_dotn_q3_k_avx2(int K, const uint8_t *w, const void *xv,
                                             size_t xstride, int nr, float *out) {
    float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int i = 0; i < K / 256; i++) {
        const uint8_t *b = w + 110 * i;
        const float d = mc_h16(b + 108);
        int8_t sc[16];
        mc_q3k_scales(b + 96, sc);
        const __m256i hm = _mm256_loadu_si256((const __m256i *)b);
        __m256i u[8]; /* q + 4 (0..7); the 4 is taken off through bsums */
        for (int n = 0; n < 2; n++) {
            const __m256i qv = _mm256_loadu_si256((const __m256i *)(b + 32 + 32 * n));
            for (int k = 0; k < 4; k++)
                u[4 * n + k] = _mm256_or_si256(
                    mc_crumbs(qv, k),
                    _mm256_and_si256(mc_bitmask8(hm, 4 * n + k), _mm256_set1_epi8(4)));
        }
        for (int r = 0; r < nr; r++) {
            const mc_q8k *xb = MC_XROW(mc_q8k, r) + i;
            __m256i acc = _mm256_setzero_si256();
            for (int g = 0; g < 8; g++) {
                const __m256i yv = _mm256_loadu_si256((const __m256i *)(xb->qs + 32 * g));
                acc = _mm256_add_epi32(acc, mc_madd_scaled(u[g], yv, sc[2 * g], sc[2 * g + 1]));
            }
            int corr = 0;
            for (int j = 0; j < 16; j++) corr += sc[j] * xb->bsums[j];
            const int si = mc_hsum256_i32(acc) - 4 * corr;
            sum[r] += xb->d * (d * (float)si);
        }
    }
    for (int r = 0; r < nr; r++) out[r] = sum[r];
}

MC_AVX2 static inline void mc_dotn_q5_k_avx2(int K, const uint8_t *w, const void *xv,
                                             size_t xstride, int nr, float *out) {
    float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const __m256i m4 = _mm256_set1_epi8(0xF), h = _mm256_set1_epi8(0x10);
    for (int i = 0; i < K / 256; i++) {
        const uint8_t *b = w + 176 * i;
        const float d = mc_h16(b), dmin = mc_h16(b + 2);
        uint8_t sc[8], mn[8];
        for (int j = 0; j < 8; j++) mc_q4k_scale_min(j, b + 4, &sc[j], &mn[j]);
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 16));
        __m256i q[8]; /* 32-element group 2j: low nibbles of run j, 2j + 1: high */
        for (int j = 0; j < 4; j++) {
            const __m256i q4 = _mm256_loadu_si256((const __m256i *)(b + 48 + 32 * j));
            q[2 * j] = _mm256_or_si256(_mm256_and_si256(q4, m4),
                                       _mm256_and_si256(mc_bitmask8(qh, 2 * j), h));
            q[2 * j + 1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q4, 4), m4),
                                           _mm256_and_si256(mc_bitmask8(qh, 2 * j + 1), h));
        }
        for (int r = 0; r < nr; r++) {
            const mc_q8k *xb = MC_XROW(mc_q8k, r) + i;
            __m256i acc = _mm256_setzero_si256();
            for (int g = 0; g < 8; g++) {
                const __m256i yv = _mm256_loadu_si256((const __m256i *)(xb->qs + 32 * g));
                acc = _mm256_add_epi32(acc, mc_madd_scaled(q[g], yv, sc[g], sc[g]));
            }
            int sm = 0;
            for (int j = 0; j < 8; j++) sm += mn[j] * (xb->bsums[2 * j] + xb->bsums[2 * j + 1]);
            const int si = mc_hsum256_i32(acc);
            sum[r] += xb->d * (d * (float)si - dmin * (float)sm);
        }
    }
    for (int r = 0; r < nr; r++) out[r] = sum[r];
}
#undef MC_XROW

/* the single-row (mc_dot_fn) and 4-row (mc_dot4_fn) entry points of each mc_dotn_* */
#define MC_DOT_ENTRIES(T)                                                                          \
    MC_AVX2 static float mc_dot_##T##_avx2(int K, const uint8_t *w, const void *xv) {              \
        float o;                                                                                   \
        mc_dotn_##T##_avx2(K, w, xv, 0, 1, &o);                                                    \
        return o;                                                                                  \
    }                                                                                              \
    MC_AVX2 static void mc_dot4_##T##_avx2(int K, const uint8_t *w, const void *xv,                \
                                           size_t xstride, float *out) {                           \
        mc_dotn_##T##_avx2(K, w, xv, xstride, 4, out);                                             \
    }
MC_DOT_ENTRIES(q5_1)
MC_DOT_ENTRIES(iq4_nl)
MC_DOT_ENTRIES(iq4_xs)
MC_DOT_ENTRIES(q2_k)
MC_DOT_ENTRIES(q3_k)
MC_DOT_ENTRIES(q5_k)
#undef MC_DOT_ENTRIES

/* 8 bfloat16 -> 8 floats */
MC_AVX2 static inline __m256 mc_bf16x8(const uint8_t *p) {
    const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

/* mc_dot_f16_avx2's accumulation order on bf16 weights */
MC_AVX2 static float mc_dot_bf16_avx2(int K, const uint8_t *w, const void *xv) {
    const float *x = (const float *)xv;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= K; i += 16) {
        a0 = _mm256_fmadd_ps(mc_bf16x8(w + 2 * i), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(mc_bf16x8(w + 2 * i + 16), _mm256_loadu_ps(x + i + 8), a1);
    }
    for (; i + 8 <= K; i += 8) a0 = _mm256_fmadd_ps(mc_bf16x8(w + 2 * i), _mm256_loadu_ps(x + i), a0);
    float sum = mc_hsum256(_mm256_add_ps(a0, a1));
    for (; i < K; i++) sum += mc_load_bf16(w + 2 * i) * x[i];
    return sum;
}

/* 4 rows of x against one bf16 weight row; per row exactly mc_dot_bf16_avx2 */
MC_AVX2 static void mc_dot4_bf16_avx2(int K, const uint8_t *w, const void *xv, size_t xstride,
                                      float *out) {
    const float *x[4];
    for (int r = 0; r < 4; r++) x[r] = (const float *)((const char *)xv + r * xstride);
    __m256 a0[4], a1[4];
    for (int r = 0; r < 4; r++) a0[r] = a1[r] = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= K; i += 16) {
        const __m256 w0 = mc_bf16x8(w + 2 * i), w1 = mc_bf16x8(w + 2 * i + 16);
        for (int r = 0; r < 4; r++) {
            a0[r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x[r] + i), a0[r]);
            a1[r] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x[r] + i + 8), a1[r]);
        }
    }
    for (; i + 8 <= K; i += 8) {
        const __m256 w0 = mc_bf16x8(w + 2 * i);
        for (int r = 0; r < 4; r++) a0[r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x[r] + i), a0[r]);
    }
    for (int r = 0; r < 4; r++) {
        float sum = mc_hsum256(_mm256_add_ps(a0[r], a1[r]));
        for (int j = i; j < K; j++) sum += mc_load_bf16(w + 2 * j) * x[r][j];
        out[r] = sum;
    }
}

#endif /* MC_X86 */

#endif /* MC_DOT_AVX2_MORE_H */
