/* AVX2 dequantization and the exact path's fused dequantize-and-dot kernels. */
#ifndef MC_DEQUANT_AVX2_H
#define MC_DEQUANT_AVX2_H

#include "mc_dot_avx2.h"
#include "mc_dot_avx2_more.h"

#if defined(MC_X86)

/* ---- dequantization with AVX2: bit-identical to mc_dequant_row (same float ops) */

/* y[0..cnt) = d * q + m, cnt a multiple of 8 */
MC_AVX2 static inline void mc_i8_affine_avx2(const int8_t *q, int cnt, float d, float m, float *y) {
    const __m256 vd = _mm256_set1_ps(d), vm = _mm256_set1_ps(m);
    for (int i = 0; i < cnt; i += 8) {
        const __m256 f =
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + i))));
        _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_mul_ps(vd, f), vm));
    }
}

/* y[0..cnt) = d * q, cnt a multiple of 8 */
MC_AVX2 static inline void mc_i8_scale_avx2(const int8_t *q, int cnt, float d, float *y) {
    const __m256 vd = _mm256_set1_ps(d);
    for (int i = 0; i < cnt; i += 8) {
        const __m256 f =
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + i))));
        _mm256_storeu_ps(y + i, _mm256_mul_ps(vd, f));
    }
}

