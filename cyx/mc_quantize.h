/* Pack-time quantization of float32 rows into GGML blocks, bit for bit as ggml's quantizers
 * (ggml-quants.c: quantize_q4_K & co., what ggml_quantize_chunk calls and llama-quantize
 * writes).  Written from the math of ggml's reference code: the same float32 operations in the
 * same order, -ffp-contract=off (mc_build.py) so that nothing is fused.
 *
 * mc_quantize_rows(type, src, dst, nrow, n_per_row, imatrix): type is the GGML type id
 * (Q4_0 2, Q4_1 3, Q5_0 6, Q5_1 7, Q8_0 8, Q2_K 10, Q3_K 11, Q4_K 12, Q5_K 13, Q6_K 14,
 * IQ4_NL 20, IQ4_XS 23; the low-bit ones in mc_quantize_low.h); imatrix, when not NULL,
 * holds n_per_row importance weights (llama.cpp's imatrix for this tensor), used as ggml does:
 * the weighted search replaces the reference one, except for Q8_0, which ignores it.
 *
 * Block layouts: see modelc/formats/quants.py. */
#ifndef MC_QUANTIZE_H
#define MC_QUANTIZE_H

#include <float.h>

#include "mc_common.h"

#define MCQ_QK_K 256
#define MCQ_EPS 1e-15f
#define MCQ_MIN(a, b) ((a) < (b) ? (a) : (b))
#define MCQ_MAX(a, b) ((a) > (b) ? (a) : (b))

static inline int mcq_nearest_int(float fval) {
    float val = fval + 12582912.f;
    int i;
    memcpy(&i, &val, sizeof(int));
    return (i & 0x007fffff) - 0x00400000;
}

static inline void mcq_put_f16(uint8_t *p, float f) {
    const uint16_t h = mc_fp32_to_fp16(f);
    memcpy(p, &h, 2);
}

static inline float mcq_get_f16(const uint8_t *p) { return mc_load_f16(p); }

