/* Q4_1 and Q8_0 on repacked weights (mc_q41x8, mc_q80x8), and Q4_0, Q5_0, IQ4_NL
 * (mc_gemm_off16_body) and IQ4_XS (session 13), AVX512 on 512-bit registers:
 * two groups of 8 weight rows at once, 16 lanes (lanes 0-7: group g, 8-15: group g + 1,
 * the group nb blocks on), so each vpdpbusd with an activation dword broadcast {1to16}
 * does twice the ymm kernels' (mc_gemm_q41x8_body, mc_gemm_q80x8_body) work.  The
 * layout is unchanged: a block's 32-byte pieces of the two groups are loaded into the
 * two halves of one zmm.
 *
 * Arithmetic: per lane that of the ymm kernels, so bit-identical to them and to the
 * single-row path: the exact block sum s (Q8_0: sum((q + 128) x) - 128 sum(x)), then
 * acc = fma(dw * dx, (float)s, acc) in block order, Q4_1's sum(mw * sx) kept apart (in
 * block order) and added at the end.
 *
 * Needs avx512f and avx512bw besides the VNNI level's avx512vnni and avx512vl, checked at
 * run time (mc_zmm41_ok).  Which x row counts take the zmm kernels: MC_ZMM41_*_MIN_NA.
 *
 * Measured on SmolLM2-135M (bench/bench_gmac.py, 2 threads, Zen 5): at 1 and 2 x rows
 * (memory-bound) about as fast as the ymm kernels, from 4 rows 10-35% faster.  The prefetches
 * must cover both streams of the next pair (MC_ZMM41_PREFETCH): with the ymm kernels'
 * per-group distances half of it went unfetched and 1-4 rows ran 20-25% slower.
 */
#ifndef MC_GEMM_ZMM41_H
#define MC_GEMM_ZMM41_H

#include "mc_gemm_vnni.h"
#include "mc_gemm_zmm.h" /* mc_dpbusd16_bcst, mc_pair32_z, mc_x16_store */

#if defined(MC_X86)

#define MC_ZMM41 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

/* Fewest x rows in a call for the zmm kernels; fewer: the ymm kernel on each group.
 * Q4_1 at 1 x row (memory-bound) was 3-5% slower in zmm (SmolLM2's layers, 2 threads, in
 * one process alternately, either order); Q8_0 (the output head) was not. */
#ifndef MC_ZMM41_Q41_MIN_NA
#define MC_ZMM41_Q41_MIN_NA 2
#endif
#ifndef MC_ZMM41_Q80_MIN_NA
#define MC_ZMM41_Q80_MIN_NA 1
#endif

/* whether this CPU runs the zmm kernels (the VNNI level checks avx512vnni and avx512vl) */
static int mc_zmm41_ok(void) {
    static volatile int ok = -1; /* benign race: every thread stores the same value */
    if (ok < 0) {
        __builtin_cpu_init();
        ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
             __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
    }
    return ok;
}

/* mc_dpbusd16_bcst, mc_pair32_z and mc_x16_store: mc_gemm_zmm.h */

/* sum over k < 8 of vpdpbusd(u[k], the x dword xd[k] broadcast), in two chains */
MC_ZMM41 static inline __attribute__((always_inline)) __m512i mc_dpbusd8x16(const __m512i u[8],
                                                                            const int32_t *xd) {
    __m512i s = mc_dpbusd16_bcst(_mm512_setzero_si512(), u[0], xd);
    __m512i t = mc_dpbusd16_bcst(_mm512_setzero_si512(), u[1], xd + 1);
    for (int k = 2; k < 8; k += 2) {
        s = mc_dpbusd16_bcst(s, u[k], xd + k);
        t = mc_dpbusd16_bcst(t, u[k + 1], xd + k + 1);
    }
    return _mm512_add_epi32(s, t);
}

