/* Int8 GEMM for AVX512-VNNI (on 256-bit registers), two designs; the repacked one also
 * for AVX2 without VNNI (vpmaddubsw + vpmaddwd for vpdpbusd, the same exact ints):
 *
 * Repacked (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, IQ4_XS, MXFP4; Q2_K to Q6_K in mc_gemm_kx8.h; every x row
 * count).  The weights are copied once, 8 rows to a
 * group and interleaved by dword (mc_q41x8, mc_q80x8: same size as the original), so
 * one 32-byte load holds 4 columns of 8 rows; Q4_1's nibbles are split in registers.
 * The weights are then vpdpbusd's vector operand (lane j: weight row j) and each
 * activation row's dword its broadcast operand, folded into the instruction; a block of
 * 8 weight rows x up to 8 activation rows takes 64 vpdpbusd and no unpacking through
 * memory.  ~1.6-1.8x the unpacking GEMM below at 8 rows, and faster at 1-4 rows too.
 *
 * Unpacking (Q4_0, Q5_0, and weights without a repacked copy; 5+ x rows): 4 weight rows
 * x 8 activation rows per inner step.
 *
 * Layout.  A tile's weight rows are first unpacked, 4 at a time, into a small buffer
 * of unsigned bytes in element order (q + c: c = 8 for Q4_0, 16 for Q5_0, 128 for
 * Q8_0, 0 for Q4_1) with their block scales as float.  The activations are packed
 * once per call, 8 rows to a group (mc_q8t8): for block i, vector p holds elements
 * 4p..4p+3 of rows 0..7, row j in dword lane j.  One vpdpbusd of a broadcast weight
 * dword against vector p then adds 4 products to each of the 8 rows' sums, so 8 of
 * them give the 8 exact block sums in the 8 lanes: no horizontal adds, and each
 * activation vector serves 4 weight rows from a register.
 *
 * Arithmetic.  The same as every other 32-element kernel (mc_quant_x86.h): per row
 * and block the exact integer sum s (here sum((q + c) x) - c sum(x)), then
 * acc = fma(dw * dx, (float)s, acc) in block order, Q4_1's sum(mw * sx) kept apart
 * and added at the end; so a row's result is bit-identical to the single-row path.
 */
#ifndef MC_GEMM_VNNI_H
#define MC_GEMM_VNNI_H

#include "mc_dot_avx2.h"

/* the unsigned-weight offset c of each type, and its sum term c * sum(x) */
static inline int mc_gemm_offset(int t) {
    return t == MC_Q4_0 ? 8 : t == MC_Q5_0 ? 16 : t == MC_Q8_0 ? 128 : 0;
}

static inline int mc_gemm_type(int t) {
    return t == MC_Q4_0 || t == MC_Q4_1 || t == MC_Q5_0 || t == MC_Q8_0;
}

/* Bytes of 8 repacked rows per 32 columns (mc_q41x8 / mc_q80x8; the K-quants: an eighth of
 * mc_q2kx8 .. mc_q6kx8, which cover 256 columns); 0: type not repacked */
MC_API size_t mc_repack_block_bytes(int t) {
    switch (t) {
    case MC_Q4_1: return sizeof(mc_q41x8);
    case MC_Q8_0: return sizeof(mc_q80x8);
    case MC_Q4_K: return sizeof(mc_q4kx8) / 8;
    case MC_Q3_K: return sizeof(mc_q3kx8) / 8;
    case MC_Q2_K: return sizeof(mc_q2kx8) / 8;
    case MC_IQ4_NL: case MC_Q4_0: return sizeof(mc_iq4nlx8);
    case MC_MXFP4: return sizeof(mc_mxfp4x8);
    case MC_Q5_0: return sizeof(mc_q50x8);
    case MC_Q5_1: return sizeof(mc_q51x8);
    case MC_IQ4_XS: return sizeof(mc_iq4xsx8) / 8;
    case MC_Q5_K: return sizeof(mc_q5kx8) / 8;
    case MC_Q6_K: return sizeof(mc_q6kx8) / 8;
    default: return 0;
    }
}

/* whether the kernels on repacked weights of type t at SIMD level simd take 128 times
 * each x block's int sum (cx): on VNNI those holding the weights as unsigned ints + 128,
 * and Q4_0 and Q5_0 (their - 8, - 16) at both levels */
static inline int mc_repack_cx(int t, int simd) {
    return t == MC_Q4_0 || t == MC_Q5_0 ||
           (simd == MC_SIMD_VNNI && (t == MC_Q8_0 || t == MC_IQ4_NL || t == MC_IQ4_XS || t == MC_MXFP4));
}

/* whether SIMD level simd has kernels for weights of type t repacked: Q4_1, Q8_0, Q2_K
 * to Q6_K, IQ4_NL, IQ4_XS and MXFP4, with VNNI or AVX2 */
MC_API int mc_repack_simd(int t, int simd) {
    return (simd == MC_SIMD_VNNI || simd == MC_SIMD_AVX2) && mc_repack_block_bytes(t) != 0;
}

/* mc_repack_lane for the K-quants: row j of a group of 8 <-> its nsb 256-column blocks */
static void mc_repack_lane_k(int t, uint8_t *row, uint8_t *grp, int j, int nsb, int pack) {
    for (int i = 0; i < nsb; i++) {
        if (t == MC_Q4_K || t == MC_Q5_K) {
            /* Q5_K: Q4_K's fields (its qs 32 bytes further on) and the high bits qh */
            const int q5 = t == MC_Q5_K;
            uint8_t *b = row + (q5 ? 176 : 144) * (size_t)i, *bq = b + (q5 ? 48 : 16);
            mc_q4kx8 *o4 = (mc_q4kx8 *)grp + i;
            mc_q5kx8 *o5 = (mc_q5kx8 *)grp + i;
            uint16_t *d = q5 ? o5->d : o4->d, *dmin = q5 ? o5->dmin : o4->dmin;
            uint8_t(*sc)[8] = q5 ? o5->sc : o4->sc, (*mn)[8] = q5 ? o5->mn : o4->mn;
            uint8_t(*qs)[256] = q5 ? o5->qs : o4->qs;
            if (pack) {
                memcpy(&d[j], b, 2);
                memcpy(&dmin[j], b + 2, 2);
                for (int s = 0; s < 8; s++) mc_q4k_scale_min(s, b + 4, &sc[s][j], &mn[s][j]);
            } else {
                memcpy(b, &d[j], 2);
                memcpy(b + 2, &dmin[j], 2);
                uint8_t *q = b + 4; /* the 6-bit scales and mins packed back (every bit used) */
                for (int s = 0; s < 4; s++) {
                    q[s] = (uint8_t)(sc[s][j] | ((sc[s + 4][j] >> 4) << 6));
                    q[s + 4] = (uint8_t)(mn[s][j] | ((mn[s + 4][j] >> 4) << 6));
                    q[s + 8] = (uint8_t)((sc[s + 4][j] & 0xF) | ((mn[s + 4][j] & 0xF) << 4));
                }
            }
            for (int c = 0; c < 4; c++)
                for (int v = 0; v < 8; v++) {
                    uint8_t *p = qs[c] + 32 * v + 4 * j, *q = bq + 32 * c + 4 * v;
                    if (pack) memcpy(p, q, 4);
                    else memcpy(q, p, 4);
                }
            if (q5)
                for (int v = 0; v < 8; v++) {
                    uint8_t *p = o5->qh + 32 * v + 4 * j, *q = b + 16 + 4 * v;
                    if (pack) memcpy(p, q, 4);
                    else memcpy(q, p, 4);
                }
        } else if (t == MC_IQ4_XS) { /* d, the scales unpacked to int8, the nibbles */
            mc_iq4xsx8 *o = (mc_iq4xsx8 *)grp + i;
            uint8_t *b = row + 136 * (size_t)i;
            if (pack) {
                memcpy(&o->d[j], b, 2);
                for (int s = 0; s < 8; s++) o->sc[s][j] = (int8_t)mc_iq4xs_scale(b, s);
            } else { /* the 6-bit scales packed back (every bit of scales_h / scales_l used) */
                memcpy(b, &o->d[j], 2);
                uint16_t sh = 0;
                for (int s = 0; s < 8; s++) {
                    const int ls = o->sc[s][j] + 32;
                    sh = (uint16_t)(sh | ((ls >> 4) << (2 * s)));
                    if (s % 2 == 0) b[4 + s / 2] = (uint8_t)(ls & 0xF);
                    else b[4 + s / 2] = (uint8_t)(b[4 + s / 2] | ((ls & 0xF) << 4));
                }
                memcpy(b + 2, &sh, 2);
            }
            for (int s = 0; s < 8; s++)
                for (int v = 0; v < 4; v++) {
                    uint8_t *p = o->qs[s] + 32 * v + 4 * j, *q = b + 8 + 16 * s + 4 * v;
                    if (pack) memcpy(p, q, 4);
                    else memcpy(q, p, 4);
                }
        } else if (t == MC_Q2_K) { /* the stored bytes, moved: d, dmin, scales, crumbs */
            mc_q2kx8 *o = (mc_q2kx8 *)grp + i;
            uint8_t *b = row + 84 * (size_t)i;
            uint8_t *f[2] = {(uint8_t *)&o->d[j], (uint8_t *)&o->dmin[j]};
            for (int h = 0; h < 2; h++) {
                if (pack) memcpy(f[h], b + 80 + 2 * h, 2);
                else memcpy(b + 80 + 2 * h, f[h], 2);
            }
            for (int s = 0; s < 16; s++) {
                if (pack) o->sc[s][j] = b[s];
                else b[s] = o->sc[s][j];
            }
            for (int v = 0; v < 8; v++)
                for (int n = 0; n < 2; n++) {
                    uint8_t *p = o->qs[n] + 32 * v + 4 * j, *q = b + 16 + 32 * n + 4 * v;
                    if (pack) memcpy(p, q, 4);
                    else memcpy(q, p, 4);
                }
        } else if (t == MC_Q3_K) {
            mc_q3kx8 *o = (mc_q3kx8 *)grp + i;
            uint8_t *b = row + 110 * (size_t)i;
            if (pack) {
                int8_t sc[16];
                memcpy(&o->d[j], b + 108, 2);
                mc_q3k_scales(b + 96, sc);
                for (int s = 0; s < 16; s++) o->sc[s][j] = sc[s];
            } else { /* the 6-bit scales packed back (every bit used): mc_q3k_scales undone */
                uint8_t *q = b + 96;
                memcpy(b + 108, &o->d[j], 2);
                memset(q, 0, 12);
                for (int s = 0; s < 16; s++) {
                    const int u = o->sc[s][j] + 32;
                    q[s % 8] |= (uint8_t)((u & 0xF) << (4 * (s / 8)));
                    q[8 + s % 4] |= (uint8_t)((u >> 4) << (2 * (s / 4)));
                }
            }
            for (int v = 0; v < 8; v++) {
                uint8_t *p = o->hm + 32 * v + 4 * j, *q = b + 4 * v;
                if (pack) memcpy(p, q, 4);
                else memcpy(q, p, 4);
                for (int n = 0; n < 2; n++) {
                    p = o->qs[n] + 32 * v + 4 * j;
                    q = b + 32 + 32 * n + 4 * v;
                    if (pack) memcpy(p, q, 4);
                    else memcpy(q, p, 4);
                }
            }
        } else { /* MC_Q6_K */
            mc_q6kx8 *o = (mc_q6kx8 *)grp + i;
            uint8_t *b = row + 210 * (size_t)i;
            if (pack) memcpy(&o->d[j], b + 208, 2);
            else memcpy(b + 208, &o->d[j], 2);
            for (int s = 0; s < 16; s++) {
                if (pack) o->sc[s][j] = (int8_t)b[192 + s];
                else b[192 + s] = (uint8_t)o->sc[s][j];
            }
            for (int v = 0; v < 8; v++)
                for (int n = 0; n < 2; n++) {
                    for (int h = 0; h < 2; h++) {
                        uint8_t *p = MC_Q6_QL(o, n, h, v) + 4 * j, *q = b + 64 * n + 32 * h + 4 * v;
                        if (pack) memcpy(p, q, 4);
                        else memcpy(q, p, 4);
                    }
                    uint8_t *p = MC_Q6_QH(o, n, v) + 4 * j, *q = b + 128 + 32 * n + 4 * v;
                    if (pack) memcpy(p, q, 4);
                    else memcpy(q, p, 4);
                }
        }
    }
}