/* symmetric levels -nmax..nmax-1 (stored + nmax) of one group; returns the scale */
static float mcq_make_qx_quants(int n, int nmax, const float *x, int8_t *L, int rmse_type,
                                const float *qw) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; ++i) {
        float ax = fabsf(x[i]);
        if (ax > amax) { amax = ax; max = x[i]; }
    }
    if (amax < MCQ_EPS) {
        for (int i = 0; i < n; ++i) L[i] = 0;
        return 0.f;
    }
    float iscale = -nmax / max;
    if (rmse_type == 0) {
        for (int i = 0; i < n; ++i) {
            int l = mcq_nearest_int(iscale * x[i]);
            L[i] = (int8_t)(nmax + MCQ_MAX(-nmax, MCQ_MIN(nmax - 1, l)));
        }
        return 1 / iscale;
    }
    int return_early = 0;
    if (rmse_type < 0) { rmse_type = -rmse_type; return_early = 1; }
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; ++i) {
        int l = mcq_nearest_int(iscale * x[i]);
        l = MCQ_MAX(-nmax, MCQ_MIN(nmax - 1, l));
        L[i] = (int8_t)(l + nmax);
        float w = qw ? qw[i] : rmse_type == 1 ? x[i] * x[i] : rmse_type == 2 ? 1 : rmse_type == 3 ? fabsf(x[i]) : sqrtf(fabsf(x[i]));
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 ? sumlx / suml2 : 0.0f;
    if (return_early) return suml2 > 0 ? 0.5f * (scale + 1 / iscale) : 1 / iscale;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; ++is) {
        if (is == 0) continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; ++i) {
            int l = mcq_nearest_int(iscale * x[i]);
            l = MCQ_MAX(-nmax, MCQ_MIN(nmax - 1, l));
            float w = qw ? qw[i] : rmse_type == 1 ? x[i] * x[i] : rmse_type == 2 ? 1 : rmse_type == 3 ? fabsf(x[i]) : sqrtf(fabsf(x[i]));
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; ++i) {
                int l = mcq_nearest_int(iscale * x[i]);
                L[i] = (int8_t)(nmax + MCQ_MAX(-nmax, MCQ_MIN(nmax - 1, l)));
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* levels 0..nmax with a min (ggml's make_qkx2_quants when weights given and x3 = 0, or
 * make_qkx3_quants when x3 = 1: the same search, x3 accepting max <= min and default weights
 * x*x when none are given; mad: weigh absolute errors, not squared ones); returns the scale,
 * *the_min = -min */
static float mcq_make_qkx_quants(int x3, int n, int nmax, const float *x, const float *weights,
                                 uint8_t *L, float *the_min, uint8_t *Laux, float rmin,
                                 float rdelta, int nstep, int mad) {
    float min = x[0], max = x[0];
    float sum_w = weights ? weights[0] : x[0] * x[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; ++i) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        float w = weights ? weights[i] : x[i] * x[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if (min > 0) min = 0;
    if (x3 ? max <= min : max == min) {
        for (int i = 0; i < n; ++i) L[i] = 0;
        *the_min = -min;
        return 0.f;
    }
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    float best_error = 0;
    for (int i = 0; i < n; ++i) {
        int l = mcq_nearest_int(iscale * (x[i] - min));
        L[i] = (uint8_t)MCQ_MAX(0, MCQ_MIN(nmax, l));
        float diff = scale * L[i] + min - x[i];
        diff = mad ? fabsf(diff) : diff * diff;
        float w = weights ? weights[i] : x[i] * x[i];
        best_error += w * diff;
    }
    if (nstep < 1) {
        *the_min = -min;
        return scale;
    }
    for (int is = 0; is <= nstep; ++is) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; ++i) {
            int l = mcq_nearest_int(iscale * (x[i] - min));
            l = MCQ_MAX(0, MCQ_MIN(nmax, l));
            Laux[i] = (uint8_t)l;
            float w = weights ? weights[i] : x[i] * x[i];
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0;
            for (int i = 0; i < n; ++i) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                diff = mad ? fabsf(diff) : diff * diff;
                float w = weights ? weights[i] : x[i] * x[i];
                cur_error += w * diff;
            }
            if (cur_error < best_error) {
                for (int i = 0; i < n; ++i) L[i] = Laux[i];
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

/* the 6-bit super-block scales of Q4_K/Q5_K under an imatrix (ggml's make_qp_quants) */
static float mcq_make_qp_quants(int n, int nmax, const float *x, uint8_t *L, const float *qw) {
    float max = 0;
    for (int i = 0; i < n; ++i) max = MCQ_MAX(max, x[i]);
    if (max < MCQ_EPS) {
        for (int i = 0; i < n; ++i) L[i] = 0;
        return 0.f;
    }
    float iscale = nmax / max;
    for (int i = 0; i < n; ++i) L[i] = (uint8_t)mcq_nearest_int(iscale * x[i]);
    float scale = 1 / iscale;
    float best_mse = 0;
    for (int i = 0; i < n; ++i) {
        float diff = x[i] - scale * L[i];
        float w = qw[i];
        best_mse += w * diff * diff;
    }
    for (int is = -4; is <= 4; ++is) {
        if (is == 0) continue;
        float iscale_is = (0.1f * is + nmax) / max;
        float scale_is = 1 / iscale_is;
        float mse = 0;
        for (int i = 0; i < n; ++i) {
            int l = mcq_nearest_int(iscale_is * x[i]);
            l = MCQ_MIN(nmax, l);
            float diff = x[i] - scale_is * l;
            float w = qw[i];
            mse += w * diff * diff;
        }
        if (mse < best_mse) {
            best_mse = mse;
            iscale = iscale_is;
        }
    }
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; ++i) {
        int l = mcq_nearest_int(iscale * x[i]);
        l = MCQ_MIN(nmax, l);
        L[i] = (uint8_t)l;
        float w = qw[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    for (int itry = 0; itry < 5; ++itry) {
        int n_changed = 0;
        for (int i = 0; i < n; ++i) {
            float w = qw[i];
            float slx = sumlx - w * x[i] * L[i];
            float sl2 = suml2 - w * L[i] * L[i];
            if (slx > 0 && sl2 > 0) {
                int new_l = mcq_nearest_int(x[i] * sl2 / slx);
                new_l = MCQ_MIN(nmax, new_l);
                if (new_l != L[i]) {
                    slx += w * x[i] * new_l;
                    sl2 += w * new_l * new_l;
                    if (slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (uint8_t)new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        ++n_changed;
                    }
                }
            }
        }
        if (!n_changed) break;
    }
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* ------------------------------------------------------------ Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 */

static void mcq_q4_0_ref(const float *x, uint8_t *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 32, y += 18) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < 32; j++) {
            const float v = x[j];
            if (amax < fabsf(v)) { amax = fabsf(v); max = v; }
        }
        const float d = max / -8;
        const float id = d ? 1.0f / d : 0.0f;
        mcq_put_f16(y, d);
        for (int j = 0; j < 16; ++j) {
            const float x0 = x[j] * id, x1 = x[16 + j] * id;
            const uint8_t xi0 = (uint8_t)MCQ_MIN(15, (int8_t)(x0 + 8.5f));
            const uint8_t xi1 = (uint8_t)MCQ_MIN(15, (int8_t)(x1 + 8.5f));
            y[2 + j] = (uint8_t)(xi0 | (xi1 << 4));
        }
    }
}

static void mcq_q4_1_ref(const float *x, uint8_t *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 32, y += 20) {
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < 32; j++) {
            if (x[j] < min) min = x[j];
            if (x[j] > max) max = x[j];
        }
        const float d = (max - min) / ((1 << 4) - 1);
        const float id = d ? 1.0f / d : 0.0f;
        mcq_put_f16(y, d);
        mcq_put_f16(y + 2, min);
        for (int j = 0; j < 16; ++j) {
            const float x0 = (x[j] - min) * id, x1 = (x[16 + j] - min) * id;
            const uint8_t xi0 = (uint8_t)MCQ_MIN(15, (int8_t)(x0 + 0.5f));
            const uint8_t xi1 = (uint8_t)MCQ_MIN(15, (int8_t)(x1 + 0.5f));
            y[4 + j] = (uint8_t)(xi0 | (xi1 << 4));
        }
    }
}

