/* AVX2 (and AVX512-VNNI) dot kernels, compiled with target attributes, chosen at run time. */
#ifndef MC_DOT_AVX2_H
#define MC_DOT_AVX2_H

#include "mc_blocks.h"

/* --------------------------------------------------------------- AVX2 dots */
#if defined(MC_X86)

MC_AVX2 static inline float mc_h16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* 16 bytes of nibbles -> 32 bytes: low nibbles first, then high nibbles */
MC_AVX2 static inline __m256i mc_nibbles32(const uint8_t *p) {
    const __m128i t = _mm_loadu_si128((const __m128i *)p);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), _mm256_set1_epi8(0xF));
}

/* 32 bits -> 32 bytes, 0xFF where the bit is set */
MC_AVX2 static inline __m256i mc_bits32(const uint8_t *p) {
    uint32_t x32;
    memcpy(&x32, p, 4);
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                           0x0101010101010101, 0x0000000000000000);
    __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32((int)x32), shuf);
    bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    return _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1));
}

/* mc_quantize_q8 with AVX2: the same float operations (|x| max, d = amax / 127,
 * q = round-half-even(x * (1 / d))), so the blocks are bit-identical; a partial
 * last block takes the scalar code. */
MC_AVX2 static void mc_quantize_q8_avx2(const float *x, int K, mc_q8 *out) {
    const int nb = K / 32;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int i = 0; i < nb; i++) {
        const float *xb = x + 32 * i;
        const __m256 v0 = _mm256_loadu_ps(xb), v1 = _mm256_loadu_ps(xb + 8);
        const __m256 v2 = _mm256_loadu_ps(xb + 16), v3 = _mm256_loadu_ps(xb + 24);
        const float amax = mc_hmax256(
            _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                          _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3))));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        const __m256 vid = _mm256_set1_ps(id);
        /* cvtps_epi32 rounds half to even in the default MXCSR mode, as nearbyintf */
        const __m256i q0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, vid));
        const __m256i q1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, vid));
        const __m256i q2 = _mm256_cvtps_epi32(_mm256_mul_ps(v2, vid));
        const __m256i q3 = _mm256_cvtps_epi32(_mm256_mul_ps(v3, vid));
        const int sum = mc_hsum256_i32(_mm256_add_epi32(_mm256_add_epi32(q0, q1), _mm256_add_epi32(q2, q3)));
        /* packs interleave the 128-bit halves: q0 q1 q2 q3 lanes -> one fixing permute */
        const __m256i p16a = _mm256_packs_epi32(q0, q1), p16b = _mm256_packs_epi32(q2, q3);
        const __m256i p8 = _mm256_packs_epi16(p16a, p16b);
        const __m256i fixed = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)out[i].qs, fixed);
        out[i].d = d;
        out[i].s = d * (float)sum;
    }
    if (K % 32) mc_quantize_q8(x + 32 * nb, K - 32 * nb, out + nb);
}

/* mc_quantize_q8k with AVX2: the same float operations (|x| max over 256, d = amax / 127,
 * q = round-half-even(x * (1 / d)), int sums per 16), so the blocks are bit-identical. */
MC_AVX2 static void mc_quantize_q8k_avx2(const float *x, int K, mc_q8k *out) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i fix = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int i = 0; i < K / 256; i++) {
        const float *xb = x + 256 * i;
        __m256 m0 = _mm256_setzero_ps(), m1 = m0;
        for (int j = 0; j < 256; j += 16) {
            m0 = _mm256_max_ps(m0, _mm256_andnot_ps(sign, _mm256_loadu_ps(xb + j)));
            m1 = _mm256_max_ps(m1, _mm256_andnot_ps(sign, _mm256_loadu_ps(xb + j + 8)));
        }
        const float d = mc_hmax256(_mm256_max_ps(m0, m1)) / 127.0f;
        const __m256 vid = _mm256_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
        for (int g = 0; g < 256; g += 32) {
            const __m256i q0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + g), vid));
            const __m256i q1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + g + 8), vid));
            const __m256i q2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + g + 16), vid));
            const __m256i q3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + g + 24), vid));
            out[i].bsums[g / 16] = (int16_t)mc_hsum256_i32(_mm256_add_epi32(q0, q1));
            out[i].bsums[g / 16 + 1] = (int16_t)mc_hsum256_i32(_mm256_add_epi32(q2, q3));
            const __m256i p8 = _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
            _mm256_storeu_si256((__m256i *)(out[i].qs + g), _mm256_permutevar8x32_epi32(p8, fix));
        }
        out[i].d = d;
    }
}