/* returns 0 when the type has no AVX2 dequantizer (the caller uses the scalar one) */
MC_AVX2 static int mc_dequant_row_avx2(int t, const uint8_t *row, int K, float *y) {
    int8_t tmp[32];
    switch (t) {
    case MC_Q4_0:
        for (int i = 0; i < K / 32; i++, y += 32) {
            const uint8_t *b = row + 18 * i;
            _mm256_storeu_si256((__m256i *)tmp,
                                _mm256_sub_epi8(mc_nibbles32(b + 2), _mm256_set1_epi8(8)));
            mc_i8_scale_avx2(tmp, 32, mc_h16(b), y);
        }
        return 1;
    case MC_Q4_1:
        for (int i = 0; i < K / 32; i++, y += 32) {
            const uint8_t *b = row + 20 * i;
            _mm256_storeu_si256((__m256i *)tmp, mc_nibbles32(b + 4));
            mc_i8_affine_avx2(tmp, 32, mc_h16(b), mc_h16(b + 2), y);
        }
        return 1;
    case MC_Q5_0:
        for (int i = 0; i < K / 32; i++, y += 32) {
            const uint8_t *b = row + 22 * i;
            const __m256i hi = _mm256_andnot_si256(mc_bits32(b + 2), _mm256_set1_epi8((char)0xF0));
            _mm256_storeu_si256((__m256i *)tmp, _mm256_or_si256(mc_nibbles32(b + 6), hi));
            mc_i8_scale_avx2(tmp, 32, mc_h16(b), y);
        }
        return 1;
    case MC_Q8_0:
        for (int i = 0; i < K / 32; i++, y += 32) {
            const uint8_t *b = row + 34 * i;
            mc_i8_scale_avx2((const int8_t *)(b + 2), 32, mc_h16(b), y);
        }
        return 1;
    case MC_Q4_K: {
        const __m256i m4 = _mm256_set1_epi8(0xF);
        for (int i = 0; i < K / 256; i++) {
            const uint8_t *b = row + 144 * i;
            const float d = mc_h16(b), dmin = mc_h16(b + 2);
            for (int j = 0; j < 4; j++, y += 64) {
                uint8_t s0, m0, s1, m1;
                mc_q4k_scale_min(2 * j, b + 4, &s0, &m0);
                mc_q4k_scale_min(2 * j + 1, b + 4, &s1, &m1);
                const __m256i q4 = _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * j));
                _mm256_storeu_si256((__m256i *)tmp, _mm256_and_si256(q4, m4));
                mc_i8_affine_avx2(tmp, 32, d * s0, -(dmin * m0), y);
                _mm256_storeu_si256((__m256i *)tmp, _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4));
                mc_i8_affine_avx2(tmp, 32, d * s1, -(dmin * m1), y + 32);
            }
        }
        return 1;
    }
    case MC_Q6_K: {
        const __m256i m4 = _mm256_set1_epi8(0xF), m30 = _mm256_set1_epi8(0x30);
        const __m256i o32 = _mm256_set1_epi8(32);
        for (int i = 0; i < K / 256; i++) {
            const uint8_t *b = row + 210 * i;
            const int8_t *sc = (const int8_t *)(b + 192);
            const float d = mc_h16(b + 208);
            for (int n = 0; n < 2; n++, y += 128) {
                const __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * n));
                const __m256i ql0 = _mm256_loadu_si256((const __m256i *)(b + 64 * n));
                const __m256i ql1 = _mm256_loadu_si256((const __m256i *)(b + 64 * n + 32));
                __m256i q[4];
                q[0] = _mm256_or_si256(_mm256_and_si256(ql0, m4),
                                       _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
                q[1] = _mm256_or_si256(_mm256_and_si256(ql1, m4),
                                       _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
                q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                                       _mm256_and_si256(qh, m30));
                q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                                       _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
                for (int k = 0; k < 4; k++) {
                    _mm256_storeu_si256((__m256i *)tmp, _mm256_sub_epi8(q[k], o32));
                    const int8_t *s = sc + 8 * n + 2 * k;
                    mc_i8_scale_avx2(tmp, 16, d * (float)s[0], y + 32 * k);
                    mc_i8_scale_avx2(tmp + 16, 16, d * (float)s[1], y + 32 * k + 16);
                }
            }
        }
        return 1;
    }
    case MC_Q5_1:
        for (int i = 0; i < K / 32; i++, y += 32) {
            const uint8_t *b = row + 24 * i;
            const __m256i hi = _mm256_and_si256(mc_bits32(b + 4), _mm256_set1_epi8(0x10));
            _mm256_storeu_si256((__m256i *)tmp, _mm256_or_si256(mc_nibbles32(b + 8), hi));
            mc_i8_affine_avx2(tmp, 32, mc_h16(b), mc_h16(b + 2), y);
        }
        return 1;
    case MC_IQ4_NL:
        for (int i = 0; i < K / 32; i++, y += 32) {
            const uint8_t *b = row + 18 * i;
            _mm256_storeu_si256((__m256i *)tmp, mc_iq4_levels32(b + 2));
            mc_i8_scale_avx2(tmp, 32, mc_h16(b), y);
        }
        return 1;
    case MC_MXFP4:
        for (int i = 0; i < K / 32; i++, y += 32) {
            const uint8_t *b = row + 17 * i;
            _mm256_storeu_si256((__m256i *)tmp, mc_mxfp4_levels32(b + 1));
            mc_i8_scale_avx2(tmp, 32, mc_e8m0_half(b[0]), y);
        }
        return 1;
    case MC_IQ4_XS:
        for (int i = 0; i < K / 256; i++) {
            const uint8_t *b = row + 136 * i;
            const float d = mc_h16(b);
            for (int ib = 0; ib < 8; ib++, y += 32) {
                _mm256_storeu_si256((__m256i *)tmp, mc_iq4_levels32(b + 8 + 16 * ib));
                mc_i8_scale_avx2(tmp, 32, d * (float)mc_iq4xs_scale(b, ib), y);
            }
        }
        return 1;
    case MC_Q2_K:
        for (int i = 0; i < K / 256; i++) {
            const uint8_t *b = row + 84 * i;
            const float d = mc_h16(b + 80), dmin = mc_h16(b + 82);
            for (int n = 0; n < 2; n++) {
                const __m256i qv = _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * n));
                for (int k = 0; k < 4; k++, y += 32) {
                    const int j = 8 * n + 2 * k;
                    _mm256_storeu_si256((__m256i *)tmp, mc_crumbs(qv, k));
                    mc_i8_affine_avx2(tmp, 16, d * (float)(b[j] & 0xF), -(dmin * (float)(b[j] >> 4)), y);
                    mc_i8_affine_avx2(tmp + 16, 16, d * (float)(b[j + 1] & 0xF),
                                      -(dmin * (float)(b[j + 1] >> 4)), y + 16);
                }
            }
        }
        return 1;
    case MC_Q3_K:
        for (int i = 0; i < K / 256; i++) {
            const uint8_t *b = row + 110 * i;
            const float d = mc_h16(b + 108);
            int8_t sc[16];
            mc_q3k_scales(b + 96, sc);
            const __m256i hm = _mm256_loadu_si256((const __m256i *)b);
            for (int n = 0; n < 2; n++) {
                const __m256i qv = _mm256_loadu_si256((const __m256i *)(b + 32 + 32 * n));
                for (int k = 0; k < 4; k++, y += 32) {
                    const int g = 4 * n + k;
                    const __m256i u = _mm256_or_si256(
                        mc_crumbs(qv, k), _mm256_and_si256(mc_bitmask8(hm, g), _mm256_set1_epi8(4)));
                    _mm256_storeu_si256((__m256i *)tmp, _mm256_sub_epi8(u, _mm256_set1_epi8(4)));
                    mc_i8_scale_avx2(tmp, 16, d * (float)sc[2 * g], y);
                    mc_i8_scale_avx2(tmp + 16, 16, d * (float)sc[2 * g + 1], y + 16);
                }
            }
        }
        return 1;
    case MC_Q5_K: {
        const __m256i m4 = _mm256_set1_epi8(0xF), h = _mm256_set1_epi8(0x10);
        for (int i = 0; i < K / 256; i++) {
            const uint8_t *b = row + 176 * i;
            const float d = mc_h16(b), dmin = mc_h16(b + 2);
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 16));
            for (int j = 0; j < 4; j++, y += 64) {
                uint8_t s0, m0, s1, m1;
                mc_q4k_scale_min(2 * j, b + 4, &s0, &m0);
                mc_q4k_scale_min(2 * j + 1, b + 4, &s1, &m1);
                const __m256i q4 = _mm256_loadu_si256((const __m256i *)(b + 48 + 32 * j));
                _mm256_storeu_si256((__m256i *)tmp,
                                    _mm256_or_si256(_mm256_and_si256(q4, m4),
                                                    _mm256_and_si256(mc_bitmask8(qh, 2 * j), h)));
                mc_i8_affine_avx2(tmp, 32, d * (float)s0, -(dmin * (float)m0), y);
                _mm256_storeu_si256(
                    (__m256i *)tmp,
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q4, 4), m4),
                                    _mm256_and_si256(mc_bitmask8(qh, 2 * j + 1), h)));
                mc_i8_affine_avx2(tmp, 32, d * (float)s1, -(dmin * (float)m1), y + 32);
            }
        }
        return 1;
    }
    case MC_BF16:
        for (int i = 0; i + 8 <= K; i += 8) _mm256_storeu_ps(y + i, mc_bf16x8(row + 2 * i));
        for (int i = K & ~7; i < K; i++) y[i] = mc_load_bf16(row + 2 * i);
        return 1;
    default:
        return 0;
    }
}