/* the low nibbles and the 5th bits of 32 levels 0..31 */
static void mcq_pack5(const uint8_t *L, uint8_t *qh_out, uint8_t *qs) {
    uint32_t qh = 0;
    for (int j = 0; j < 16; ++j) {
        const uint8_t xi0 = L[j], xi1 = L[j + 16];
        qs[j] = (uint8_t)((xi0 & 0x0F) | ((xi1 & 0x0F) << 4));
        qh |= ((xi0 & 0x10u) >> 4) << (j + 0);
        qh |= ((xi1 & 0x10u) >> 4) << (j + 16);
    }
    memcpy(qh_out, &qh, 4);
}

static void mcq_q5_0_ref(const float *x, uint8_t *y, int64_t nb) {
    uint8_t L[32];
    for (int64_t i = 0; i < nb; i++, x += 32, y += 22) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < 32; j++) {
            const float v = x[j];
            if (amax < fabsf(v)) { amax = fabsf(v); max = v; }
        }
        const float d = max / -16;
        const float id = d ? 1.0f / d : 0.0f;
        mcq_put_f16(y, d);
        for (int j = 0; j < 32; ++j) L[j] = (uint8_t)MCQ_MIN(31, (int8_t)(x[j] * id + 16.5f));
        mcq_pack5(L, y + 2, y + 6);
    }
}

static void mcq_q5_1_ref(const float *x, uint8_t *y, int64_t nb) {
    uint8_t L[32];
    for (int64_t i = 0; i < nb; i++, x += 32, y += 24) {
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < 32; j++) {
            if (x[j] < min) min = x[j];
            if (x[j] > max) max = x[j];
        }
        const float d = (max - min) / ((1 << 5) - 1);
        const float id = d ? 1.0f / d : 0.0f;
        mcq_put_f16(y, d);
        mcq_put_f16(y + 2, min);
        for (int j = 0; j < 32; ++j) L[j] = (uint8_t)((x[j] - min) * id + 0.5f);
        mcq_pack5(L, y + 4, y + 8);
    }
}

