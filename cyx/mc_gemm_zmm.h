/* Q2_K to Q6_K on repacked weights (mc_q2kx8 .. mc_q6kx8) on 512-bit registers:
 * two groups of 8 weight rows at once.
 *
 * The kernels of mc_gemm_vnni.h (mc_gemm_q4kx8, mc_gemm_q6kx8) hold one group of 8 weight
 * rows in the 8 dword lanes of a ymm register and are bound by the vpdpbusd they issue.
 * These hold two neighbouring groups g and g + 1 in one zmm register (lanes 0-7: group g's
 * rows 0-7, lanes 8-15: group g + 1's), so each broadcast x dword meets 16 weight rows
 * per vpdpbusd, and the scale multiplies, the mins' / offsets' terms and the float
 * epilogue each serve 16 rows per instruction too (the mins' / offsets' terms by vpdpwssd
 * on broadcast x dwords).  The repacked layout is unchanged: each of the two groups' 32-byte
 * pieces is loaded and the pair joined by vinserti64x4.  With many x rows (from
 * MC_ZMM_UNPACK_MIN_ROWS) each pair is first unpacked once into scratch (mc_q4kx16u,
 * mc_q6kx16u: the ints as vpdpbusd takes them, the scales as int32 / float), which every
 * group of 8 x rows then reads with one load a vector.
 *
 * Arithmetic.  Lane by lane that of the ymm kernels: the same exact integer sums per
 * 256-column block (each sub-block's vpdpbusd sum times its scale, the mins' or the -32
 * offset's term; exact in int32, so the order of the integer adds does not matter; Q4_K
 * multiplies each half sub-block's sum, an int16, by vpdpwssd (+11-14 % at 8 and 64 x rows
 * on a 1B model's Q4_K layers), Q6_K each sum split into int16 halves by vpdpwssd too
 * (mc_q6k_scale_add: +16 % at 512 rows, +6 % at 8), Q3_K's and Q2_K's 16-column sums (int16) by
 * vpdpwssd against (sc, 0), Q5_K by vpmulld), then the same float operations in the same
 * order (mc_dot_q2_k_scalar .. mc_dot_q6_k_scalar), so
 * the results are bit-identical to them and to the single-row kernels.  A tile's last
 * single group of 8 rows goes through the ymm kernel.
 *
 * Needs AVX512F and AVX512BW besides VNNI and VL (mc_simd_best's MC_SIMD_VNNI checks all).
 */
#ifndef MC_GEMM_ZMM_H
#define MC_GEMM_ZMM_H

#include "mc_gemm_vnni.h"

#if defined(MC_X86)

#define MC_ZMM __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))

/* Kernels on two repacked groups (w, and the group `gs` bytes on): x rows x[0 .. na - 1]
 * (mc_q8k blocks), weight rows j < nr (9 .. 16; j >= 8: row j - 8 of the second group) into
 * y[a * ldy + j], as mc_repacked_fn does for one group. */
/* Fewest x rows in a call for the zmm kernels (fewer: the ymm kernels).  At 1 row (decode,
 * memory-bound) the layers alone measured 1 thread +3-15%, 2 threads even within the noise,
 * but the whole 1B Q4_K_M decode step with 2 threads was slower with them in each of 3
 * alternating pairs (26.6 / 26.3 / 43.7 tok/s against 33.9 / 42.0 / 51.2 on the ymm
 * kernels; `bench.bench_step`, a shared machine): batch 1 stays on ymm. */
#ifndef MC_ZMM_MIN_ROWS
#define MC_ZMM_MIN_ROWS 2
#endif

/* Fewest x rows for which each pair of groups is unpacked once (mc_q4kx16u, mc_q6kx16u) and
 * then read by every group of 8 x rows.  Measured on a 1B model's Q4_K and Q6_K layers, one
 * thread: 16 rows -5 to -10%, 24 even, 64 +10-12%, 512 +17-25%. */
#ifndef MC_ZMM_UNPACK_MIN_ROWS
#define MC_ZMM_UNPACK_MIN_ROWS 32
#endif

typedef void (*mc_repacked16_fn)(int na, int nb, const void *w, size_t gs,
                                 const mc_q8 *const x[8], float *y, size_t ldy, int nr);

/* acc += dpbusd(x, the dword at p broadcast to 16 lanes), the broadcast folded into the
 * instruction as in mc_dpbusd_bcst */
MC_ZMM static inline __attribute__((always_inline)) __m512i
mc_dpbusd16_bcst(__m512i acc, __m512i x, const int32_t *p) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(x), "m"(*p));
    return acc;
}

/* acc += dpwssd(x, the dword at p broadcast to 16 lanes): per dword lane the two int16
 * products of x's and p's words added to acc (vpmaddwd + vpaddd in one instruction) */
