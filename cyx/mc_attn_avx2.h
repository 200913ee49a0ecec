/* AVX2 attention over a KV cache (hd % 8 == 0, f32 or f16 cache), included by mc_ops.h.
 *
 * One work item is a tile of up to mq query rows times g query heads of one KV head:
 * M = mq * g query vectors that share every K/V row (a lone row, as in decode, takes the
 * heads of kvs KV heads, reading cache rows as contiguous slices).  Per chunk of nc keys
 * the chunk's K is transposed (f16: converted) once into (hd, nc), so the scores are a
 * small GEMM (mc_att_qk: 6 query vectors x 16 keys of FMAs, no horizontal add per key);
 * then each vector's online softmax step runs over the whole chunk (one max, one
 * rescale, mc_exp256 8 keys at a time); then P . V is a second small GEMM (mc_att_pv:
 * 6 vectors x 16 columns, p broadcast into V rows).  The kernel before took one query
 * row per item: it converted each f16 K/V row once per query row, scored 4 keys at a
 * time by FMA chains and horizontal adds, and kept 4 FMA chains in its P . V loop; its
 * profile split between those three (~1/5 to 1/4 each) at ~40 GFLOP/s on 2 cores.
 *
 * A vector's result does not depend on the tile it is in: its chunks start at its
 * window's start (tiles whose rows' windows start at different keys go row by row),
 * keys past its own end get p = 0 exactly (their FMAs add +-0), and its sums run in the
 * same order in any tile.  So g, mq, threads and batching never change a result, and an
 * f16 cache gives bit for bit what its values widened to f32 give. */

#define MC_ATT_INLINE MC_AVX2 static inline __attribute__((always_inline))

/* s[r * lds + c] = scale * q_r . k_c for R (<= 6, a constant once inlined) query vectors
 * q + r * hd and the 16 keys of columns 0..15 of kt ((hd, ldk), keys transposed):
 * 12 accumulators, so the FMA pipes never wait on one chain. */
MC_ATT_INLINE void mc_att_qk(const float *q, const int R, const float *kt, int ldk, int hd,
                             __m256 sc, float *s, int lds) {
    __m256 a0[6], a1[6];
    for (int r = 0; r < R; r++) a0[r] = a1[r] = _mm256_setzero_ps();
    for (int d = 0; d < hd; d++, kt += ldk) {
        const __m256 k0 = _mm256_loadu_ps(kt), k1 = _mm256_loadu_ps(kt + 8);
        for (int r = 0; r < R; r++) {
            const __m256 qv = _mm256_broadcast_ss(q + (size_t)r * hd + d);
            a0[r] = _mm256_fmadd_ps(qv, k0, a0[r]);
            a1[r] = _mm256_fmadd_ps(qv, k1, a1[r]);
        }
    }
    for (int r = 0; r < R; r++) {
        _mm256_storeu_ps(s + (size_t)r * lds, _mm256_mul_ps(a0[r], sc));
        _mm256_storeu_ps(s + (size_t)r * lds + 8, _mm256_mul_ps(a1[r], sc));
    }
}

/* o[r * ldo + 0 .. 8W-1] += sum over c < n of p[r * ldp + c] * v[c * ldv + 0 .. 8W-1],
 * for R (<= 6) vectors and W (1 or 2) column vectors, in registers across the n keys */
MC_ATT_INLINE void mc_att_pv(const float *p, int ldp, const int R, const int W, const float *v,
                             size_t ldv, int n, float *o, int ldo) {
    __m256 x0[6], x1[6];
    for (int r = 0; r < R; r++) {
        x0[r] = _mm256_loadu_ps(o + (size_t)r * ldo);
        if (W == 2) x1[r] = _mm256_loadu_ps(o + (size_t)r * ldo + 8);
    }
    for (int c = 0; c < n; c++, v += ldv) {
        const __m256 v0 = _mm256_loadu_ps(v), v1 = W == 2 ? _mm256_loadu_ps(v + 8) : v0;
        for (int r = 0; r < R; r++) {
            const __m256 pv = _mm256_broadcast_ss(p + (size_t)r * ldp + c);
            x0[r] = _mm256_fmadd_ps(pv, v0, x0[r]);
            if (W == 2) x1[r] = _mm256_fmadd_ps(pv, v1, x1[r]);
        }
    }
    for (int r = 0; r < R; r++) {
        _mm256_storeu_ps(o + (size_t)r * ldo, x0[r]);
        if (W == 2) _mm256_storeu_ps(o + (size_t)r * ldo + 8, x1[r]);
    }
}