/* Move one row of K / 32 blocks between its original bytes `row` and lane j of a
 * repacked group `grp` (mc_gemm_repack's layout), either way (`pack`): the scale (and
 * Q4_1's min) and dword v of the ints (Q4_1: 4 bytes of nibbles; Q8_0: 4 ints, stored
 * as unsigned q + 128) into / out of vector v. */
static void mc_repack_lane(int t, uint8_t *row, uint8_t *grp, int j, int nb, int pack) {
    if (t == MC_Q2_K || t == MC_Q3_K || t == MC_Q4_K || t == MC_Q5_K || t == MC_Q6_K || t == MC_IQ4_XS) {
        mc_repack_lane_k(t, row, grp, j, nb / 8, pack);
        return;
    }
    /* Q4_1, Q4_0, IQ4_NL, MXFP4 and Q5_0: 4 vectors of nibbles (Q5_0's high bits apart);
     * Q8_0 8 of ints, flipped to unsigned */
    const int q41 = t == MC_Q4_1, q51 = t == MC_Q5_1, q50 = t == MC_Q5_0 || q51;
    const int mx = t == MC_MXFP4, nl = t == MC_IQ4_NL || t == MC_Q4_0 || mx;
    const int bs = q41 ? 20 : q51 ? 24 : q50 ? 22 : mx ? 17 : nl ? 18 : 34;
    const int nv = q41 || nl || q50 ? 4 : 8, hb = q41 ? 4 : q51 ? 8 : q50 ? 6 : mx ? 1 : 2;
    const int sb = mx ? 1 : 2; /* bytes of a row's scale: E8M0 or f16 */
    const int at = q51 ? 4 : 2; /* Q5_0's / Q5_1's high bits */
    const uint8_t flip = q41 || nl || q50 ? 0 : 0x80;
    const size_t ob = mc_repack_block_bytes(t);
    for (int i = 0; i < nb; i++) {
        uint8_t *o = grp + ob * (size_t)i, *b = row + (size_t)bs * i;
        uint8_t *d = mx ? ((mc_mxfp4x8 *)o)->e + j
                        : (uint8_t *)(q41 ? ((mc_q41x8 *)o)->d
                                      : q51 ? ((mc_q51x8 *)o)->d
                                      : q50 ? ((mc_q50x8 *)o)->d
                                      : nl  ? ((mc_iq4nlx8 *)o)->d
                                            : ((mc_q80x8 *)o)->d) + 2 * j;
        if (q50 && pack) memcpy(((mc_q50x8 *)o)->qh + 4 * j, b + at, 4);
        if (q50 && !pack) memcpy(b + at, ((mc_q50x8 *)o)->qh + 4 * j, 4);
        uint8_t *m = q41 ? (uint8_t *)((mc_q41x8 *)o)->m + 2 * j : q51 ? (uint8_t *)((mc_q51x8 *)o)->m + 2 * j : NULL;
        if (pack) {
            memcpy(d, b, sb);
            if (m != NULL) memcpy(m, b + 2, 2);
        } else {
            memcpy(b, d, sb);
            if (m != NULL) memcpy(b + 2, m, 2);
        }
        for (int v = 0; v < nv; v++)
            for (int k = 0; k < 4; k++) {
                uint8_t *p = o + 32 * v + 4 * j + k, *q = b + hb + 4 * v + k;
                if (pack) *p = *q ^ flip;
                else *q = *p ^ flip;
            }
    }
}

/* Q4_1 or Q8_0 rows (`st` bytes apart) repacked 8 at a time (out: ceil(M / 8) groups of
 * K / 32 blocks of mc_repack_block_bytes(t); a last group past row M - 1 repeats that
 * row), as the repacked kernels read them. */
MC_API void mc_gemm_repack(int t, const uint8_t *W, int64_t st, int M, int K, void *out) {
    const int nb = K / 32;
    for (int g = 0; g < (M + 7) / 8; g++)
        for (int j = 0; j < 8; j++)
            mc_repack_lane(t, (uint8_t *)W + (size_t)st * (size_t)mc_imin(8 * g + j, M - 1),
                           (uint8_t *)out + mc_repack_block_bytes(t) * (size_t)g * nb, j, nb, 1);
}

/* Row r of repacked weights (mc_gemm_repack) back in its original bytes, into row. */
static void mc_repack_row(int t, const void *rp, int K, int r, uint8_t *row) {
    const int nb = K / 32;
    mc_repack_lane(t, row, (uint8_t *)rp + mc_repack_block_bytes(t) * (size_t)(r / 8) * nb, r % 8,
                   nb, 0);
}

#if defined(MC_X86)

/* acc += dpbusd(x, the dword at p broadcast): the broadcast as the instruction's own
 * {1to8} memory operand (GCC 12 does not fold _mm256_set1_epi32 into it) */
MC_VNNI static inline __attribute__((always_inline)) __m256i
mc_dpbusd_bcst(__m256i acc, __m256i x, const int32_t *p) {
    __asm__("vpdpbusd %2%{1to8%}, %1, %0" : "+v"(acc) : "v"(x), "m"(*p));
    return acc;
}

/* x0 .. x7: the 8 activation vectors of block xb (mc_q8t8) */
#define MC_GEMM_LOAD_X(xb)                                                                         \
    const __m256i x0 = _mm256_load_si256((const __m256i *)(xb)->q[0]);                             \
    const __m256i x1 = _mm256_load_si256((const __m256i *)(xb)->q[1]);                             \
    const __m256i x2 = _mm256_load_si256((const __m256i *)(xb)->q[2]);                             \
    const __m256i x3 = _mm256_load_si256((const __m256i *)(xb)->q[3]);                             \
    const __m256i x4 = _mm256_load_si256((const __m256i *)(xb)->q[4]);                             \
    const __m256i x5 = _mm256_load_si256((const __m256i *)(xb)->q[5]);                             \
    const __m256i x6 = _mm256_load_si256((const __m256i *)(xb)->q[6]);                             \
    const __m256i x7 = _mm256_load_si256((const __m256i *)(xb)->q[7])

/* Weight rows between the rows being unpacked and those prefetched (measured on SmolLM2's
 * layers at 8 x rows: 4 and 8 best, 0 -37%, 16-128 -6 to -14%). */
#ifndef MC_GEMM_AHEAD
#define MC_GEMM_AHEAD 4
#endif

/* Bytes of one unpacked row: blocks in pairs, each pair 64 bytes
 * [elements 0-15 of block 2i | 0-15 of 2i+1 | 16-31 of 2i | 16-31 of 2i+1]. */
