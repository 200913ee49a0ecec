/* The K-quants (Q3_K to Q6_K) against many x rows on AVX2 (prefill): weights broadcast,
 * x rows in the lanes.
 *
 * The 8-row kernels (mc_gemm_kx8.h) hold 8 weight rows in a vector's lanes and broadcast
 * one x dword per vpmaddubsw; on AVX2 a broadcast from memory costs about as much as the
 * multiply it feeds (an AMD Zen 3, in L1: ~5.3 G vpmaddubsw/s a core from registers, ~2.6 G
 * with one broadcast each), which held those kernels near 50 GMAC/s a core.  Here it is turned
 * round: the x rows are interleaved once per call (mc_kw_x: 8 rows a group, vector v of a
 * block holding in dword lane a row a's ints 4v .. 4v+3), a group of 8 weight rows is
 * unpacked once to unsigned ints (mc_kw_unpack: the repacked layout with every int in a
 * byte), and each weight dword, broadcast once, meets MC_KW_G groups of 8 x rows through
 * vpmaddubsw with the x vectors read from memory.
 *
 * Exactness: each lane's integer sums are the same integers the 8-row kernels and the
 * single-row kernels form (no 16-bit lane can saturate: sums of at most `ch` vpmaddubsw,
 * as mc_gemm_vnni.h's AVX2 helpers group them), and the float steps per lane are the
 * single-row kernels' (mc_dot_q4_k_scalar ..), in the same order; so the results are bit
 * for bit those of every other path. */
#ifndef MC_GEMM_KWIDE_H
#define MC_GEMM_KWIDE_H

#if defined(MC_X86)

/* groups of 8 x rows per weight broadcast (registers: 2G int16 sums) */
#ifndef MC_KW_G
#define MC_KW_G 4
#endif
_Static_assert(MC_KW_G >= 1 && MC_KW_G <= 6, "MC_KW_BY_G takes 1 to 6 groups");
/* unpacked weight groups at a time, at most (and at most MC_KW_WBYTES KiB of them) */
#ifndef MC_KW_NG
#define MC_KW_NG 4
#endif
#ifndef MC_KW_WBYTES
#define MC_KW_WBYTES 200u
#endif
/* weight rows per tile of the thread pool (a multiple of 16) */
#ifndef MC_KW_TR
#define MC_KW_TR 64
#endif
/* fewest x rows for this path; fewer go through the 8-row kernels */
#ifndef MC_KW_MIN_ROWS
#define MC_KW_MIN_ROWS 32
#endif

/* One block of 256 columns of 8 x rows (mc_q8k rows interleaved) */
typedef struct {
    int8_t q[64][32];   /* vector v: dword lane a = row a's qs[4v .. 4v + 3] */
    float d[8];         /* row a's d */
    int32_t b32[4][8];  /* lane a: row a's (bs[2p], bs[2p + 1]) as int16, bs[s] the sum of its
                         * 32 ints of sub-block s */
    int32_t b16[8][8];  /* lane a: row a's (bsums[2p], bsums[2p + 1]) */
} mc_kw_x;

/* One block of 256 columns of 8 weight rows, unpacked: u[c] dword lane j = row j's ints
 * 4c .. 4c + 3 (unsigned, one to a byte); sc[s][j] = (scale, scale) of row j's sub-block
 * s as int16; mp[p][j]: Q4_K / Q5_K row j's (min[2p], min[2p + 1]), Q6_K / Q3_K its
 * (scale[2p], scale[2p + 1]), as int16; d / dmin row j's, as float. */
typedef struct {
    uint8_t u[64][32];
    int32_t sc[16][8];
    int32_t mp[8][8];
    float d[8];
    float dmin[8];
} mc_kw_w;

/* the types this path takes (their sub-block columns and vpmaddubsw per 16-bit sum: mc_kw_run) */
static inline int mc_kw_type(int t) { return t == MC_Q4_K || t == MC_Q5_K || t == MC_Q6_K || t == MC_Q3_K; }