/* ---- exact path without the row buffer: a weight block is dequantized in
 * registers with mc_dequant_row_avx2's operations and meets float x with
 * mc_dot_f32_avx2's accumulation order, so the result is bit-identical to
 * dequantizing the row and calling mc_dot_f32_avx2 (which the batched exact
 * path does). */

MC_AVX2 static inline void mc_fma_block32(__m256i q, __m256 vd, int affine, __m256 vm,
                                          const float *x, __m256 *a0, __m256 *a1) {
    const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    __m256 w0 = _mm256_mul_ps(vd, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)));
    __m256 w1 = _mm256_mul_ps(vd, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))));
    __m256 w2 = _mm256_mul_ps(vd, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)));
    __m256 w3 = _mm256_mul_ps(vd, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))));
    if (affine) {
        w0 = _mm256_add_ps(w0, vm);
        w1 = _mm256_add_ps(w1, vm);
        w2 = _mm256_add_ps(w2, vm);
        w3 = _mm256_add_ps(w3, vm);
    }
    *a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x), *a0);
    *a1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + 8), *a1);
    *a0 = _mm256_fmadd_ps(w2, _mm256_loadu_ps(x + 16), *a0);
    *a1 = _mm256_fmadd_ps(w3, _mm256_loadu_ps(x + 24), *a1);
}