MC_ZMM static inline __attribute__((always_inline)) __m512i
mc_dpwssd16_bcst(__m512i acc, __m512i x, const int32_t *p) {
    __asm__("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(x), "m"(*p));
    return acc;
}

/* sum over k < 8 of vpdpbusd(u[k], the x dword xd[k] broadcast), in one chain (the x rows
 * and sub-blocks give the independent chains: one vpaddd fewer than two chains) */
MC_ZMM static inline __attribute__((always_inline)) __m512i mc_dpbusd8_z(const __m512i u[8],
                                                                         const int32_t *xd) {
    __m512i s = mc_dpbusd16_bcst(_mm512_setzero_si512(), u[0], xd);
    for (int k = 1; k < 8; k++) s = mc_dpbusd16_bcst(s, u[k], xd + k);
    return s;
}

/* sum over k < 4 of vpdpbusd(u[k], the x dword xd[k] broadcast), in one chain */
MC_ZMM static inline __attribute__((always_inline)) __m512i mc_dpbusd4_z(const __m512i u[4],
                                                                         const int32_t *xd) {
    __m512i s = mc_dpbusd16_bcst(_mm512_setzero_si512(), u[0], xd);
    for (int k = 1; k < 4; k++) s = mc_dpbusd16_bcst(s, u[k], xd + k);
    return s;
}

/* the 32 bytes at p0 (lanes 0-7) and at p1 (lanes 8-15) in one vector */
MC_ZMM static inline __attribute__((always_inline)) __m512i mc_pair32_z(const uint8_t *p0,
                                                                        const uint8_t *p1) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p0)),
                              _mm256_loadu_si256((const __m256i *)p1), 1);
}

/* the 8 bytes at p0 then the 8 at p1 (one byte per row of each group) */
MC_ZMM static inline __attribute__((always_inline)) __m128i mc_pair8_z(const void *p0,
                                                                       const void *p1) {
    return _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)p0), _mm_loadl_epi64((const __m128i *)p1));
}

/* the 8 f16 at p0 and the 8 at p1 as 16 floats */
MC_ZMM static inline __attribute__((always_inline)) __m512 mc_pair_h16_z(const uint16_t *p0,
                                                                         const uint16_t *p1) {
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)p0)),
                                                   _mm_loadu_si128((const __m128i *)p1), 1));
}

/* r (lane j: weight row j) into y[j] for j < nr */
MC_ZMM static inline __attribute__((always_inline)) void mc_x16_store(__m512 r, float *y, int nr) {
    _mm512_mask_storeu_ps(y, (__mmask16)((1u << nr) - 1u), r);
}

/* A pair of groups' 256-column block unpacked once per call into what the kernels' inner
 * loops read (mc_repacked_tile, for many x rows): the ints as the bytes vpdpbusd takes, the
 * scales as int32, the mins' / offsets' int16 pairs and the f16 scales as float, each a
 * 64-byte vector.  Reading them back is one aligned load each, where unpacking takes two
 * loads, a vinserti64x4 and one to three shifts / masks; the values are the same. */
typedef struct {
    uint8_t u[8][8][64]; /* sub-block s, vector v: mc_q4kx16_sub's u[v] */
    int32_t sc[8][16];   /* sub-block scales */
    int32_t mn[4][16];   /* sub-block mins in pairs (mc_q4kx16_mins) */
    float dw[16], dm[16];
} mc_q4kx16u;

typedef struct {
    uint8_t u[8][8][64]; /* columns 128 n + 32 X (index 4n + X), vector v: mc_q6kx16_sub's u[v] */
    int32_t scw[16][16]; /* sub-block scales as the pairs mc_sub16x16_scw makes */
    int32_t scp[8][16];  /* sub-block scales (Q2_K: mins) in pairs (mc_sub16x16_pairs) */
    float dw[16];
    float dm[16];        /* Q2_K's dmin */
} mc_q6kx16u;

/* Q5_K shares the Q4_K kernels below through the constant flag q5 (MC_Q45_BYTES,
 * MC_Q45_QS: mc_gemm_vnni.h), and the unpacked pair (mc_q4kx16u); on it q5 only says that
 * the ints are < 32, too wide for Q4_K's vpdpwssd scale step. */

/* Q4_K (Q5_K: q5) block pair (b0, b1), sub-block s (the low (s even) or high nibbles of
 * chunk s / 2): its ints u[v] as bytes (lane j: row j of b0, 8 + j: row j of b1), its
 * scales returned */
MC_ZMM static inline __attribute__((always_inline)) __m512i
mc_q4kx16_sub(const mc_q4kx8 *b0, const mc_q4kx8 *b1, int s, __m512i u[8], const int q5) {
    const __m512i m4 = _mm512_set1_epi8(0xF), h = _mm512_set1_epi8(0x10);
    for (int v = 0; v < 8; v++) {
        const __m512i q = mc_pair32_z(MC_Q45_QS(b0, q5, s >> 1) + 32 * v, MC_Q45_QS(b1, q5, s >> 1) + 32 * v);
        u[v] = _mm512_and_si512(s & 1 ? _mm512_srli_epi16(q, 4) : q, m4);
        if (q5) { /* bit s of each qh byte to bit 4, as mc_gemm_q45kx8_body does */
            const __m512i qh = mc_pair32_z(((const mc_q5kx8 *)b0)->qh + 32 * v,
                                           ((const mc_q5kx8 *)b1)->qh + 32 * v);
            const __m512i hb = s < 4 ? _mm512_slli_epi16(qh, 4 - s) : _mm512_srli_epi16(qh, s - 4);
            u[v] = _mm512_or_si512(u[v], _mm512_and_si512(hb, h));
        }
    }
    return _mm512_cvtepu8_epi32(mc_pair8_z(b0->sc[s], b1->sc[s]));
}

