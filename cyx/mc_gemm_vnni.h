/* Batched int8 GEMM for AVX512-VNNI (on 256-bit registers): 4 weight rows x 8
 * activation rows per inner step, for the 32-element block types Q4_0, Q4_1, Q5_0
 * and Q8_0.
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
 * block an 8 x 8 transpose of the rows' dwords.  `plus128`: the ints stored as unsigned
 * x + 128 (for mc_gemm_q8raw_4x8, whose weights are the signed operand). */
MC_VNNI static void mc_gemm_pack8(const void *xbase, size_t xstride, int nr, int nb, int c,
                                  int plus128, mc_q8t8 *out) {
    const __m256i ones = _mm256_set1_epi8(1), cv = _mm256_set1_epi32(c);
    const __m256i flip = _mm256_set1_epi8(plus128 ? (char)0x80 : 0); /* x + 128 as unsigned */
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
            _mm256_store_si256((__m256i *)o->q[q], _mm256_xor_si256(p[q], flip));
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

/* Q8_0 weights with a table (mc_q8tab per block: the scale as float, 128 times the
 * block's int sum), made once per weight matrix: the GEMM then reads the weights'
 * ints straight from their blocks as the signed operand of vpdpbusd (broadcast from
 * memory), against activations packed as x + 128, and takes back 128 sum(q): no
 * unpacking.  The block sums are the same exact integers as the other kernels'. */
MC_VNNI static void mc_gemm_q8raw_4x8(int nb, const uint8_t *w, size_t st, int nr,
                                      const mc_q8tab *tab, const mc_q8t8 *xg, __m256 res[4]) {
    const uint8_t *w0 = w, *w1 = w + st * (nr > 1), *w2 = w + st * (nr > 2 ? 2 : nr - 1);
    const uint8_t *w3 = w + st * (size_t)(nr - 1);
    const mc_q8tab *t0 = tab, *t1 = tab + (size_t)nb * (nr > 1), *t2 = tab + (size_t)nb * (nr > 2 ? 2 : nr - 1);
    const mc_q8tab *t3 = tab + (size_t)nb * (nr - 1);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int i = 0; i < nb; i++) {
        const mc_q8t8 *xb = xg + i;
        MC_GEMM_LOAD_X(xb);
        const __m256 dx = _mm256_load_ps(xb->d);
#define MC_Q8R_ROW(wr, tr, acc)                                                                    \
    do {                                                                                           \
        const int32_t *q = (const int32_t *)(wr + 34 * (size_t)i + 2);                             \
        _mm_prefetch((const char *)(wr) + MC_GEMM_AHEAD * st + 34 * (size_t)i, _MM_HINT_T0);      \
        __m256i s0 = mc_dpbusd_bcst(_mm256_setzero_si256(), x0, q);                                \
        __m256i s1 = mc_dpbusd_bcst(_mm256_setzero_si256(), x1, q + 1);                            \
        s0 = mc_dpbusd_bcst(s0, x2, q + 2);                                                        \
        s1 = mc_dpbusd_bcst(s1, x3, q + 3);                                                        \
        s0 = mc_dpbusd_bcst(s0, x4, q + 4);                                                        \
        s1 = mc_dpbusd_bcst(s1, x5, q + 5);                                                        \
        s0 = mc_dpbusd_bcst(s0, x6, q + 6);                                                        \
        s1 = mc_dpbusd_bcst(s1, x7, q + 7);                                                        \
        const __m256i s = _mm256_sub_epi32(_mm256_add_epi32(s0, s1), _mm256_set1_epi32(tr[i].wc)); \
        acc = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(tr[i].d), dx), _mm256_cvtepi32_ps(s), acc); \
    } while (0)
        MC_Q8R_ROW(w0, t0, a0);
        MC_Q8R_ROW(w1, t1, a1);
        MC_Q8R_ROW(w2, t2, a2);
        MC_Q8R_ROW(w3, t3, a3);
#undef MC_Q8R_ROW
    }
    res[0] = a0, res[1] = a1, res[2] = a2, res[3] = a3;
}

#endif /* MC_X86 */
#endif /* MC_GEMM_VNNI_H */