static inline size_t mc_gemm_row_bytes(int nb) { return (size_t)32 * (size_t)(nb + (nb & 1)); }

/* two 16-byte pieces into one vector: p0 low, p1 high */
MC_VNNI static inline __m256i mc_gemm_pair16(const uint8_t *p0, const uint8_t *p1) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)p0)),
                                   _mm_loadu_si128((const __m128i *)p1), 1);
}

static inline int mc_gemm_block_bytes(int t) {
    return t == MC_Q4_1 ? 20 : t == MC_Q4_0 ? 18 : t == MC_Q5_0 ? 22 : 34;
}

/* Unpack blocks i and i + 1 (i itself again when i + 1 == nb) of one weight row of
 * type t: the ints as unsigned q + c into the pair's 64 bytes at o + 32 i, the scales
 * into d[i], d[i + 1] and, for Q4_1, the mins into m[i], m[i + 1]. */
MC_VNNI static inline __attribute__((always_inline)) void
mc_gemm_unpack_pair(int t, const uint8_t *row, int i, int nb, uint8_t *o, float *d, float *m) {
    const int bs = mc_gemm_block_bytes(t), i1 = i + 1 < nb ? i + 1 : i;
    const uint8_t *b0 = row + (size_t)bs * i, *b1 = row + (size_t)bs * i1;
    const __m256i m4 = _mm256_set1_epi8(0xF);
    __m256i lo, hi;
    d[i] = mc_h16(b0), d[i1] = mc_h16(b1);
    switch (t) {
    case MC_Q4_1: {
        m[i] = mc_h16(b0 + 2), m[i1] = mc_h16(b1 + 2);
        const __m256i q = mc_gemm_pair16(b0 + 4, b1 + 4);
        lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        break;
    }
    case MC_Q4_0: {
        const __m256i q = mc_gemm_pair16(b0 + 2, b1 + 2);
        lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        break;
    }
    case MC_Q5_0: { /* each block's 32 ints [0-15 | 16-31], then regrouped */
        const __m256i h = _mm256_set1_epi8(0x10);
        const __m256i q0 = _mm256_or_si256(mc_nibbles32(b0 + 6), _mm256_and_si256(mc_bits32(b0 + 2), h));
        const __m256i q1 = _mm256_or_si256(mc_nibbles32(b1 + 6), _mm256_and_si256(mc_bits32(b1 + 2), h));
        lo = _mm256_permute2x128_si256(q0, q1, 0x20), hi = _mm256_permute2x128_si256(q0, q1, 0x31);
        break;
    }
    default: { /* MC_Q8_0: signed -> + 128 */
        const __m256i c80 = _mm256_set1_epi8((char)0x80);
        lo = _mm256_xor_si256(mc_gemm_pair16(b0 + 2, b1 + 2), c80);
        hi = _mm256_xor_si256(mc_gemm_pair16(b0 + 18, b1 + 18), c80);
        break;
    }
    }
    _mm256_store_si256((__m256i *)(o + 32 * (size_t)i), lo);
    _mm256_store_si256((__m256i *)(o + 32 * (size_t)i + 32), hi);
}

/* Unpack weight rows w[0..3] (`st` bytes apart; rows past `nr` repeat the last) of type
 * t: their ints as unsigned q + c into wb (4 rows of mc_gemm_row_bytes(nb); an odd last
 * block is paired with itself), block scales into dw and, for Q4_1, mins into mw (4
 * rows of nb floats). */
MC_VNNI static void mc_gemm_unpack4(int t, const uint8_t *w, size_t st, int nr, int nb,
                                    uint8_t *wb, float *dw, float *mw) {
    const size_t ws = mc_gemm_row_bytes(nb);
    for (int u = 0; u < 4; u++) {
        const uint8_t *row = w + st * (size_t)(u < nr ? u : nr - 1);
        for (int i = 0; i < nb; i += 2)
            mc_gemm_unpack_pair(t, row, i, nb, wb + (size_t)u * ws, dw + (size_t)u * nb,
                                mw + (size_t)u * nb);
    }
}

/* Pack 8 activation rows (mc_q8 blocks, `xstride` bytes apart; rows past `nr` are
 * zero) into nb mc_q8t8 blocks, with cs = c * sum(x) for the weight offset c: per
 * block an 8 x 8 transpose of the rows' dwords. */
MC_VNNI static void mc_gemm_pack8(const void *xbase, size_t xstride, int nr, int nb, int c,
                                  mc_q8t8 *out) {
    const __m256i ones = _mm256_set1_epi8(1), cv = _mm256_set1_epi32(c);
    for (int i = 0; i < nb; i++) {
        mc_q8t8 *o = out + i;
        __m256i r[8];
        for (int j = 0; j < 8; j++) {
            if (j < nr) {
                const mc_q8 *xb = (const mc_q8 *)((const char *)xbase + xstride * (size_t)j) + i;
                r[j] = _mm256_loadu_si256((const __m256i *)xb->qs);
                o->d[j] = xb->d;
                o->s[j] = xb->s;
            } else {
                r[j] = _mm256_setzero_si256();
                o->d[j] = 0.0f;
                o->s[j] = 0.0f;
            }
        }
        const __m256i t0 = _mm256_unpacklo_epi32(r[0], r[1]), t1 = _mm256_unpackhi_epi32(r[0], r[1]);
        const __m256i t2 = _mm256_unpacklo_epi32(r[2], r[3]), t3 = _mm256_unpackhi_epi32(r[2], r[3]);
        const __m256i t4 = _mm256_unpacklo_epi32(r[4], r[5]), t5 = _mm256_unpackhi_epi32(r[4], r[5]);
        const __m256i t6 = _mm256_unpacklo_epi32(r[6], r[7]), t7 = _mm256_unpackhi_epi32(r[6], r[7]);
        const __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
        const __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
        const __m256i u4 = _mm256_unpacklo_epi64(t4, t6), u5 = _mm256_unpackhi_epi64(t4, t6);
        const __m256i u6 = _mm256_unpacklo_epi64(t5, t7), u7 = _mm256_unpackhi_epi64(t5, t7);
        const __m256i p[8] = {
            _mm256_permute2x128_si256(u0, u4, 0x20), _mm256_permute2x128_si256(u1, u5, 0x20),
            _mm256_permute2x128_si256(u2, u6, 0x20), _mm256_permute2x128_si256(u3, u7, 0x20),
            _mm256_permute2x128_si256(u0, u4, 0x31), _mm256_permute2x128_si256(u1, u5, 0x31),
            _mm256_permute2x128_si256(u2, u6, 0x31), _mm256_permute2x128_si256(u3, u7, 0x31),
        };
        __m256i sum = _mm256_setzero_si256(); /* lane j: row j's sum of its 32 ints */
        for (int q = 0; q < 8; q++) {
            _mm256_store_si256((__m256i *)o->q[q], p[q]);
            sum = _mm256_dpbusd_epi32(sum, ones, p[q]);
        }
        _mm256_store_si256((__m256i *)o->cs, _mm256_mullo_epi32(sum, cv));
    }
}

MC_VNNI static inline __attribute__((always_inline)) void
mc_gemm_4x8_body(int t, int nb, const uint8_t *wb, const float *dw, const float *mw,
                 const mc_q8t8 *xg, __m256 res[4], const uint8_t *nw, size_t nst, int nnr,
                 uint8_t *nwb, float *ndw, float *nmw) {
    const int has_min = t == MC_Q4_1, use_cs = !has_min;
    const size_t ws = mc_gemm_row_bytes(nb);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    __m256 m0 = a0, m1 = a0, m2 = a0, m3 = a0;
    for (int i = 0; i < nb; i++) {
        const mc_q8t8 *xb = xg + i;
        MC_GEMM_LOAD_X(xb);
        const __m256 dx = _mm256_load_ps(xb->d);
        const __m256i cs = _mm256_load_si256((const __m256i *)xb->cs);
        const size_t at = (size_t)64 * (i >> 1) + (size_t)16 * (i & 1);
#define MC_G_ROW(u, acc, summ)                                                                 \
    do {                                                                                           \
        const int32_t *wl = (const int32_t *)(wb + (u) * ws + at), *wh = wl + 8;                   \
        __m256i s0 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi32(wl[0]), x0);  \
        __m256i s1 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi32(wl[1]), x1);  \
        s0 = _mm256_dpbusd_epi32(s0, _mm256_set1_epi32(wl[2]), x2);                                \
        s1 = _mm256_dpbusd_epi32(s1, _mm256_set1_epi32(wl[3]), x3);                                \
        s0 = _mm256_dpbusd_epi32(s0, _mm256_set1_epi32(wh[0]), x4);                                \
        s1 = _mm256_dpbusd_epi32(s1, _mm256_set1_epi32(wh[1]), x5);                                \
        s0 = _mm256_dpbusd_epi32(s0, _mm256_set1_epi32(wh[2]), x6);                                \
        s1 = _mm256_dpbusd_epi32(s1, _mm256_set1_epi32(wh[3]), x7);                                \
        __m256i s = _mm256_add_epi32(s0, s1);                                                      \
        if (use_cs) s = _mm256_sub_epi32(s, cs);                                                   \
        acc = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(dw[(u) * nb + i]), dx),                            \
                              _mm256_cvtepi32_ps(s), acc);                                         \
        if (has_min)                                                                               \
            summ = _mm256_add_ps(summ, _mm256_mul_ps(_mm256_set1_ps(mw[(u) * nb + i]),                  \
                                                     _mm256_load_ps(xb->s)));                      \
    } while (0)
        MC_G_ROW(0, a0, m0);
        MC_G_ROW(1, a1, m1);
        MC_G_ROW(2, a2, m2);
        MC_G_ROW(3, a3, m3);
