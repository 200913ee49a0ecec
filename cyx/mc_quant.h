/* Quantized matrix products y = x @ W^T straight from GGML blocks.
 *
 * Strategy (as llama.cpp): each activation row x is quantized once per call to
 * int8 blocks (mc_q8 per 32 elements, mc_q8k per 256 for the K-quants), then
 * every weight block meets its activation block in an integer dot product
 * (AVX2 maddubs/madd, NEON mull/padal, or scalar C), scaled by the two block
 * scales.  F32/F16 weights use a float FMA path on the unquantized x.
 *
 * Work split: tiles of MC_TR output rows are handed to the threads of the pool
 * (mc_pool.h); inside a tile each weight row meets every activation row (four
 * at a time where a 4-row kernel exists), so each weight row is read from
 * memory once per call for the whole batch.
 */
#ifndef MC_QUANT_H
#define MC_QUANT_H

#include "mc_common.h"
#include "mc_pool.h"

/* ---------------------------------------------------------------- layout */

/* elements per block and bytes per block of each weight type (INT8: per row) */
static int mc_block_elems(int t) {
    switch (t) {
    case MC_Q4_0: case MC_Q4_1: case MC_Q5_0: case MC_Q8_0: return 32;
    case MC_Q4_K: case MC_Q6_K: return 256;
    default: return 1;
    }
}

static int mc_block_bytes(int t) {
    switch (t) {
    case MC_F32: return 4;
    case MC_F16: return 2;
    case MC_Q4_0: return 18;
    case MC_Q4_1: return 20;
    case MC_Q5_0: return 22;
    case MC_Q8_0: return 34;
    case MC_Q4_K: return 144;
    case MC_Q6_K: return 210;
    default: return 1;
    }
}

/* ------------------------------------------------- activation quantization */

/* x (K,) -> ceil(K/32) mc_q8 blocks; a partial last block is zero padded. */
static void mc_quantize_q8(const float *x, int K, mc_q8 *out) {
    const int nb = (K + 31) / 32;
    for (int i = 0; i < nb; i++) {
        const int cnt = mc_imin(32, K - 32 * i);
        const float *xb = x + 32 * i;
        float amax = 0.0f;
        for (int j = 0; j < cnt; j++) {
            const float a = fabsf(xb[j]);
            amax = a > amax ? a : amax;
        }
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int j = 0; j < 32; j++) {
            const int q = j < cnt ? (int)nearbyintf(xb[j] * id) : 0;
            out[i].qs[j] = (int8_t)q;
            sum += q;
        }
        out[i].d = d;
        out[i].s = d * (float)sum;
    }
}

/* x (K,), K % 256 == 0 -> K/256 mc_q8k blocks. */
static void mc_quantize_q8k(const float *x, int K, mc_q8k *out) {
    const int nb = K / 256;
    for (int i = 0; i < nb; i++) {
        const float *xb = x + 256 * i;
        float amax = 0.0f;
        for (int j = 0; j < 256; j++) {
            const float a = fabsf(xb[j]);
            amax = a > amax ? a : amax;
        }
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int g = 0; g < 16; g++) {
            int sum = 0;
            for (int j = 16 * g; j < 16 * g + 16; j++) {
                const int q = (int)nearbyintf(xb[j] * id);
                out[i].qs[j] = (int8_t)q;
                sum += q;
            }
            out[i].bsums[g] = (int16_t)sum;
        }
        out[i].d = d;
    }
}

/* ------------------------------------------------------- dequantization */