/* as mc_fma_block32, elements 0-15 scaled by vd0 and 16-31 by vd1 (Q6_K) */
MC_AVX2 static inline void mc_fma_block32_2s(__m256i q, __m256 vd0, __m256 vd1, const float *x,
                                             __m256 *a0, __m256 *a1) {
    const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    const __m256 w0 = _mm256_mul_ps(vd0, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)));
    const __m256 w1 =
        _mm256_mul_ps(vd0, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))));
    const __m256 w2 = _mm256_mul_ps(vd1, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)));
    const __m256 w3 =
        _mm256_mul_ps(vd1, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))));
    *a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x), *a0);
    *a1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + 8), *a1);
    *a0 = _mm256_fmadd_ps(w2, _mm256_loadu_ps(x + 16), *a0);
    *a1 = _mm256_fmadd_ps(w3, _mm256_loadu_ps(x + 24), *a1);
}

MC_AVX2 static float mc_fdot_q4_k_avx2(int K, const uint8_t *w, const void *xv) {
    const float *x = (const float *)xv;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0xF);
    for (int i = 0; i < K / 256; i++) {
        const uint8_t *b = w + 144 * i;
        const float d = mc_h16(b), dmin = mc_h16(b + 2);
        for (int j = 0; j < 4; j++) {
            uint8_t s0, m0, s1, m1;
            mc_q4k_scale_min(2 * j, b + 4, &s0, &m0);
            mc_q4k_scale_min(2 * j + 1, b + 4, &s1, &m1);
            const __m256i q4 = _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * j));
            const float *xx = x + 256 * i + 64 * j;
            mc_fma_block32(_mm256_and_si256(q4, m4), _mm256_set1_ps(d * s0), 1,
                           _mm256_set1_ps(-(dmin * m0)), xx, &a0, &a1);
            mc_fma_block32(_mm256_and_si256(_mm256_srli_epi16(q4, 4), m4), _mm256_set1_ps(d * s1),
                           1, _mm256_set1_ps(-(dmin * m1)), xx + 32, &a0, &a1);
        }
    }
    return mc_hsum256(_mm256_add_ps(a0, a1));
}

MC_AVX2 static float mc_fdot_q6_k_avx2(int K, const uint8_t *w, const void *xv) {
    const float *x = (const float *)xv;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0xF), m30 = _mm256_set1_epi8(0x30);
    const __m256i o32 = _mm256_set1_epi8(32);
    for (int i = 0; i < K / 256; i++) {
        const uint8_t *b = w + 210 * i;
        const int8_t *sc = (const int8_t *)(b + 192);
        const float d = mc_h16(b + 208);
        for (int n = 0; n < 2; n++) {
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * n));
            const __m256i ql0 = _mm256_loadu_si256((const __m256i *)(b + 64 * n));
            const __m256i ql1 = _mm256_loadu_si256((const __m256i *)(b + 64 * n + 32));
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(ql0, m4),
                                   _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
            q[1] = _mm256_or_si256(_mm256_and_si256(ql1, m4),
                                   _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                                   _mm256_and_si256(qh, m30));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                                   _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
            for (int k = 0; k < 4; k++) {
                const int8_t *s2 = sc + 8 * n + 2 * k;
                mc_fma_block32_2s(_mm256_sub_epi8(q[k], o32), _mm256_set1_ps(d * (float)s2[0]),
                                  _mm256_set1_ps(d * (float)s2[1]), x + 256 * i + 128 * n + 32 * k,
                                  &a0, &a1);
            }
        }
    }
    return mc_hsum256(_mm256_add_ps(a0, a1));
}

MC_AVX2 static float mc_fdot_q4_0_avx2(int K, const uint8_t *w, const void *xv) {
    const float *x = (const float *)xv;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    for (int i = 0; i < K / 32; i++) {
        const uint8_t *b = w + 18 * i;
        const __m256i q = _mm256_sub_epi8(mc_nibbles32(b + 2), _mm256_set1_epi8(8));
        mc_fma_block32(q, _mm256_set1_ps(mc_h16(b)), 0, a0, x + 32 * i, &a0, &a1);
    }
    return mc_hsum256(_mm256_add_ps(a0, a1));
}

MC_AVX2 static float mc_fdot_q4_1_avx2(int K, const uint8_t *w, const void *xv) {
    const float *x = (const float *)xv;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    for (int i = 0; i < K / 32; i++) {
        const uint8_t *b = w + 20 * i;
        mc_fma_block32(mc_nibbles32(b + 4), _mm256_set1_ps(mc_h16(b)), 1,
                       _mm256_set1_ps(mc_h16(b + 2)), x + 32 * i, &a0, &a1);
    }
    return mc_hsum256(_mm256_add_ps(a0, a1));
}