static inline int32_t mc_kw_pair(int lo, int hi) {
    return (int32_t)((uint32_t)(uint16_t)(int16_t)lo | ((uint32_t)(uint16_t)(int16_t)hi << 16));
}

/* x rows [j0, j0 + na) (na <= 8; the rest zero) of nbk blocks of mc_q8k rows into out: the
 * ints by 8 x 8 dword transposes, the sums of 32 as int16 pairs */
MC_AVX2 static void mc_kw_pack_x(const char *xq, size_t xstride, int j0, int na, int nbk, mc_kw_x *out) {
    for (int i = 0; i < nbk; i++) {
        mc_kw_x *o = out + i;
        const mc_q8k *x[8];
        for (int a = 0; a < 8; a++) x[a] = a < na ? (const mc_q8k *)(xq + xstride * (size_t)(j0 + a)) + i : NULL;
        for (int c = 0; c < 8; c++) { /* columns 32c ..: dwords 8c .. 8c + 7 */
            __m256i r[8], t[8], u[8];
            for (int a = 0; a < 8; a++)
                r[a] = x[a] != NULL ? _mm256_loadu_si256((const __m256i *)(x[a]->qs + 32 * c)) : _mm256_setzero_si256();
            for (int a = 0; a < 8; a += 2) {
                t[a] = _mm256_unpacklo_epi32(r[a], r[a + 1]);     /* d0 d0 d1 d1 | d4 d4 d5 d5 */
                t[a + 1] = _mm256_unpackhi_epi32(r[a], r[a + 1]); /* d2 d2 d3 d3 | d6 d6 d7 d7 */
            }
            for (int h = 0; h < 8; h += 4) { /* rows h .. h + 3 */
                u[h] = _mm256_unpacklo_epi64(t[h], t[h + 2]);     /* d0 x 4 | d4 x 4 */
                u[h + 1] = _mm256_unpackhi_epi64(t[h], t[h + 2]); /* d1 | d5 */
                u[h + 2] = _mm256_unpacklo_epi64(t[h + 1], t[h + 3]); /* d2 | d6 */
                u[h + 3] = _mm256_unpackhi_epi64(t[h + 1], t[h + 3]); /* d3 | d7 */
            }
            for (int k = 0; k < 4; k++) {
                _mm256_store_si256((__m256i *)o->q[8 * c + k], _mm256_permute2x128_si256(u[k], u[4 + k], 0x20));
                _mm256_store_si256((__m256i *)o->q[8 * c + 4 + k], _mm256_permute2x128_si256(u[k], u[4 + k], 0x31));
            }
        }
        for (int a = 0; a < 8; a++) {
            o->d[a] = x[a] != NULL ? x[a]->d : 0.0f;
            for (int p = 0; p < 4; p++) {
                const int lo = x[a] != NULL ? x[a]->bsums[4 * p] + x[a]->bsums[4 * p + 1] : 0;
                const int hi = x[a] != NULL ? x[a]->bsums[4 * p + 2] + x[a]->bsums[4 * p + 3] : 0;
                o->b32[p][a] = mc_kw_pair(lo, hi);
            }
            for (int p = 0; p < 8; p++)
                o->b16[p][a] = x[a] != NULL ? mc_kw_pair(x[a]->bsums[2 * p], x[a]->bsums[2 * p + 1]) : 0;
        }
    }
}

