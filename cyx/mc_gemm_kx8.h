/* Q2_K to Q6_K on repacked weights, 8 weight rows x na <= 8 x rows (mc_repacked_fn),
 * included twice by mc_gemm_vnni.h: once for AVX512-VNNI on 256-bit registers and once for
 * AVX2.  Expects MC_TGT (target attribute), MC_TGT_UNIT (its unit, mc_common.h),
 * MC_SFX(name) (name suffix), MC_KX_SCW / MC_KX_SCALE16 (a 16-column sub-block's sum times
 * its scale: mc_kx8_scale_add, or vpmulld), and the exact integer sums of the 8 weight rows
 * against one x row, lane j: row j:
 *   MC_KX_SUM8(u, xd, wide): sum over k < 8 of u[k] . (x dword xd[k] broadcast), u[k]
 *     unsigned and < 16 (< 32 where the constant `wide` is set: Q5_K);
 *   MC_KX_SUM4(u, xd): the same over k < 4, u[k] < 64.
 * vpdpbusd gives them directly; vpmaddubsw + vpmaddwd give the same ints as long as no
 * 16-bit lane saturates, which the AVX2 helpers' grouping ensures (mc_gemm_vnni.h).  So
 * both builds are bit-identical to each other and to the single-row kernels.  No include
 * guard, on purpose. */

/* Q4_K (Q5_K: q5) groups of 8 rows against na x rows */
MC_TGT static inline __attribute__((always_inline)) void
MC_SFX(mc_gemm_q45kx8_body)(int nb, const void *wv, const mc_q8 *const x[8], float *y, size_t ldy, int nr,
                    const int na, const int q5) {
    const char *w = (const char *)wv;
    const mc_q8k *xk[8];
    for (int a = 0; a < na; a++) xk[a] = (const mc_q8k *)x[a];
    __m256 f[8];
    for (int a = 0; a < na; a++) f[a] = _mm256_setzero_ps();
    for (int i = 0; i < nb / 8; i++) {
        const mc_q4kx8 *b = (const mc_q4kx8 *)(w + MC_Q45_BYTES(q5) * (size_t)i);
        __m256i si[8], qh[8];
        if (q5) {
            const mc_q5kx8 *b5 = (const mc_q5kx8 *)b;
            MC_KX8_PREFETCH(b5);
            for (int v = 0; v < 8; v++) qh[v] = _mm256_loadu_si256((const __m256i *)(b5->qh + 32 * v));
        }
        for (int a = 0; a < na; a++) si[a] = _mm256_setzero_si256();
        for (int s = 0; s < 8; s++) { /* sub-block s: the low (s even) or high nibbles of chunk s / 2 */
            __m256i u[8];
            if (!q5) mc_prefetch_part(b, sizeof *b, s, 8); /* block MC_KX8_AHEAD on, an eighth a sub-block */
            for (int v = 0; v < 8; v++) {
                const __m256i q = _mm256_loadu_si256((const __m256i *)(MC_Q45_QS(b, q5, s >> 1) + 32 * v));
                u[v] = mc_q45kx8_u(q, s, q5, q5 ? qh[v] : q);
            }
            const __m256i sc = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)b->sc[s]));
            for (int a = 0; a < na; a++) {
                const int32_t *xd = (const int32_t *)(xk[a][i].qs + 32 * s);
                si[a] = _mm256_add_epi32(si[a], _mm256_mullo_epi32(MC_KX_SUM8(u, xd, q5), sc));
            }
        }
        mc_kx8_finish(b->d, b->dmin, b->mn, xk, i, si, f, na);
    }
    for (int a = 0; a < na; a++) mc_x8_store(f[a], y + (size_t)a * ldy, nr);
}

MC_TGT static inline __attribute__((always_inline)) void
MC_SFX(mc_gemm_q4kx8_body)(int nb, const void *wv, const mc_q8 *const x[8], const int32_t *const cx[8],
                   float *y, size_t ldy, int nr, const int na) {
    (void)cx;
    MC_SFX(mc_gemm_q45kx8_body)(nb, wv, x, y, ldy, nr, na, 0);
}

MC_TGT static inline __attribute__((always_inline)) void
MC_SFX(mc_gemm_q5kx8_body)(int nb, const void *wv, const mc_q8 *const x[8], const int32_t *const cx[8],
                   float *y, size_t ldy, int nr, const int na) {
    (void)cx;
    MC_SFX(mc_gemm_q45kx8_body)(nb, wv, x, y, ldy, nr, na, 1);
}