MC_AVX2 static float mc_fdot_q5_0_avx2(int K, const uint8_t *w, const void *xv) {
    const float *x = (const float *)xv;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    for (int i = 0; i < K / 32; i++) {
        const uint8_t *b = w + 22 * i;
        const __m256i hi = _mm256_andnot_si256(mc_bits32(b + 2), _mm256_set1_epi8((char)0xF0));
        const __m256i q = _mm256_or_si256(mc_nibbles32(b + 6), hi);
        mc_fma_block32(q, _mm256_set1_ps(mc_h16(b)), 0, a0, x + 32 * i, &a0, &a1);
    }
    return mc_hsum256(_mm256_add_ps(a0, a1));
}

MC_AVX2 static float mc_fdot_q8_0_avx2(int K, const uint8_t *w, const void *xv) {
    const float *x = (const float *)xv;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    for (int i = 0; i < K / 32; i++) {
        const uint8_t *b = w + 34 * i;
        const __m256i q = _mm256_loadu_si256((const __m256i *)(b + 2));
        mc_fma_block32(q, _mm256_set1_ps(mc_h16(b)), 0, a0, x + 32 * i, &a0, &a1);
    }
    return mc_hsum256(_mm256_add_ps(a0, a1));
}

/* as mc_fma_block32_2s with a min per half: w = vd * q + vm (Q2_K) */
MC_AVX2 static inline void mc_fma_block32_2a(__m256i q, __m256 vd0, __m256 vm0, __m256 vd1,
                                             __m256 vm1, const float *x, __m256 *a0, __m256 *a1) {
    const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    const __m256 w0 = _mm256_add_ps(_mm256_mul_ps(vd0, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo))), vm0);
    const __m256 w1 = _mm256_add_ps(
        _mm256_mul_ps(vd0, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)))), vm0);
    const __m256 w2 = _mm256_add_ps(_mm256_mul_ps(vd1, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi))), vm1);
    const __m256 w3 = _mm256_add_ps(
        _mm256_mul_ps(vd1, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)))), vm1);
    *a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x), *a0);
    *a1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + 8), *a1);
    *a0 = _mm256_fmadd_ps(w2, _mm256_loadu_ps(x + 16), *a0);
    *a1 = _mm256_fmadd_ps(w3, _mm256_loadu_ps(x + 24), *a1);
}

/* the fused exact kernels of Q5_1, IQ4_NL, IQ4_XS, Q2_K, Q3_K, Q5_K (see above) */

MC_AVX2 static float mc_fdot_q5_1_avx2(int K, const uint8_t *w, const void *xv) {
    const float *x = (const float *)xv;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    for (int i = 0; i < K / 32; i++) {
        const uint8_t *b = w + 24 * i;
        const __m256i q = _mm256_or_si256(mc_nibbles32(b + 8),
                                          _mm256_and_si256(mc_bits32(b + 4), _mm256_set1_epi8(0x10)));
        mc_fma_block32(q, _mm256_set1_ps(mc_h16(b)), 1, _mm256_set1_ps(mc_h16(b + 2)), x + 32 * i,
                       &a0, &a1);
    }
    return mc_hsum256(_mm256_add_ps(a0, a1));
}

MC_AVX2 static float mc_fdot_iq4_nl_avx2(int K, const uint8_t *w, const void *xv) {
    const float *x = (const float *)xv;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    for (int i = 0; i < K / 32; i++) {
        const uint8_t *b = w + 18 * i;
        mc_fma_block32(mc_iq4_levels32(b + 2), _mm256_set1_ps(mc_h16(b)), 0, _mm256_setzero_ps(),
                       x + 32 * i, &a0, &a1);
    }
    return mc_hsum256(_mm256_add_ps(a0, a1));
}

MC_AVX2 static float mc_fdot_iq4_xs_avx2(int K, const uint8_t *w, const void *xv) {
    const float *x = (const float *)xv;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    for (int i = 0; i < K / 256; i++) {
        const uint8_t *b = w + 136 * i;
        const float d = mc_h16(b);
        for (int ib = 0; ib < 8; ib++)
            mc_fma_block32(mc_iq4_levels32(b + 8 + 16 * ib),
                           _mm256_set1_ps(d * (float)mc_iq4xs_scale(b, ib)), 0, _mm256_setzero_ps(),
                           x + 256 * i + 32 * ib, &a0, &a1);
    }
    return mc_hsum256(_mm256_add_ps(a0, a1));
}