/* one repacked group (8 rows, nbk blocks of 256 columns) of type t into out */
MC_AVX2 static void mc_kw_unpack(int t, const void *wg, int nbk, mc_kw_w *out) {
    for (int i = 0; i < nbk; i++) {
        mc_kw_w *o = out + i;
        const uint16_t *d = NULL, *dmin = NULL;
        if (t == MC_Q4_K || t == MC_Q5_K) {
            const mc_q4kx8 *b = t == MC_Q4_K ? (const mc_q4kx8 *)wg + i : NULL;
            const mc_q5kx8 *b5 = t == MC_Q5_K ? (const mc_q5kx8 *)wg + i : NULL;
            const uint8_t(*sc)[8] = b != NULL ? b->sc : b5->sc;
            const uint8_t(*mn)[8] = b != NULL ? b->mn : b5->mn;
            d = b != NULL ? b->d : b5->d;
            dmin = b != NULL ? b->dmin : b5->dmin;
            for (int s = 0; s < 8; s++) {
                for (int j = 0; j < 8; j++) o->sc[s][j] = mc_kw_pair(sc[s][j], sc[s][j]);
                const uint8_t *qs = b != NULL ? b->qs[s >> 1] : b5->qs[s >> 1];
                for (int v = 0; v < 8; v++) {
                    const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * v));
                    const __m256i u = b5 == NULL ? mc_q45kx8_u(q, s, 0, q)
                                                 : mc_q45kx8_u(q, s, 1, _mm256_loadu_si256((const __m256i *)(b5->qh + 32 * v)));
                    _mm256_storeu_si256((__m256i *)o->u[8 * s + v], u);
                }
            }
            for (int p = 0; p < 4; p++)
                for (int j = 0; j < 8; j++) o->mp[p][j] = mc_kw_pair(mn[2 * p][j], mn[2 * p + 1][j]);
        } else { /* Q6_K and Q3_K: their d and 16 int8 scales where the other's are */
            const mc_q6kx8 *b6 = t == MC_Q6_K ? (const mc_q6kx8 *)wg + i : NULL;
            const mc_q3kx8 *b3 = t == MC_Q3_K ? (const mc_q3kx8 *)wg + i : NULL;
            const int8_t(*sc)[8] = b6 != NULL ? b6->sc : b3->sc;
            d = b6 != NULL ? b6->d : b3->d;
            for (int n = 0; n < 2; n++)
                for (int X = 0; X < 4; X++)
                    for (int v = 0; v < 8; v++) {
                        const __m256i u =
                            b6 != NULL ? mc_q6kx8_u(b6, n, X, v)
                                       : mc_q3kx8_u(b3, n, X, v, _mm256_loadu_si256((const __m256i *)(b3->hm + 32 * v)));
                        _mm256_storeu_si256((__m256i *)o->u[32 * n + 8 * X + v], u);
                    }
            for (int k = 0; k < 16; k++)
                for (int j = 0; j < 8; j++) o->sc[k][j] = mc_kw_pair(sc[k][j], sc[k][j]);
            for (int p = 0; p < 8; p++)
                for (int j = 0; j < 8; j++) o->mp[p][j] = mc_kw_pair(sc[2 * p][j], sc[2 * p + 1][j]);
        }
        const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)d));
        _mm256_storeu_ps(o->d, dv);
        _mm256_storeu_ps(o->dmin, dmin != NULL ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dmin))
                                               : _mm256_setzero_ps());
    }
}

/* The float steps of weight row j's block against G groups of x rows (the single-row
 * kernels' operations per lane): f[g] (lane a: x row 8g + a) += the block's term from
 * the exact integer sums si[g]. */