/* a switch over R = 1..6 that calls F with R a constant, so its loops unroll */
#define MC_ATT_BY_R(R, F, ...)              \
    switch (R) {                            \
    case 6: F(__VA_ARGS__, 6); break;       \
    case 5: F(__VA_ARGS__, 5); break;       \
    case 4: F(__VA_ARGS__, 4); break;       \
    case 3: F(__VA_ARGS__, 3); break;       \
    case 2: F(__VA_ARGS__, 2); break;       \
    default: F(__VA_ARGS__, 1); break;      \
    }

MC_ATT_INLINE void mc_att_qk_rows(const float *q, const float *kt, int ldk, int hd, __m256 sc,
                                   float *s, int lds, int ncol, const int R) {
    for (int c = 0; c < ncol; c += 16) mc_att_qk(q, R, kt + c, ldk, hd, sc, s + c, lds);
}

MC_ATT_INLINE void mc_att_pv_rows(const float *p, int ldp, const float *v, size_t ldv, int n,
                                   int hd, float *o, const int R) {
    int j = 0;
    for (; j + 16 <= hd; j += 16) mc_att_pv(p, ldp, R, 2, v + j, ldv, n, o + j, hd);
    if (j < hd) mc_att_pv(p, ldp, R, 1, v + j, ldv, n, o + j, hd);
}

/* a vector's online softmax after a chunk whose max is cm: where cm beats the running max
 * m, the sum l and sums o (hd) are rescaled by exp(m - cm) and m becomes cm */
MC_ATT_INLINE void mc_att_rescale(float cm, float *m, float *l, float *o, int hd) {
    if (cm > *m) {
        const float corr = expf(*m - cm); /* 0 when m is -inf */
        const __m256 c = _mm256_set1_ps(corr);
        *l *= corr;
        for (int j = 0; j < hd; j += 8)
            _mm256_storeu_ps(o + j, _mm256_mul_ps(_mm256_loadu_ps(o + j), c));
        *m = cm;
    }
}

#include "mc_attn_zmm.h"

/* 8 rows of 8 floats transposed in place */
MC_ATT_INLINE void mc_att_tr8(__m256 r[8]) {
    __m256 t[8], u[8];
    for (int j = 0; j < 8; j += 2) {
        t[j] = _mm256_unpacklo_ps(r[j], r[j + 1]);
        t[j + 1] = _mm256_unpackhi_ps(r[j], r[j + 1]);
    }
    for (int j = 0; j < 8; j += 4) {
        u[j] = _mm256_shuffle_ps(t[j], t[j + 2], 0x44);
        u[j + 1] = _mm256_shuffle_ps(t[j], t[j + 2], 0xEE);
        u[j + 2] = _mm256_shuffle_ps(t[j + 1], t[j + 3], 0x44);
        u[j + 3] = _mm256_shuffle_ps(t[j + 1], t[j + 3], 0xEE);
    }
    for (int j = 0; j < 4; j++) {
        r[j] = _mm256_permute2f128_ps(u[j], u[j + 4], 0x20);
        r[j + 4] = _mm256_permute2f128_ps(u[j], u[j + 4], 0x31);
    }
}

/* keys t0 .. t0 + n - 1 of slice pk (of w floats; pn slices a row) of cache `base`
 * transposed into kt (w, ldk) as floats; columns n .. ncol - 1 (ncol a multiple of 8)
 * repeat the last key, unused */
MC_AVX2 static void mc_att_kt(const void *base, int f16, int pn, int pk, int w, int t0, int n,
                              int ncol, float *kt, int ldk) {
    for (int c0 = 0; c0 < ncol; c0 += 8) {
        size_t row[8];
        for (int j = 0; j < 8; j++) row[j] = ((size_t)(t0 + mc_imin(c0 + j, n - 1)) * pn + pk) * w;
        for (int d = 0; d < w; d += 8) {
            __m256 r[8];
            for (int j = 0; j < 8; j++) {
                const size_t at = row[j] + d;
                r[j] = f16 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)base + at)))
                           : _mm256_loadu_ps((const float *)base + at);
            }
            mc_att_tr8(r);
            for (int j = 0; j < 8; j++) _mm256_storeu_ps(kt + (size_t)(d + j) * ldk + c0, r[j]);
        }
    }
}