#undef MC_G_ROW
        if (nw != NULL && (i & 1) == 0) /* the next 4 rows' pair, on the other ports */
            for (int u = 0; u < 4; u++) {
                const uint8_t *row = nw + nst * (size_t)(u < nnr ? u : nnr - 1);
                /* and the same bytes MC_GEMM_AHEAD rows on: in cache when their turn comes */
                const char *ahead = (const char *)row + MC_GEMM_AHEAD * nst + (size_t)mc_gemm_block_bytes(t) * i;
                _mm_prefetch(ahead, _MM_HINT_T0);
                _mm_prefetch(ahead + 2 * mc_gemm_block_bytes(t) - 1, _MM_HINT_T0);
                mc_gemm_unpack_pair(t, row, i, nb, nwb + (size_t)u * ws, ndw + (size_t)u * nb,
                                    nmw + (size_t)u * nb);
            }
    }
    if (has_min) {
        a0 = _mm256_add_ps(a0, m0), a1 = _mm256_add_ps(a1, m1);
        a2 = _mm256_add_ps(a2, m2), a3 = _mm256_add_ps(a3, m3);
    }
    res[0] = a0, res[1] = a1, res[2] = a2, res[3] = a3;
}

/* 4 unpacked weight rows (mc_gemm_unpack4) x one group of 8 activation rows;
 * res[u] lane j = weight row u's result for activation row j. */
MC_VNNI static void mc_gemm_4x8(int t, int nb, const uint8_t *wb, const float *dw, const float *mw,
                                const mc_q8t8 *xg, __m256 res[4]) {
    switch (t) { /* one specialized copy per type */
    case MC_Q4_1: mc_gemm_4x8_body(MC_Q4_1, nb, wb, dw, mw, xg, res, NULL, 0, 0, NULL, NULL, NULL); break;
    case MC_Q4_0: mc_gemm_4x8_body(MC_Q4_0, nb, wb, dw, mw, xg, res, NULL, 0, 0, NULL, NULL, NULL); break;
    case MC_Q5_0: mc_gemm_4x8_body(MC_Q5_0, nb, wb, dw, mw, xg, res, NULL, 0, 0, NULL, NULL, NULL); break;
    default: mc_gemm_4x8_body(MC_Q8_0, nb, wb, dw, mw, xg, res, NULL, 0, 0, NULL, NULL, NULL); break;
    }
}

/* mc_gemm_4x8 that also unpacks the next 4 weight rows (nw, `nst` bytes apart, `nnr`
 * of them real) into nwb / ndw / nmw as mc_gemm_unpack4 does: the unpacking runs on
 * the ports the integer dots leave idle. */
MC_VNNI static void mc_gemm_4x8_next(int t, int nb, const uint8_t *wb, const float *dw,
                                     const float *mw, const mc_q8t8 *xg, __m256 res[4],
                                     const uint8_t *nw, size_t nst, int nnr, uint8_t *nwb,
                                     float *ndw, float *nmw) {
#define MC_G_NEXT(T) mc_gemm_4x8_body(T, nb, wb, dw, mw, xg, res, nw, nst, nnr, nwb, ndw, nmw)
    switch (t) {
    case MC_Q4_1: MC_G_NEXT(MC_Q4_1); break;
    case MC_Q4_0: MC_G_NEXT(MC_Q4_0); break;
    case MC_Q5_0: MC_G_NEXT(MC_Q5_0); break;
    default: MC_G_NEXT(MC_Q8_0); break;
    }
#undef MC_G_NEXT
}

/* ---- Kernels on repacked weights (mc_gemm_repack): 8 weight rows x na <= 8 x rows.
 * Each takes the x rows' mc_q8 blocks x[0 .. na - 1] (and, for Q8_0, cx[a][i] = 128 times
 * the int sum of row a's block i) and writes y[a * ldy + j] for weight rows j < nr, with
 * the single-row kernels' arithmetic: the exact block sum s, acc = fma(dw * dx, s, acc)
 * in block order, Q4_1's sum(mw * sx) apart and added last. */
typedef void (*mc_repacked_fn)(int na, int nb, const void *w, const mc_q8 *const x[8],
                               const int32_t *const cx[8], float *y, size_t ldy, int nr);

/* block b's nibbles as unsigned bytes, u[k] to meet the x dword k (elements 4k .. 4k + 3):
 * u[v] the low nibbles (elements 4v + c), u[4 + v] the high (16 + 4v + c); lane j: row j */
MC_AVX2 static inline __attribute__((always_inline)) void mc_q41x8_split(const mc_q41x8 *b,
                                                                         __m256i u[8]) {
    const __m256i m4 = _mm256_set1_epi8(0xF);
    for (int v = 0; v < 4; v++) { /* numpy's arrays: 16-byte alignment */
        const __m256i q = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * v));
        u[v] = _mm256_and_si256(q, m4);
        u[4 + v] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
    }
}

/* sum over k < 8 of vpdpbusd(u[k], the x dword xd[k] broadcast), in two chains */
MC_VNNI static inline __attribute__((always_inline)) __m256i mc_dpbusd8(const __m256i u[8],
                                                                        const int32_t *xd) {
    __m256i s = mc_dpbusd_bcst(_mm256_setzero_si256(), u[0], xd);
    __m256i t = mc_dpbusd_bcst(_mm256_setzero_si256(), u[1], xd + 1);
    for (int k = 2; k < 8; k += 2) {
        s = mc_dpbusd_bcst(s, u[k], xd + k);
        t = mc_dpbusd_bcst(t, u[k + 1], xd + k + 1);
    }
    return _mm256_add_epi32(s, t);
}

/* r (lane j: weight row j) into y[j] for j < nr */
MC_AVX2 static inline __attribute__((always_inline)) void mc_x8_store(__m256 r, float *y, int nr) {
    if (nr == 8) {
        _mm256_storeu_ps(y, r);
    } else {
        float o[8];
        _mm256_storeu_ps(o, r);
        memcpy(y, o, sizeof(float) * (size_t)nr);
    }
}

/* the mins' terms added to f[a] (in block order; the group is in L1 by now), stored */
MC_AVX2 static inline __attribute__((always_inline)) void
mc_q41x8_finish(int nb, const mc_q41x8 *w, const mc_q8 *const x[8], const __m256 f[8], float *y,
                size_t ldy, int nr, const int na) {
    __m256 m[8];
    for (int a = 0; a < na; a++) m[a] = _mm256_setzero_ps();
    for (int i = 0; i < nb; i++) {
        const __m256 mw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)w[i].m));
        for (int a = 0; a < na; a++) m[a] = _mm256_add_ps(m[a], _mm256_mul_ps(mw, _mm256_set1_ps(x[a][i].s)));
    }
    for (int a = 0; a < na; a++) mc_x8_store(_mm256_add_ps(f[a], m[a]), y + (size_t)a * ldy, nr);
}

/* the first 3 cache lines of the block 16 blocks (2.5 KB) ahead: measured on SmolLM2's
 * layers at 1 and 8 x rows, 4 -> 8 blocks -4%, -> 16 another -2 to -4%, 32 no better */
#define MC_Q41X8_PREFETCH(b)                                                                       \
    do {                                                                                           \
        _mm_prefetch((const char *)((b) + 16), _MM_HINT_T0);                                       \
        _mm_prefetch((const char *)((b) + 16) + 64, _MM_HINT_T0);                                  \
        _mm_prefetch((const char *)((b) + 16) + 128, _MM_HINT_T0);                                 \
    } while (0)

/* sum over k < 8 of vpmaddubsw(u[k], the x dword xd[k] broadcast), for nibbles u (each
 * 16-bit lane at most 2 x 15 x 127, the 8 of a block at most 30480: no saturation), then
 * vpmaddwd into the block sums: the AVX2 twin of mc_dpbusd8 for Q4_1 */
MC_AVX2 static inline __attribute__((always_inline)) __m256i mc_maddubs8(const __m256i u[8],
                                                                         const int32_t *xd) {
    __m256i s = _mm256_maddubs_epi16(u[0], _mm256_set1_epi32(xd[0]));
    __m256i t = _mm256_maddubs_epi16(u[1], _mm256_set1_epi32(xd[1]));
    for (int k = 2; k < 8; k += 2) {
        s = _mm256_add_epi16(s, _mm256_maddubs_epi16(u[k], _mm256_set1_epi32(xd[k])));
        t = _mm256_add_epi16(t, _mm256_maddubs_epi16(u[k + 1], _mm256_set1_epi32(xd[k + 1])));
    }
    return _mm256_madd_epi16(_mm256_add_epi16(s, t), _mm256_set1_epi16(1));
}

/* The Q4_1 kernels' body, `dot8` (mc_dpbusd8 or mc_maddubs8) giving the exact block sums
 * of the 8 weight rows for one x row: per block the nibbles split in registers (the
 * weights are the vector operand, each x row's dwords the broadcast one, no unpacking
 * through memory), acc = fma(dw * dx, s, acc), the mins' terms added last. */