static inline void mc_q4k_scale_min(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* One row of K elements of type t at `row` -> y (K,) float32. */
static void mc_dequant_row(int t, const uint8_t *row, int K, float *y) {
    switch (t) {
    case MC_F32:
        memcpy(y, row, (size_t)K * 4);
        return;
    case MC_F16:
        for (int i = 0; i < K; i++) y[i] = mc_load_f16(row + 2 * i);
        return;
    case MC_INT8: {
        const float s = mc_load_f32(row);
        const int8_t *q = (const int8_t *)(row + 4);
        for (int i = 0; i < K; i++) y[i] = s * (float)q[i];
        return;
    }
    default: break;
    }
    const int nb = K / mc_block_elems(t);
    const int bb = mc_block_bytes(t);
    for (int i = 0; i < nb; i++) {
        const uint8_t *b = row + (size_t)i * bb;
        switch (t) {
        case MC_Q4_0: {
            const float d = mc_load_f16(b);
            for (int j = 0; j < 16; j++) {
                y[j] = d * (float)((b[2 + j] & 0xF) - 8);
                y[j + 16] = d * (float)((b[2 + j] >> 4) - 8);
            }
            y += 32;
            break;
        }
        case MC_Q4_1: {
            const float d = mc_load_f16(b), m = mc_load_f16(b + 2);
            for (int j = 0; j < 16; j++) {
                y[j] = d * (float)(b[4 + j] & 0xF) + m;
                y[j + 16] = d * (float)(b[4 + j] >> 4) + m;
            }
            y += 32;
            break;
        }
        case MC_Q5_0: {
            const float d = mc_load_f16(b);
            uint32_t qh;
            memcpy(&qh, b + 2, 4);
            for (int j = 0; j < 16; j++) {
                const int h0 = (qh >> j) & 1, h1 = (qh >> (j + 16)) & 1;
                y[j] = d * (float)(((b[6 + j] & 0xF) | (h0 << 4)) - 16);
                y[j + 16] = d * (float)(((b[6 + j] >> 4) | (h1 << 4)) - 16);
            }
            y += 32;
            break;
        }
        case MC_Q8_0: {
            const float d = mc_load_f16(b);
            for (int j = 0; j < 32; j++) y[j] = d * (float)(int8_t)b[2 + j];
            y += 32;
            break;
        }
        case MC_Q4_K: {
            const float d = mc_load_f16(b), dmin = mc_load_f16(b + 2);
            const uint8_t *sc = b + 4, *q = b + 16;
            for (int j = 0; j < 4; j++) {
                uint8_t s0, m0, s1, m1;
                mc_q4k_scale_min(2 * j, sc, &s0, &m0);
                mc_q4k_scale_min(2 * j + 1, sc, &s1, &m1);
                const float d1 = d * s0, mm1 = dmin * m0, d2 = d * s1, mm2 = dmin * m1;
                for (int l = 0; l < 32; l++) y[l] = d1 * (float)(q[l] & 0xF) - mm1;
                for (int l = 0; l < 32; l++) y[32 + l] = d2 * (float)(q[l] >> 4) - mm2;
                y += 64;
                q += 32;
            }
            break;
        }
        case MC_Q6_K: {
            const float d = mc_load_f16(b + 208);
            const uint8_t *ql = b, *qh = b + 128;
            const int8_t *sc = (const int8_t *)(b + 192);
            for (int n = 0; n < 2; n++) {
                for (int l = 0; l < 32; l++) {
                    const int is = l / 16;
                    const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                    const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                    const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                    const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                    y[l] = d * (float)sc[is] * (float)q1;
                    y[l + 32] = d * (float)sc[is + 2] * (float)q2;
                    y[l + 64] = d * (float)sc[is + 4] * (float)q3;
                    y[l + 96] = d * (float)sc[is + 6] * (float)q4;
                }
                y += 128;
                ql += 64;
                qh += 32;
                sc += 8;
            }
            break;
        }
        default: break;
        }
    }
}

/* ------------------------------------------------------ scalar dot products */
/* Each returns dot(W row, x row); `x` is the quantized (or float) activation row. */

typedef float (*mc_dot_fn)(int K, const uint8_t *w, const void *x);
/* one weight row against 4 activation rows `xstride` bytes apart -> out[0..3] */
typedef void (*mc_dot4_fn)(int K, const uint8_t *w, const void *x, size_t xstride, float *out);

static float mc_dot_q4_0_scalar(int K, const uint8_t *w, const void *xv) {
    const mc_q8 *x = (const mc_q8 *)xv;
    float sum = 0.0f;
    for (int i = 0; i < K / 32; i++) {
        const uint8_t *b = w + 18 * i;
        int s = 0;
        for (int j = 0; j < 16; j++) {
            s += ((b[2 + j] & 0xF) - 8) * x[i].qs[j];
            s += ((b[2 + j] >> 4) - 8) * x[i].qs[j + 16];
        }
        sum += mc_load_f16(b) * x[i].d * (float)s;
    }
    return sum;
}

static float mc_dot_q4_1_scalar(int K, const uint8_t *w, const void *xv) {
    const mc_q8 *x = (const mc_q8 *)xv;
    float sum = 0.0f;
    for (int i = 0; i < K / 32; i++) {
        const uint8_t *b = w + 20 * i;
        int s = 0;
        for (int j = 0; j < 16; j++) {
            s += (b[4 + j] & 0xF) * x[i].qs[j];
            s += (b[4 + j] >> 4) * x[i].qs[j + 16];
        }
        sum += mc_load_f16(b) * x[i].d * (float)s + mc_load_f16(b + 2) * x[i].s;
    }
    return sum;
}

static float mc_dot_q5_0_scalar(int K, const uint8_t *w, const void *xv) {
    const mc_q8 *x = (const mc_q8 *)xv;
    float sum = 0.0f;
    for (int i = 0; i < K / 32; i++) {
        const uint8_t *b = w + 22 * i;
        uint32_t qh;
        memcpy(&qh, b + 2, 4);
        int s = 0;
        for (int j = 0; j < 16; j++) {
            const int h0 = (qh >> j) & 1, h1 = (qh >> (j + 16)) & 1;
            s += (((b[6 + j] & 0xF) | (h0 << 4)) - 16) * x[i].qs[j];
            s += (((b[6 + j] >> 4) | (h1 << 4)) - 16) * x[i].qs[j + 16];
        }
        sum += mc_load_f16(b) * x[i].d * (float)s;
    }
    return sum;
}

static float mc_dot_q8_0_scalar(int K, const uint8_t *w, const void *xv) {
    const mc_q8 *x = (const mc_q8 *)xv;
    float sum = 0.0f;
    for (int i = 0; i < K / 32; i++) {
        const uint8_t *b = w + 34 * i;
        int s = 0;
        for (int j = 0; j < 32; j++) s += (int8_t)b[2 + j] * x[i].qs[j];
        sum += mc_load_f16(b) * x[i].d * (float)s;
    }
    return sum;
}

static float mc_dot_int8_scalar(int K, const uint8_t *w, const void *xv) {
    const mc_q8 *x = (const mc_q8 *)xv;
    const int8_t *q = (const int8_t *)(w + 4);
    float sum = 0.0f;
    for (int i = 0; i < (K + 31) / 32; i++) {
        const int cnt = mc_imin(32, K - 32 * i);
        int s = 0;
        for (int j = 0; j < cnt; j++) s += q[32 * i + j] * x[i].qs[j];
        sum += x[i].d * (float)s;
    }
    return sum * mc_load_f32(w);
}

static float mc_dot_q4_k_scalar(int K, const uint8_t *w, const void *xv) {
    const mc_q8k *x = (const mc_q8k *)xv;
    float sum = 0.0f;
    for (int i = 0; i < K / 256; i++) {
        const uint8_t *b = w + 144 * i;
        const uint8_t *q = b + 16;
        const int8_t *y = x[i].qs;
        int si = 0, sm = 0;
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            mc_q4k_scale_min(j, b + 4, &sc, &m);
            const uint8_t *qq = q + 32 * (j / 2);
            const int shift = (j & 1) * 4;
            int s = 0;
            for (int l = 0; l < 32; l++) s += ((qq[l] >> shift) & 0xF) * y[32 * j + l];
            si += sc * s;
            sm += m * (x[i].bsums[2 * j] + x[i].bsums[2 * j + 1]);
        }
        sum += x[i].d * (mc_load_f16(b) * (float)si - mc_load_f16(b + 2) * (float)sm);
    }
    return sum;
}

