/* GGML block layouts: sizes, int8 activation blocks, row and element dequantization. */
#ifndef MC_BLOCKS_H
#define MC_BLOCKS_H

#include "mc_common.h"

/* ---------------------------------------------------------------- layout */

/* elements per block and bytes per block of each weight type (INT8: per row) */
static int mc_block_elems(int t) {
    switch (t) {
    case MC_Q4_0: case MC_Q4_1: case MC_Q5_0: case MC_Q5_1: case MC_Q8_0: case MC_IQ4_NL:
    case MC_MXFP4:
        return 32;
    case MC_Q2_K: case MC_Q3_K: case MC_Q4_K: case MC_Q5_K: case MC_Q6_K: case MC_IQ4_XS:
        return 256;
    default: return 1;
    }
}

static int mc_block_bytes(int t) {
    switch (t) {
    case MC_F32: return 4;
    case MC_F16: case MC_BF16: return 2;
    case MC_Q4_0: return 18;
    case MC_Q5_1: return 24;
    case MC_Q2_K: return 84;
    case MC_Q3_K: return 110;
    case MC_Q5_K: return 176;
    case MC_IQ4_NL: return 18;
    case MC_IQ4_XS: return 136;
    case MC_MXFP4: return 17;
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

/* IQ4_NL / IQ4_XS: the 16 non-linear levels a nibble indexes */
static const int8_t mc_iq4_kvalues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                          1,    13,   25,  38,  53,  69,  89,  113};

/* MXFP4: the E2M1 values doubled (ggml's kvalues_mxfp4), met by a halved E8M0 scale */
static const int8_t mc_mxfp4_kvalues[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* E8M0 e -> 2^(e - 128), ggml's GGML_E8M0_TO_FP32_HALF (subnormal bits for e < 2) */
static inline float mc_e8m0_half(uint8_t e) {
    return mc_f32_from_bits(e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23);
}

/* bfloat16 bits -> float (exact) */
static inline float mc_load_bf16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return mc_f32_from_bits((uint32_t)h << 16);
}

/* Q3_K: the 12 packed bytes -> 16 signed 6-bit scales (value - 32) */
static inline void mc_q3k_scales(const uint8_t *p, int8_t *sc) {
    for (int i = 0; i < 16; i++) {
        const int lo = (i < 8 ? p[i] : p[i - 8] >> 4) & 0xF;
        const int hi = (p[8 + i % 4] >> (2 * (i / 4))) & 3;
        sc[i] = (int8_t)((lo | (hi << 4)) - 32);
    }
}

/* IQ4_XS: the signed 6-bit scale (value - 32) of 32-element group ib of block b */
static inline int mc_iq4xs_scale(const uint8_t *b, int ib) {
    uint16_t sh;
    memcpy(&sh, b + 2, 2);
    const int lo = (b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF;
    return (lo | (((sh >> (2 * ib)) & 3) << 4)) - 32;
}

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
    case MC_BF16:
        for (int i = 0; i < K; i++) y[i] = mc_load_bf16(row + 2 * i);
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
        case MC_Q5_1: {
            const float d = mc_load_f16(b), m = mc_load_f16(b + 2);
            uint32_t qh;
            memcpy(&qh, b + 4, 4);
            for (int j = 0; j < 16; j++) {
                const int h0 = (qh >> j) & 1, h1 = (qh >> (j + 16)) & 1;
                y[j] = d * (float)((b[8 + j] & 0xF) | (h0 << 4)) + m;
                y[j + 16] = d * (float)((b[8 + j] >> 4) | (h1 << 4)) + m;
            }
            y += 32;
            break;
        }
        case MC_Q2_K: { /* element 128n + 32k + l: bits 2k of qs[32n + l]; scale e / 16 */
            const float d = mc_load_f16(b + 80), dmin = mc_load_f16(b + 82);
            for (int e = 0; e < 256; e++) {
                const int n = e / 128, k = (e % 128) / 32, l = e % 32, sc = b[e / 16];
                const int q = (b[16 + 32 * n + l] >> (2 * k)) & 3;
                y[e] = d * (float)(sc & 0xF) * (float)q - dmin * (float)(sc >> 4);
            }
            y += 256;
            break;
        }
        case MC_Q3_K: { /* as Q2_K, minus 4 where bit e / 32 of hmask[l] is clear */
            const float d = mc_load_f16(b + 108);
            int8_t sc[16];
            mc_q3k_scales(b + 96, sc);
            for (int e = 0; e < 256; e++) {
                const int n = e / 128, k = (e % 128) / 32, l = e % 32;
                const int q = ((b[32 + 32 * n + l] >> (2 * k)) & 3) - (((b[l] >> (e / 32)) & 1) ? 0 : 4);
                y[e] = d * (float)sc[e / 16] * (float)q;
            }
            y += 256;
            break;
        }
        case MC_Q5_K: { /* as Q4_K, bit e / 32 of qh[l] the fifth */
            const float d = mc_load_f16(b), dmin = mc_load_f16(b + 2);
            for (int j = 0; j < 8; j++) {
                uint8_t sc, m;
                mc_q4k_scale_min(j, b + 4, &sc, &m);
                const float dl = d * (float)sc, ml = dmin * (float)m;
                for (int l = 0; l < 32; l++) {
                    const int q = ((b[48 + 32 * (j / 2) + l] >> (4 * (j % 2))) & 0xF) |
                                  (((b[16 + l] >> j) & 1) << 4);
                    y[32 * j + l] = dl * (float)q - ml;
                }
            }
            y += 256;
            break;
        }
        case MC_IQ4_NL: {
            const float d = mc_load_f16(b);
            for (int j = 0; j < 16; j++) {
                y[j] = d * (float)mc_iq4_kvalues[b[2 + j] & 0xF];
                y[j + 16] = d * (float)mc_iq4_kvalues[b[2 + j] >> 4];
            }
            y += 32;
            break;
        }
        case MC_MXFP4: { /* ggml's dequantize_row_mxfp4: kvalue * d */
            const float d = mc_e8m0_half(b[0]);
            for (int j = 0; j < 16; j++) {
                y[j] = (float)mc_mxfp4_kvalues[b[1 + j] & 0xF] * d;
                y[j + 16] = (float)mc_mxfp4_kvalues[b[1 + j] >> 4] * d;
            }
            y += 32;
            break;
        }
        case MC_IQ4_XS: {
            const float d = mc_load_f16(b);
            for (int ib = 0; ib < 8; ib++) {
                const float dl = d * (float)mc_iq4xs_scale(b, ib);
                const uint8_t *q = b + 8 + 16 * ib;
                for (int j = 0; j < 16; j++) {
                    y[32 * ib + j] = dl * (float)mc_iq4_kvalues[q[j] & 0xF];
                    y[32 * ib + j + 16] = dl * (float)mc_iq4_kvalues[q[j] >> 4];
                }
            }
            y += 256;
            break;
        }
        default: break;
        }
    }
}