#define MC_Q41X8_BODY(dot8)                                                                        \
    const mc_q41x8 *w = (const mc_q41x8 *)wv;                                                      \
    (void)cx;                                                                                      \
    __m256 f[8];                                                                                   \
    for (int a = 0; a < na; a++) f[a] = _mm256_setzero_ps();                                       \
    for (int i = 0; i < nb; i++) {                                                                 \
        const mc_q41x8 *b = w + i;                                                                 \
        MC_Q41X8_PREFETCH(b);                                                                      \
        __m256i u[8];                                                                              \
        mc_q41x8_split(b, u);                                                                      \
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)b->d));                \
        for (int a = 0; a < na; a++) { /* unrolled: the f[a] stay in registers */                 \
            const mc_q8 *xq = x[a] + i;                                                            \
            const __m256i s = dot8(u, (const int32_t *)xq->qs);                                    \
            f[a] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(xq->d)), _mm256_cvtepi32_ps(s), \
                                   f[a]);                                                          \
        }                                                                                          \
    }                                                                                              \
    mc_q41x8_finish(nb, w, x, f, y, ldy, nr, na)

/* Q4_1, VNNI: 64 vpdpbusd a block of 8 x 8, the x dwords folded into the instruction */
MC_VNNI static inline __attribute__((always_inline)) void
mc_gemm_q41x8_body(int nb, const void *wv, const mc_q8 *const x[8], const int32_t *const cx[8],
                   float *y, size_t ldy, int nr, const int na) {
    MC_Q41X8_BODY(mc_dpbusd8);
}

/* Q4_1, AVX2 without VNNI: vpmaddubsw + vpmaddwd into the same exact block sums */
MC_AVX2 static inline __attribute__((always_inline)) void
mc_gemm_q41x8_avx2_body(int nb, const void *wv, const mc_q8 *const x[8],
                        const int32_t *const cx[8], float *y, size_t ldy, int nr, const int na) {
    MC_Q41X8_BODY(mc_maddubs8);
}

/* Q8_0, VNNI (weights stored as unsigned q + 128): the weights are vpdpbusd's vector
 * operand, the x dwords its broadcast one, and 128 sum(x) is taken back. */
MC_VNNI static inline __attribute__((always_inline)) void
mc_gemm_q80x8_body(int nb, const void *wv, const mc_q8 *const x[8], const int32_t *const cx[8],
                   float *y, size_t ldy, int nr, const int na) {
    const mc_q80x8 *w = (const mc_q80x8 *)wv;
    __m256 f[8];
    for (int a = 0; a < na; a++) f[a] = _mm256_setzero_ps();
    for (int i = 0; i < nb; i++) {
        const mc_q80x8 *b = w + i;
        for (int c = 0; c < (int)sizeof *b; c += 64) _mm_prefetch((const char *)(b + 3) + c, _MM_HINT_T0);
        __m256i q[8];
        for (int v = 0; v < 8; v++) q[v] = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * v));
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)b->d));
        for (int a = 0; a < na; a++) {
            const mc_q8 *xq = x[a] + i;
            const __m256i st = _mm256_sub_epi32(mc_dpbusd8(q, (const int32_t *)xq->qs),
                                                _mm256_set1_epi32(cx[a][i]));
            f[a] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(xq->d)), _mm256_cvtepi32_ps(st), f[a]);
        }
    }
    for (int a = 0; a < na; a++) mc_x8_store(f[a], y + (size_t)a * ldy, nr);
}

/* AVX2: sum over k < 8 of the signed levels q[k] times the x dword xd[k] broadcast, by the
 * sign trick (vpmaddubsw(|q|, x with q's signs), each 16-bit pair at most 2 x 127 x 127: no
 * saturation), widened by vpmaddwd before summing: the exact sum (Q8_0's and IQ4_*'s AVX2 kernels) */
MC_AVX2 static inline __attribute__((always_inline)) __m256i mc_signdot8(const __m256i q[8], const __m256i aq[8],
                                                                        const int32_t *xd) {
    __m256i s = _mm256_setzero_si256();
    for (int v = 0; v < 8; v++) {
        const __m256i sx = _mm256_sign_epi8(_mm256_set1_epi32(xd[v]), q[v]);
        s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_maddubs_epi16(aq[v], sx), _mm256_set1_epi16(1)));
    }
    return s;
}

/* Q8_0, AVX2 without VNNI: the signed products by the sign trick, vpmaddubsw(|q|, x with
 * q's signs) (each 16-bit pair at most 2 x 128 x 127: no saturation), widened by vpmaddwd
 * before summing; the exact sum(q x) with no offset to take back (cx unused). */
MC_AVX2 static inline __attribute__((always_inline)) void
mc_gemm_q80x8_avx2_body(int nb, const void *wv, const mc_q8 *const x[8],
                        const int32_t *const cx[8], float *y, size_t ldy, int nr, const int na) {
    const mc_q80x8 *w = (const mc_q80x8 *)wv;
    (void)cx;
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    __m256 f[8];
    for (int a = 0; a < na; a++) f[a] = _mm256_setzero_ps();
    for (int i = 0; i < nb; i++) {
        const mc_q80x8 *b = w + i;
        for (int c = 0; c < (int)sizeof *b; c += 64) _mm_prefetch((const char *)(b + 3) + c, _MM_HINT_T0);
        __m256i q[8], aq[8]; /* the signed ints and their magnitudes */
        for (int v = 0; v < 8; v++) {
            q[v] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(b->qs + 32 * v)), flip);
            aq[v] = _mm256_abs_epi8(q[v]);
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)b->d));
        for (int a = 0; a < na; a++) {
            const mc_q8 *xq = x[a] + i;
            const __m256i s = mc_signdot8(q, aq, (const int32_t *)xq->qs);
            f[a] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(xq->d)), _mm256_cvtepi32_ps(s), f[a]);
        }
    }
    for (int a = 0; a < na; a++) mc_x8_store(f[a], y + (size_t)a * ldy, nr);
}

/* the 8 rows' E8M0 scale bytes e as mc_e8m0_half's floats: 2^(e - 128), bit for bit */
MC_AVX2 static inline __m256 mc_e8m0_half8(const uint8_t *e) {
    const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)e));
    const __m256i norm = _mm256_slli_epi32(_mm256_sub_epi32(v, _mm256_set1_epi32(1)), 23);
    const __m256i sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), v); /* e < 2 */
    return _mm256_castsi256_ps(_mm256_blendv_epi8(norm, sub, _mm256_cmpgt_epi32(_mm256_set1_epi32(2), v)));
}

/* IQ4_NL, IQ4_XS (xs) and MXFP4 (mx) on repacked weights: per 32-column block (IQ4_XS:
 * sub-block) the nibbles as Q4_1's (mc_q41x8_split) mapped through the IQ4 levels (MXFP4:
 * the doubled E2M1 values), the exact block sums, then the single-row kernels' float steps,
 * sum += (d * dx) * s (IQ4_XS: s times the sub-block's scale first; MXFP4: d the halved
 * E8M0 scale).  VNNI (vnni): the levels + 128 as vpdpbusd's unsigned operand and 128 sum(x)
 * (cx) taken back, as Q8_0's; AVX2: mc_signdot8. */