MC_AVX2 static inline __attribute__((always_inline)) void
mc_kw_finish(const mc_kw_w *w, int j, const mc_kw_x *x, size_t gstride, const __m256i *si, __m256 *f,
             const int G, const int t) {
    const __m256 dw = _mm256_set1_ps(w->d[j]);
    if (t == MC_Q4_K || t == MC_Q5_K) {
        const __m256 dm = _mm256_set1_ps(w->dmin[j]);
        for (int g = 0; g < G; g++) { /* f += dx * (d * si - dmin * sm) */
            const mc_kw_x *xg = x + g * gstride;
            __m256i m = _mm256_madd_epi16(_mm256_load_si256((const __m256i *)xg->b32[0]), _mm256_set1_epi32(w->mp[0][j]));
            for (int p = 1; p < 4; p++)
                m = _mm256_add_epi32(m, _mm256_madd_epi16(_mm256_load_si256((const __m256i *)xg->b32[p]),
                                                          _mm256_set1_epi32(w->mp[p][j])));
            const __m256 tt = _mm256_sub_ps(_mm256_mul_ps(dw, _mm256_cvtepi32_ps(si[g])),
                                            _mm256_mul_ps(dm, _mm256_cvtepi32_ps(m)));
            f[g] = _mm256_add_ps(f[g], _mm256_mul_ps(_mm256_load_ps(xg->d), tt));
        }
    } else {
        const int shift = t == MC_Q6_K ? 5 : 2; /* the offset of the unsigned ints */
        for (int g = 0; g < G; g++) {
            const mc_kw_x *xg = x + g * gstride;
            __m256i c = _mm256_madd_epi16(_mm256_load_si256((const __m256i *)xg->b16[0]), _mm256_set1_epi32(w->mp[0][j]));
            for (int p = 1; p < 8; p++)
                c = _mm256_add_epi32(c, _mm256_madd_epi16(_mm256_load_si256((const __m256i *)xg->b16[p]),
                                                          _mm256_set1_epi32(w->mp[p][j])));
            const __m256 sv = _mm256_cvtepi32_ps(_mm256_sub_epi32(si[g], _mm256_slli_epi32(c, shift)));
            const __m256 dx = _mm256_load_ps(xg->d);
            if (t == MC_Q6_K) /* f += (d * dx) * si */
                f[g] = _mm256_add_ps(f[g], _mm256_mul_ps(_mm256_mul_ps(dw, dx), sv));
            else /* Q3_K: f += dx * (d * si) */
                f[g] = _mm256_add_ps(f[g], _mm256_mul_ps(dx, _mm256_mul_ps(dw, sv)));
        }
    }
}

/* Weight rows j and j + 1 of unpacked block w against G groups of x rows (block x,
 * groups gstride blocks apart): the exact integer sums into si[0][g] and si[1][g].  Two
 * weight broadcasts meet G x vectors loaded once: 2G multiplies per G + 2 loads.  sub /
 * ch / t are constants where this is inlined. */
MC_AVX2 static inline __attribute__((always_inline)) void
mc_kw_sums2(const mc_kw_w *w, int j, const mc_kw_x *x, size_t gstride, __m256i si[2][MC_KW_G],
            const int G, const int sub, const int ch) {
    const int ns = 256 / sub, nd = sub / 4; /* sub-blocks, dwords per sub-block */
    for (int g = 0; g < G; g++) si[0][g] = si[1][g] = _mm256_setzero_si256();
    for (int s = 0; s < ns; s++)
#pragma GCC unroll 8
        for (int c0 = 0; c0 < nd; c0 += ch) {
            __m256i h0[MC_KW_G], h1[MC_KW_G];
#pragma GCC unroll 8
            for (int c = c0; c < c0 + ch; c++) {
                const int v = s * nd + c;
                const __m256i u0 = _mm256_set1_epi32(*(const int32_t *)(w->u[v] + 4 * j));
                const __m256i u1 = _mm256_set1_epi32(*(const int32_t *)(w->u[v] + 4 * j + 4));
                for (int g = 0; g < G; g++) {
                    __m256i xv = _mm256_load_si256((const __m256i *)x[g * gstride].q[v]);
                    __asm__("" : "+x"(xv)); /* one load for both multiplies, not two */
                    const __m256i p0 = _mm256_maddubs_epi16(u0, xv), p1 = _mm256_maddubs_epi16(u1, xv);
                    h0[g] = c == c0 ? p0 : _mm256_add_epi16(h0[g], p0);
                    h1[g] = c == c0 ? p1 : _mm256_add_epi16(h1[g], p1);
                }
                /* keep the compiler from hoisting every multiply of the sub-block ahead of
                 * the sums (it spilled them to the stack) */
                for (int g = 0; g < G; g++) __asm__("" : "+x"(h0[g]), "+x"(h1[g]));
            }
            const __m256i sc0 = _mm256_set1_epi32(w->sc[s][j]), sc1 = _mm256_set1_epi32(w->sc[s][j + 1]);
            for (int g = 0; g < G; g++) {
                si[0][g] = _mm256_add_epi32(si[0][g], _mm256_madd_epi16(h0[g], sc0));
                si[1][g] = _mm256_add_epi32(si[1][g], _mm256_madd_epi16(h1[g], sc1));
            }
        }
}