/* Q4_K (or Q5_K) block pair: lanes holding (mn[2p], mn[2p + 1]) as int16, p < 4 */
MC_ZMM static inline __attribute__((always_inline)) void
mc_q4kx16_mins(const mc_q4kx8 *b0, const mc_q4kx8 *b1, __m512i mn[4]) {
    for (int p = 0; p < 4; p++) {
        const __m512i v0 = _mm512_cvtepu8_epi32(mc_pair8_z(b0->mn[2 * p], b1->mn[2 * p]));
        const __m512i v1 = _mm512_cvtepu8_epi32(mc_pair8_z(b0->mn[2 * p + 1], b1->mn[2 * p + 1]));
        mn[p] = _mm512_or_si512(v0, _mm512_slli_epi32(v1, 16));
    }
}

/* Q6_K block pair, columns 128 n + 32 X .. (sub-blocks 8n + 2X, + 1): the 6-bit ints u[v] */
MC_ZMM static inline __attribute__((always_inline)) void
mc_q6kx16_sub(const mc_q6kx8 *b0, const mc_q6kx8 *b1, int n, int X, __m512i u[8]) {
    const __m512i m4 = _mm512_set1_epi8(0xF), m30 = _mm512_set1_epi8(0x30);
    for (int v = 0; v < 8; v++) {
        const __m512i ql = mc_pair32_z(MC_Q6_QL(b0, n, X & 1, v), MC_Q6_QL(b1, n, X & 1, v));
        const __m512i qh = mc_pair32_z(MC_Q6_QH(b0, n, v), MC_Q6_QH(b1, n, v));
        const __m512i l4 = X < 2 ? _mm512_and_si512(ql, m4)
                                 : _mm512_and_si512(_mm512_srli_epi16(ql, 4), m4);
        const __m512i h2 = X == 0   ? _mm512_slli_epi16(qh, 4)
                           : X == 1 ? _mm512_slli_epi16(qh, 2)
                           : X == 2 ? qh
                                    : _mm512_srli_epi16(qh, 2);
        u[v] = _mm512_or_si512(l4, _mm512_and_si512(h2, m30));
    }
}

/* Q3_K block pair, columns 128 n + 32 X ..: the 3-bit ints u[v] (the 2-bit crumb | the
 * hmask bit 4 n + X as 4, mc_q3kx8_u's operations on both groups); Q2_K (hmask NULL): the
 * crumbs alone (mc_q2kx8_u's) */
MC_ZMM static inline __attribute__((always_inline)) void
mc_q32kx16_sub(const uint8_t (*qs0)[256], const uint8_t (*qs1)[256], const uint8_t *hm0, const uint8_t *hm1,
               int n, int X, __m512i u[8]) {
    const int hb = 4 * n + X;
    const __m512i m3 = _mm512_set1_epi8(3), m4 = _mm512_set1_epi8(4);
    for (int v = 0; v < 8; v++) {
        const __m512i q = mc_pair32_z(qs0[n] + 32 * v, qs1[n] + 32 * v);
        u[v] = _mm512_and_si512(_mm512_srli_epi16(q, 2 * X), m3);
        if (hm0 != NULL) {
            const __m512i hm = mc_pair32_z(hm0 + 32 * v, hm1 + 32 * v);
            const __m512i h = hb < 2 ? _mm512_slli_epi16(hm, 2 - hb) : _mm512_srli_epi16(hm, hb - 2);
            u[v] = _mm512_or_si512(u[v], _mm512_and_si512(h, m4));
        }
    }
}

/* The 16-column-sub-block K-quants on zmm (kt, a constant where inlined: 6 Q6_K, 3 Q3_K,
 * 2 Q2_K): a block's bytes, its scale bytes ([sub-block][row]; Q6_K's and Q3_K's int8
 * scales, Q2_K's scale | min << 4) and its f16 d (the first field of all three) */
#define MC_SUB16_BYTES(kt) ((kt) == 6 ? sizeof(mc_q6kx8) : (kt) == 3 ? sizeof(mc_q3kx8) : sizeof(mc_q2kx8))
#define MC_SUB16_SC(b, kt)                                                                         \
    ((kt) == 2 ? ((const mc_q2kx8 *)(const void *)(b))->sc                                        \
               : (const uint8_t(*)[8])((const mc_q6kx8 *)(const void *)(b))->sc)
#define MC_SUB16_D(b) (((const mc_q6kx8 *)(const void *)(b))->d)
#define MC_SUB16_DMIN(b) (((const mc_q2kx8 *)(const void *)(b))->dmin) /* Q2_K only */