#define MC_IQ4X8_BODY(xs, vnni, mx)                                                                \
    const __m128i lv_ = _mm_loadu_si128((const __m128i *)((mx) ? mc_mxfp4_kvalues : mc_iq4_kvalues)); \
    const __m256i tbl = _mm256_broadcastsi128_si256(vnni ? _mm_xor_si128(lv_, _mm_set1_epi8((char)0x80)) : lv_); \
    const int per = (xs) ? 8 : 1; /* 32-column blocks per repacked block */                        \
    __m256 f[8];                                                                                   \
    for (int a = 0; a < na; a++) f[a] = _mm256_setzero_ps();                                       \
    for (int i = 0; i < nb / per; i++) {                                                           \
        const mc_iq4xsx8 *bx = (xs) ? (const mc_iq4xsx8 *)wv + i : NULL;                           \
        const mc_iq4nlx8 *bn = (xs) || (mx) ? NULL : (const mc_iq4nlx8 *)wv + i;                   \
        const mc_mxfp4x8 *bm = (mx) ? (const mc_mxfp4x8 *)wv + i : NULL;                           \
        const char *ahead = (xs) ? (const char *)(bx + 1) : (mx) ? (const char *)(bm + 4) : (const char *)(bn + 4); \
        const size_t bsz = (xs) ? sizeof *bx : (mx) ? sizeof *bm : sizeof *bn;                     \
        for (size_t c = 0; c < bsz; c += 64) _mm_prefetch(ahead + c, _MM_HINT_T0);                 \
        const __m256 dw = (mx) ? mc_e8m0_half8(bm->e)                                              \
                               : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((xs) ? bx->d : bn->d))); \
        for (int ib = 0; ib < per; ib++) {                                                         \
            __m256i u[8], au[8];                                                                   \
            mc_q41x8_split((const mc_q41x8 *)((xs) ? bx->qs[ib] : (mx) ? bm->qs : bn->qs), u);     \
            for (int v = 0; v < 8; v++) {                                                          \
                u[v] = _mm256_shuffle_epi8(tbl, u[v]);                                             \
                au[v] = vnni ? u[v] : _mm256_abs_epi8(u[v]);                                       \
            }                                                                                      \
            (void)au;                                                                              \
            const __m256i sc = (xs) ? _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)bx->sc[ib])) \
                                    : _mm256_setzero_si256();                                      \
            for (int a = 0; a < na; a++) {                                                         \
                const mc_q8 *xq = x[a] + per * i + ib;                                             \
                __m256i s = MC_IQ4X8_SUM(u, au, (const int32_t *)xq->qs, cx[a][per * i + ib]);      \
                if (xs) s = _mm256_mullo_epi32(s, sc);                                             \
                f[a] = _mm256_add_ps(f[a], _mm256_mul_ps(_mm256_mul_ps(dw, _mm256_set1_ps(xq->d)),  \
                                                         _mm256_cvtepi32_ps(s)));                  \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
    for (int a = 0; a < na; a++) mc_x8_store(f[a], y + (size_t)a * ldy, nr)

/* the IQ4_NL / IQ4_XS / MXFP4 kernel body `name` at one target (vnni: VNNI's sums) */
#define MC_IQ4X8_FN(target, name, xs, vnni, mx)                                                    \
    target static inline __attribute__((always_inline)) void name(                                 \
        int nb, const void *wv, const mc_q8 *const x[8], const int32_t *const cx[8], float *y,     \
        size_t ldy, int nr, const int na) {                                                        \
        (void)cx;                                                                                  \
        MC_IQ4X8_BODY(xs, vnni, mx);                                                               \
    }

#define MC_IQ4X8_SUM(u, au, xd, cxv) _mm256_sub_epi32(mc_dpbusd8(u, xd), _mm256_set1_epi32(cxv))
MC_IQ4X8_FN(MC_VNNI, mc_gemm_iq4nlx8_body, 0, 1, 0)
MC_IQ4X8_FN(MC_VNNI, mc_gemm_iq4xsx8_body, 1, 1, 0)
MC_IQ4X8_FN(MC_VNNI, mc_gemm_mxfp4x8_body, 0, 1, 1)
#undef MC_IQ4X8_SUM

#define MC_IQ4X8_SUM(u, au, xd, cxv) mc_signdot8(u, au, xd)
MC_IQ4X8_FN(MC_AVX2, mc_gemm_iq4nlx8_avx2_body, 0, 0, 0)
MC_IQ4X8_FN(MC_AVX2, mc_gemm_iq4xsx8_avx2_body, 1, 0, 0)
MC_IQ4X8_FN(MC_AVX2, mc_gemm_mxfp4x8_avx2_body, 0, 0, 1)
#undef MC_IQ4X8_SUM
#undef MC_IQ4X8_FN
#undef MC_IQ4X8_BODY

/* body(args..., na) with na a constant 1 .. 8 (so each count's loops unroll) */
#define MC_BY_NA(na, body, ...)                                                                    \
    switch (na) {                                                                                  \
    case 1: body(__VA_ARGS__, 1); break;                                                           \
    case 2: body(__VA_ARGS__, 2); break;                                                           \
    case 3: body(__VA_ARGS__, 3); break;                                                           \
    case 4: body(__VA_ARGS__, 4); break;                                                           \
    case 5: body(__VA_ARGS__, 5); break;                                                           \
    case 6: body(__VA_ARGS__, 6); break;                                                           \
    case 7: body(__VA_ARGS__, 7); break;                                                           \
    default: body(__VA_ARGS__, 8); break;                                                          \
    }

/* the kernels specialized per x row count (1 .. 8), as mc_repacked_fn: compiled where
 * `unit` (MC_UNIT_VNNI or MC_UNIT_AVX2, see mc_common.h) is this one, else declared */
#define MC_REPACKED_FN(unit, target, name, body) MC_REPACKED_FN_(unit, target, name, body)
#define MC_REPACKED_FN_(unit, target, name, body) MC_REPACKED_FN_##unit(target, name, body)
#define MC_REPACKED_FN_1(target, name, body)                                                      \
    target MC_SHARED void name(int na, int nb, const void *w, const mc_q8 *const x[8],             \
                               const int32_t *const cx[8], float *y, size_t ldy, int nr) {         \
        MC_BY_NA(na, body, nb, w, x, cx, y, ldy, nr)                                               \
    }
#define MC_REPACKED_FN_0(target, name, body)                                                      \
    MC_SHARED void name(int na, int nb, const void *w, const mc_q8 *const x[8],                    \
                        const int32_t *const cx[8], float *y, size_t ldy, int nr);

/* ---- Q2_K to Q6_K on repacked weights (mc_q2kx8 .. mc_q6kx8; mc_gemm_kx8.h), VNNI and AVX2:
 * per 256-column block and x row the exact integer sums of the 8 weight rows in the 8 lanes
 * (each 32- or 16-column sub-block's vpdpbusd sum, or AVX2's vpmaddubsw + vpmaddwd, times
 * its scale by vpmulld, VNNI's 16-column ones by vpdpwssd (mc_kx8_scale_add), the mins' term by
 * vpmaddwd on the x row's bsums), then the single-row kernels' float operations per
 * lane (mc_dot_q4_k_scalar, mc_dot_q6_k_scalar): bit-identical to them. */

/* sum over k < 4 of vpdpbusd(u[k], the x dword xd[k] broadcast), in two chains */
MC_VNNI static inline __attribute__((always_inline)) __m256i mc_dpbusd4(const __m256i u[4],
                                                                        const int32_t *xd) {
    const __m256i s = mc_dpbusd_bcst(mc_dpbusd_bcst(_mm256_setzero_si256(), u[0], xd), u[2], xd + 2);
    const __m256i t = mc_dpbusd_bcst(mc_dpbusd_bcst(_mm256_setzero_si256(), u[1], xd + 1), u[3], xd + 3);
    return _mm256_add_epi32(s, t);
}

/* acc + s * sc per lane, exactly, for a 16-column sub-block's sum s and its scale sc as
 * mc_kx8_scw gives it: one vpdpwssd.  Q2_K's and Q3_K's sums fit an int16 (|s| <= 16 x 7 x
 * 128), so against the pair (sc, 0) it adds s sc; Q6_K's (q6) do not (|s| <= 16 x 63 x
 * 128 = 129024): vpshufb makes s's bytes (b0, b1, b2, b3) the int16 pair (b0, (b1, b2)) =
 * (s & 255, s >> 8), against (sc, 256 sc) (mc_q6k_scale_add does the same on zmm).  2 uops
 * where vpmulld + vpaddd take 3. */
MC_VNNI static inline __attribute__((always_inline)) __m256i mc_kx8_scale_add(__m256i acc, __m256i s,
                                                                              __m256i scw, const int q6) {
    const __m256i split = _mm256_set_epi32(0x0E0D800C, 0x0A098008, 0x06058004, 0x02018000, 0x0E0D800C,
                                           0x0A098008, 0x06058004, 0x02018000);
    return _mm256_dpwssd_epi32(acc, q6 ? _mm256_shuffle_epi8(s, split) : s, scw);
}

/* a sub-block's int32 scales sc as mc_kx8_scale_add takes them: (sc, 0), Q6_K (sc, 256 sc) */
MC_VNNI static inline __attribute__((always_inline)) __m256i mc_kx8_scw(__m256i sc, const int q6) {
    const __m256i lo = _mm256_and_si256(sc, _mm256_set1_epi32(0xFFFF));
    return q6 ? _mm256_or_si256(lo, _mm256_slli_epi32(sc, 24)) : lo;
}

/* A Q4_K or Q5_K group's float steps once a block's integer sums si are in (na rows of
 * x): the mins' term sm = sum over sub-blocks s of mn[s] * (bsums[2s] + bsums[2s + 1])
 * (sub-blocks in pairs, lanes holding (mn[2p], mn[2p + 1]) as int16, x dword p (bs[2p],
 * bs[2p + 1])), then f[a] += dx * (d * si - dmin * sm), as mc_dot_q4_k_scalar does. */
MC_AVX2 static inline __attribute__((always_inline)) void
mc_kx8_finish(const uint16_t d[8], const uint16_t dmin[8], const uint8_t mnb[8][8],
              const mc_q8k *const xk[8], int i, const __m256i si[8], __m256 f[8], const int na) {
    __m256i mn[4];
    for (int p = 0; p < 4; p++) {
        const __m256i v0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)mnb[2 * p]));
        const __m256i v1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)mnb[2 * p + 1]));
        mn[p] = _mm256_or_si256(v0, _mm256_slli_epi32(v1, 16));
    }
    const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)d));
    const __m256 dm = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dmin));
    for (int a = 0; a < na; a++) {
        /* bs[s] = bsums[2s] + bsums[2s + 1] (|bs| <= 32 x 127: int16), packed in pairs */
        const __m256i b16 = _mm256_loadu_si256((const __m256i *)xk[a][i].bsums);
        const __m256i b32 = _mm256_madd_epi16(b16, _mm256_set1_epi16(1)); /* 8 x int32 */
        const __m128i bs = _mm_packs_epi32(_mm256_castsi256_si128(b32), _mm256_extracti128_si256(b32, 1));
        __m256i m = _mm256_madd_epi16(mn[0], _mm256_broadcastd_epi32(bs));
        m = _mm256_add_epi32(m, _mm256_madd_epi16(mn[1], _mm256_broadcastd_epi32(_mm_srli_si128(bs, 4))));
        m = _mm256_add_epi32(m, _mm256_madd_epi16(mn[2], _mm256_broadcastd_epi32(_mm_srli_si128(bs, 8))));
        m = _mm256_add_epi32(m, _mm256_madd_epi16(mn[3], _mm256_broadcastd_epi32(_mm_srli_si128(bs, 12))));
        const __m256 t = _mm256_sub_ps(_mm256_mul_ps(dw, _mm256_cvtepi32_ps(si[a])),
                                       _mm256_mul_ps(dm, _mm256_cvtepi32_ps(m)));
        f[a] = _mm256_add_ps(f[a], _mm256_mul_ps(_mm256_set1_ps(xk[a][i].d), t));
    }
}