#define MC_X4(r) ((const mc_q8 *)((const char *)x + (r) * xstride))
#define MC_XK4(r) ((const mc_q8k *)((const char *)x + (r) * xstride))

/* the 32-element-block integer kernels, for AVX2 and for AVX512-VNNI (256-bit) */
#define MC_TGT MC_AVX2
#define MC_SFX(name) name##_avx2
#define MC_SUM_U8I8(u, s) _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
#define MC_DPBUSD 0
#include "mc_quant_x86.h"
#undef MC_DPBUSD
#undef MC_TGT
#undef MC_SFX
#undef MC_SUM_U8I8

#define MC_TGT MC_VNNI
#define MC_SFX(name) name##_vnni
#define MC_SUM_U8I8(u, s) _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s)
#define MC_DPBUSD 1
#include "mc_quant_x86.h"
#undef MC_DPBUSD
#undef MC_TGT
#undef MC_SFX
#undef MC_SUM_U8I8

MC_AVX2 static float mc_dot_q4_k_avx2(int K, const uint8_t *w, const void *xv) {
    const mc_q8k *x = (const mc_q8k *)xv;
    float sum = 0.0f; /* per block the exact ints, then mc_dot_q4_k_scalar's float ops */
    const __m256i m4 = _mm256_set1_epi8(0xF);
    for (int i = 0; i < K / 256; i++) {
        const uint8_t *b = w + 144 * i;
        uint8_t sc[8], mn[8];
        for (int j = 0; j < 8; j++) mc_q4k_scale_min(j, b + 4, &sc[j], &mn[j]);
        const uint8_t *q = b + 16;
        const int8_t *y = x[i].qs;
        __m256i sumi = _mm256_setzero_si256();
        for (int j = 0; j < 4; j++) {
            const __m256i q4 = _mm256_loadu_si256((const __m256i *)(q + 32 * j));
            const __m256i lo = _mm256_and_si256(q4, m4);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4);
            const __m256i p0 =
                _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)(y + 64 * j)));
            const __m256i p1 =
                _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(y + 64 * j + 32)));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p0, _mm256_set1_epi16(sc[2 * j])));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p1, _mm256_set1_epi16(sc[2 * j + 1])));
        }
        int sm = 0;
        for (int j = 0; j < 8; j++) sm += mn[j] * (x[i].bsums[2 * j] + x[i].bsums[2 * j + 1]);
        sum += x[i].d * (mc_h16(b) * (float)mc_hsum256_i32(sumi) - mc_h16(b + 2) * (float)sm);
    }
    return sum;
}

MC_AVX2 static inline __m256i mc_scale2(int8_t a, int8_t b) {
    return _mm256_set_m128i(_mm_set1_epi16(b), _mm_set1_epi16(a));
}

MC_AVX2 static float mc_dot_q6_k_avx2(int K, const uint8_t *w, const void *xv) {
    const mc_q8k *x = (const mc_q8k *)xv;
    float sum = 0.0f; /* per block the exact int sum, then mc_dot_q6_k_scalar's float ops */
    const __m256i m4 = _mm256_set1_epi8(0xF);
    const __m256i m30 = _mm256_set1_epi8(0x30);
    for (int i = 0; i < K / 256; i++) {
        const uint8_t *b = w + 210 * i;
        const int8_t *sc = (const int8_t *)(b + 192);
        __m256i sumi = _mm256_setzero_si256();
        for (int n = 0; n < 2; n++) {
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * n));
            const __m256i ql0 = _mm256_loadu_si256((const __m256i *)(b + 64 * n));
            const __m256i ql1 = _mm256_loadu_si256((const __m256i *)(b + 64 * n + 32));
            const __m256i q1 = _mm256_or_si256(_mm256_and_si256(ql0, m4),
                                               _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
            const __m256i q2 = _mm256_or_si256(_mm256_and_si256(ql1, m4),
                                               _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
            const __m256i q3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                                               _mm256_and_si256(qh, m30));
            const __m256i q4 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                                               _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
            const int8_t *y = x[i].qs + 128 * n;
            const int8_t *s = sc + 8 * n;
            const __m256i p1 = _mm256_maddubs_epi16(q1, _mm256_loadu_si256((const __m256i *)y));
            const __m256i p2 = _mm256_maddubs_epi16(q2, _mm256_loadu_si256((const __m256i *)(y + 32)));
            const __m256i p3 = _mm256_maddubs_epi16(q3, _mm256_loadu_si256((const __m256i *)(y + 64)));
            const __m256i p4 = _mm256_maddubs_epi16(q4, _mm256_loadu_si256((const __m256i *)(y + 96)));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p1, mc_scale2(s[0], s[1])));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p2, mc_scale2(s[2], s[3])));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p3, mc_scale2(s[4], s[5])));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p4, mc_scale2(s[6], s[7])));
        }
        /* the -32 offset of every q: subtract 32 * sum_k sc[k] * bsums[k] */
        const __m128i b16 = _mm_loadu_si128((const __m128i *)x[i].bsums);
        const __m128i b16h = _mm_loadu_si128((const __m128i *)(x[i].bsums + 8));
        const __m128i s16 = _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)sc));
        const __m128i s16h = _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)(sc + 8)));
        const __m256i corr = _mm256_set_m128i(_mm_madd_epi16(b16h, s16h), _mm_madd_epi16(b16, s16));
        sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32(corr, 5));
        sum += mc_h16(b + 208) * x[i].d * (float)mc_hsum256_i32(sumi);
    }
    return sum;
}

