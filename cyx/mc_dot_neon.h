/* NEON (arm64) dot kernels; types without one use the scalar C path. */
#ifndef MC_DOT_NEON_H
#define MC_DOT_NEON_H

#include "mc_blocks.h"

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

#endif /* MC_DOT_NEON_H */