/* Q2_K, Q3_K, Q6_K (t, a constant where inlined; block b of `bytes` bytes, Q3_K's hmask vectors hm): per
 * 128-column half n and 32 columns X the unsigned ints of 8 rows, each 16-column
 * sub-block's exact sum times its scale (Q2_K: the low nibble of its scale byte) into si
 * (MC_KX_SCALE16: VNNI's vpdpwssd, AVX2's vpmulld; the scales as MC_KX_SCW makes them) */
MC_TGT static inline __attribute__((always_inline)) void
MC_SFX(mc_kx8_sub16)(const void *b, size_t bytes, const mc_q8k *const xk[8], int i, __m256i si[8], const int na, const int t,
                     const __m256i *hm) {
    const int8_t(*sc)[8] = t == MC_Q6_K ? ((const mc_q6kx8 *)b)->sc
                           : t == MC_Q3_K ? ((const mc_q3kx8 *)b)->sc
                                          : (const int8_t(*)[8])((const mc_q2kx8 *)b)->sc;
    for (int n = 0; n < 2; n++)
        for (int X = 0; X < 4; X++) { /* columns 128 n + 32 X ..: sub-blocks k, k + 1 */
            __m256i u[8], scv[2];
            mc_prefetch_part(b, bytes, 4 * n + X, 8); /* block MC_KX8_AHEAD on, an eighth a step */
            for (int v = 0; v < 8; v++)
                u[v] = t == MC_Q6_K   ? mc_q6kx8_u((const mc_q6kx8 *)b, n, X, v)
                       : t == MC_Q3_K ? mc_q3kx8_u((const mc_q3kx8 *)b, n, X, v, hm[v])
                                      : mc_q2kx8_u((const mc_q2kx8 *)b, n, X, v);
            for (int h = 0; h < 2; h++) {
                const __m128i raw = _mm_loadl_epi64((const __m128i *)sc[8 * n + 2 * X + h]);
                scv[h] = MC_KX_SCW(t == MC_Q2_K ? _mm256_and_si256(_mm256_cvtepu8_epi32(raw), _mm256_set1_epi32(0xF))
                                                : _mm256_cvtepi8_epi32(raw),
                                   t == MC_Q6_K);
            }
            for (int a = 0; a < na; a++) {
                const int32_t *xd = (const int32_t *)(xk[a][i].qs + 128 * n + 32 * X);
                si[a] = MC_KX_SCALE16(MC_KX_SCALE16(si[a], MC_KX_SUM4(u, xd), scv[0], t == MC_Q6_K),
                                      MC_KX_SUM4(u + 4, xd + 4), scv[1], t == MC_Q6_K);
            }
        }
}

/* Q2_K, Q3_K and Q6_K (t, a constant where inlined) groups of 8 rows against na x rows:
 * mc_kx8_sub16's sums, then per type
 *   Q3_K: the + 4 of its 3-bit ints u = crumb | hmask bit << 2 taken off through bsums
 *     (mc_kx8_offset), then mc_dot_q3_k_scalar's float steps, dx * (d * si);
 *   Q6_K: the same for its + 32, then d * dx * si;
 *   Q2_K: the mins' term sm = sum over sub-blocks k of min[k] bsums[k] (sub-blocks in
 *     pairs, lanes holding (min[2p], min[2p + 1]) as int16), then mc_dot_q2_k_scalar's
 *     dx * (d * si - dmin * sm). */
