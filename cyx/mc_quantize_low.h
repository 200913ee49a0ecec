/* Pack-time quantizers of the low-bit types, bit for bit as ggml's (ggml-quants.c:
 * quantize_q2_K, quantize_q3_K, quantize_iq4_nl, quantize_iq4_xs): the same float32 operations
 * in the same order.  Included by mc_quantize.h, whose helpers (mcq_nearest_int,
 * mcq_make_qx_quants, mcq_make_qkx_quants, mcq_make_qp_quants) they share; qw, when not NULL,
 * holds this block's importance weights.
 *
 * Block layouts (see modelc/formats/quants.py):
 *   Q2_K   scales[16] (4-bit scale | 4-bit min << 4), qs[64], d, dmin       84 bytes / 256
 *   Q3_K   hmask[32], qs[64], scales[12] (16 x 6 bits), d                  110 bytes / 256
 *   IQ4_NL d, qs[16]                                                         18 bytes / 32
 *   IQ4_XS d, scales_h (u16), scales_l[4], qs[128]                          136 bytes / 256 */
#ifndef MC_QUANTIZE_LOW_H
#define MC_QUANTIZE_LOW_H

/* ------------------------------------------------------------------------ Q2_K */

/* the 2-bit levels of 16 groups of 16, four to a byte (the layout Q2_K and Q3_K share) */
static void mcq_pack2(const uint8_t *L, uint8_t *qs) {
    for (int j = 0; j < MCQ_QK_K; j += 128)
        for (int l = 0; l < 32; ++l)
            qs[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) |
                                      (L[j + l + 96] << 6));
}

