/* Portable C dot kernels: the reference every SIMD path is held to. */
#ifndef MC_DOT_SCALAR_H
#define MC_DOT_SCALAR_H

#include "mc_blocks.h"

/* ------------------------------------------------------ scalar dot products */
/* Each returns dot(W row, x row); `x` is the quantized (or float) activation row. */


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

static float mc_dot_q5_1_scalar(int K, const uint8_t *w, const void *xv) {
    const mc_q8 *x = (const mc_q8 *)xv;
    float sum = 0.0f;
    for (int i = 0; i < K / 32; i++) {
        const uint8_t *b = w + 24 * i;
        uint32_t qh;
        memcpy(&qh, b + 4, 4);
        int s = 0;
        for (int j = 0; j < 16; j++) {
            const int h0 = (qh >> j) & 1, h1 = (qh >> (j + 16)) & 1;
            s += ((b[8 + j] & 0xF) | (h0 << 4)) * x[i].qs[j];
            s += ((b[8 + j] >> 4) | (h1 << 4)) * x[i].qs[j + 16];
        }
        sum += mc_load_f16(b) * x[i].d * (float)s + mc_load_f16(b + 2) * x[i].s;
    }
    return sum;
}

static float mc_dot_iq4_nl_scalar(int K, const uint8_t *w, const void *xv) {
    const mc_q8 *x = (const mc_q8 *)xv;
    float sum = 0.0f;
    for (int i = 0; i < K / 32; i++) {
        const uint8_t *b = w + 18 * i;
        int s = 0;
        for (int j = 0; j < 16; j++) {
            s += mc_iq4_kvalues[b[2 + j] & 0xF] * x[i].qs[j];
            s += mc_iq4_kvalues[b[2 + j] >> 4] * x[i].qs[j + 16];
        }
        sum += mc_load_f16(b) * x[i].d * (float)s;
    }
    return sum;
}

/* IQ4_XS against mc_q8 blocks: each 32-element group is one activation block */
static float mc_dot_iq4_xs_scalar(int K, const uint8_t *w, const void *xv) {
    const mc_q8 *x = (const mc_q8 *)xv;
    float sum = 0.0f;
    for (int i = 0; i < K / 256; i++) {
        const uint8_t *b = w + 136 * i;
        const float d = mc_load_f16(b);
        for (int ib = 0; ib < 8; ib++) {
            const uint8_t *q = b + 8 + 16 * ib;
            const mc_q8 *xb = x + 8 * i + ib;
            int s = 0;
            for (int j = 0; j < 16; j++) {
                s += mc_iq4_kvalues[q[j] & 0xF] * xb->qs[j];
                s += mc_iq4_kvalues[q[j] >> 4] * xb->qs[j + 16];
            }
            sum += d * xb->d * (float)(mc_iq4xs_scale(b, ib) * s);
        }
    }
    return sum;
}

/* The K-quants below: per 256-block the exact integer sums, then one float step
 * x.d * (d * si - dmin * sm); the AVX2 kernels compute the same integers. */

static float mc_dot_q2_k_scalar(int K, const uint8_t *w, const void *xv) {
    const mc_q8k *x = (const mc_q8k *)xv;
    float sum = 0.0f;
    for (int i = 0; i < K / 256; i++) {
        const uint8_t *b = w + 84 * i;
        const int8_t *y = x[i].qs;
        int a[16] = {0};
        for (int e = 0; e < 256; e++) {
            const int n = e / 128, k = (e % 128) / 32, l = e % 32;
            a[e / 16] += ((b[16 + 32 * n + l] >> (2 * k)) & 3) * y[e];
        }
        int si = 0, sm = 0;
        for (int j = 0; j < 16; j++) {
            si += (b[j] & 0xF) * a[j];
            sm += (b[j] >> 4) * x[i].bsums[j];
        }
        sum += x[i].d * (mc_load_f16(b + 80) * (float)si - mc_load_f16(b + 82) * (float)sm);
    }
    return sum;
}

static float mc_dot_q3_k_scalar(int K, const uint8_t *w, const void *xv) {
    const mc_q8k *x = (const mc_q8k *)xv;
    float sum = 0.0f;
    for (int i = 0; i < K / 256; i++) {
        const uint8_t *b = w + 110 * i;
        const int8_t *y = x[i].qs;
        int8_t sc[16];
        mc_q3k_scales(b + 96, sc);
        int a[16] = {0};
        for (int e = 0; e < 256; e++) { /* q + 4 (0..7), the 4 taken off through bsums */
            const int n = e / 128, k = (e % 128) / 32, l = e % 32;
            const int u = ((b[32 + 32 * n + l] >> (2 * k)) & 3) | (((b[l] >> (e / 32)) & 1) << 2);
            a[e / 16] += u * y[e];
        }
        int si = 0;
        for (int j = 0; j < 16; j++) si += sc[j] * (a[j] - 4 * x[i].bsums[j]);
        sum += x[i].d * (mc_load_f16(b + 108) * (float)si);
    }
    return sum;
}

static float mc_dot_q5_k_scalar(int K, const uint8_t *w, const void *xv) {
    const mc_q8k *x = (const mc_q8k *)xv;
    float sum = 0.0f;
    for (int i = 0; i < K / 256; i++) {
        const uint8_t *b = w + 176 * i;
        const int8_t *y = x[i].qs;
        int si = 0, sm = 0;
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            mc_q4k_scale_min(j, b + 4, &sc, &m);
            int s = 0;
            for (int l = 0; l < 32; l++) {
                const int q = ((b[48 + 32 * (j / 2) + l] >> (4 * (j % 2))) & 0xF) |
                              (((b[16 + l] >> j) & 1) << 4);
                s += q * y[32 * j + l];
            }
            si += sc * s;
            sm += m * (x[i].bsums[2 * j] + x[i].bsums[2 * j + 1]);
        }
        sum += x[i].d * (mc_load_f16(b) * (float)si - mc_load_f16(b + 2) * (float)sm);
    }
    return sum;
}

static float mc_dot_bf16_scalar(int K, const uint8_t *w, const void *xv) {
    const float *x = (const float *)xv;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= K; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += mc_load_bf16(w + 2 * (i + j)) * x[i + j];
    float sum = 0.0f;
    for (; i < K; i++) sum += mc_load_bf16(w + 2 * i) * x[i];
    for (int j = 0; j < 8; j++) sum += acc[j];
    return sum;
}

#endif /* MC_DOT_SCALAR_H */