MC_AVX2 static float mc_fdot_q2_k_avx2(int K, const uint8_t *w, const void *xv) {
    const float *x = (const float *)xv;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    for (int i = 0; i < K / 256; i++) {
        const uint8_t *b = w + 84 * i;
        const float d = mc_h16(b + 80), dmin = mc_h16(b + 82);
        for (int n = 0; n < 2; n++) {
            const __m256i qv = _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * n));
            for (int k = 0; k < 4; k++) {
                const int j = 8 * n + 2 * k;
                mc_fma_block32_2a(mc_crumbs(qv, k), _mm256_set1_ps(d * (float)(b[j] & 0xF)),
                                  _mm256_set1_ps(-(dmin * (float)(b[j] >> 4))),
                                  _mm256_set1_ps(d * (float)(b[j + 1] & 0xF)),
                                  _mm256_set1_ps(-(dmin * (float)(b[j + 1] >> 4))),
                                  x + 256 * i + 128 * n + 32 * k, &a0, &a1);
            }
        }
    }
    return mc_hsum256(_mm256_add_ps(a0, a1));
}

MC_AVX2 static float mc_fdot_q3_k_avx2(int K, const uint8_t *w, const void *xv) {
    const float *x = (const float *)xv;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    for (int i = 0; i < K / 256; i++) {
        const uint8_t *b = w + 110 * i;
        const float d = mc_h16(b + 108);
        int8_t sc[16];
        mc_q3k_scales(b + 96, sc);
        const __m256i hm = _mm256_loadu_si256((const __m256i *)b);
        for (int n = 0; n < 2; n++) {
            const __m256i qv = _mm256_loadu_si256((const __m256i *)(b + 32 + 32 * n));
            for (int k = 0; k < 4; k++) {
                const int g = 4 * n + k;
                const __m256i u = _mm256_or_si256(
                    mc_crumbs(qv, k), _mm256_and_si256(mc_bitmask8(hm, g), _mm256_set1_epi8(4)));
                mc_fma_block32_2s(_mm256_sub_epi8(u, _mm256_set1_epi8(4)),
                                  _mm256_set1_ps(d * (float)sc[2 * g]),
                                  _mm256_set1_ps(d * (float)sc[2 * g + 1]), x + 256 * i + 32 * g,
                                  &a0, &a1);
            }
        }
    }
    return mc_hsum256(_mm256_add_ps(a0, a1));
}

MC_AVX2 static float mc_fdot_q5_k_avx2(int K, const uint8_t *w, const void *xv) {
    const float *x = (const float *)xv;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0xF), h = _mm256_set1_epi8(0x10);
    for (int i = 0; i < K / 256; i++) {
        const uint8_t *b = w + 176 * i;
        const float d = mc_h16(b), dmin = mc_h16(b + 2);
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 16));
        for (int j = 0; j < 4; j++) {
            uint8_t s0, m0, s1, m1;
            mc_q4k_scale_min(2 * j, b + 4, &s0, &m0);
            mc_q4k_scale_min(2 * j + 1, b + 4, &s1, &m1);
            const __m256i q4 = _mm256_loadu_si256((const __m256i *)(b + 48 + 32 * j));
            const float *xx = x + 256 * i + 64 * j;
            mc_fma_block32(_mm256_or_si256(_mm256_and_si256(q4, m4),
                                           _mm256_and_si256(mc_bitmask8(qh, 2 * j), h)),
                           _mm256_set1_ps(d * (float)s0), 1, _mm256_set1_ps(-(dmin * (float)m0)), xx,
                           &a0, &a1);
            mc_fma_block32(_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q4, 4), m4),
                                           _mm256_and_si256(mc_bitmask8(qh, 2 * j + 1), h)),
                           _mm256_set1_ps(d * (float)s1), 1, _mm256_set1_ps(-(dmin * (float)m1)),
                           xx + 32, &a0, &a1);
        }
    }
    return mc_hsum256(_mm256_add_ps(a0, a1));
}

#endif /* MC_X86 */

#endif /* MC_DEQUANT_AVX2_H */