static void mcq_q8_0_ref(const float *x, uint8_t *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 32, y += 34) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = MCQ_MAX(amax, fabsf(x[j]));
        const float d = amax / ((1 << 7) - 1);
        const float id = d ? 1.0f / d : 0.0f;
        mcq_put_f16(y, d);
        for (int j = 0; j < 32; ++j) y[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
    }
}

/* one row of a 32-block type under an imatrix: Q4_0/Q5_0 symmetric, Q4_1/Q5_1 with a min */
static void mcq_legacy_imatrix_row(int type, const float *x, uint8_t *y, int64_t n_per_row,
                                   const float *qw_row) {
    float weight[32];
    int8_t L[32];
    uint8_t U[32], Laux[32];
    float sum_x2 = 0;
    for (int64_t j = 0; j < n_per_row; ++j) sum_x2 += x[j] * x[j];
    float sigma2 = sum_x2 / n_per_row;
    const int64_t nb = n_per_row / 32;
    for (int64_t ib = 0; ib < nb; ++ib) {
        const float *xb = x + 32 * ib;
        const float *qw = qw_row + 32 * ib;
        for (int j = 0; j < 32; ++j) weight[j] = qw[j] * sqrtf(sigma2 + xb[j] * xb[j]);
        if (type == 2 || type == 6) { /* Q4_0, Q5_0 */
            const int nmax = type == 2 ? 8 : 16;
            float d = mcq_make_qx_quants(32, nmax, xb, L, 1, weight);
            uint8_t *b = y + ib * (type == 2 ? 18 : 22);
            mcq_put_f16(b, d);
            if (type == 2) {
                for (int j = 0; j < 16; ++j) b[2 + j] = (uint8_t)(L[j] | (L[j + 16] << 4));
            } else {
                for (int j = 0; j < 32; ++j) U[j] = (uint8_t)L[j];
                mcq_pack5(U, b + 2, b + 6);
            }
        } else { /* Q4_1, Q5_1 */
            float min;
            float d = mcq_make_qkx_quants(1, 32, type == 3 ? 15 : 31, xb, weight, U, &min, Laux,
                                          -0.9f, 0.05f, 36, 0);
            uint8_t *b = y + ib * (type == 3 ? 20 : 24);
            mcq_put_f16(b, d);
            mcq_put_f16(b + 2, -min);
            if (type == 3) {
                for (int j = 0; j < 16; ++j) b[4 + j] = (uint8_t)(U[j] | (U[j + 16] << 4));
            } else {
                mcq_pack5(U, b + 4, b + 8);
            }
        }
    }
}

/* ------------------------------------------------------------------- Q4_K Q5_K */

static inline void mcq_get_scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
    }
}