/* block pair: sub-block k's scales (Q2_K: the low nibbles; mins: their high nibbles) */
MC_ZMM static inline __attribute__((always_inline)) __m512i
mc_sub16x16_sc(const uint8_t (*s0)[8], const uint8_t (*s1)[8], int k, const int kt, const int mins) {
    const __m128i b = mc_pair8_z(s0[k], s1[k]);
    if (kt != 2) return _mm512_cvtepi8_epi32(b);
    const __m512i v = _mm512_cvtepu8_epi32(b);
    return mins ? _mm512_srli_epi32(v, 4) : _mm512_and_si512(v, _mm512_set1_epi32(0xF));
}

/* block pair: sub-block k's scales sc as the int16 pairs a sum is multiplied by: Q6_K
 * (sc, 256 sc) for mc_q6k_scale_add (256 sc fits an int16: sc is an int8); Q3_K and Q2_K,
 * whose 16-column sums fit an int16 (|s| <= 16 x 7 x 128): (sc, 0), for one vpdpwssd */
MC_ZMM static inline __attribute__((always_inline)) __m512i
mc_sub16x16_scw(const uint8_t (*s0)[8], const uint8_t (*s1)[8], int k, const int kt) {
    const __m512i sc = mc_sub16x16_sc(s0, s1, k, kt, 0), lo = _mm512_and_si512(sc, _mm512_set1_epi32(0xFFFF));
    return kt == 6 ? _mm512_or_si512(lo, _mm512_slli_epi32(sc, 24)) : lo;
}

/* acc + s * sc in each lane, exactly, for a Q6_K 16-column sub-block's sum s (|s| <= 16 x 63
 * x 128 = 129024, wider than an int16) and scw = (sc, 256 sc) (mc_sub16x16_scw): s's bytes
 * (b0, b1, b2, b3) are rearranged to (b0, 0, b1, b2), the int16 pair (s & 255, s >> 8)
 * (s >> 8 fits an int16), and one vpdpwssd adds (s & 255) sc + (s >> 8) 256 sc = s sc.
 * A vpshufb and a vpdpwssd where vpmulld + vpaddd take 3 uops, two of them on port 0. */
MC_ZMM static inline __attribute__((always_inline)) __m512i mc_q6k_scale_add(__m512i acc, __m512i s,
                                                                             __m512i scw) {
    const __m512i split = _mm512_set4_epi32(0x0E0D800C, 0x0A098008, 0x06058004, 0x02018000);
    return _mm512_dpwssd_epi32(acc, _mm512_shuffle_epi8(s, split), scw);
}

/* block pair: lanes holding (sc[2p], sc[2p + 1]) as int16, p < 8 (Q2_K: its mins) */
MC_ZMM static inline __attribute__((always_inline)) void
mc_sub16x16_pairs(const uint8_t (*s0)[8], const uint8_t (*s1)[8], __m512i scp[8], const int kt) {
    for (int p = 0; p < 8; p++)
        scp[p] = _mm512_mask_blend_epi16((__mmask32)0xAAAAAAAAu, mc_sub16x16_sc(s0, s1, 2 * p, kt, 1),
                                         _mm512_slli_epi32(mc_sub16x16_sc(s0, s1, 2 * p + 1, kt, 1), 16));
}

/* the unpacked block pairs of two groups (w, and the group gs bytes on), nb / 8 of them */
MC_ZMM static inline __attribute__((always_inline)) void
mc_q4kx16_unpack_body(int nb, const void *wv, size_t gs, void *out, const int q5) {
    const char *w0 = (const char *)wv, *w1 = (const char *)wv + gs;
    for (int i = 0; i < nb / 8; i++) {
        const mc_q4kx8 *b0 = (const mc_q4kx8 *)(w0 + MC_Q45_BYTES(q5) * i);
        const mc_q4kx8 *b1 = (const mc_q4kx8 *)(w1 + MC_Q45_BYTES(q5) * i);
        mc_q4kx16u *o = (mc_q4kx16u *)out + i;
        if (q5) {
            MC_KX8_PREFETCH((const mc_q5kx8 *)b0);
            MC_KX8_PREFETCH((const mc_q5kx8 *)b1);
        } else {
            MC_KX8_PREFETCH(b0);
            MC_KX8_PREFETCH(b1);
        }
        for (int s = 0; s < 8; s++) {
            __m512i u[8];
            _mm512_store_si512(o->sc[s], mc_q4kx16_sub(b0, b1, s, u, q5));
            for (int v = 0; v < 8; v++) _mm512_store_si512(o->u[s][v], u[v]);
        }
        __m512i mn[4];
        mc_q4kx16_mins(b0, b1, mn);
        for (int p = 0; p < 4; p++) _mm512_store_si512(o->mn[p], mn[p]);
        _mm512_store_ps(o->dw, mc_pair_h16_z(b0->d, b1->d));
        _mm512_store_ps(o->dm, mc_pair_h16_z(b0->dmin, b1->dmin));
    }
}

MC_ZMM static void mc_q4kx16_unpack(int nb, const void *wv, size_t gs, void *out) {
    mc_q4kx16_unpack_body(nb, wv, gs, out, 0);
}