/* the 8 f16 at p0 and the 8 at p1 as 16 floats */
MC_ZMM41 static inline __attribute__((always_inline)) __m512 mc_zmm41_h16(const uint16_t *p0,
                                                                          const uint16_t *p1) {
    return _mm512_cvtph_ps(_mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)p0)), _mm_loadu_si128((const __m128i *)p1),
        1));
}

/* a block's nibbles of two groups (q0: lanes 0-7, q1: 8-15) as mc_q41x8_split orders them */
MC_ZMM41 static inline __attribute__((always_inline)) void mc_zmm41_split(const uint8_t *q0, const uint8_t *q1,
                                                                          __m512i u[8]) {
    const __m512i m4 = _mm512_set1_epi8(0xF);
    for (int v = 0; v < 4; v++) {
        const __m512i q = mc_pair32_z(q0 + 32 * v, q1 + 32 * v);
        u[v] = _mm512_and_si512(q, m4);
        u[4 + v] = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
    }
}

/* the IQ4 levels + 128 (vpdpbusd's unsigned operand) in each 128-bit lane, for vpshufb */
MC_ZMM41 static inline __attribute__((always_inline)) __m512i mc_zmm41_iq4_levels(void) {
    return _mm512_broadcast_i32x4(
        _mm_xor_si128(_mm_loadu_si128((const __m128i *)mc_iq4_kvalues), _mm_set1_epi8((char)0x80)));
}

/* MXFP4's doubled E2M1 values + 128 in every 128-bit lane */
MC_ZMM41 static inline __attribute__((always_inline)) __m512i mc_zmm41_mxfp4_levels(void) {
    return _mm512_broadcast_i32x4(
        _mm_xor_si128(_mm_loadu_si128((const __m128i *)mc_mxfp4_kvalues), _mm_set1_epi8((char)0x80)));
}

/* two groups' 8 E8M0 scale bytes (e0: lanes 0-7, e1: 8-15) as mc_e8m0_half's floats */
MC_ZMM41 static inline __attribute__((always_inline)) __m512 mc_zmm41_e8m0(const uint8_t *e0,
                                                                          const uint8_t *e1) {
    const __m512i v = _mm512_cvtepu8_epi32(
        _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)e0), _mm_loadl_epi64((const __m128i *)e1)));
    const __m512i norm = _mm512_slli_epi32(_mm512_sub_epi32(v, _mm512_set1_epi32(1)), 23);
    const __m512i sub = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), v); /* e < 2 */
    return _mm512_castsi512_ps(_mm512_mask_mov_epi32(norm, _mm512_cmplt_epi32_mask(v, _mm512_set1_epi32(2)), sub));
}

/* Prefetch for the pair's two streams (group g at w0, g + 1 at w1 = w0 + nb blocks): the
 * block each stream reads `ahead` blocks on, past the pair's end the next pair's (groups
 * g + 2, g + 3: nb blocks further), so both streams of the next pair are fetched too, as
 * the ymm kernels' one linear stream runs on into the next group.  The first `lines`
 * cache lines of each block. */
#define MC_ZMM41_PREFETCH(w0, w1, i, nb, ahead, lines)                                            \
    do {                                                                                           \
        int o_ = (i) + (ahead);                                                                    \
        if (o_ >= (nb)) o_ += (nb);                                                                \
        for (int c_ = 0; c_ < (lines); c_++) {                                                     \
            _mm_prefetch((const char *)((w0) + o_) + 64 * c_, _MM_HINT_T0);                        \
            _mm_prefetch((const char *)((w1) + o_) + 64 * c_, _MM_HINT_T0);                        \
        }                                                                                          \
    } while (0)