/* Weight rows of unpacked groups w (nw rows, a multiple of 8 but for the last group's nr)
 * against G groups of x rows starting at x (nbk blocks each): y[(8g + a) * ldy + r] for
 * x rows 8g + a < nx. */
MC_AVX2 static inline __attribute__((always_inline)) void
mc_kw_rows(int nbk, const mc_kw_w *w, int nw, const mc_kw_x *x, float *y, size_t ldy, int nx,
           float *facc, const int G, const int t, const int sub, const int ch) {
    __m256 *F = (__m256 *)facc; /* (nw rounded up to 8, G) accumulators, 32-byte aligned */
    const int nw8 = (nw + 7) & ~7;
    for (int r = 0; r < nw8 * G; r++) F[r] = _mm256_setzero_ps();
    for (int i = 0; i < nbk; i++)
        for (int r0 = 0; r0 < nw8; r0 += 8) { /* one unpacked group: the sums of its rows, then
                                              * their float steps (32 independent chains
                                              * rather than each pair's 8 waiting on it) */
            const mc_kw_w *wb = w + (size_t)(r0 / 8) * nbk + i;
            __m256i si[4][2][MC_KW_G];
            for (int e = 0; e < 4; e++) mc_kw_sums2(wb, 2 * e, x + i, (size_t)nbk, si[e], G, sub, ch);
            for (int j = 0; j < 8; j++) {
                __m256 f[MC_KW_G];
                for (int g = 0; g < G; g++) f[g] = F[(r0 + j) * G + g];
                mc_kw_finish(wb, j, x + i, (size_t)nbk, si[j / 2][j % 2], f, G, t);
                for (int g = 0; g < G; g++) F[(r0 + j) * G + g] = f[g];
            }
        }
    for (int r = 0; r < nw; r++)
        for (int g = 0; g < G; g++) {
            float o[8];
            _mm256_storeu_ps(o, F[r * G + g]);
            for (int a = 0; a < 8 && 8 * g + a < nx; a++) y[(size_t)(8 * g + a) * ldy + r] = o[a];
        }
}

/* mc_kw_rows with its G a constant (those above MC_KW_G are never taken) */
#define MC_KW_CASE(n, t, sub, ch, ...)                                                             \
    case n: mc_kw_rows(__VA_ARGS__, (n) <= MC_KW_G ? (n) : MC_KW_G, t, sub, ch); break;
#define MC_KW_BY_G(G, t, sub, ch, ...)                                                            \
    switch (G) {                                                                                   \
        MC_KW_CASE(1, t, sub, ch, __VA_ARGS__)                                                     \
        MC_KW_CASE(2, t, sub, ch, __VA_ARGS__)                                                     \
        MC_KW_CASE(3, t, sub, ch, __VA_ARGS__)                                                     \
        MC_KW_CASE(4, t, sub, ch, __VA_ARGS__)                                                     \
        MC_KW_CASE(5, t, sub, ch, __VA_ARGS__)                                                     \
    default: mc_kw_rows(__VA_ARGS__, MC_KW_G, t, sub, ch); break;                                  \
    }

/* mc_kw_rows for type t, G = ceil(nx / 8) <= MC_KW_G groups: per type its sub-block
 * columns and how many vpmaddubsw one 16-bit sum takes without saturating (|x| <= 128:
 * Q4_K's ints < 16 take 8, Q5_K's < 32 4, Q6_K's < 64 2, Q3_K's < 8 the 4 of a sub-block) */