MC_ZMM static void mc_q5kx16_unpack(int nb, const void *wv, size_t gs, void *out) {
    mc_q4kx16_unpack_body(nb, wv, gs, out, 1);
}

/* block pair (b0, b1) of type kt, columns 128 n + 32 X ..: the ints u[v] */
MC_ZMM static inline __attribute__((always_inline)) void mc_sub16x16_u(const char *b0, const char *b1, int n,
                                                                      int X, __m512i u[8], const int kt) {
    if (kt == 6) {
        mc_q6kx16_sub((const mc_q6kx8 *)(const void *)b0, (const mc_q6kx8 *)(const void *)b1, n, X, u);
    } else if (kt == 3) {
        const mc_q3kx8 *c0 = (const mc_q3kx8 *)(const void *)b0, *c1 = (const mc_q3kx8 *)(const void *)b1;
        mc_q32kx16_sub(c0->qs, c1->qs, c0->hm, c1->hm, n, X, u);
    } else {
        const mc_q2kx8 *c0 = (const mc_q2kx8 *)(const void *)b0, *c1 = (const mc_q2kx8 *)(const void *)b1;
        mc_q32kx16_sub(c0->qs, c1->qs, NULL, NULL, n, X, u);
    }
}

MC_ZMM static inline __attribute__((always_inline)) void
mc_sub16x16_unpack_body(int nb, const void *wv, size_t gs, void *out, const int kt) {
    const char *w0 = (const char *)wv, *w1 = (const char *)wv + gs;
    for (int i = 0; i < nb / 8; i++) {
        const char *b0 = w0 + MC_SUB16_BYTES(kt) * i, *b1 = w1 + MC_SUB16_BYTES(kt) * i;
        mc_q6kx16u *o = (mc_q6kx16u *)out + i;
        for (int n = 0; n < 2; n++)
            for (int X = 0; X < 4; X++) {
                __m512i u[8];
                mc_prefetch_part(b0, MC_SUB16_BYTES(kt), 4 * n + X, 8);
                mc_prefetch_part(b1, MC_SUB16_BYTES(kt), 4 * n + X, 8);
                mc_sub16x16_u(b0, b1, n, X, u, kt);
                for (int v = 0; v < 8; v++) _mm512_store_si512(o->u[4 * n + X][v], u[v]);
            }
        for (int k = 0; k < 16; k++)
            _mm512_store_si512(o->scw[k], mc_sub16x16_scw(MC_SUB16_SC(b0, kt), MC_SUB16_SC(b1, kt), k, kt));
        __m512i scp[8];
        mc_sub16x16_pairs(MC_SUB16_SC(b0, kt), MC_SUB16_SC(b1, kt), scp, kt);
        for (int p = 0; p < 8; p++) _mm512_store_si512(o->scp[p], scp[p]);
        _mm512_store_ps(o->dw, mc_pair_h16_z(MC_SUB16_D(b0), MC_SUB16_D(b1)));
        if (kt == 2)
            _mm512_store_ps(o->dm, mc_pair_h16_z(MC_SUB16_DMIN(b0), MC_SUB16_DMIN(b1)));
    }
}

MC_ZMM static void mc_q6kx16_unpack(int nb, const void *wv, size_t gs, void *out) {
    mc_sub16x16_unpack_body(nb, wv, gs, out, 6);
}

MC_ZMM static void mc_q3kx16_unpack(int nb, const void *wv, size_t gs, void *out) {
    mc_sub16x16_unpack_body(nb, wv, gs, out, 3);
}

MC_ZMM static void mc_q2kx16_unpack(int nb, const void *wv, size_t gs, void *out) {
    mc_sub16x16_unpack_body(nb, wv, gs, out, 2);
}

/* the next block pair's unpacked vectors [k0, k1) (64 bytes each), from L2 into L1 */
#define MC_KX16U_PREFETCH(o, k0, k1)                                                               \
    do {                                                                                           \
        for (int k_ = (k0); k_ < (k1); k_++) _mm_prefetch((const char *)((o) + 1) + 64 * k_, _MM_HINT_T0); \
    } while (0)

/* Q4_K (Q5_K: q5): mc_gemm_q4kx8_body on two groups; `pre`: wv holds them unpacked
 * (mc_q4kx16u) */