/* Q4_1: 16 weight rows (groups g, g + 1 at wv and nb blocks on) x na <= 8 x rows */
MC_ZMM41 static inline __attribute__((always_inline)) void
mc_gemm_q41x16_body(int nb, const void *wv, const mc_q8 *const x[8], const int32_t *const cx[8],
                    float *y, size_t ldy, int nr, const int na) {
    const mc_q41x8 *w0 = (const mc_q41x8 *)wv, *w1 = w0 + nb;
    (void)cx;
    __m512 f[8];
    for (int a = 0; a < na; a++) f[a] = _mm512_setzero_ps();
    for (int i = 0; i < nb; i++) {
        const mc_q41x8 *b0 = w0 + i, *b1 = w1 + i;
        /* as MC_Q41X8_PREFETCH (SmolLM2's layers at 1 and 8 x rows: 8 and 32 no better) */
        MC_ZMM41_PREFETCH(w0, w1, i, nb, 16, 3);
        __m512i u[8];
        mc_zmm41_split(b0->qs, b1->qs, u);
        const __m512 dw = mc_zmm41_h16(b0->d, b1->d);
        for (int a = 0; a < na; a++) {
            const mc_q8 *xq = x[a] + i;
            const __m512i s = mc_dpbusd8x16(u, (const int32_t *)xq->qs);
            f[a] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(xq->d)), _mm512_cvtepi32_ps(s), f[a]);
        }
    }
    __m512 m[8]; /* the mins' terms in block order (the groups are in L1 by now) */
    for (int a = 0; a < na; a++) m[a] = _mm512_setzero_ps();
    for (int i = 0; i < nb; i++) {
        const __m512 mw = mc_zmm41_h16(w0[i].m, w1[i].m);
        for (int a = 0; a < na; a++) m[a] = _mm512_add_ps(m[a], _mm512_mul_ps(mw, _mm512_set1_ps(x[a][i].s)));
    }
    for (int a = 0; a < na; a++) mc_x16_store(_mm512_add_ps(f[a], m[a]), y + (size_t)a * ldy, nr);
}

/* Q8_0 (weights stored as unsigned q + 128; cx[a][i] = 128 sum(x) taken back) */
MC_ZMM41 static inline __attribute__((always_inline)) void
mc_gemm_q80x16_body(int nb, const void *wv, const mc_q8 *const x[8], const int32_t *const cx[8],
                    float *y, size_t ldy, int nr, const int na) {
    const mc_q80x8 *w0 = (const mc_q80x8 *)wv, *w1 = w0 + nb;
    __m512 f[8];
    for (int a = 0; a < na; a++) f[a] = _mm512_setzero_ps();
    for (int i = 0; i < nb; i++) {
        const mc_q80x8 *b0 = w0 + i, *b1 = w1 + i;
        /* all 5 lines of the block 10 blocks on (SmolLM2's output head at 1 and 8 x rows:
         * 3, the ymm kernel's distance, 10-30% slower; 6 to 16 alike) */
        MC_ZMM41_PREFETCH(w0, w1, i, nb, 10, 5);
        __m512i q[8];
        for (int v = 0; v < 8; v++) q[v] = mc_pair32_z(b0->qs + 32 * v, b1->qs + 32 * v);
        const __m512 dw = mc_zmm41_h16(b0->d, b1->d);
        for (int a = 0; a < na; a++) {
            const mc_q8 *xq = x[a] + i;
            const __m512i st = _mm512_sub_epi32(mc_dpbusd8x16(q, (const int32_t *)xq->qs),
                                                _mm512_set1_epi32(cx[a][i]));
            f[a] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(xq->d)), _mm512_cvtepi32_ps(st), f[a]);
        }
    }
    for (int a = 0; a < na; a++) mc_x16_store(f[a], y + (size_t)a * ldy, nr);
}

/* Q4_0 (mc_iq4nlx8: nibbles as Q4_1's), Q5_0 (mc_q50x8, the fifth bits apart), IQ4_NL
 * (mc_iq4nlx8, its nibbles indexing the IQ4 levels + 128) and MXFP4 (mc_mxfp4x8, the
 * doubled E2M1 values + 128, its E8M0 scales) on two groups, t a constant:
 * the exact block sums of their unsigned ints less 8, 16 or 128 sum(x) (cx >> shift),
 * then the ymm kernels' float step in block order: acc = fma(dw * dx, s, acc)
 * (MC_OFFX8_BODY), IQ4_NL's and MXFP4's acc + (dw * dx) * s (MC_IQ4X8_BODY) */