MC_AVX2 static float mc_dot_f32_avx2(int K, const uint8_t *w, const void *xv) {
    const float *x = (const float *)xv;
    const float *wf = (const float *)w; /* loadu: no alignment needed */
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= K; i += 16) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(wf + i), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(wf + i + 8), _mm256_loadu_ps(x + i + 8), a1);
    }
    for (; i + 8 <= K; i += 8)
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(wf + i), _mm256_loadu_ps(x + i), a0);
    float sum = mc_hsum256(_mm256_add_ps(a0, a1));
    for (; i < K; i++) sum += mc_load_f32(w + 4 * i) * x[i];
    return sum;
}

/* 4 rows of x against one f32 (f16 when `half`) weight row; per row exactly
 * the single-row kernel's arithmetic */
MC_AVX2 static inline void mc_dot4_float_avx2(int K, const uint8_t *w, const void *xv,
                                              size_t xstride, float *out, int half) {
    const float *x[4];
    for (int r = 0; r < 4; r++) x[r] = (const float *)((const char *)xv + r * xstride);
    __m256 a0[4], a1[4];
    for (int r = 0; r < 4; r++) a0[r] = a1[r] = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= K; i += 16) {
        __m256 w0, w1;
        if (half) {
            w0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + 2 * i)));
            w1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + 2 * i + 16)));
        } else {
            w0 = _mm256_loadu_ps((const float *)w + i);
            w1 = _mm256_loadu_ps((const float *)w + i + 8);
        }
        for (int r = 0; r < 4; r++) {
            a0[r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x[r] + i), a0[r]);
            a1[r] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x[r] + i + 8), a1[r]);
        }
    }
    for (; i + 8 <= K; i += 8) {
        const __m256 w0 = half ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + 2 * i)))
                               : _mm256_loadu_ps((const float *)w + i);
        for (int r = 0; r < 4; r++) a0[r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x[r] + i), a0[r]);
    }
    for (int r = 0; r < 4; r++) {
        float sum = mc_hsum256(_mm256_add_ps(a0[r], a1[r]));
        for (int j = i; j < K; j++) sum += (half ? mc_h16(w + 2 * j) : mc_load_f32(w + 4 * j)) * x[r][j];
        out[r] = sum;
    }
}

MC_AVX2 static void mc_dot4_f32_avx2(int K, const uint8_t *w, const void *x, size_t xstride,
                                     float *out) {
    mc_dot4_float_avx2(K, w, x, xstride, out, 0);
}

MC_AVX2 static void mc_dot4_f16_avx2(int K, const uint8_t *w, const void *x, size_t xstride,
                                     float *out) {
    mc_dot4_float_avx2(K, w, x, xstride, out, 1);
}

MC_AVX2 static float mc_dot_f16_avx2(int K, const uint8_t *w, const void *xv) {
    const float *x = (const float *)xv;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= K; i += 16) {
        const __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + 2 * i)));
        const __m256 w1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + 2 * i + 16)));
        a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + i + 8), a1);
    }
    for (; i + 8 <= K; i += 8) {
        const __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + 2 * i)));
        a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + i), a0);
    }
    float sum = mc_hsum256(_mm256_add_ps(a0, a1));
    for (; i < K; i++) sum += mc_h16(w + 2 * i) * x[i];
    return sum;
}

/* ---- four activation rows per weight row: unpack each weight block once.
 * Each row's arithmetic is exactly the single-row kernel's, so results are
 * bit-identical to four separate calls. */