MC_ZMM static inline __attribute__((always_inline)) void
mc_gemm_q4kx16_body(int nb, const void *wv, size_t gs, const mc_q8 *const x[8], float *y,
                    size_t ldy, int nr, const int na, const int pre, const int q5) {
    const char *w0 = (const char *)wv, *w1 = (const char *)wv + gs;
    const mc_q8k *xk[8];
    for (int a = 0; a < na; a++) xk[a] = (const mc_q8k *)x[a];
    __m512 f[8];
    for (int a = 0; a < na; a++) f[a] = _mm512_setzero_ps();
    for (int i = 0; i < nb / 8; i++) {
        const mc_q4kx8 *b0 = (const mc_q4kx8 *)(w0 + MC_Q45_BYTES(q5) * i);
        const mc_q4kx8 *b1 = (const mc_q4kx8 *)(w1 + MC_Q45_BYTES(q5) * i);
        const mc_q4kx16u *o = (const mc_q4kx16u *)wv + i;
        __m512i si[8], sm[8];
        for (int a = 0; a < na; a++) si[a] = _mm512_setzero_si512();
        for (int s = 0; s < 8; s++) {
            __m512i u[8], sc;
            if (!pre) { /* the block pair MC_KX8_AHEAD on, an eighth a sub-block */
                mc_prefetch_part(b0, MC_Q45_BYTES(q5), s, 8);
                mc_prefetch_part(b1, MC_Q45_BYTES(q5), s, 8);
            }
            if (pre) {
                MC_KX16U_PREFETCH(o, 8 * s, 8 * s + 8);
                for (int v = 0; v < 8; v++) u[v] = _mm512_load_si512(o->u[s][v]);
                sc = _mm512_load_si512(o->sc[s]);
            } else {
                sc = mc_q4kx16_sub(b0, b1, s, u, q5);
            }
            for (int a = 0; a < na; a++) {
                const int32_t *xd = (const int32_t *)(xk[a][i].qs + 32 * s);
                if (q5) {
                    si[a] = _mm512_add_epi32(si[a], _mm512_mullo_epi32(mc_dpbusd8_z(u, xd), sc));
                } else { /* Q4_K: each half sub-block's sum fits an int16 (|sum| <= 16 x 15 x 127),
                          * so vpdpwssd against sc's lanes (scale, 0) adds sum * scale exactly:
                          * one uop where vpmulld takes two and vpaddd a third */
                    const __m512i h0 = mc_dpbusd4_z(u, xd), h1 = mc_dpbusd4_z(u + 4, xd + 4);
                    si[a] = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(si[a], h0, sc), h1, sc);
                }
            }
        }
        /* sum over sub-blocks s of mn[s] * (bsums[2s] + bsums[2s + 1]): sub-blocks in pairs,
         * lanes holding (mn[2p], mn[2p + 1]) as int16, x dword p (bs[2p], bs[2p + 1]) */
        __m512i mn[4];
        if (pre) {
            MC_KX16U_PREFETCH(o, 64, 78);
            for (int p = 0; p < 4; p++) mn[p] = _mm512_load_si512(o->mn[p]);
        } else {
            mc_q4kx16_mins(b0, b1, mn);
        }
        for (int a = 0; a < na; a++) {
            /* bs[s] = bsums[2s] + bsums[2s + 1] (|bs| <= 32 x 127: int16), packed in pairs and
             * kept in memory for vpdpwssd's broadcast operand */
            const __m256i b16 = _mm256_loadu_si256((const __m256i *)xk[a][i].bsums);
            const __m256i b32 = _mm256_madd_epi16(b16, _mm256_set1_epi16(1)); /* 8 x int32 */
            int32_t bs[4];
            _mm_storeu_si128((__m128i *)bs, _mm_packs_epi32(_mm256_castsi256_si128(b32), _mm256_extracti128_si256(b32, 1)));
            const __m512i m0 = mc_dpwssd16_bcst(mc_dpwssd16_bcst(_mm512_setzero_si512(), mn[0], bs), mn[2], bs + 2);
            const __m512i m1 = mc_dpwssd16_bcst(mc_dpwssd16_bcst(_mm512_setzero_si512(), mn[1], bs + 1), mn[3], bs + 3);
            sm[a] = _mm512_add_epi32(m0, m1);
        }
        const __m512 dw = pre ? _mm512_load_ps(o->dw) : mc_pair_h16_z(b0->d, b1->d);
        const __m512 dm = pre ? _mm512_load_ps(o->dm) : mc_pair_h16_z(b0->dmin, b1->dmin);
        for (int a = 0; a < na; a++) { /* sum += dx * (d * si - dmin * sm) */
            const __m512 t = _mm512_sub_ps(_mm512_mul_ps(dw, _mm512_cvtepi32_ps(si[a])),
                                           _mm512_mul_ps(dm, _mm512_cvtepi32_ps(sm[a])));
            f[a] = _mm512_add_ps(f[a], _mm512_mul_ps(_mm512_set1_ps(xk[a][i].d), t));
        }
    }
    for (int a = 0; a < na; a++) mc_x16_store(f[a], y + (size_t)a * ldy, nr);
}

/* Q6_K, Q3_K or Q2_K (kt): mc_gemm_sub16x8_body on two groups; `pre`: wv holds them
 * unpacked (mc_q6kx16u) */