/* the repacked block MC_KX8_AHEAD blocks on */
#ifndef MC_KX8_AHEAD
#define MC_KX8_AHEAD 2
#endif
#define MC_KX8_PREFETCH(b)                                                                         \
    do {                                                                                           \
        for (size_t c_ = 0; c_ < sizeof *(b); c_ += 64)                                            \
            _mm_prefetch((const char *)((b) + MC_KX8_AHEAD) + c_, _MM_HINT_T0);                    \
    } while (0)

/* Part `part` of `parts` of the repacked block MC_KX8_AHEAD blocks on from the `bytes`-byte
 * block at b: its 64-byte lines [part n / parts, (part + 1) n / parts), so that a block's
 * prefetches are spread over the steps of its loop.  All of a block's lines at once (18-27
 * of them, two blocks' at 16 weight rows) left an 8-row pass of a 1B's K-quant layers no
 * faster than no prefetching at all on an AMD EPYC, spread 12-55 % faster. */
static inline __attribute__((always_inline)) void mc_prefetch_part(const void *b, size_t bytes, int part,
                                                                   int parts) {
    const char *p = (const char *)b + MC_KX8_AHEAD * bytes;
    const size_t n = (bytes + 63) / 64, c0 = (size_t)part * n / (size_t)parts,
                 c1 = (size_t)(part + 1) * n / (size_t)parts;
    for (size_t c = c0; c < c1; c++) _mm_prefetch(p + 64 * c, _MM_HINT_T0);
}

/* Q5_K shares the Q4_K kernels through a constant flag q5: its blocks (mc_q5kx8) hold d,
 * dmin, sc and mn where mc_q4kx8 does, then the high bits, then qs; its ints (the nibbles
 * with the fifth bits or-ed in as 16, < 32) go through vpdpbusd as the nibbles do, and its
 * float steps are Q4_K's (mc_dot_q5_k_scalar). */
#define MC_Q45_BYTES(q5) ((q5) ? sizeof(mc_q5kx8) : sizeof(mc_q4kx8))
#define MC_Q45_QS(b, q5, c) ((q5) ? ((const mc_q5kx8 *)(b))->qs[c] : (b)->qs[c])

/* A Q3_K or Q6_K group's integer sums less the offset its unsigned ints carry (2^shift: 4
 * for Q3_K, 32 for Q6_K): 2^shift sum over sub-blocks k of sc[k] bsums[k], sub-blocks in
 * pairs (lanes holding (sc[2p], sc[2p + 1]) as int16, x dword p (bsums[2p], bsums[2p + 1])) */
MC_AVX2 static inline __attribute__((always_inline)) void
mc_kx8_offset(const int8_t sc[16][8], const mc_q8k *const xk[8], int i, __m256i si[8], const int na,
              const int shift) {
    __m256i scp[8];
    for (int p = 0; p < 8; p++) {
        const __m256i v0 = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)sc[2 * p]));
        const __m256i v1 = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)sc[2 * p + 1]));
        scp[p] = _mm256_blend_epi16(v0, _mm256_slli_epi32(v1, 16), 0xAA);
    }
    for (int a = 0; a < na; a++) {
        const int32_t *bs = (const int32_t *)xk[a][i].bsums;
        __m256i c = _mm256_madd_epi16(scp[0], _mm256_set1_epi32(bs[0]));
        for (int p = 1; p < 8; p++) c = _mm256_add_epi32(c, _mm256_madd_epi16(scp[p], _mm256_set1_epi32(bs[p])));
        si[a] = _mm256_sub_epi32(si[a], _mm256_slli_epi32(c, shift));
    }
}

/* The unsigned ints of repacked K-quant blocks, one vector (8 rows x 4 columns) at a
 * time, as the 8-row kernels (mc_gemm_kx8.h) and the wide-x unpacking (mc_gemm_kwide.h)
 * both read them. */

/* Q4_K / Q5_K: vector v of sub-block s from the chunk's bytes q (low nibbles for even s,
 * high for odd), Q5_K (q5) with bit s of its high-bit vector qh as 16 (16-bit shifts: bit
 * 4 of either byte comes from the same byte for shifts up to 4 left and 3 right) */
MC_AVX2 static inline __attribute__((always_inline)) __m256i mc_q45kx8_u(__m256i q, int s, const int q5,
                                                                         __m256i qh) {
    const __m256i u = _mm256_and_si256(s & 1 ? _mm256_srli_epi16(q, 4) : q, _mm256_set1_epi8(0xF));
    if (!q5) return u;
    const __m256i hb = s < 4 ? _mm256_slli_epi16(qh, 4 - s) : _mm256_srli_epi16(qh, s - 4);
    return _mm256_or_si256(u, _mm256_and_si256(hb, _mm256_set1_epi8(0x10)));
}

/* Q6_K: vector v of columns 128 n + 32 X .. (low nibbles ql, 2 high bits from qh) */
MC_AVX2 static inline __attribute__((always_inline)) __m256i mc_q6kx8_u(const mc_q6kx8 *b, int n, int X, int v) {
    const __m256i ql = _mm256_loadu_si256((const __m256i *)MC_Q6_QL(b, n, X & 1, v));
    const __m256i qh = _mm256_loadu_si256((const __m256i *)MC_Q6_QH(b, n, v));
    const __m256i m4 = _mm256_set1_epi8(0xF);
    const __m256i l4 = X < 2 ? _mm256_and_si256(ql, m4) : _mm256_and_si256(_mm256_srli_epi16(ql, 4), m4);
    const __m256i h2 = X == 0   ? _mm256_slli_epi16(qh, 4)
                       : X == 1 ? _mm256_slli_epi16(qh, 2)
                       : X == 2 ? qh
                                : _mm256_srli_epi16(qh, 2);
    return _mm256_or_si256(l4, _mm256_and_si256(h2, _mm256_set1_epi8(0x30)));
}

/* Q3_K: vector v of columns 128 n + 32 X ..: the 2-bit crumb | the hmask bit (of vector
 * hm, bit 4 n + X) as 4 (16-bit shifts: bit 2 of either byte comes from the same byte) */
MC_AVX2 static inline __attribute__((always_inline)) __m256i mc_q3kx8_u(const mc_q3kx8 *b, int n, int X, int v,
                                                                        __m256i hm) {
    const int hb = 4 * n + X;
    const __m256i q = _mm256_loadu_si256((const __m256i *)(b->qs[n] + 32 * v));
    const __m256i h = hb < 2 ? _mm256_slli_epi16(hm, 2 - hb) : _mm256_srli_epi16(hm, hb - 2);
    return _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 2 * X), _mm256_set1_epi8(3)),
                           _mm256_and_si256(h, _mm256_set1_epi8(4)));
}

/* Q2_K: vector v of columns 128 n + 32 X ..: the 2-bit crumbs (mc_q3kx8_u without the
 * hmask bit) */
MC_AVX2 static inline __attribute__((always_inline)) __m256i mc_q2kx8_u(const mc_q2kx8 *b, int n, int X, int v) {
    const __m256i q = _mm256_loadu_si256((const __m256i *)(b->qs[n] + 32 * v));
    return _mm256_and_si256(_mm256_srli_epi16(q, 2 * X), _mm256_set1_epi8(3));
}

/* The AVX2 twins of mc_dpbusd8 / mc_dpbusd4 for the K-quants (mc_gemm_kx8.h): vpmaddubsw
 * results summed in 16-bit lanes only as far as they cannot saturate (|x| <= 127), then
 * widened by vpmaddwd.  A 16-bit lane of one vpmaddubsw holds 2 products; Q4_K's nibbles
 * (< 16) take all 8 in one lane (mc_maddubs8: 16 x 15 x 127 = 30480), Q5_K's ints (< 32)
 * two groups of 4 (mc_maddubs8w: 8 x 31 x 127 = 31496 each), the 6-bit ints of Q6_K and
 * Q3_K (< 64) pairs (mc_maddubs4: 4 x 63 x 127 = 32004). */
MC_AVX2 static inline __attribute__((always_inline)) __m256i mc_maddubs8w(const __m256i u[8],
                                                                          const int32_t *xd) {
    __m256i s[2];
    for (int h = 0; h < 2; h++) {
        const __m256i *v = u + 4 * h;
        const int32_t *d = xd + 4 * h;
        s[h] = _mm256_add_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(v[0], _mm256_set1_epi32(d[0])),
                                                 _mm256_maddubs_epi16(v[1], _mm256_set1_epi32(d[1]))),
                                _mm256_add_epi16(_mm256_maddubs_epi16(v[2], _mm256_set1_epi32(d[2])),
                                                 _mm256_maddubs_epi16(v[3], _mm256_set1_epi32(d[3]))));
    }
    const __m256i one = _mm256_set1_epi16(1);
    return _mm256_add_epi32(_mm256_madd_epi16(s[0], one), _mm256_madd_epi16(s[1], one));
}

MC_AVX2 static inline __attribute__((always_inline)) __m256i mc_maddubs4(const __m256i u[4],
                                                                         const int32_t *xd) {
    const __m256i one = _mm256_set1_epi16(1);
    const __m256i s = _mm256_add_epi16(_mm256_maddubs_epi16(u[0], _mm256_set1_epi32(xd[0])),
                                       _mm256_maddubs_epi16(u[1], _mm256_set1_epi32(xd[1])));
    const __m256i t = _mm256_add_epi16(_mm256_maddubs_epi16(u[2], _mm256_set1_epi32(xd[2])),
                                       _mm256_maddubs_epi16(u[3], _mm256_set1_epi32(xd[3])));
    return _mm256_add_epi32(_mm256_madd_epi16(s, one), _mm256_madd_epi16(t, one));
}

