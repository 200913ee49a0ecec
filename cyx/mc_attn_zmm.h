/* The score and P . V GEMMs of the AVX2 attention tile (mc_attn_avx2.h: mc_att_qk,
 * mc_att_pv) on 512-bit registers, for the VNNI level (whose check includes AVX512F):
 * 16 keys or 16 value columns a vector, so each broadcast query element or p meets twice
 * the columns per FMA.  Every output lane is the same chain of FMAs in the same order as
 * the ymm kernels' (a score: over d; a sum: over keys), so the results are bit-identical
 * to them (tests/test_attention_kernels.py compares the two levels).  Included by
 * mc_attn_avx2.h; the tile driver calls these when its job's level is VNNI. */

#define MC_ATZ __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl")))
#define MC_ATZ_INLINE MC_ATZ static inline __attribute__((always_inline))

/* s[r * lds + c] = scale * q_r . k_c, R (<= 6) query vectors, 16 W (W: 1 or 2) keys of kt
 * ((hd, ldk), keys transposed) */
MC_ATZ_INLINE void mc_atz_qk(const float *q, const int R, const int W, const float *kt, int ldk,
                             int hd, float scale, float *s, int lds) {
    __m512 a0[6], a1[6];
    for (int r = 0; r < R; r++) a0[r] = a1[r] = _mm512_setzero_ps();
    for (int d = 0; d < hd; d++, kt += ldk) {
        const __m512 k0 = _mm512_loadu_ps(kt), k1 = W == 2 ? _mm512_loadu_ps(kt + 16) : k0;
        for (int r = 0; r < R; r++) {
            const __m512 qv = _mm512_set1_ps(q[(size_t)r * hd + d]);
            a0[r] = _mm512_fmadd_ps(qv, k0, a0[r]);
            if (W == 2) a1[r] = _mm512_fmadd_ps(qv, k1, a1[r]);
        }
    }
    const __m512 sc = _mm512_set1_ps(scale);
    for (int r = 0; r < R; r++) {
        _mm512_storeu_ps(s + (size_t)r * lds, _mm512_mul_ps(a0[r], sc));
        if (W == 2) _mm512_storeu_ps(s + (size_t)r * lds + 16, _mm512_mul_ps(a1[r], sc));
    }
}

/* o[r * ldo + 0 .. 16W-1] += sum over c < n of p[r * ldp + c] * v[c * ldv + 0 .. 16W-1] */
MC_ATZ_INLINE void mc_atz_pv(const float *p, int ldp, const int R, const int W, const float *v,
                             size_t ldv, int n, float *o, int ldo) {
    __m512 x0[6], x1[6];
    for (int r = 0; r < R; r++) {
        x0[r] = _mm512_loadu_ps(o + (size_t)r * ldo);
        if (W == 2) x1[r] = _mm512_loadu_ps(o + (size_t)r * ldo + 16);
    }
    for (int c = 0; c < n; c++, v += ldv) {
        const __m512 v0 = _mm512_loadu_ps(v), v1 = W == 2 ? _mm512_loadu_ps(v + 16) : v0;
        for (int r = 0; r < R; r++) {
            const __m512 pv = _mm512_set1_ps(p[(size_t)r * ldp + c]);
            x0[r] = _mm512_fmadd_ps(pv, v0, x0[r]);
            if (W == 2) x1[r] = _mm512_fmadd_ps(pv, v1, x1[r]);
        }
    }
    for (int r = 0; r < R; r++) {
        _mm512_storeu_ps(o + (size_t)r * ldo, x0[r]);
        if (W == 2) _mm512_storeu_ps(o + (size_t)r * ldo + 16, x1[r]);
    }
}

/* mc_att_qk_rows's work (ncol a multiple of 16) */
MC_ATZ_INLINE void mc_atz_qk_cols(const float *q, const float *kt, int ldk, int hd, float scale,
                                  float *s, int lds, int ncol, const int R) {
    int c = 0;
    for (; c + 32 <= ncol; c += 32) mc_atz_qk(q, R, 2, kt + c, ldk, hd, scale, s + c, lds);
    if (c < ncol) mc_atz_qk(q, R, 1, kt + c, ldk, hd, scale, s + c, lds);
}