MC_ZMM static inline __attribute__((always_inline)) void
mc_gemm_sub16x16_body(int nb, const void *wv, size_t gs, const mc_q8 *const x[8], float *y,
                      size_t ldy, int nr, const int na, const int pre, const int kt) {
    const char *w0 = (const char *)wv, *w1 = (const char *)wv + gs;
    const mc_q8k *xk[8];
    for (int a = 0; a < na; a++) xk[a] = (const mc_q8k *)x[a];
    __m512 f[8];
    for (int a = 0; a < na; a++) f[a] = _mm512_setzero_ps();
    for (int i = 0; i < nb / 8; i++) {
        const char *b0 = w0 + MC_SUB16_BYTES(kt) * i, *b1 = w1 + MC_SUB16_BYTES(kt) * i;
        const mc_q6kx16u *o = (const mc_q6kx16u *)wv + i;
        __m512i si[8];
        for (int a = 0; a < na; a++) si[a] = _mm512_setzero_si512();
        for (int n = 0; n < 2; n++)
            for (int X = 0; X < 4; X++) { /* columns 128 n + 32 X ..: sub-blocks k, k + 1 */
                const int k = 8 * n + 2 * X;
                __m512i u[8], sc0, sc1;
                if (!pre) { /* the block pair MC_KX8_AHEAD on, an eighth a step */
                    mc_prefetch_part(b0, MC_SUB16_BYTES(kt), 4 * n + X, 8);
                    mc_prefetch_part(b1, MC_SUB16_BYTES(kt), 4 * n + X, 8);
                }
                if (pre) {
                    MC_KX16U_PREFETCH(o, 8 * (4 * n + X), 8 * (4 * n + X) + 8);
                    for (int v = 0; v < 8; v++) u[v] = _mm512_load_si512(o->u[4 * n + X][v]);
                    sc0 = _mm512_load_si512(o->scw[k]);
                    sc1 = _mm512_load_si512(o->scw[k + 1]);
                } else {
                    mc_sub16x16_u(b0, b1, n, X, u, kt);
                    sc0 = mc_sub16x16_scw(MC_SUB16_SC(b0, kt), MC_SUB16_SC(b1, kt), k, kt);
                    sc1 = mc_sub16x16_scw(MC_SUB16_SC(b0, kt), MC_SUB16_SC(b1, kt), k + 1, kt);
                }
                for (int a = 0; a < na; a++) { /* sum(q x) * sc per sub-block */
                    const int32_t *xd = (const int32_t *)(xk[a][i].qs + 128 * n + 32 * X);
                    const __m512i h0 = mc_dpbusd4_z(u, xd), h1 = mc_dpbusd4_z(u + 4, xd + 4);
                    si[a] = kt == 6 ? mc_q6k_scale_add(mc_q6k_scale_add(si[a], h0, sc0), h1, sc1)
                                    : _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(si[a], h0, sc0), h1, sc1);
                }
            }
        /* Q6_K / Q3_K: the offset of every q (-32 / -4), 32 (4) sum over k of sc[k] bsums[k];
         * Q2_K: the mins' term sm = sum over k of min[k] bsums[k]; sub-blocks in pairs (lanes
         * holding (sc[2p], sc[2p + 1]) as int16, x dword p (bsums[2p], bsums[2p + 1])) */
        __m512i scp[8], sm[8];
        if (pre) {
            MC_KX16U_PREFETCH(o, 64, 90);
            for (int p = 0; p < 8; p++) scp[p] = _mm512_load_si512(o->scp[p]);
        } else {
            mc_sub16x16_pairs(MC_SUB16_SC(b0, kt), MC_SUB16_SC(b1, kt), scp, kt);
        }
        for (int a = 0; a < na; a++) { /* x dword p: (bsums[2p], bsums[2p + 1]), broadcast */
            const int32_t *bs = (const int32_t *)xk[a][i].bsums;
            __m512i c0 = mc_dpwssd16_bcst(_mm512_setzero_si512(), scp[0], bs);
            __m512i c1 = mc_dpwssd16_bcst(_mm512_setzero_si512(), scp[1], bs + 1);
            for (int p = 2; p < 8; p += 2) {
                c0 = mc_dpwssd16_bcst(c0, scp[p], bs + p);
                c1 = mc_dpwssd16_bcst(c1, scp[p + 1], bs + p + 1);
            }
            if (kt == 2)
                sm[a] = _mm512_add_epi32(c0, c1);
            else
                si[a] = _mm512_sub_epi32(si[a], _mm512_slli_epi32(_mm512_add_epi32(c0, c1), kt == 3 ? 2 : 5));
        }
        const __m512 dw = pre ? _mm512_load_ps(o->dw) : mc_pair_h16_z(MC_SUB16_D(b0), MC_SUB16_D(b1));
        __m512 dm = _mm512_setzero_ps();
        if (kt == 2)
            dm = pre ? _mm512_load_ps(o->dm) : mc_pair_h16_z(MC_SUB16_DMIN(b0), MC_SUB16_DMIN(b1));
        for (int a = 0; a < na; a++) { /* Q6_K: d * dx * si; Q3_K: dx * (d * si); Q2_K: dx * (d * si - dmin * sm) */
            const __m512 dx = _mm512_set1_ps(xk[a][i].d), sv = _mm512_cvtepi32_ps(si[a]);
            const __m512 t = kt == 6 ? _mm512_mul_ps(_mm512_mul_ps(dw, dx), sv)
                             : kt == 3
                                 ? _mm512_mul_ps(dx, _mm512_mul_ps(dw, sv))
                                 : _mm512_mul_ps(dx, _mm512_sub_ps(_mm512_mul_ps(dw, sv),
                                                                   _mm512_mul_ps(dm, _mm512_cvtepi32_ps(sm[a]))));
            f[a] = _mm512_add_ps(f[a], t);
        }
    }
    for (int a = 0; a < na; a++) mc_x16_store(f[a], y + (size_t)a * ldy, nr);
}