static float mc_dot_q6_k_scalar(int K, const uint8_t *w, const void *xv) {
    const mc_q8k *x = (const mc_q8k *)xv;
    float sum = 0.0f;
    for (int i = 0; i < K / 256; i++) {
        const uint8_t *b = w + 210 * i;
        const int8_t *sc = (const int8_t *)(b + 192);
        const int8_t *y = x[i].qs;
        int si = 0;
        for (int n = 0; n < 2; n++) {
            const uint8_t *ql = b + 64 * n, *qh = b + 128 + 32 * n;
            const int8_t *s8 = sc + 8 * n;
            const int8_t *yy = y + 128 * n;
            int a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                a[is + 0] += ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) * yy[l];
                a[is + 2] += ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) * yy[l + 32];
                a[is + 4] += ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) * yy[l + 64];
                a[is + 6] += ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) * yy[l + 96];
            }
            for (int k = 0; k < 8; k++) si += s8[k] * a[k];
        }
        int corr = 0;
        for (int k = 0; k < 16; k++) corr += sc[k] * x[i].bsums[k];
        sum += mc_load_f16(b + 208) * x[i].d * (float)(si - 32 * corr);
    }
    return sum;
}

static float mc_dot_f32_scalar(int K, const uint8_t *w, const void *xv) {
    const float *x = (const float *)xv;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= K; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += mc_load_f32(w + 4 * (i + j)) * x[i + j];
    float sum = 0.0f;
    for (; i < K; i++) sum += mc_load_f32(w + 4 * i) * x[i];
    for (int j = 0; j < 8; j++) sum += acc[j];
    return sum;
}

static float mc_dot_f16_scalar(int K, const uint8_t *w, const void *xv) {
    const float *x = (const float *)xv;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= K; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += mc_load_f16(w + 2 * (i + j)) * x[i + j];
    float sum = 0.0f;
    for (; i < K; i++) sum += mc_load_f16(w + 2 * i) * x[i];
    for (int j = 0; j < 8; j++) sum += acc[j];
    return sum;
}

/* --------------------------------------------------------------- AVX2 dots */
#if defined(MC_X86)

MC_AVX2 static inline float mc_hsum256(__m256 v) {
    __m128 r = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

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

#define MC_X4(r) ((const mc_q8 *)((const char *)x + (r) * xstride))
#define MC_XK4(r) ((const mc_q8k *)((const char *)x + (r) * xstride))

/* the 32-element-block integer kernels, for AVX2 and for AVX512-VNNI (256-bit) */
#define MC_TGT MC_AVX2
#define MC_SFX(name) name##_avx2
#define MC_SUM_U8I8(u, s) _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
#include "mc_quant_x86.h"
#undef MC_TGT
#undef MC_SFX
#undef MC_SUM_U8I8

#define MC_TGT MC_VNNI
#define MC_SFX(name) name##_vnni
#define MC_SUM_U8I8(u, s) _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s)
#include "mc_quant_x86.h"
#undef MC_TGT
#undef MC_SFX
#undef MC_SUM_U8I8

MC_AVX2 static float mc_dot_q4_k_avx2(int K, const uint8_t *w, const void *xv) {
    const mc_q8k *x = (const mc_q8k *)xv;
    __m256 acc = _mm256_setzero_ps();
    float summ = 0.0f;
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
        acc = _mm256_fmadd_ps(_mm256_set1_ps(mc_h16(b) * x[i].d), _mm256_cvtepi32_ps(sumi), acc);
        int sm = 0;
        for (int j = 0; j < 8; j++) sm += mn[j] * (x[i].bsums[2 * j] + x[i].bsums[2 * j + 1]);
        summ += mc_h16(b + 2) * x[i].d * (float)sm;
    }
    return mc_hsum256(acc) - summ;
}

MC_AVX2 static inline __m256i mc_scale2(int8_t a, int8_t b) {
    return _mm256_set_m128i(_mm_set1_epi16(b), _mm_set1_epi16(a));
}

MC_AVX2 static float mc_dot_q6_k_avx2(int K, const uint8_t *w, const void *xv) {
    const mc_q8k *x = (const mc_q8k *)xv;
    __m256 acc = _mm256_setzero_ps();
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
        acc = _mm256_fmadd_ps(_mm256_set1_ps(mc_h16(b + 208) * x[i].d), _mm256_cvtepi32_ps(sumi), acc);
    }
    return mc_hsum256(acc);
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

/* ---- four activation rows per weight row: unpack each weight block once.
 * Each row's arithmetic is exactly the single-row kernel's, so results are
 * bit-identical to four separate calls. */


MC_AVX2 static void mc_dot4_q4_k_avx2(int K, const uint8_t *w, const void *x, size_t xstride,
                                      float *out) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    float summ[4] = {0.0f, 0.0f, 0.0f, 0.0f};
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
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dw * xb->d), _mm256_cvtepi32_ps(sumi), acc[r]);
            int sm = 0;
            for (int j = 0; j < 8; j++) sm += mn[j] * (xb->bsums[2 * j] + xb->bsums[2 * j + 1]);
            summ[r] += dmw * xb->d * (float)sm;
        }
    }
    for (int r = 0; r < 4; r++) out[r] = mc_hsum256(acc[r]) - summ[r];
}

MC_AVX2 static void mc_dot4_q6_k_avx2(int K, const uint8_t *w, const void *x, size_t xstride,
                                      float *out) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
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
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dw * xb->d), _mm256_cvtepi32_ps(sumi), acc[r]);
        }
    }
    for (int r = 0; r < 4; r++) out[r] = mc_hsum256(acc[r]);
}

#endif /* MC_X86 */

/* --------------------------------------------------------------- NEON dots */
#if defined(MC_NEON)

/* sum of a[j]*b[j] over 32 int8 lanes (a0|a1, b0|b1) */
static inline int32_t mc_neon_dot32(int8x16_t a0, int8x16_t a1, int8x16_t b0, int8x16_t b1) {
    int16x8_t p0 = vmull_s8(vget_low_s8(a0), vget_low_s8(b0));
    int16x8_t p1 = vmull_s8(vget_high_s8(a0), vget_high_s8(b0));
    int16x8_t p2 = vmull_s8(vget_low_s8(a1), vget_low_s8(b1));
    int16x8_t p3 = vmull_s8(vget_high_s8(a1), vget_high_s8(b1));
    int32x4_t s = vpaddlq_s16(p0);
    s = vpadalq_s16(s, p1);
    s = vpadalq_s16(s, p2);
    s = vpadalq_s16(s, p3);
    return vaddvq_s32(s);
}