/* One online-softmax step of a query vector over a chunk: s (ncol scores, ncol % 8 == 0)
 * of which the first cnt (>= 1) are its keys, the rest masked.  The running max m, sum
 * l and sums o (hd) are rescaled when the chunk's max is larger; s becomes p, 0 past
 * cnt. */
MC_AVX2 static void mc_att_softmax_step(float *s, int ncol, int cnt, float softcap, float *m,
                                        float *l, float *o, int hd) {
    const __m256 ninf = _mm256_set1_ps(-INFINITY), c8 = _mm256_set1_ps(softcap);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256 mx = ninf;
    for (int c = 0; c < ncol; c += 8) {
        __m256 x = _mm256_loadu_ps(s + c);
        if (softcap > 0.0f) x = _mm256_mul_ps(c8, mc_tanh256(_mm256_div_ps(x, c8)));
        const __m256 ok = _mm256_castsi256_ps(
            _mm256_cmpgt_epi32(_mm256_set1_epi32(cnt - c), lane)); /* key c + lane < cnt */
        x = _mm256_blendv_ps(ninf, x, ok);
        _mm256_storeu_ps(s + c, x);
        mx = _mm256_max_ps(mx, x);
    }
    mc_att_rescale(mc_hmax256(mx), m, l, o, hd);
    const __m256 vm = _mm256_set1_ps(*m);
    __m256 ps = _mm256_setzero_ps();
    for (int c = 0; c < ncol; c += 8) {
        const __m256 x = _mm256_loadu_ps(s + c);
        /* a masked key's p is 0 exactly, whatever exp makes of -inf */
        const __m256 e =
            _mm256_and_ps(mc_exp256(_mm256_sub_ps(x, vm)), _mm256_cmp_ps(x, ninf, _CMP_NEQ_OQ));
        _mm256_storeu_ps(s + c, e);
        ps = _mm256_add_ps(ps, e);
    }
    *l += mc_hsum256(ps);
}

/* query rows i0 .. i0 + nr - 1 (their windows start at the same key), heads h0 .. h0 + g
 * - 1 of KV heads kh .. kh + kvs - 1 (kvs > 1: one row, all their heads) */