/* mc_att_pv_rows's work (hd a multiple of 8: a last 8 columns through the ymm kernel) */
MC_ATZ_INLINE void mc_atz_pv_cols(const float *p, int ldp, const float *v, size_t ldv, int n,
                                  int hd, float *o, const int R) {
    int j = 0;
    for (; j + 32 <= hd; j += 32) mc_atz_pv(p, ldp, R, 2, v + j, ldv, n, o + j, hd);
    if (j + 16 <= hd) {
        mc_atz_pv(p, ldp, R, 1, v + j, ldv, n, o + j, hd);
        j += 16;
    }
    if (j < hd) mc_att_pv(p, ldp, R, 1, v + j, ldv, n, o + j, hd);
}

MC_ATZ static void mc_atz_qk_rows(const float *q, const float *kt, int ldk, int hd, float scale,
                                  float *s, int lds, int ncol, int R) {
    MC_ATT_BY_R(R, mc_atz_qk_cols, q, kt, ldk, hd, scale, s, lds, ncol)
}

MC_ATZ static void mc_atz_pv_rows(const float *p, int ldp, const float *v, size_t ldv, int n, int hd,
                                  float *o, int R) {
    MC_ATT_BY_R(R, mc_atz_pv_cols, p, ldp, v, ldv, n, hd, o)
}

/* mc_exp256 on 16 floats: the same operations lane by lane, so the same bits */
MC_ATZ_INLINE __m512 mc_exp512(__m512 x) {
    x = _mm512_min_ps(x, _mm512_set1_ps(88.3762626647949f));
    x = _mm512_max_ps(x, _mm512_set1_ps(-88.3762626647949f));
    __m512 fx = _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f));
    fx = _mm512_roundscale_ps(fx, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), x);
    const __m512 z = _mm512_mul_ps(x, x);
    __m512 y = _mm512_set1_ps(1.9875691500E-4f);
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507E-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073E-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894E-2f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459E-1f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201E-1f));
    y = _mm512_fmadd_ps(y, z, x);
    y = _mm512_add_ps(y, _mm512_set1_ps(1.0f));
    __m512i e = _mm512_add_epi32(_mm512_cvttps_epi32(fx), _mm512_set1_epi32(0x7f));
    e = _mm512_slli_epi32(e, 23);
    return _mm512_mul_ps(y, _mm512_castsi512_ps(e));
}

/* mc_att_softmax_step without a soft cap (ncol a multiple of 16), 16 scores a vector: the
 * max is exact in any order, each p is mc_exp512's (mc_exp256's bits), and the p's are
 * summed 8 at a time in the ymm kernel's order, so m, l, o and s come out the same. */
MC_ATZ static void mc_atz_softmax_step(float *s, int ncol, int cnt, float *m, float *l, float *o, int hd) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512 mx = ninf;
    for (int c = 0; c < ncol; c += 16) { /* keys c + lane < cnt kept, the rest -inf */
        const __mmask16 ok = _mm512_cmpgt_epi32_mask(_mm512_set1_epi32(cnt - c), lane);
        const __m512 x = _mm512_mask_blend_ps(ok, ninf, _mm512_loadu_ps(s + c));
        _mm512_storeu_ps(s + c, x);
        mx = _mm512_max_ps(mx, x);
    }
    mc_att_rescale(_mm512_reduce_max_ps(mx), m, l, o, hd);
    const __m512 vm = _mm512_set1_ps(*m);
    __m256 ps = _mm256_setzero_ps();
    for (int c = 0; c < ncol; c += 16) {
        const __m512 x = _mm512_loadu_ps(s + c);
        /* a masked key's p is 0 exactly, whatever exp makes of -inf */
        const __m512 e = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, ninf, _CMP_NEQ_OQ),
                                             mc_exp512(_mm512_sub_ps(x, vm)));
        _mm512_storeu_ps(s + c, e);
        ps = _mm256_add_ps(ps, _mm512_castps512_ps256(e));
        ps = _mm256_add_ps(ps, _mm256_castsi256_ps(_mm512_extracti64x4_epi64(_mm512_castps_si512(e), 1)));
    }
    *l += mc_hsum256(ps);
}