static float mc_dot_q4_0_neon(int K, const uint8_t *w, const void *xv) {
    const mc_q8 *x = (const mc_q8 *)xv;
    float sum = 0.0f;
    const uint8x16_t m4 = vdupq_n_u8(0xF);
    const int8x16_t s8 = vdupq_n_s8(8);
    for (int i = 0; i < K / 32; i++) {
        const uint8_t *b = w + 18 * i;
        const uint8x16_t v = vld1q_u8(b + 2);
        const int8x16_t lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v, m4)), s8);
        const int8x16_t hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v, 4)), s8);
        const int32_t s = mc_neon_dot32(lo, hi, vld1q_s8(x[i].qs), vld1q_s8(x[i].qs + 16));
        sum += mc_load_f16(b) * x[i].d * (float)s;
    }
    return sum;
}

static float mc_dot_q4_1_neon(int K, const uint8_t *w, const void *xv) {
    const mc_q8 *x = (const mc_q8 *)xv;
    float sum = 0.0f;
    const uint8x16_t m4 = vdupq_n_u8(0xF);
    for (int i = 0; i < K / 32; i++) {
        const uint8_t *b = w + 20 * i;
        const uint8x16_t v = vld1q_u8(b + 4);
        const int8x16_t lo = vreinterpretq_s8_u8(vandq_u8(v, m4));
        const int8x16_t hi = vreinterpretq_s8_u8(vshrq_n_u8(v, 4));
        const int32_t s = mc_neon_dot32(lo, hi, vld1q_s8(x[i].qs), vld1q_s8(x[i].qs + 16));
        sum += mc_load_f16(b) * x[i].d * (float)s + mc_load_f16(b + 2) * x[i].s;
    }
    return sum;
}

static float mc_dot_q8_0_neon(int K, const uint8_t *w, const void *xv) {
    const mc_q8 *x = (const mc_q8 *)xv;
    float sum = 0.0f;
    for (int i = 0; i < K / 32; i++) {
        const uint8_t *b = w + 34 * i;
        const int8_t *q = (const int8_t *)(b + 2);
        const int32_t s =
            mc_neon_dot32(vld1q_s8(q), vld1q_s8(q + 16), vld1q_s8(x[i].qs), vld1q_s8(x[i].qs + 16));
        sum += mc_load_f16(b) * x[i].d * (float)s;
    }
    return sum;
}

static float mc_dot_f32_neon(int K, const uint8_t *w, const void *xv) {
    const float *x = (const float *)xv;
    const float *wf = (const float *)w;
    float32x4_t a0 = vdupq_n_f32(0.0f), a1 = vdupq_n_f32(0.0f);
    int i = 0;
    for (; i + 8 <= K; i += 8) {
        a0 = vfmaq_f32(a0, vld1q_f32(wf + i), vld1q_f32(x + i));
        a1 = vfmaq_f32(a1, vld1q_f32(wf + i + 4), vld1q_f32(x + i + 4));
    }
    float sum = vaddvq_f32(vaddq_f32(a0, a1));
    for (; i < K; i++) sum += wf[i] * x[i];
    return sum;
}

/* sum of a[j]*b[j] over 16 int8 lanes */
static inline int32_t mc_neon_dot16(int8x16_t a, int8x16_t b) {
    int32x4_t s = vpaddlq_s16(vmull_s8(vget_low_s8(a), vget_low_s8(b)));
    s = vpadalq_s16(s, vmull_s8(vget_high_s8(a), vget_high_s8(b)));
    return vaddvq_s32(s);
}

static float mc_dot_q5_0_neon(int K, const uint8_t *w, const void *xv) {
    const mc_q8 *x = (const mc_q8 *)xv;
    float sum = 0.0f;
    const uint8x16_t m4 = vdupq_n_u8(0xF);
    /* bit j of each 16-bit group, for expanding qh into bytes */
    static const uint8_t bitsel[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t sel = vld1q_u8(bitsel);
    for (int i = 0; i < K / 32; i++) {
        const uint8_t *b = w + 22 * i;
        uint32_t qh;
        memcpy(&qh, b + 2, 4);
        const uint8x16_t v = vld1q_u8(b + 6);
        /* bytes 0-1 of qh give the high bits of elements 0-15, bytes 2-3 of 16-31 */
        const uint8x16_t hb0 = vcombine_u8(vdup_n_u8((uint8_t)(qh & 0xFF)), vdup_n_u8((uint8_t)((qh >> 8) & 0xFF)));
        const uint8x16_t hb1 = vcombine_u8(vdup_n_u8((uint8_t)((qh >> 16) & 0xFF)), vdup_n_u8((uint8_t)(qh >> 24)));
        /* 0x10 where the bit is set */
        const uint8x16_t t0 = vandq_u8(vtstq_u8(hb0, sel), vdupq_n_u8(0x10));
        const uint8x16_t t1 = vandq_u8(vtstq_u8(hb1, sel), vdupq_n_u8(0x10));
        const int8x16_t lo = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vandq_u8(v, m4), t0)), vdupq_n_s8(16));
        const int8x16_t hi = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(v, 4), t1)), vdupq_n_s8(16));
        const int32_t s = mc_neon_dot32(lo, hi, vld1q_s8(x[i].qs), vld1q_s8(x[i].qs + 16));
        sum += mc_load_f16(b) * x[i].d * (float)s;
    }
    return sum;
}

static float mc_dot_int8_neon(int K, const uint8_t *w, const void *xv) {
    const mc_q8 *x = (const mc_q8 *)xv;
    const int8_t *q = (const int8_t *)(w + 4);
    float sum = 0.0f;
    const int nb = K / 32;
    for (int i = 0; i < nb; i++) {
        const int32_t s = mc_neon_dot32(vld1q_s8(q + 32 * i), vld1q_s8(q + 32 * i + 16),
                                        vld1q_s8(x[i].qs), vld1q_s8(x[i].qs + 16));
        sum += x[i].d * (float)s;
    }
    if (K % 32) {
        int s = 0;
        for (int j = 0; j < K % 32; j++) s += q[32 * nb + j] * x[nb].qs[j];
        sum += x[nb].d * (float)s;
    }
    return sum * mc_load_f32(w);
}