MC_ZMM41 static inline __attribute__((always_inline)) void
mc_gemm_off16_body(int nb, const void *wv, const mc_q8 *const x[8], const int32_t *const cx[8], float *y,
                   size_t ldy, int nr, const int na, const int t) {
    const int q5 = t == MC_Q5_0, mx = t == MC_MXFP4, nl = t == MC_IQ4_NL || mx;
    const size_t bs = q5 ? sizeof(mc_q50x8) : mx ? sizeof(mc_mxfp4x8) : sizeof(mc_iq4nlx8);
    const char *w0 = (const char *)wv, *w1 = w0 + bs * (size_t)nb;
    const int shift = q5 ? 3 : nl ? 0 : 4;
    const __m512i tbl = mx ? mc_zmm41_mxfp4_levels() : mc_zmm41_iq4_levels();
    /* Q5_0: each lane's qh word (bits e .. e + 3: elements 4k .. 4k + 3 of u[k]) spread
     * by vpshufb to the lane's 4 bytes (byte e / 8), each byte then testing its own bit */
    const __m512i lane = _mm512_set4_epi32(0x0C0C0C0C, 0x08080808, 0x04040404, 0x00000000);
    const __m512i lo = _mm512_set1_epi32(0x08040201), hi = _mm512_set1_epi32((int)0x80402010u);
    __m512 f[8];
    for (int a = 0; a < na; a++) f[a] = _mm512_setzero_ps();
    for (int i = 0; i < nb; i++) {
        const char *b0 = w0 + bs * (size_t)i, *b1 = w1 + bs * (size_t)i;
        for (int c = 0; c < (int)bs; c += 64) {
            _mm_prefetch(b0 + 8 * bs + c, _MM_HINT_T0);
            _mm_prefetch(b1 + 8 * bs + c, _MM_HINT_T0);
        }
        const mc_iq4nlx8 *n0 = (const mc_iq4nlx8 *)b0, *n1 = (const mc_iq4nlx8 *)b1;
        const mc_q50x8 *f0 = (const mc_q50x8 *)b0, *f1 = (const mc_q50x8 *)b1;
        __m512i u[8];
        mc_zmm41_split(n0->qs, n1->qs, u); /* qs leads both layouts */
        if (nl)
            for (int v = 0; v < 8; v++) u[v] = _mm512_shuffle_epi8(tbl, u[v]);
        if (q5) {
            const __m512i qh = mc_pair32_z(f0->qh, f1->qh);
            for (int k = 0; k < 8; k++) {
                const int e = k < 4 ? 4 * k : 16 + 4 * (k - 4);
                const __m512i rep = _mm512_shuffle_epi8(qh, _mm512_add_epi8(lane, _mm512_set1_epi8((char)(e / 8))));
                const __m512i m = e % 8 ? hi : lo;
                const __mmask64 set = _mm512_cmpeq_epi8_mask(_mm512_and_si512(rep, m), m);
                u[k] = _mm512_or_si512(u[k], _mm512_maskz_mov_epi8(set, _mm512_set1_epi8(0x10)));
            }
        }
        const __m512 dw = q5   ? mc_zmm41_h16(f0->d, f1->d)
                          : mx ? mc_zmm41_e8m0(((const mc_mxfp4x8 *)b0)->e, ((const mc_mxfp4x8 *)b1)->e)
                               : mc_zmm41_h16(n0->d, n1->d);
        for (int a = 0; a < na; a++) {
            const mc_q8 *xq = x[a] + i;
            const __m512i s = _mm512_sub_epi32(mc_dpbusd8x16(u, (const int32_t *)xq->qs),
                                               _mm512_set1_epi32(cx[a][i] >> shift));
            const __m512 ddx = _mm512_mul_ps(dw, _mm512_set1_ps(xq->d));
            f[a] = nl ? _mm512_add_ps(f[a], _mm512_mul_ps(ddx, _mm512_cvtepi32_ps(s)))
                      : _mm512_fmadd_ps(ddx, _mm512_cvtepi32_ps(s), f[a]);
        }
    }
    for (int a = 0; a < na; a++) mc_x16_store(f[a], y + (size_t)a * ldy, nr);
}