/* Q5_0: block b's ints (nibble | high bit << 4, < 32) as u[k] to meet the x dword k, as
 * mc_q41x8_split orders them: the high bits of elements 4k .. 4k + 3 (k < 4; 16 + 4(k - 4)
 * .. for k >= 4) are bits e .. e + 3 of each lane's qh, so byte e / 8 of the lane is
 * copied to its 4 bytes (vpshufb) and each byte tests its own bit */
MC_AVX2 static inline __attribute__((always_inline)) void mc_q50x8_split(const mc_q50x8 *b, __m256i u[8]) {
    mc_q41x8_split((const mc_q41x8 *)b, u);
    const __m256i qh = _mm256_loadu_si256((const __m256i *)b->qh);
    const __m256i lane = _mm256_setr_epi8(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12, 0, 0, 0, 0, 4, 4, 4, 4, 8,
                                          8, 8, 8, 12, 12, 12, 12);
    const __m256i lo = _mm256_set1_epi32(0x08040201), hi = _mm256_set1_epi32((int)0x80402010u);
    for (int k = 0; k < 8; k++) {
        const int e = k < 4 ? 4 * k : 16 + 4 * (k - 4);
        const __m256i rep = _mm256_shuffle_epi8(qh, _mm256_add_epi8(lane, _mm256_set1_epi8((char)(e / 8))));
        const __m256i m = e % 8 ? hi : lo;
        const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(rep, m), m);
        u[k] = _mm256_or_si256(u[k], _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
    }
}

/* Q4_0 (its nibbles repacked as Q4_1's, in mc_iq4nlx8) and Q5_0: the exact block sums of
 * their unsigned ints less 8 or 16 sum(x) (cx >> shift), then acc = fma(dw * dx, s, acc)
 * as their SIMD single-row kernels do */
#define MC_OFFX8_BODY(T, split, dot8, shift)                                                       \
    const T *w = (const T *)wv;                                                                    \
    __m256 f[8];                                                                                   \
    for (int a = 0; a < na; a++) f[a] = _mm256_setzero_ps();                                       \
    for (int i = 0; i < nb; i++) {                                                                 \
        const T *b = w + i;                                                                        \
        for (int c = 0; c < (int)sizeof *b; c += 64) _mm_prefetch((const char *)(b + 4) + c, _MM_HINT_T0); \
        __m256i u[8];                                                                              \
        split(b, u);                                                                               \
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)b->d));                \
        for (int a = 0; a < na; a++) {                                                             \
            const mc_q8 *xq = x[a] + i;                                                            \
            const __m256i s = _mm256_sub_epi32(dot8(u, (const int32_t *)xq->qs), _mm256_set1_epi32(cx[a][i] >> (shift))); \
            f[a] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(xq->d)), _mm256_cvtepi32_ps(s), f[a]); \
        }                                                                                          \
    }                                                                                              \
    for (int a = 0; a < na; a++) mc_x8_store(f[a], y + (size_t)a * ldy, nr)

#define MC_Q40_SPLIT(b, u) mc_q41x8_split((const mc_q41x8 *)(b), u)
#define MC_Q50_SUM8(u, xd) mc_maddubs8w(u, xd) /* ints < 32 */
#define MC_OFFX8_FN(target, name, ...)                                                             \
    target static inline __attribute__((always_inline)) void name(                                 \
        int nb, const void *wv, const mc_q8 *const x[8], const int32_t *const cx[8], float *y,     \
        size_t ldy, int nr, const int na) {                                                        \
        MC_OFFX8_BODY(__VA_ARGS__);                                                                \
    }
MC_OFFX8_FN(MC_VNNI, mc_gemm_q40x8_body, mc_iq4nlx8, MC_Q40_SPLIT, mc_dpbusd8, 4)
MC_OFFX8_FN(MC_AVX2, mc_gemm_q40x8_avx2_body, mc_iq4nlx8, MC_Q40_SPLIT, mc_maddubs8, 4)
MC_OFFX8_FN(MC_VNNI, mc_gemm_q50x8_body, mc_q50x8, mc_q50x8_split, mc_dpbusd8, 3)
MC_OFFX8_FN(MC_AVX2, mc_gemm_q50x8_avx2_body, mc_q50x8, mc_q50x8_split, MC_Q50_SUM8, 3)
#undef MC_OFFX8_FN
#undef MC_Q50_SUM8
#undef MC_Q40_SPLIT
#undef MC_OFFX8_BODY

/* Q5_1 (its ints as Q5_0's, mc_q50x8_split): the exact block sums, then per block the
 * single-row kernels' (d * dx) * s + m * sx added to the row's sum */
#define MC_Q51X8_BODY(dot8)                                                                        \
    const mc_q51x8 *w = (const mc_q51x8 *)wv;                                                      \
    (void)cx;                                                                                      \
    __m256 f[8];                                                                                   \
    for (int a = 0; a < na; a++) f[a] = _mm256_setzero_ps();                                       \
    for (int i = 0; i < nb; i++) {                                                                 \
        const mc_q51x8 *b = w + i;                                                                 \
        for (int c = 0; c < (int)sizeof *b; c += 64) _mm_prefetch((const char *)(b + 4) + c, _MM_HINT_T0); \
        __m256i u[8];                                                                              \
        mc_q50x8_split((const mc_q50x8 *)b, u);                                                    \
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)b->d));                \
        const __m256 mw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)b->m));                \
        for (int a = 0; a < na; a++) {                                                             \
            const mc_q8 *xq = x[a] + i;                                                            \
            const __m256 s = _mm256_cvtepi32_ps(dot8(u, (const int32_t *)xq->qs));                 \
            f[a] = _mm256_add_ps(f[a], _mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(dw, _mm256_set1_ps(xq->d)), s), \
                                                     _mm256_mul_ps(mw, _mm256_set1_ps(xq->s))));   \
        }                                                                                          \
    }                                                                                              \
    for (int a = 0; a < na; a++) mc_x8_store(f[a], y + (size_t)a * ldy, nr)

MC_VNNI static inline __attribute__((always_inline)) void
mc_gemm_q51x8_body(int nb, const void *wv, const mc_q8 *const x[8], const int32_t *const cx[8],
                   float *y, size_t ldy, int nr, const int na) {
    MC_Q51X8_BODY(mc_dpbusd8);
}

MC_AVX2 static inline __attribute__((always_inline)) void
mc_gemm_q51x8_avx2_body(int nb, const void *wv, const mc_q8 *const x[8], const int32_t *const cx[8],
                        float *y, size_t ldy, int nr, const int na) {
    MC_Q51X8_BODY(mc_maddubs8w); /* ints < 32 */
}
#undef MC_Q51X8_BODY

#define MC_TGT MC_VNNI
#define MC_TGT_UNIT MC_UNIT_VNNI
#define MC_SFX(name) name
#define MC_KX_SUM8(u, xd, wide) mc_dpbusd8(u, xd)
#define MC_KX_SUM4(u, xd) mc_dpbusd4(u, xd)
#define MC_KX_SCW(sc, q6) mc_kx8_scw(sc, q6)
#define MC_KX_SCALE16(acc, s, scw, q6) mc_kx8_scale_add(acc, s, scw, q6)
#include "mc_gemm_kx8.h"
#undef MC_TGT
#undef MC_TGT_UNIT
#undef MC_SFX
#undef MC_KX_SUM8
#undef MC_KX_SUM4
#undef MC_KX_SCW
#undef MC_KX_SCALE16

#define MC_TGT MC_AVX2
#define MC_TGT_UNIT MC_UNIT_AVX2
#define MC_SFX(name) name##_avx2
#define MC_KX_SUM8(u, xd, wide) ((wide) ? mc_maddubs8w(u, xd) : mc_maddubs8(u, xd))
#define MC_KX_SUM4(u, xd) mc_maddubs4(u, xd)
#define MC_KX_SCW(sc, q6) (sc)
#define MC_KX_SCALE16(acc, s, sc, q6) _mm256_add_epi32(acc, _mm256_mullo_epi32(s, sc))
#include "mc_gemm_kx8.h"
#undef MC_TGT
#undef MC_TGT_UNIT
#undef MC_SFX
#undef MC_KX_SUM8
#undef MC_KX_SUM4

/* each type's VNNI kernel and its AVX2 twin */
#define MC_REPACKED_PAIR(name)                                                                     \
    MC_REPACKED_FN(MC_UNIT_VNNI, MC_VNNI, name, name##_body)                                       \
    MC_REPACKED_FN(MC_UNIT_AVX2, MC_AVX2, name##_avx2, name##_avx2_body)
MC_REPACKED_PAIR(mc_gemm_q41x8)
MC_REPACKED_PAIR(mc_gemm_q80x8)
MC_REPACKED_PAIR(mc_gemm_q50x8)
MC_REPACKED_PAIR(mc_gemm_q51x8)
MC_REPACKED_PAIR(mc_gemm_q40x8)
MC_REPACKED_PAIR(mc_gemm_iq4nlx8)
MC_REPACKED_PAIR(mc_gemm_iq4xsx8)
MC_REPACKED_PAIR(mc_gemm_mxfp4x8)
#undef MC_REPACKED_PAIR

#endif /* MC_X86 */
#endif /* MC_GEMM_VNNI_H */