static float mc_dot_q4_k_neon(int K, const uint8_t *w, const void *xv) {
    const mc_q8k *x = (const mc_q8k *)xv;
    float sum = 0.0f;
    const uint8x16_t m4 = vdupq_n_u8(0xF);
    for (int i = 0; i < K / 256; i++) {
        const uint8_t *b = w + 144 * i;
        const uint8_t *q = b + 16;
        const int8_t *y = x[i].qs;
        int si = 0, sm = 0;
        for (int j = 0; j < 4; j++) {
            uint8_t s0, m0, s1, m1;
            mc_q4k_scale_min(2 * j, b + 4, &s0, &m0);
            mc_q4k_scale_min(2 * j + 1, b + 4, &s1, &m1);
            const uint8x16_t v0 = vld1q_u8(q + 32 * j), v1 = vld1q_u8(q + 32 * j + 16);
            const int32_t d0 = mc_neon_dot32(vreinterpretq_s8_u8(vandq_u8(v0, m4)),
                                             vreinterpretq_s8_u8(vandq_u8(v1, m4)),
                                             vld1q_s8(y + 64 * j), vld1q_s8(y + 64 * j + 16));
            const int32_t d1 = mc_neon_dot32(vreinterpretq_s8_u8(vshrq_n_u8(v0, 4)),
                                             vreinterpretq_s8_u8(vshrq_n_u8(v1, 4)),
                                             vld1q_s8(y + 64 * j + 32), vld1q_s8(y + 64 * j + 48));
            si += s0 * d0 + s1 * d1;
            sm += m0 * (x[i].bsums[4 * j] + x[i].bsums[4 * j + 1]) +
                  m1 * (x[i].bsums[4 * j + 2] + x[i].bsums[4 * j + 3]);
        }
        sum += x[i].d * (mc_load_f16(b) * (float)si - mc_load_f16(b + 2) * (float)sm);
    }
    return sum;
}

static float mc_dot_q6_k_neon(int K, const uint8_t *w, const void *xv) {
    const mc_q8k *x = (const mc_q8k *)xv;
    float sum = 0.0f;
    const uint8x16_t m4 = vdupq_n_u8(0xF), m3 = vdupq_n_u8(3);
    for (int i = 0; i < K / 256; i++) {
        const uint8_t *b = w + 210 * i;
        const int8_t *sc = (const int8_t *)(b + 192);
        int si = 0;
        for (int n = 0; n < 2; n++) {
            const uint8_t *ql = b + 64 * n, *qh = b + 128 + 32 * n;
            const int8_t *y = x[i].qs + 128 * n;
            const int8_t *s8 = sc + 8 * n;
            for (int h = 0; h < 2; h++) { /* 16-lane halves: l in [16h, 16h + 16) */
                const uint8x16_t a = vld1q_u8(ql + 16 * h), c = vld1q_u8(ql + 32 + 16 * h);
                const uint8x16_t hh = vld1q_u8(qh + 16 * h);
                const uint8x16_t q1 = vorrq_u8(vandq_u8(a, m4), vshlq_n_u8(vandq_u8(hh, m3), 4));
                const uint8x16_t q2 =
                    vorrq_u8(vandq_u8(c, m4), vshlq_n_u8(vandq_u8(vshrq_n_u8(hh, 2), m3), 4));
                const uint8x16_t q3 =
                    vorrq_u8(vshrq_n_u8(a, 4), vshlq_n_u8(vandq_u8(vshrq_n_u8(hh, 4), m3), 4));
                const uint8x16_t q4 = vorrq_u8(vshrq_n_u8(c, 4), vshlq_n_u8(vshrq_n_u8(hh, 6), 4));
                si += s8[h + 0] * mc_neon_dot16(vreinterpretq_s8_u8(q1), vld1q_s8(y + 16 * h));
                si += s8[h + 2] * mc_neon_dot16(vreinterpretq_s8_u8(q2), vld1q_s8(y + 32 + 16 * h));
                si += s8[h + 4] * mc_neon_dot16(vreinterpretq_s8_u8(q3), vld1q_s8(y + 64 + 16 * h));
                si += s8[h + 6] * mc_neon_dot16(vreinterpretq_s8_u8(q4), vld1q_s8(y + 96 + 16 * h));
            }
        }
        int corr = 0;
        for (int k = 0; k < 16; k++) corr += sc[k] * x[i].bsums[k];
        sum += mc_load_f16(b + 208) * x[i].d * (float)(si - 32 * corr);
    }
    return sum;
}

static float mc_dot_f16_neon(int K, const uint8_t *w, const void *xv) {
    const float *x = (const float *)xv;
    float32x4_t a0 = vdupq_n_f32(0.0f), a1 = vdupq_n_f32(0.0f);
    int i = 0;
    for (; i + 8 <= K; i += 8) {
        const float16x8_t h = vreinterpretq_f16_u8(vld1q_u8(w + 2 * i));
        a0 = vfmaq_f32(a0, vcvt_f32_f16(vget_low_f16(h)), vld1q_f32(x + i));
        a1 = vfmaq_f32(a1, vcvt_high_f32_f16(h), vld1q_f32(x + i + 4));
    }
    float sum = vaddvq_f32(vaddq_f32(a0, a1));
    for (; i < K; i++) sum += mc_load_f16(w + 2 * i) * x[i];
    return sum;
}

#endif /* MC_NEON */

/* ------------------------------------------------ single weight elements */