/* IQ4_XS (mc_iq4xsx8) on two groups: MC_IQ4X8_BODY's steps per 32-column sub-block, the
 * sum (less 128 sum(x)) times the sub-block's scale, then acc + (dw * dx) * s */
MC_ZMM41 static inline __attribute__((always_inline)) void
mc_gemm_iq4xsx16_body(int nb, const void *wv, const mc_q8 *const x[8], const int32_t *const cx[8],
                      float *y, size_t ldy, int nr, const int na) {
    const mc_iq4xsx8 *w0 = (const mc_iq4xsx8 *)wv, *w1 = w0 + nb / 8;
    const __m512i tbl = mc_zmm41_iq4_levels();
    __m512 f[8];
    for (int a = 0; a < na; a++) f[a] = _mm512_setzero_ps();
    for (int i = 0; i < nb / 8; i++) {
        const mc_iq4xsx8 *b0 = w0 + i, *b1 = w1 + i;
        for (size_t c = 0; c < sizeof *b0; c += 64) {
            _mm_prefetch((const char *)(b0 + 1) + c, _MM_HINT_T0);
            _mm_prefetch((const char *)(b1 + 1) + c, _MM_HINT_T0);
        }
        const __m512 dw = mc_zmm41_h16(b0->d, b1->d);
        for (int ib = 0; ib < 8; ib++) {
            __m512i u[8];
            mc_zmm41_split(b0->qs[ib], b1->qs[ib], u);
            for (int v = 0; v < 8; v++) u[v] = _mm512_shuffle_epi8(tbl, u[v]);
            const __m512i sc = _mm512_cvtepi8_epi32(mc_pair8_z(b0->sc[ib], b1->sc[ib]));
            for (int a = 0; a < na; a++) {
                const mc_q8 *xq = x[a] + 8 * i + ib;
                const __m512i s = _mm512_mullo_epi32(
                    _mm512_sub_epi32(mc_dpbusd8x16(u, (const int32_t *)xq->qs), _mm512_set1_epi32(cx[a][8 * i + ib])),
                    sc);
                f[a] = _mm512_add_ps(f[a], _mm512_mul_ps(_mm512_mul_ps(dw, _mm512_set1_ps(xq->d)), _mm512_cvtepi32_ps(s)));
            }
        }
    }
    for (int a = 0; a < na; a++) mc_x16_store(f[a], y + (size_t)a * ldy, nr);
}

#define MC_OFF16_BODY(name, t)                                                                     \
    MC_ZMM41 static inline __attribute__((always_inline)) void name(                               \
        int nb, const void *wv, const mc_q8 *const x[8], const int32_t *const cx[8], float *y,     \
        size_t ldy, int nr, const int na) {                                                        \
        mc_gemm_off16_body(nb, wv, x, cx, y, ldy, nr, na, t);                                      \
    }
MC_OFF16_BODY(mc_gemm_q40x16_body, MC_Q4_0)
MC_OFF16_BODY(mc_gemm_q50x16_body, MC_Q5_0)
MC_OFF16_BODY(mc_gemm_iq4nlx16_body, MC_IQ4_NL)
MC_OFF16_BODY(mc_gemm_mxfp4x16_body, MC_MXFP4)
#undef MC_OFF16_BODY

/* as mc_repacked_fn for a pair of groups (nr 9 .. 16 weight rows); below min_na x rows the
 * ymm kernel `ymm` on each group; compiled by the zmm unit (mc_common.h), declared elsewhere */