MC_AVX2 static void mc_dot4_q4_k_avx2(int K, const uint8_t *w, const void *x, size_t xstride,
                                      float *out) {
    float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const __m256i m4 = _mm256_set1_epi8(0xF);
    for (int i = 0; i < K / 256; i++) {
        const uint8_t *b = w + 144 * i;
        uint8_t sc[8], mn[8];
        for (int j = 0; j < 8; j++) mc_q4k_scale_min(j, b + 4, &sc[j], &mn[j]);
        const float dw = mc_h16(b), dmw = mc_h16(b + 2);
        __m256i lo[4], hi[4];
        for (int j = 0; j < 4; j++) {
            const __m256i q4 = _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * j));
            lo[j] = _mm256_and_si256(q4, m4);
            hi[j] = _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4);
        }
        for (int r = 0; r < 4; r++) {
            const mc_q8k *xb = MC_XK4(r) + i;
            const int8_t *y = xb->qs;
            __m256i sumi = _mm256_setzero_si256();
            for (int j = 0; j < 4; j++) {
                const __m256i p0 =
                    _mm256_maddubs_epi16(lo[j], _mm256_loadu_si256((const __m256i *)(y + 64 * j)));
                const __m256i p1 = _mm256_maddubs_epi16(
                    hi[j], _mm256_loadu_si256((const __m256i *)(y + 64 * j + 32)));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p0, _mm256_set1_epi16(sc[2 * j])));
                sumi = _mm256_add_epi32(sumi,
                                        _mm256_madd_epi16(p1, _mm256_set1_epi16(sc[2 * j + 1])));
            }
            int sm = 0;
            for (int j = 0; j < 8; j++) sm += mn[j] * (xb->bsums[2 * j] + xb->bsums[2 * j + 1]);
            sum[r] += xb->d * (dw * (float)mc_hsum256_i32(sumi) - dmw * (float)sm);
        }
    }
    for (int r = 0; r < 4; r++) out[r] = sum[r];
}

MC_AVX2 static void mc_dot4_q6_k_avx2(int K, const uint8_t *w, const void *x, size_t xstride,
                                      float *out) {
    float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const __m256i m4 = _mm256_set1_epi8(0xF);
    const __m256i m30 = _mm256_set1_epi8(0x30);
    for (int i = 0; i < K / 256; i++) {
        const uint8_t *b = w + 210 * i;
        const int8_t *sc = (const int8_t *)(b + 192);
        const float dw = mc_h16(b + 208);
        __m256i qv[2][4], sv[2][4];
        for (int n = 0; n < 2; n++) {
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * n));
            const __m256i ql0 = _mm256_loadu_si256((const __m256i *)(b + 64 * n));
            const __m256i ql1 = _mm256_loadu_si256((const __m256i *)(b + 64 * n + 32));
            qv[n][0] = _mm256_or_si256(_mm256_and_si256(ql0, m4),
                                       _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
            qv[n][1] = _mm256_or_si256(_mm256_and_si256(ql1, m4),
                                       _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
            qv[n][2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                                       _mm256_and_si256(qh, m30));
            qv[n][3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                                       _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
            for (int k = 0; k < 4; k++) sv[n][k] = mc_scale2(sc[8 * n + 2 * k], sc[8 * n + 2 * k + 1]);
        }
        const __m128i s16 = _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)sc));
        const __m128i s16h = _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)(sc + 8)));
        for (int r = 0; r < 4; r++) {
            const mc_q8k *xb = MC_XK4(r) + i;
            __m256i sumi = _mm256_setzero_si256();
            for (int n = 0; n < 2; n++) {
                const int8_t *y = xb->qs + 128 * n;
                for (int k = 0; k < 4; k++) {
                    const __m256i p = _mm256_maddubs_epi16(
                        qv[n][k], _mm256_loadu_si256((const __m256i *)(y + 32 * k)));
                    sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, sv[n][k]));
                }
            }
            const __m128i b16 = _mm_loadu_si128((const __m128i *)xb->bsums);
            const __m128i b16h = _mm_loadu_si128((const __m128i *)(xb->bsums + 8));
            const __m256i corr =
                _mm256_set_m128i(_mm_madd_epi16(b16h, s16h), _mm_madd_epi16(b16, s16));
            sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32(corr, 5));
            sum[r] += dw * xb->d * (float)mc_hsum256_i32(sumi);
        }
    }
    for (int r = 0; r < 4; r++) out[r] = sum[r];
}

#endif /* MC_X86 */

#endif /* MC_DOT_AVX2_H */