MC_AVX2 static void mc_kw_run(int t, int nbk, const mc_kw_w *w, int nw, const mc_kw_x *x, float *y,
                              size_t ldy, int nx, float *facc) {
    const int G = (nx + 7) / 8;
    switch (t) {
    case MC_Q4_K: MC_KW_BY_G(G, MC_Q4_K, 32, 8, nbk, w, nw, x, y, ldy, nx, facc) break;
    case MC_Q5_K: MC_KW_BY_G(G, MC_Q5_K, 32, 4, nbk, w, nw, x, y, ldy, nx, facc) break;
    case MC_Q6_K: MC_KW_BY_G(G, MC_Q6_K, 16, 2, nbk, w, nw, x, y, ldy, nx, facc) break;
    default: MC_KW_BY_G(G, MC_Q3_K, 16, 4, nbk, w, nw, x, y, ldy, nx, facc) break;
    }
}

/* ---- The path in a matmul job (mc_quant.h): jb->kw set by mc_matmul_prep, which packs
 * the x rows into jb->xp (ceil(n / 8) groups of K / 256 mc_kw_x blocks), and mc_kw_tile
 * per tile of weight rows. */

/* pack x group g of the job (mc_parallel chunk) */
static void mc_kw_pack_chunk(void *ctx, int g) {
    const mc_matmul_job *jb = (const mc_matmul_job *)ctx;
    const int nbk = jb->K / 256;
    mc_kw_pack_x((const char *)jb->xbase, jb->xstride, 8 * g, mc_imin(8, jb->n - 8 * g), nbk,
                 (mc_kw_x *)jb->xp + (size_t)g * nbk);
}

/* bytes of the packed x rows */
static size_t mc_kw_x_bytes(int n, int K) { return sizeof(mc_kw_x) * (size_t)((n + 7) / 8) * (size_t)(K / 256); }

/* whether a job of type t, n x rows, on repacked weights takes this path */
static int mc_kw_takes(int t, int K, int n, int simd) {
    return simd == MC_SIMD_AVX2 && mc_kw_type(t) && K % 256 == 0 && n >= MC_KW_MIN_ROWS;
}

/* Weight rows [r0, r1) (r0 a multiple of 8) of a job on repacked weights: up to MC_KW_NG
 * groups unpacked at a time (at most MC_KW_WBYTES KiB, for L2), each against every
 * 8 * MC_KW_G x rows. */
static void mc_kw_tile(mc_matmul_job *jb, int r0, int r1) {
    const int M = jb->M, n = jb->n, nbk = jb->K / 256, nb = jb->K / 32;
    const size_t gbytes = mc_repack_block_bytes(jb->t) * (size_t)nb; /* one repacked group */
    const size_t ubytes = sizeof(mc_kw_w) * (size_t)nbk;             /* one unpacked group */
    int ng = (int)((MC_KW_WBYTES << 10) / ubytes);
    ng = ng < 1 ? 1 : ng > MC_KW_NG ? MC_KW_NG : ng;
    /* the unpacked groups, then the float sums of their rows (mc_kw_rows) */
    char *buf = (char *)mc_scratch(2, ubytes * (size_t)ng + sizeof(__m256) * 8 * MC_KW_NG * MC_KW_G + 64);
    if (buf == NULL) {
        jb->failed = 1;
        return;
    }
    mc_kw_w *wu = (mc_kw_w *)(((uintptr_t)buf + 63) & ~(uintptr_t)63);
    float *facc = (float *)((char *)wu + ubytes * (size_t)ng);
    const mc_kw_x *xp = (const mc_kw_x *)jb->xp;
    for (int r = r0; r < r1; r += 8 * ng) {
        const int nw = mc_imin(8 * ng, r1 - r);
        for (int g = 0; g < (nw + 7) / 8; g++)
            mc_kw_unpack(jb->t, (const char *)jb->ilv + gbytes * (size_t)(r / 8 + g), nbk, wu + (size_t)g * nbk);
        for (int j = 0; j < n; j += 8 * MC_KW_G)
            mc_kw_run(jb->t, nbk, wu, nw, xp + (size_t)(j / 8) * nbk, jb->y + (size_t)j * M + r, (size_t)M,
                      mc_imin(8 * MC_KW_G, n - j), facc);
    }
}

#endif /* MC_X86 */
#endif /* MC_GEMM_KWIDE_H */