MC_AVX2 static void mc_att_tile(const mc_att_job *jb, int i0, int nr, int kh, int h0, int g) {
    const int hd = jb->hd, kvs = jb->kvs, f16 = jb->kv_f16, M = nr * g, W = kvs * hd;
    const int pn = jb->n_head_kv / kvs, pk = kh / kvs; /* the item's slice of a cache row */
    const int Mg = M / kvs;                           /* vectors per KV head */
    const int nc = mc_att_nc(hd), nb = (Mg + 5) / 6;  /* nb blocks of <= 6 query vectors */
    const int zmm = jb->simd == MC_SIMD_VNNI;         /* the GEMMs on 512-bit registers */
    float qb[MC_ATT_ACC], acc[MC_ATT_ACC];         /* (M, hd) queries, running sums of p * v */
    float s[MC_ATT_MMAX * MC_ATT_CHUNK], m[MC_ATT_MMAX], l[MC_ATT_MMAX]; /* s: (M, nc) */
    float buf[MC_ATT_KT]; /* the chunk's K transposed (W, nc), then its V (f16) */
    for (int r = 0; r < nr; r++)
        memcpy(qb + (size_t)r * g * hd, jb->q + ((size_t)(i0 + r) * jb->n_head + h0) * hd,
               sizeof(float) * (size_t)g * hd);
    for (int j = 0; j < M * hd; j++) acc[j] = 0.0f;
    for (int a = 0; a < M; a++) {
        m[a] = -INFINITY;
        l[a] = 0.0f;
    }
    const int es = f16 ? 2 : 4, t_lo = mc_att_lo(jb, i0);
    const int T = mc_imin(jb->q_pos0 + i0 + nr, jb->n_kv); /* the last row's end */
    const __m256 sc = _mm256_set1_ps(jb->scale);
    if (t_lo < T) mc_att_prefetch(jb->k, t_lo, mc_imin(nc, T - t_lo), pn, pk, W, es);
    for (int t0 = t_lo; t0 < T; t0 += nc) {
        const int n = mc_imin(nc, T - t0), ncol = (n + 15) & ~15;
        /* this chunk's V (used after its scores), the next chunk's K */
        mc_att_prefetch(jb->v, t0, n, pn, pk, W, es);
        if (t0 + n < T) mc_att_prefetch(jb->k, t0 + n, mc_imin(nc, T - t0 - n), pn, pk, W, es);
        mc_att_kt(jb->k, f16, pn, pk, W, t0, n, ncol, buf, nc);
        for (int j = 0; j < kvs; j++) /* each KV head's Mg split as evenly as it goes */
            for (int b = 0, a0 = j * Mg; b < nb; b++) {
                const int R = (Mg - (a0 - j * Mg)) / (nb - b);
                if (zmm)
                    mc_atz_qk_rows(qb + (size_t)a0 * hd, buf + (size_t)j * hd * nc, nc, hd, jb->scale,
                                   s + (size_t)a0 * nc, nc, ncol, R);
                else
                    MC_ATT_BY_R(R, mc_att_qk_rows, qb + (size_t)a0 * hd, buf + (size_t)j * hd * nc, nc,
                                hd, sc, s + (size_t)a0 * nc, nc, ncol);
                a0 += R;
            }
        for (int a = 0; a < M; a++) {
            const int cnt = mc_imin(jb->q_pos0 + i0 + a / g + 1, jb->n_kv) - t0; /* its keys */
            float *sa = s + (size_t)a * nc;
            if (cnt > 0 && zmm && jb->softcap == 0.0f)
                mc_atz_softmax_step(sa, ncol, cnt, m + a, l + a, acc + (size_t)a * hd, hd);
            else if (cnt > 0)
                mc_att_softmax_step(sa, ncol, cnt, jb->softcap, m + a, l + a,
                                    acc + (size_t)a * hd, hd);
            else
                for (int c = 0; c < ncol; c++) sa[c] = 0.0f;
        }
        size_t vs;
        const float *vb = mc_att_block(jb->v, f16, t0, n, pn, pk, W, buf, &vs);
        for (int j = 0; j < kvs; j++)
            for (int b = 0, a0 = j * Mg; b < nb; b++) {
                const int R = (Mg - (a0 - j * Mg)) / (nb - b);
                if (zmm)
                    mc_atz_pv_rows(s + (size_t)a0 * nc, nc, vb + (size_t)j * hd, vs, n, hd,
                                   acc + (size_t)a0 * hd, R);
                else
                    MC_ATT_BY_R(R, mc_att_pv_rows, s + (size_t)a0 * nc, nc, vb + (size_t)j * hd, vs, n,
                                hd, acc + (size_t)a0 * hd);
                a0 += R;
            }
    }
    for (int a = 0; a < M; a++) {
        float *o = jb->out + ((size_t)(i0 + a / g) * jb->n_head + h0 + a % g) * hd;
        const __m256 inv = _mm256_set1_ps(mc_att_inv(jb, h0 + a % g, m[a], l[a]));
        for (int j = 0; j < hd; j += 8)
            _mm256_storeu_ps(o + j, _mm256_mul_ps(_mm256_loadu_ps(acc + (size_t)a * hd + j), inv));
    }
}

/* work item idx: a tile of rows, or its rows one by one where their windows start at
 * different keys (each row's chunks start at its own window's start) */
MC_AVX2 static void mc_attention_grp_avx2(const void *ctx, int idx) {
    const mc_att_job *jb = (const mc_att_job *)ctx;
    int i0, kh, h0;
    const int g = mc_att_item(jb, idx, &i0, &kh, &h0), nr = mc_imin(jb->mq, jb->n_q - i0);
    if (mc_att_lo(jb, i0) == mc_att_lo(jb, i0 + nr - 1))
        mc_att_tile(jb, i0, nr, kh, h0, g);
    else
        for (int r = 0; r < nr; r++) mc_att_tile(jb, i0 + r, 1, kh, h0, g);
}

static void mc_attention_grp_avx2_fn(void *ctx, int idx) { mc_attention_grp_avx2(ctx, idx); }