/* Element i of a row of type t (a quantized type), as mc_dequant_row computes it. */
static float mc_elem(int t, const uint8_t *row, int i) {
    switch (t) {
    case MC_Q4_0: {
        const uint8_t *b = row + 18 * (i / 32);
        const int j = i % 32;
        const int q = j < 16 ? (b[2 + j] & 0xF) : (b[2 + j - 16] >> 4);
        return mc_load_f16(b) * (float)(q - 8);
    }
    case MC_Q4_1: {
        const uint8_t *b = row + 20 * (i / 32);
        const int j = i % 32;
        const int q = j < 16 ? (b[4 + j] & 0xF) : (b[4 + j - 16] >> 4);
        return mc_load_f16(b) * (float)q + mc_load_f16(b + 2);
    }
    case MC_Q5_0: {
        const uint8_t *b = row + 22 * (i / 32);
        const int j = i % 32;
        uint32_t qh;
        memcpy(&qh, b + 2, 4);
        const int nib = j < 16 ? (b[6 + j] & 0xF) : (b[6 + j - 16] >> 4);
        return mc_load_f16(b) * (float)((nib | (int)(((qh >> j) & 1) << 4)) - 16);
    }
    case MC_Q8_0: {
        const uint8_t *b = row + 34 * (i / 32);
        return mc_load_f16(b) * (float)(int8_t)b[2 + i % 32];
    }
    case MC_INT8:
        return mc_load_f32(row) * (float)((const int8_t *)(row + 4))[i];
    case MC_Q4_K: {
        const uint8_t *b = row + 144 * (i / 256);
        const int e = i % 256, jj = e / 64, l = e % 64;
        uint8_t sc, m;
        mc_q4k_scale_min(2 * jj + (l >= 32), b + 4, &sc, &m);
        const uint8_t qb = b[16 + 32 * jj + l % 32];
        const int q = l < 32 ? (qb & 0xF) : (qb >> 4);
        return mc_load_f16(b) * sc * (float)q - mc_load_f16(b + 2) * m;
    }
    case MC_Q6_K: {
        const uint8_t *b = row + 210 * (i / 256);
        const int e = i % 256, n = e / 128, r = e % 128, quarter = r / 32, l = r % 32;
        const uint8_t *ql = b + 64 * n, *qh = b + 128 + 32 * n;
        const int8_t *sc = (const int8_t *)(b + 192) + 8 * n;
        const int lo = (quarter & 1) ? ql[l + 32] : ql[l];
        const int nib = quarter < 2 ? (lo & 0xF) : (lo >> 4);
        const int q = (nib | (((qh[l] >> (2 * quarter)) & 3) << 4)) - 32;
        return mc_load_f16(b + 208) * (float)sc[l / 16 + 2 * quarter] * (float)q;
    }
    default:
        return 0.0f;
    }
}

/* dequantize one row with the fastest path `simd` allows */
static void mc_dequant_row_simd(int t, const uint8_t *row, int K, float *y, int simd) {
#if defined(MC_X86)
    if (MC_IS_AVX2(simd) && mc_dequant_row_avx2(t, row, K, y)) return;
#endif
    (void)simd;
    mc_dequant_row(t, row, K, y);
}

/* ----------------------------------------------------------------- dispatch */

static mc_dot_fn mc_pick_dot(int t, int simd) {
#if defined(MC_X86)
    if (simd == MC_SIMD_VNNI) {
        switch (t) {
        case MC_Q4_0: return mc_dot_q4_0_vnni;
        case MC_Q4_1: return mc_dot_q4_1_vnni;
        case MC_Q5_0: return mc_dot_q5_0_vnni;
        case MC_Q8_0: return mc_dot_q8_0_vnni;
        case MC_INT8: return mc_dot_int8_vnni;
        default: break; /* the rest: the AVX2 kernels */
        }
    }
    if (MC_IS_AVX2(simd)) {
        switch (t) {
        case MC_F32: return mc_dot_f32_avx2;
        case MC_F16: return mc_dot_f16_avx2;
        case MC_Q4_0: return mc_dot_q4_0_avx2;
        case MC_Q4_1: return mc_dot_q4_1_avx2;
        case MC_Q5_0: return mc_dot_q5_0_avx2;
        case MC_Q8_0: return mc_dot_q8_0_avx2;
        case MC_Q4_K: return mc_dot_q4_k_avx2;
        case MC_Q6_K: return mc_dot_q6_k_avx2;
        case MC_INT8: return mc_dot_int8_avx2;
        default: return NULL;
        }
    }
#endif
#if defined(MC_NEON)
    if (simd == MC_SIMD_NEON) {
        switch (t) {
        case MC_F32: return mc_dot_f32_neon;
        case MC_Q4_0: return mc_dot_q4_0_neon;
        case MC_Q4_1: return mc_dot_q4_1_neon;
        case MC_Q8_0: return mc_dot_q8_0_neon;
        case MC_Q5_0: return mc_dot_q5_0_neon;
        case MC_Q4_K: return mc_dot_q4_k_neon;
        case MC_Q6_K: return mc_dot_q6_k_neon;
        case MC_F16: return mc_dot_f16_neon;
        case MC_INT8: return mc_dot_int8_neon;
        default: break;
        }
    }
#endif
    (void)simd;
    switch (t) {
    case MC_F32: return mc_dot_f32_scalar;
    case MC_F16: return mc_dot_f16_scalar;
    case MC_Q4_0: return mc_dot_q4_0_scalar;
    case MC_Q4_1: return mc_dot_q4_1_scalar;
    case MC_Q5_0: return mc_dot_q5_0_scalar;
    case MC_Q8_0: return mc_dot_q8_0_scalar;
    case MC_Q4_K: return mc_dot_q4_k_scalar;
    case MC_Q6_K: return mc_dot_q6_k_scalar;
    case MC_INT8: return mc_dot_int8_scalar;
    default: return NULL;
    }
}

static mc_dot4_fn mc_pick_dot4(int t, int simd) {
#if defined(MC_X86)
    if (simd == MC_SIMD_VNNI) {
        switch (t) {
        case MC_Q4_0: return mc_dot4_q4_0_vnni;
        case MC_Q4_1: return mc_dot4_q4_1_vnni;
        case MC_Q5_0: return mc_dot4_q5_0_vnni;
        case MC_Q8_0: return mc_dot4_q8_0_vnni;
        case MC_INT8: return mc_dot4_int8_vnni;
        default: break;
        }
    }
    if (MC_IS_AVX2(simd)) {
        switch (t) {
        case MC_Q4_0: return mc_dot4_q4_0_avx2;
        case MC_Q4_1: return mc_dot4_q4_1_avx2;
        case MC_Q5_0: return mc_dot4_q5_0_avx2;
        case MC_Q8_0: return mc_dot4_q8_0_avx2;
        case MC_Q4_K: return mc_dot4_q4_k_avx2;
        case MC_Q6_K: return mc_dot4_q6_k_avx2;
        case MC_INT8: return mc_dot4_int8_avx2;
        case MC_F32: return mc_dot4_f32_avx2;
        case MC_F16: return mc_dot4_f16_avx2;
        default: return NULL;
        }
    }
#endif
    (void)t;
    (void)simd;
    return NULL;
}