/* the kernels specialized per x row count (1 .. 8), as mc_repacked16_fn */
#define MC_REPACKED16_FN(name, body, ...)                                                          \
    MC_ZMM static void name(int na, int nb, const void *w, size_t gs, const mc_q8 *const x[8],     \
                            float *y, size_t ldy, int nr) {                                        \
        switch (na) {                                                                              \
        case 1: body(nb, w, gs, x, y, ldy, nr, 1, __VA_ARGS__); break;                             \
        case 2: body(nb, w, gs, x, y, ldy, nr, 2, __VA_ARGS__); break;                             \
        case 3: body(nb, w, gs, x, y, ldy, nr, 3, __VA_ARGS__); break;                             \
        case 4: body(nb, w, gs, x, y, ldy, nr, 4, __VA_ARGS__); break;                             \
        case 5: body(nb, w, gs, x, y, ldy, nr, 5, __VA_ARGS__); break;                             \
        case 6: body(nb, w, gs, x, y, ldy, nr, 6, __VA_ARGS__); break;                             \
        case 7: body(nb, w, gs, x, y, ldy, nr, 7, __VA_ARGS__); break;                             \
        default: body(nb, w, gs, x, y, ldy, nr, 8, __VA_ARGS__); break;                            \
        }                                                                                          \
    }

MC_REPACKED16_FN(mc_gemm_q4kx16, mc_gemm_q4kx16_body, 0, 0)
MC_REPACKED16_FN(mc_gemm_q5kx16, mc_gemm_q4kx16_body, 0, 1)
MC_REPACKED16_FN(mc_gemm_q6kx16, mc_gemm_sub16x16_body, 0, 6)
MC_REPACKED16_FN(mc_gemm_q3kx16, mc_gemm_sub16x16_body, 0, 3)
MC_REPACKED16_FN(mc_gemm_q2kx16, mc_gemm_sub16x16_body, 0, 2)
MC_REPACKED16_FN(mc_gemm_q4kx16u, mc_gemm_q4kx16_body, 1, 0)
MC_REPACKED16_FN(mc_gemm_q5kx16u, mc_gemm_q4kx16_body, 1, 1) /* ints < 32: vpmulld */
MC_REPACKED16_FN(mc_gemm_q6kx16u, mc_gemm_sub16x16_body, 1, 6)
MC_REPACKED16_FN(mc_gemm_q3kx16u, mc_gemm_sub16x16_body, 1, 3)
MC_REPACKED16_FN(mc_gemm_q2kx16u, mc_gemm_sub16x16_body, 1, 2)

/* One type's zmm kernels, as mc_repacked_tile takes them. */
typedef struct {
    mc_repacked16_fn fn;                                  /* on two repacked groups */
    void (*unpack)(int nb, const void *w, size_t gs, void *out); /* two groups unpacked */
    mc_repacked16_fn fn_pre;                              /* on them unpacked (gs unused) */
    size_t pre_bytes;                                     /* unpacked bytes per 256 columns */
} mc_zmm_kernels;

/* defined by the zmm unit (mc_common.h), declared elsewhere */
#if MC_UNIT_ZMM
MC_SHARED const mc_zmm_kernels mc_zmm_q4k = {mc_gemm_q4kx16, mc_q4kx16_unpack, mc_gemm_q4kx16u,
                                             sizeof(mc_q4kx16u)};
MC_SHARED const mc_zmm_kernels mc_zmm_q5k = {mc_gemm_q5kx16, mc_q5kx16_unpack, mc_gemm_q5kx16u,
                                             sizeof(mc_q4kx16u)};
MC_SHARED const mc_zmm_kernels mc_zmm_q6k = {mc_gemm_q6kx16, mc_q6kx16_unpack, mc_gemm_q6kx16u,
                                             sizeof(mc_q6kx16u)};
MC_SHARED const mc_zmm_kernels mc_zmm_q3k = {mc_gemm_q3kx16, mc_q3kx16_unpack, mc_gemm_q3kx16u,
                                             sizeof(mc_q6kx16u)};
MC_SHARED const mc_zmm_kernels mc_zmm_q2k = {mc_gemm_q2kx16, mc_q2kx16_unpack, mc_gemm_q2kx16u,
                                             sizeof(mc_q6kx16u)};
#else
extern MC_SHARED const mc_zmm_kernels mc_zmm_q4k;
extern MC_SHARED const mc_zmm_kernels mc_zmm_q5k;
extern MC_SHARED const mc_zmm_kernels mc_zmm_q6k;
extern MC_SHARED const mc_zmm_kernels mc_zmm_q3k;
extern MC_SHARED const mc_zmm_kernels mc_zmm_q2k;
#endif

#endif /* MC_X86 */
#endif /* MC_GEMM_ZMM_H */