#if MC_UNIT_ZMM
#define MC_ZMM41_FN(name, body, ymm, min_na)                                                        \
    MC_ZMM41 MC_SHARED void name(int na, int nb, const void *w, const mc_q8 *const x[8],           \
                                 const int32_t *const cx[8], float *y, size_t ldy, int nr) {       \
        if (na < (min_na)) {                                                                \
            ymm(na, nb, w, x, cx, y, ldy, 8);                                                      \
            ymm(na, nb, (const char *)w + ymm##_gbytes(nb), x, cx, y + 8, ldy, nr - 8);           \
            return;                                                                                \
        }                                                                                          \
        MC_BY_NA(na, body, nb, w, x, cx, y, ldy, nr)                                               \
    }
#else
#define MC_ZMM41_FN(name, body, ymm, min_na)                                                        \
    MC_SHARED void name(int na, int nb, const void *w, const mc_q8 *const x[8],                    \
                        const int32_t *const cx[8], float *y, size_t ldy, int nr);
#endif

static inline size_t mc_gemm_q41x8_gbytes(int nb) { return sizeof(mc_q41x8) * (size_t)nb; }
static inline size_t mc_gemm_q80x8_gbytes(int nb) { return sizeof(mc_q80x8) * (size_t)nb; }

static inline size_t mc_gemm_q40x8_gbytes(int nb) { return sizeof(mc_iq4nlx8) * (size_t)nb; }
static inline size_t mc_gemm_q50x8_gbytes(int nb) { return sizeof(mc_q50x8) * (size_t)nb; }
static inline size_t mc_gemm_iq4nlx8_gbytes(int nb) { return sizeof(mc_iq4nlx8) * (size_t)nb; }
static inline size_t mc_gemm_iq4xsx8_gbytes(int nb) { return sizeof(mc_iq4xsx8) * (size_t)(nb / 8); }
static inline size_t mc_gemm_mxfp4x8_gbytes(int nb) { return sizeof(mc_mxfp4x8) * (size_t)nb; }

MC_ZMM41_FN(mc_gemm_q41x16, mc_gemm_q41x16_body, mc_gemm_q41x8, MC_ZMM41_Q41_MIN_NA)
MC_ZMM41_FN(mc_gemm_q80x16, mc_gemm_q80x16_body, mc_gemm_q80x8, MC_ZMM41_Q80_MIN_NA)
MC_ZMM41_FN(mc_gemm_q40x16, mc_gemm_q40x16_body, mc_gemm_q40x8, MC_ZMM41_Q41_MIN_NA)
MC_ZMM41_FN(mc_gemm_q50x16, mc_gemm_q50x16_body, mc_gemm_q50x8, MC_ZMM41_Q41_MIN_NA)
MC_ZMM41_FN(mc_gemm_iq4nlx16, mc_gemm_iq4nlx16_body, mc_gemm_iq4nlx8, MC_ZMM41_Q41_MIN_NA)
MC_ZMM41_FN(mc_gemm_iq4xsx16, mc_gemm_iq4xsx16_body, mc_gemm_iq4xsx8, MC_ZMM41_Q41_MIN_NA)
MC_ZMM41_FN(mc_gemm_mxfp4x16, mc_gemm_mxfp4x16_body, mc_gemm_mxfp4x8, MC_ZMM41_Q41_MIN_NA)

/* the zmm kernel for repacked weights of type t at SIMD level simd, or NULL */
static mc_repacked_fn mc_repacked16_pick(int t, int simd) {
    if (simd != MC_SIMD_VNNI || !mc_zmm41_ok()) return NULL;
    return t == MC_Q4_1   ? mc_gemm_q41x16
           : t == MC_Q8_0 ? mc_gemm_q80x16
           : t == MC_Q4_0 ? mc_gemm_q40x16
           : t == MC_Q5_0 ? mc_gemm_q50x16
           : t == MC_IQ4_NL ? mc_gemm_iq4nlx16
           : t == MC_IQ4_XS ? mc_gemm_iq4xsx16
           : t == MC_MXFP4 ? mc_gemm_mxfp4x16
                          : NULL;
}

#endif /* MC_X86 */
#endif /* MC_GEMM_ZMM41_H */