/* Row tiles: MC_TR weight rows x MC_TN activation rows per inner step. */
#define MC_TR 16
#define MC_TN 32

typedef struct {
    int t, M, K, n, failed, simd;
    const uint8_t *W;
    int64_t row_stride;
    const float *x;     /* (n, K) float activations (exact path, F32/F16) */
    const void *xbase;  /* quantized (or float) activation rows */
    size_t xstride;     /* bytes between activation rows in xbase */
    float *y;           /* (n, M) */
    mc_dot_fn dot;
    mc_dot4_fn dot4;
    mc_dot_fn fdot;       /* exact path, few x rows: fused dequant + dot, or NULL */
    struct mc_outl *outl; /* (n,) outliers kept out of the int8 rows, or NULL */
} mc_matmul_job;

/* Outlier decomposition (as LLM.int8()): the few activations of a row far above
 * its RMS are taken out before int8 quantization, so they no longer set their
 * block's scale, and added back in float: y += x_i * W[r, i]. */
#define MC_OUTL_MAX 4        /* per activation row */
#define MC_OUTL_SIGMA 6.0f  /* |x_i| > MC_OUTL_SIGMA * rms(x) */
struct mc_outl {
    int n;
    int idx[MC_OUTL_MAX];
    float val[MC_OUTL_MAX];
};

/* one tile of MC_TR weight rows against all activation rows */
static void mc_matmul_chunk(void *ctx, int tile) {
    mc_matmul_job *jb = (mc_matmul_job *)ctx;
    const int M = jb->M, K = jb->K, n = jb->n;
    const int r0 = tile * MC_TR, r1 = mc_imin(M, r0 + MC_TR);
    float *y = jb->y;
    for (int j0 = 0; j0 < n; j0 += MC_TN) {
        const int j1 = mc_imin(n, j0 + MC_TN);
        for (int r = r0; r < r1; r++) {
            const uint8_t *wr = jb->W + (size_t)r * jb->row_stride;
            int j = j0;
            if (jb->dot4 != NULL) {
                for (; j + 4 <= j1; j += 4) {
                    float o[4];
                    jb->dot4(K, wr, (const char *)jb->xbase + jb->xstride * j, jb->xstride, o);
                    for (int u = 0; u < 4; u++) y[(size_t)(j + u) * M + r] = o[u];
                }
            }
            for (; j < j1; j++)
                y[(size_t)j * M + r] = jb->dot(K, wr, (const char *)jb->xbase + jb->xstride * j);
            if (jb->outl != NULL)
                for (j = j0; j < j1; j++) {
                    const struct mc_outl *o = jb->outl + j;
                    float c = 0.0f;
                    for (int k = 0; k < o->n; k++) c += o->val[k] * mc_elem(jb->t, wr, o->idx[k]);
                    if (o->n) y[(size_t)j * M + r] += c;
                }
        }
    }
}

/* quantize activation row j into the job's buffer */
static void mc_quantize_chunk(void *ctx, int j) {
    mc_matmul_job *jb = (mc_matmul_job *)ctx;
    char *dst = (char *)jb->xbase + jb->xstride * j;
    const int K = jb->K;
    const float *xr = jb->x + (size_t)j * K;
    if (jb->outl != NULL) {
        struct mc_outl *o = jb->outl + j;
        o->n = 0;
        double ss = 0.0;
        for (int i = 0; i < K; i++) ss += (double)xr[i] * xr[i];
        const float thr = MC_OUTL_SIGMA * (float)sqrt(ss / K);
        /* the MC_OUTL_MAX largest |x_i| above thr, kept sorted by |x| descending */
        for (int i = 0; i < K; i++) {
            const float a = fabsf(xr[i]);
            if (!(a > thr) || (o->n == MC_OUTL_MAX && a <= fabsf(o->val[MC_OUTL_MAX - 1])))
                continue;
            int k = o->n < MC_OUTL_MAX ? o->n++ : MC_OUTL_MAX - 1;
            for (; k > 0 && fabsf(o->val[k - 1]) < a; k--) {
                o->val[k] = o->val[k - 1];
                o->idx[k] = o->idx[k - 1];
            }
            o->val[k] = xr[i];
            o->idx[k] = i;
        }
        if (o->n) {
            float *tmp = (float *)mc_scratch(1, (size_t)K * sizeof(float));
            if (tmp != NULL) {
                memcpy(tmp, xr, (size_t)K * sizeof(float));
                for (int k = 0; k < o->n; k++) tmp[o->idx[k]] = 0.0f;
                xr = tmp;
            } else {
                o->n = 0;
            }
        }
    }
    if (jb->t == MC_Q4_K || jb->t == MC_Q6_K)
        mc_quantize_q8k(xr, K, (mc_q8k *)dst);
    else
        mc_quantize_q8(xr, K, (mc_q8 *)dst);
}

/* exact path: dequantize each weight row once, float dots against every x row */
static void mc_matmul_exact_chunk(void *ctx, int tile) {
    mc_matmul_job *jb = (mc_matmul_job *)ctx;
    const int M = jb->M, K = jb->K, n = jb->n;
    const int r0 = tile * MC_TR, r1 = mc_imin(M, r0 + MC_TR);
    float *wrow = (float *)mc_scratch(1, (size_t)K * sizeof(float));
    if (wrow == NULL) {
        jb->failed = 1;
        return;
    }
    for (int r = r0; r < r1; r++) {
        if (jb->fdot != NULL && n < 4) { /* same arithmetic as below, no row buffer */
            for (int j = 0; j < n; j++)
                jb->y[(size_t)j * M + r] =
                    jb->fdot(K, jb->W + (size_t)r * jb->row_stride, jb->x + (size_t)j * K);
            continue;
        }
        mc_dequant_row_simd(jb->t, jb->W + (size_t)r * jb->row_stride, K, wrow, jb->simd);
        int j = 0;
        if (jb->dot4 != NULL) {
            for (; j + 4 <= n; j += 4) {
                float o[4];
                jb->dot4(K, (const uint8_t *)wrow, jb->x + (size_t)j * K, (size_t)K * sizeof(float), o);
                for (int u = 0; u < 4; u++) jb->y[(size_t)(j + u) * M + r] = o[u];
            }
        }
        for (; j < n; j++)
            jb->y[(size_t)j * M + r] = jb->dot(K, (const uint8_t *)wrow, jb->x + (size_t)j * K);
    }
}