static void mcq_q2_k_block(const float *x, uint8_t *y, const float *qw) {
    uint8_t L[MCQ_QK_K], Laux[16], Ls[16], Lm[16];
    float weights[16], mins[16], scales[16], sw[16];
    uint8_t *sc = y;
    if (!qw) { /* quantize_row_q2_K_ref */
        float max_scale = 0, max_min = 0;
        for (int j = 0; j < 16; ++j) {
            for (int l = 0; l < 16; ++l) weights[l] = fabsf(x[16 * j + l]);
            scales[j] = mcq_make_qkx_quants(0, 16, 3, x + 16 * j, weights, L + 16 * j, &mins[j],
                                            Laux, -0.5f, 0.1f, 15, 1);
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        if (max_scale > 0) {
            const float iscale = 15.f / max_scale;
            for (int j = 0; j < 16; ++j) sc[j] = (uint8_t)mcq_nearest_int(iscale * scales[j]);
            mcq_put_f16(y + 80, max_scale / 15.f);
        } else {
            memset(sc, 0, 16);
            mcq_put_f16(y + 80, 0.f);
        }
        if (max_min > 0) {
            const float iscale = 15.f / max_min;
            for (int j = 0; j < 16; ++j) sc[j] |= (uint8_t)(mcq_nearest_int(iscale * mins[j]) << 4);
            mcq_put_f16(y + 82, max_min / 15.f);
        } else {
            mcq_put_f16(y + 82, 0.f);
        }
    } else { /* quantize_row_q2_K_impl */
        float sumx2 = 0;
        for (int j = 0; j < MCQ_QK_K; ++j) sumx2 += x[j] * x[j];
        const float sigma2 = sumx2 / MCQ_QK_K;
        for (int j = 0; j < 16; ++j) {
            for (int l = 0; l < 16; ++l)
                weights[l] = qw[16 * j + l] * sqrtf(sigma2 + x[16 * j + l] * x[16 * j + l]);
            sw[j] = 0;
            for (int l = 0; l < 16; ++l) sw[j] += weights[l];
            scales[j] = mcq_make_qkx_quants(1, 16, 3, x + 16 * j, weights, L + 16 * j, &mins[j],
                                            Laux, -0.9f, 0.05f, 36, 0);
        }
        const float dm = mcq_make_qp_quants(16, 15, scales, Ls, sw);
        const float mm = mcq_make_qp_quants(16, 15, mins, Lm, sw);
        mcq_put_f16(y + 80, dm);
        mcq_put_f16(y + 82, mm);
        for (int j = 0; j < 16; ++j) sc[j] = (uint8_t)(Ls[j] | (Lm[j] << 4));
    }
    const float d16 = mcq_get_f16(y + 80), dmin16 = mcq_get_f16(y + 82);
    for (int j = 0; j < 16; ++j) {
        const float d = d16 * (sc[j] & 0xF);
        if (!d) continue;
        const float dm = dmin16 * (sc[j] >> 4);
        for (int ii = 0; ii < 16; ++ii) {
            int l = mcq_nearest_int((x[16 * j + ii] + dm) / d);
            L[16 * j + ii] = (uint8_t)MCQ_MAX(0, MCQ_MIN(3, l));
        }
    }
    mcq_pack2(L, y + 16);
}

/* ------------------------------------------------------------------------ Q3_K */

/* symmetric levels -nmax..nmax-1 (stored + nmax), weights x*x (ggml's make_q3_quants) */
static float mcq_make_q3_quants(int n, int nmax, const float *x, int8_t *L, int do_rmse) {
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
    if (do_rmse) {
        float sumlx = 0, suml2 = 0;
        for (int i = 0; i < n; ++i) {
            int l = mcq_nearest_int(iscale * x[i]);
            l = MCQ_MAX(-nmax, MCQ_MIN(nmax - 1, l));
            L[i] = (int8_t)l;
            float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        for (int itry = 0; itry < 5; ++itry) {
            int n_changed = 0;
            for (int i = 0; i < n; ++i) {
                float w = x[i] * x[i];
                float slx = sumlx - w * x[i] * L[i];
                if (slx > 0) {
                    float sl2 = suml2 - w * L[i] * L[i];
                    int new_l = mcq_nearest_int(x[i] * sl2 / slx);
                    new_l = MCQ_MAX(-nmax, MCQ_MIN(nmax - 1, new_l));
                    if (new_l != L[i]) {
                        slx += w * x[i] * new_l;
                        sl2 += w * new_l * new_l;
                        if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                            L[i] = (int8_t)new_l;
                            sumlx = slx;
                            suml2 = sl2;
                            ++n_changed;
                        }
                    }
                }
            }
            if (!n_changed) break;
        }
        for (int i = 0; i < n; ++i) L[i] = (int8_t)(L[i] + nmax);
        return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
    }
    for (int i = 0; i < n; ++i) {
        int l = mcq_nearest_int(iscale * x[i]);
        L[i] = (int8_t)(MCQ_MAX(-nmax, MCQ_MIN(nmax - 1, l)) + nmax);
    }
    return 1 / iscale;
}

/* a 6-bit scale (0..63) into Q3_K's 12 scale bytes (which start zeroed) */
static inline void mcq_q3_put_scale(uint8_t *sc12, int j, int l) {
    if (j < 8) sc12[j] = (uint8_t)(l & 0xF);
    else sc12[j - 8] |= (uint8_t)((l & 0xF) << 4);
    l >>= 4;
    sc12[j % 4 + 8] |= (uint8_t)(l << (2 * (j / 4)));
}

static void mcq_q3_k_block(const float *x, uint8_t *y, const float *qw) {
    int8_t L[MCQ_QK_K], Ls[16];
    float scales[16], weights[16], sw[16];
    uint8_t *hmask = y, *sc12 = y + 96;
    memset(sc12, 0, 12);
    if (!qw) { /* quantize_row_q3_K_ref */
        float max_scale = 0, amax = 0;
        for (int j = 0; j < 16; ++j) {
            scales[j] = mcq_make_q3_quants(16, 4, x + 16 * j, L + 16 * j, 1);
            float scale = fabsf(scales[j]);
            if (scale > amax) { amax = scale; max_scale = scales[j]; }
        }
        if (max_scale) {
            const float iscale = -32.f / max_scale;
            for (int j = 0; j < 16; ++j) {
                int8_t l = (int8_t)mcq_nearest_int(iscale * scales[j]);
                l = (int8_t)(MCQ_MAX(-32, MCQ_MIN(31, l)) + 32);
                mcq_q3_put_scale(sc12, j, l);
            }
            mcq_put_f16(y + 108, 1 / iscale);
        } else {
            mcq_put_f16(y + 108, 0.f);
        }
    } else { /* quantize_row_q3_K_impl */
        float sumx2 = 0;
        for (int j = 0; j < MCQ_QK_K; ++j) sumx2 += x[j] * x[j];
        const float sigma2 = 2 * sumx2 / MCQ_QK_K;
        for (int j = 0; j < 16; ++j) {
            for (int l = 0; l < 16; ++l)
                weights[l] = qw[16 * j + l] * sqrtf(sigma2 + x[16 * j + l] * x[16 * j + l]);
            float sumw = 0;
            for (int l = 0; l < 16; ++l) sumw += weights[l];
            sw[j] = sumw;
            scales[j] = mcq_make_qx_quants(16, 4, x + 16 * j, L + 16 * j, 1, weights);
        }
        const float d_block = mcq_make_qx_quants(16, 32, scales, Ls, 1, sw);
        for (int j = 0; j < 16; ++j) mcq_q3_put_scale(sc12, j, Ls[j]);
        mcq_put_f16(y + 108, d_block);
    }
    const float d16 = mcq_get_f16(y + 108);
    for (int j = 0; j < 16; ++j) {
        int8_t sc = (int8_t)(j < 8 ? sc12[j] & 0xF : sc12[j - 8] >> 4);
        sc = (int8_t)((sc | (((sc12[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32);
        const float d = d16 * sc;
        if (!d) continue;
        for (int ii = 0; ii < 16; ++ii) {
            int l = mcq_nearest_int(x[16 * j + ii] / d);
            L[16 * j + ii] = (int8_t)(MCQ_MAX(-4, MCQ_MIN(3, l)) + 4);
        }
    }
    memset(hmask, 0, 32);
    int m = 0;
    uint8_t hm = 1;
    for (int j = 0; j < MCQ_QK_K; ++j) {
        if (L[j] > 3) {
            hmask[m] |= hm;
            L[j] -= 4;
        }
        if (++m == 32) { m = 0; hm <<= 1; }
    }
    mcq_pack2((const uint8_t *)L, y + 32);
}

/* --------------------------------------------------------------- IQ4_NL IQ4_XS */

static const int8_t mcq_kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                             1,    13,   25,  38,  53,  69,  89,  113};

static inline int mcq_best_index_int8(int n, const int8_t *val, float x) {
    if (x <= val[0]) return 0;
    if (x >= val[n - 1]) return n - 1;
    int ml = 0, mu = n - 1;
    while (mu - ml > 1) {
        int mav = (ml + mu) / 2;
        if (x < val[mav]) mu = mav; else ml = mav;
    }
    return x - val[mu - 1] < val[mu] - x ? mu - 1 : mu;
}

/* one IQ4_NL block (sbs 32) or IQ4_XS super-block (sbs 256) of groups of 32, as
 * quantize_row_iq4_nl_impl with ntry 7 (what ggml_quantize_chunk runs); d, q4: the block's
 * f16 scale and nibbles; scales_h, scales_l: IQ4_XS's 6-bit group scales */
static void mcq_iq4_block(int sbs, const float *x, uint8_t *d_out, uint8_t *q4,
                          uint8_t *scales_h_out, uint8_t *scales_l, const float *qw) {
    const int8_t *values = mcq_kvalues_iq4nl;
    const int ntry = 7;
    uint8_t L[MCQ_QK_K];
    float scales[MCQ_QK_K / 32], weight[32];
    float sigma2 = 0;
    for (int j = 0; j < sbs; ++j) sigma2 += x[j] * x[j];
    sigma2 *= 2.f / sbs;
    memset(q4, 0, sbs / 2);
    mcq_put_f16(d_out, 0.f);
    float max_scale = 0, amax_scale = 0;
    for (int ib = 0; ib < sbs / 32; ++ib) {
        const float *xb = x + ib * 32;
        uint8_t *Lb = L + ib * 32;
        if (qw) {
            for (int j = 0; j < 32; ++j) weight[j] = qw[ib * 32 + j] * sqrtf(sigma2 + xb[j] * xb[j]);
        } else {
            for (int j = 0; j < 32; ++j) weight[j] = xb[j] * xb[j];
        }
        float amax = 0, max = 0;
        for (int j = 0; j < 32; ++j) {
            float ax = fabsf(xb[j]);
            if (ax > amax) { amax = ax; max = xb[j]; }
        }
        if (amax < MCQ_EPS) {
            scales[ib] = 0;
            continue;
        }
        float d = ntry > 0 ? -max / values[0] : max / values[0];
        float id = 1 / d;
        float sumqx = 0, sumq2 = 0;
        for (int j = 0; j < 32; ++j) {
            float al = id * xb[j];
            int l = mcq_best_index_int8(16, values, al);
            Lb[j] = (uint8_t)l;
            float q = values[l];
            float w = weight[j];
            sumqx += w * q * xb[j];
            sumq2 += w * q * q;
        }
        d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
        float best = d * sumqx;
        for (int itry = -ntry; itry <= ntry; ++itry) {
            id = (itry + values[0]) / max;
            sumqx = sumq2 = 0;
            for (int j = 0; j < 32; ++j) {
                float al = id * xb[j];
                int l = mcq_best_index_int8(16, values, al);
                float q = values[l];
                float w = weight[j];
                sumqx += w * q * xb[j];
                sumq2 += w * q * q;
            }
            if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
                d = sumqx / sumq2;
                best = d * sumqx;
            }
        }
        scales[ib] = d;
        float abs_d = fabsf(d);
        if (abs_d > amax_scale) { amax_scale = abs_d; max_scale = d; }
    }
    if (sbs / 32 > 1) {
        uint16_t scales_h = 0;
        float d = -max_scale / 32;
        mcq_put_f16(d_out, d);
        float id = d ? 1 / d : 0.f;
        for (int ib = 0; ib < sbs / 32; ++ib) {
            int l = mcq_nearest_int(id * scales[ib]);
            l = MCQ_MAX(-32, MCQ_MIN(31, l));
            float dl = d * l;
            float idl = dl ? 1 / dl : 0.f;
            uint8_t *Lb = L + ib * 32;
            const float *xb = x + ib * 32;
            for (int j = 0; j < 32; ++j) Lb[j] = (uint8_t)mcq_best_index_int8(16, values, idl * xb[j]);
            l += 32;
            uint8_t l_l = (uint8_t)(l & 0xf), l_h = (uint8_t)(l >> 4);
            if (ib % 2 == 0) scales_l[ib / 2] = l_l;
            else scales_l[ib / 2] |= (uint8_t)(l_l << 4);
            scales_h |= (uint16_t)(l_h << 2 * (ib % 8));
        }
        memcpy(scales_h_out, &scales_h, 2);
    } else {
        mcq_put_f16(d_out, scales[0]);
        float id = scales[0] ? 1 / scales[0] : 0;
        for (int j = 0; j < sbs; ++j) L[j] = (uint8_t)mcq_best_index_int8(16, values, id * x[j]);
    }
    for (int i = 0; i < sbs / 32; ++i)
        for (int j = 0; j < 16; ++j) q4[16 * i + j] = (uint8_t)(L[32 * i + j] | (L[32 * i + 16 + j] << 4));
}

#endif /* MC_QUANTIZE_LOW_H */