/* one Q4_K (nmax 15) or Q5_K (nmax 31) super-block: d, dmin, scales[12], [qh[32]], qs[128] */
static void mcq_qk45_block(int nmax, const float *x, uint8_t *y, const float *qw_block) {
    uint8_t L[MCQ_QK_K], Laux[32], Ls[8], Lm[8];
    float weights[32], mins[8], scales[8], sw[8];
    uint8_t *sc12 = y + 4;
    memset(sc12, 0, 12);
    float d_block, m_block;
    if (!qw_block) {
        float max_scale = 0, max_min = 0;
        for (int j = 0; j < 8; ++j) {
            float sum_x2 = 0;
            for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
            float av_x = sqrtf(sum_x2 / 32);
            for (int l = 0; l < 32; ++l) weights[l] = av_x + fabsf(x[32 * j + l]);
            scales[j] = nmax == 15
                ? mcq_make_qkx_quants(0, 32, 15, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, -1.f, 0.1f, 20, 0)
                : mcq_make_qkx_quants(0, 32, 31, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, -0.5f, 0.1f, 15, 0);
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
        float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
        for (int j = 0; j < 8; ++j) {
            uint8_t ls = (uint8_t)mcq_nearest_int(inv_scale * scales[j]);
            uint8_t lm = (uint8_t)mcq_nearest_int(inv_min * mins[j]);
            Ls[j] = MCQ_MIN(63, ls);
            Lm[j] = MCQ_MIN(63, lm);
        }
        d_block = max_scale / 63.f;
        m_block = max_min / 63.f;
    } else {
        float sum_x2 = 0;
        for (int l = 0; l < MCQ_QK_K; ++l) sum_x2 += x[l] * x[l];
        float sigma2 = 2 * sum_x2 / MCQ_QK_K;
        for (int j = 0; j < 8; ++j) {
            const float *qw = qw_block + 32 * j;
            for (int l = 0; l < 32; ++l) weights[l] = qw[l] * sqrtf(sigma2 + x[32 * j + l] * x[32 * j + l]);
            float sumw = 0;
            for (int l = 0; l < 32; ++l) sumw += weights[l];
            sw[j] = sumw;
            scales[j] = mcq_make_qkx_quants(1, 32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, -0.9f, 0.05f, 36, 0);
        }
        d_block = mcq_make_qp_quants(8, 63, scales, Ls, sw);
        m_block = mcq_make_qp_quants(8, 63, mins, Lm, sw);
        for (int j = 0; j < 8; ++j) {
            Ls[j] = MCQ_MIN(63, Ls[j]);
            Lm[j] = MCQ_MIN(63, Lm[j]);
        }
    }
    for (int j = 0; j < 8; ++j) {
        const uint8_t ls = Ls[j], lm = Lm[j];
        if (j < 4) {
            sc12[j] = ls;
            sc12[j + 4] = lm;
        } else {
            sc12[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
            sc12[j - 4] |= (uint8_t)((ls >> 4) << 6);
            sc12[j - 0] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    mcq_put_f16(y, d_block);
    mcq_put_f16(y + 2, m_block);
    const float d16 = mcq_get_f16(y), dmin16 = mcq_get_f16(y + 2);
    for (int j = 0; j < 8; ++j) {
        uint8_t sc, m;
        mcq_get_scale_min_k4(j, sc12, &sc, &m);
        const float d = d16 * sc;
        if (!d) continue;
        const float dm = dmin16 * m;
        for (int ii = 0; ii < 32; ++ii) {
            int l = mcq_nearest_int((x[32 * j + ii] + dm) / d);
            L[32 * j + ii] = (uint8_t)MCQ_MAX(0, MCQ_MIN(nmax, l));
        }
    }
    if (nmax == 15) {
        uint8_t *q = y + 16;
        for (int j = 0; j < MCQ_QK_K; j += 64, q += 32)
            for (int l = 0; l < 32; ++l) q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
        return;
    }
    uint8_t *qh = y + 16, *ql = y + 48;
    memset(qh, 0, 32);
    uint8_t m1 = 1, m2 = 2;
    for (int n = 0; n < MCQ_QK_K; n += 64) {
        for (int j = 0; j < 32; ++j) {
            int l1 = L[n + j];
            if (l1 > 15) { l1 -= 16; qh[j] |= m1; }
            int l2 = L[n + j + 32];
            if (l2 > 15) { l2 -= 16; qh[j] |= m2; }
            ql[j] = (uint8_t)(l1 | (l2 << 4));
        }
        m1 <<= 2;
        m2 <<= 2;
        ql += 32;
    }
}

/* ------------------------------------------------------------------------ Q6_K */

/* one Q6_K super-block: ql[128], qh[64], scales[16] int8, d */
static void mcq_q6_k_block(const float *x, uint8_t *y, const float *qw_block) {
    int8_t L[MCQ_QK_K];
    float scales[16];
    float max_scale = 0, max_abs_scale = 0;
    for (int ib = 0; ib < 16; ++ib) {
        const float scale = mcq_make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib, 1,
                                               qw_block ? qw_block + 16 * ib : NULL);
        scales[ib] = scale;
        const float abs_scale = fabsf(scale);
        if (abs_scale > max_abs_scale) {
            max_abs_scale = abs_scale;
            max_scale = scale;
        }
    }
    if (max_abs_scale < MCQ_EPS) {
        memset(y, 0, 210);
        return;
    }
    int8_t *sc = (int8_t *)(y + 192);
    float iscale = -128.f / max_scale;
    mcq_put_f16(y + 208, 1 / iscale);
    for (int ib = 0; ib < 16; ++ib) sc[ib] = (int8_t)MCQ_MIN(127, mcq_nearest_int(iscale * scales[ib]));
    const float d16 = mcq_get_f16(y + 208);
    for (int j = 0; j < 16; ++j) {
        float d = d16 * sc[j];
        if (!d) continue;
        for (int ii = 0; ii < 16; ++ii) {
            int l = mcq_nearest_int(x[16 * j + ii] / d);
            l = MCQ_MAX(-32, MCQ_MIN(31, l));
            L[16 * j + ii] = (int8_t)(l + 32);
        }
    }
    uint8_t *ql = y, *qh = y + 128;
    for (int j = 0; j < MCQ_QK_K; j += 128) {
        for (int l = 0; l < 32; ++l) {
            const uint8_t q1 = L[j + l + 0] & 0xF, q2 = L[j + l + 32] & 0xF;
            const uint8_t q3 = L[j + l + 64] & 0xF, q4 = L[j + l + 96] & 0xF;
            ql[l + 0] = (uint8_t)(q1 | (q3 << 4));
            ql[l + 32] = (uint8_t)(q2 | (q4 << 4));
            qh[l] = (uint8_t)((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) |
                              ((L[j + l + 64] >> 4) << 4) | ((L[j + l + 96] >> 4) << 6));
        }
        ql += 64;
        qh += 32;
    }
}

#include "mc_quantize_low.h"

/* ------------------------------------------------------------------------ entry */

/* bytes per block and weights per block of a type this file writes, 0 if none */
static int mcq_block(int type, int *bs) {
    switch (type) {
    case 2: *bs = 32; return 18;
    case 3: *bs = 32; return 20;
    case 6: *bs = 32; return 22;
    case 7: *bs = 32; return 24;
    case 8: *bs = 32; return 34;
    case 10: *bs = 256; return 84;
    case 11: *bs = 256; return 110;
    case 12: *bs = 256; return 144;
    case 13: *bs = 256; return 176;
    case 14: *bs = 256; return 210;
    case 20: *bs = 32; return 18;
    case 23: *bs = 256; return 136;
    default: return 0;
    }
}

/* quantize nrow rows of n_per_row floats into dst; returns the bytes written, or -1 for a
 * type this file does not write or a row length that is not a whole number of blocks */
MC_API int64_t mc_quantize_rows(int type, const float *src, uint8_t *dst, int64_t nrow,
                                 int64_t n_per_row, const float *imatrix) {
    int bs = 0;
    const int ts = mcq_block(type, &bs);
    if (!ts || n_per_row <= 0 || n_per_row % bs) return -1;
    const int64_t nb = n_per_row / bs, row_bytes = nb * ts;
    for (int64_t r = 0; r < nrow; ++r) {
        const float *x = src + r * n_per_row;
        uint8_t *y = dst + r * row_bytes;
        if (imatrix && (type == 2 || type == 3 || type == 6 || type == 7)) {
            mcq_legacy_imatrix_row(type, x, y, n_per_row, imatrix);
            continue;
        }
        for (int64_t i = 0; i < nb; ++i) {
            const float *xb = x + i * bs;
            uint8_t *yb = y + i * ts;
            const float *qw = imatrix ? imatrix + i * bs : NULL;
            switch (type) {
            case 2: mcq_q4_0_ref(xb, yb, 1); break;
            case 3: mcq_q4_1_ref(xb, yb, 1); break;
            case 6: mcq_q5_0_ref(xb, yb, 1); break;
            case 7: mcq_q5_1_ref(xb, yb, 1); break;
            case 8: mcq_q8_0_ref(xb, yb, 1); break;
            case 12: mcq_qk45_block(15, xb, yb, qw); break;
            case 13: mcq_qk45_block(31, xb, yb, qw); break;
            case 10: mcq_q2_k_block(xb, yb, qw); break;
            case 11: mcq_q3_k_block(xb, yb, qw); break;
            case 20: mcq_iq4_block(32, xb, yb, yb + 2, NULL, NULL, qw); break;
            case 23: mcq_iq4_block(256, xb, yb, yb + 8, yb + 2, yb + 4, qw); break;
            default: mcq_q6_k_block(xb, yb, qw); break;
            }
        }
    }
    return nrow * row_bytes;
}

#endif /* MC_QUANTIZE_H */