/* the exact path's fused single-row kernel, where one exists */
static mc_dot_fn mc_pick_fdot(int t, int simd) {
#if defined(MC_X86)
    if (MC_IS_AVX2(simd)) {
        switch (t) {
        case MC_Q4_0: return mc_fdot_q4_0_avx2;
        case MC_Q4_1: return mc_fdot_q4_1_avx2;
        case MC_Q5_0: return mc_fdot_q5_0_avx2;
        case MC_Q8_0: return mc_fdot_q8_0_avx2;
        case MC_Q4_K: return mc_fdot_q4_k_avx2;
        case MC_Q6_K: return mc_fdot_q6_k_avx2;
        default: break;
        }
    }
#endif
    (void)t;
    (void)simd;
    return NULL;
}

static mc_dot_fn mc_pick_dot_f32(int simd) {
#if defined(MC_X86)
    if (MC_IS_AVX2(simd)) return mc_dot_f32_avx2;
#endif
#if defined(MC_NEON)
    if (simd == MC_SIMD_NEON) return mc_dot_f32_neon;
#endif
    (void)simd;
    return mc_dot_f32_scalar;
}

/* Relative RMS error that quantizing x row j introduced: sqrt(sum_b n_b d_b^2 / 12 / sum x^2),
 * rounding error being uniform in +-d/2 (an estimate: exact for no single value). */
static double mc_act_noise(const mc_matmul_job *jb, int j) {
    const float *xr = jb->x + (size_t)j * jb->K;
    const char *q = (const char *)jb->xbase + jb->xstride * j;
    double sig = 0.0, noise = 0.0;
    for (int i = 0; i < jb->K; i++) sig += (double)xr[i] * xr[i];
    if (jb->t == MC_Q4_K || jb->t == MC_Q6_K) {
        const mc_q8k *b = (const mc_q8k *)q;
        for (int i = 0; i < jb->K / 256; i++) noise += 256.0 * b[i].d * b[i].d;
    } else {
        const mc_q8 *b = (const mc_q8 *)q;
        for (int i = 0; i < (jb->K + 31) / 32; i++) noise += 32.0 * b[i].d * b[i].d;
    }
    return sig > 0.0 ? sqrt(noise / 12.0 / sig) : 0.0;
}

/* y (n, M) = x (n, K) @ W^T, W = M rows of `row_stride` bytes of type t.
 *
 * tol == 0 ("exact"): activations stay float32; each weight row is dequantized
 *     once into a row buffer and meets every x row in a float dot product (the
 *     result of x @ dequant(W)^T up to float32 summation order).
 * tol > 0: activations are quantized to int8 blocks and the dots are integer
 *     (fast), unless quantizing some row of x is estimated to add a relative RMS
 *     error above tol (activations with outliers), then the call takes the exact
 *     path.  A huge tol ("fast") always takes the integer path.
 * Work is split in tiles of MC_TR output rows over up to nth threads.
 * Returns 0, -1 for an unknown type, -2 when out of memory. */
static int mc_matmul(int t, const uint8_t *W, int64_t row_stride, int M, int K, const float *x,
                     int n, float *y, int simd, int nth, float tol) {
    mc_matmul_job jb;
    memset(&jb, 0, sizeof jb);
    jb.t = t;
    jb.M = M;
    jb.K = K;
    jb.n = n;
    jb.W = W;
    jb.row_stride = row_stride;
    jb.x = x;
    jb.y = y;
    jb.simd = simd;
    jb.dot = mc_pick_dot(t, simd);
    if (jb.dot == NULL) return -1;
    const int ntiles = (M + MC_TR - 1) / MC_TR;
    const int use = (double)M * K * n < 65536.0 ? 1 : nth;
    int exact = !(tol > 0.0f) && t != MC_F32 && t != MC_F16; /* F32/F16: float paths already */
    if (!exact) {
        jb.dot4 = mc_pick_dot4(t, simd);
        /* quantize the activations once (rows in parallel when there are many) */
        if (t == MC_F32 || t == MC_F16) {
            jb.xstride = (size_t)K * sizeof(float);
            jb.xbase = x;
        } else {
            jb.xstride = (t == MC_Q4_K || t == MC_Q6_K) ? (size_t)(K / 256) * sizeof(mc_q8k)
                                                        : (size_t)((K + 31) / 32) * sizeof(mc_q8);
            const int outl = tol < 1e30f; /* balanced: outlier decomposition */
            const size_t qbytes = jb.xstride * (size_t)n;
            const size_t obytes = outl ? sizeof(struct mc_outl) * (size_t)n : 0;
            char *xq = (char *)mc_scratch(0, qbytes + obytes + 64);
            if (xq == NULL) return -2;
            jb.xbase = xq;
            jb.outl = outl ? (struct mc_outl *)(xq + ((qbytes + 63) & ~(size_t)63)) : NULL;
            mc_parallel(n >= 16 ? nth : 1, n, mc_quantize_chunk, &jb);
            if (tol < 1e30f)
                for (int j = 0; j < n && !exact; j++) exact = mc_act_noise(&jb, j) > tol;
        }
    }
    if (exact) {
        jb.dot = mc_pick_dot_f32(simd);
        jb.dot4 = mc_pick_dot4(MC_F32, simd);
        jb.fdot = mc_pick_fdot(t, simd);
        mc_parallel(use, ntiles, mc_matmul_exact_chunk, &jb);
        return jb.failed ? -2 : 0;
    }
    mc_parallel(use, ntiles, mc_matmul_chunk, &jb);
    return 0;
}

/* out (nids, K) = dequantized rows ids of W */
static void mc_get_rows(int t, const uint8_t *W, int64_t row_stride, int K, const int64_t *ids,
                        int nids, float *out, int simd) {
    for (int i = 0; i < nids; i++)
        mc_dequant_row_simd(t, W + (size_t)ids[i] * row_stride, K, out + (size_t)i * K, simd);
}

#endif /* MC_QUANT_H */