/* ------------------------------------------------------------ dot kernels */
/* Each returns dot(W row, x row); `x` is the quantized (or float) activation row. */

typedef float (*mc_dot_fn)(int K, const uint8_t *w, const void *x);
/* one weight row against 4 activation rows `xstride` bytes apart -> out[0..3] */
typedef void (*mc_dot4_fn)(int K, const uint8_t *w, const void *x, size_t xstride, float *out);
/* 4 weight rows `st` bytes apart against one activation row */
typedef void (*mc_dotr4_fn)(int K, const uint8_t *w, size_t st, const void *x, float *out);
/* two weight rows `st` bytes apart against 8 activation rows */
typedef void (*mc_dot8x2_fn)(int K, const uint8_t *w, size_t st, const void *xp, float *out0,
                             float *out1);
/* 8 activation rows, repacked as K/32 mc_q8x8 */
typedef void (*mc_dot8_fn)(int K, const uint8_t *w, const void *xp, float *out);

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
    case MC_BF16:
        return mc_load_bf16(row + 2 * i);
    default: { /* the other block types: the element's block, dequantized */
        const int be = mc_block_elems(t);
        float tmp[256];
        if (be < 32) return 0.0f;
        mc_dequant_row(t, row + (size_t)mc_block_bytes(t) * (i / be), be, tmp);
        return tmp[i % be];
    }
    }
}

#endif /* MC_BLOCKS_H */