MC_TGT static inline __attribute__((always_inline)) void
MC_SFX(mc_gemm_sub16x8_body)(int nb, const void *wv, const mc_q8 *const x[8], float *y, size_t ldy, int nr,
                             const int na, const int t) {
    const size_t bytes = t == MC_Q6_K ? sizeof(mc_q6kx8) : t == MC_Q3_K ? sizeof(mc_q3kx8) : sizeof(mc_q2kx8);
    const mc_q8k *xk[8];
    for (int a = 0; a < na; a++) xk[a] = (const mc_q8k *)x[a];
    __m256 f[8];
    for (int a = 0; a < na; a++) f[a] = _mm256_setzero_ps();
    for (int i = 0; i < nb / 8; i++) {
        const char *b = (const char *)wv + bytes * (size_t)i;
        __m256i si[8], hm[8];
        for (int a = 0; a < na; a++) si[a] = _mm256_setzero_si256();
        if (t == MC_Q3_K)
            for (int v = 0; v < 8; v++) hm[v] = _mm256_loadu_si256((const __m256i *)(((const mc_q3kx8 *)b)->hm + 32 * v));
        MC_SFX(mc_kx8_sub16)(b, bytes, xk, i, si, na, t, hm);
        if (t == MC_Q2_K) {
            const mc_q2kx8 *b2 = (const mc_q2kx8 *)b;
            __m256i mnp[8];
            for (int p = 0; p < 8; p++) {
                const __m256i v0 = _mm256_srli_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)b2->sc[2 * p])), 4);
                const __m256i v1 = _mm256_srli_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)b2->sc[2 * p + 1])), 4);
                mnp[p] = _mm256_or_si256(v0, _mm256_slli_epi32(v1, 16));
            }
            const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)b2->d));
            const __m256 dm = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)b2->dmin));
            for (int a = 0; a < na; a++) {
                const int32_t *bs = (const int32_t *)xk[a][i].bsums; /* dword p: (bsums[2p], bsums[2p + 1]) */
                __m256i sm = _mm256_madd_epi16(mnp[0], _mm256_set1_epi32(bs[0]));
                for (int p = 1; p < 8; p++) sm = _mm256_add_epi32(sm, _mm256_madd_epi16(mnp[p], _mm256_set1_epi32(bs[p])));
                const __m256 tt = _mm256_sub_ps(_mm256_mul_ps(dw, _mm256_cvtepi32_ps(si[a])),
                                                _mm256_mul_ps(dm, _mm256_cvtepi32_ps(sm)));
                f[a] = _mm256_add_ps(f[a], _mm256_mul_ps(_mm256_set1_ps(xk[a][i].d), tt));
            }
        } else {
            const int8_t(*sc)[8] = t == MC_Q6_K ? ((const mc_q6kx8 *)b)->sc : ((const mc_q3kx8 *)b)->sc;
            const uint16_t *d = t == MC_Q6_K ? ((const mc_q6kx8 *)b)->d : ((const mc_q3kx8 *)b)->d;
            mc_kx8_offset(sc, xk, i, si, na, t == MC_Q6_K ? 5 : 2); /* the + 32 / + 4 of every u */
            const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)d));
            for (int a = 0; a < na; a++) {
                const __m256 dx = _mm256_set1_ps(xk[a][i].d), sv = _mm256_cvtepi32_ps(si[a]);
                f[a] = _mm256_add_ps(f[a], t == MC_Q6_K ? _mm256_mul_ps(_mm256_mul_ps(dw, dx), sv) /* d * dx * si */
                                                        : _mm256_mul_ps(dx, _mm256_mul_ps(dw, sv))); /* dx * (d * si) */
            }
        }
    }
    for (int a = 0; a < na; a++) mc_x8_store(f[a], y + (size_t)a * ldy, nr);
}

#define MC_SUB16X8_BODY(name, T)                                                                   \
    MC_TGT static inline __attribute__((always_inline)) void                                       \
    MC_SFX(name)(int nb, const void *wv, const mc_q8 *const x[8], const int32_t *const cx[8], float *y, \
                 size_t ldy, int nr, const int na) {                                               \
        (void)cx;                                                                                  \
        MC_SFX(mc_gemm_sub16x8_body)(nb, wv, x, y, ldy, nr, na, T);                                \
    }
MC_SUB16X8_BODY(mc_gemm_q2kx8_body, MC_Q2_K)
MC_SUB16X8_BODY(mc_gemm_q3kx8_body, MC_Q3_K)
MC_SUB16X8_BODY(mc_gemm_q6kx8_body, MC_Q6_K)
#undef MC_SUB16X8_BODY

MC_REPACKED_FN(MC_TGT_UNIT, MC_TGT, MC_SFX(mc_gemm_q4kx8), MC_SFX(mc_gemm_q4kx8_body))
MC_REPACKED_FN(MC_TGT_UNIT, MC_TGT, MC_SFX(mc_gemm_q3kx8), MC_SFX(mc_gemm_q3kx8_body))
MC_REPACKED_FN(MC_TGT_UNIT, MC_TGT, MC_SFX(mc_gemm_q2kx8), MC_SFX(mc_gemm_q2kx8_body))
MC_REPACKED_FN(MC_TGT_UNIT, MC_TGT, MC_SFX(mc_gemm_q5kx8), MC_SFX(mc_gemm_q5kx8_body))
MC_REPACKED_FN(MC_TGT_UNIT, MC_TGT, MC_SFX(mc_gemm_q6kx8), MC_SFX(mc_gemm_q6kx8_body))
