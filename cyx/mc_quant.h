/* Quantized matrix products y = x @ W^T straight from GGML blocks.
 *
 * Strategy (as llama.cpp): each activation row x is quantized once per call to
 * int8 blocks (mc_q8 per 32 elements, mc_q8k per 256 for the K-quants), then
 * every weight block meets its activation block in an integer dot product
 * (AVX2 maddubs/madd, NEON mull/padal, or scalar C), scaled by the two block
 * scales.  F32/F16 weights use a float FMA path on the unquantized x.
 *
 * Work split: tiles of output rows (MC_TR, or longer runs for a few x rows) are
 * handed to the threads of the pool in ascending order
 * (mc_pool.h); inside a tile each weight row meets every activation row (four
 * at a time where a 4-row kernel exists), so each weight row is read from
 * memory once per call for the whole batch.  With AVX512-VNNI, groups of 8 activation
 * rows go through the GEMM of mc_gemm_vnni.h instead (4 weight rows x 8 x rows per
 * step, no horizontal sums), and mc_matmul_multi runs the products of several weights
 * that share one x (Q, K, V; gate, up) as one pool job.
 */
#ifndef MC_QUANT_H
#define MC_QUANT_H

#include "mc_blocks.h"
#include "mc_dequant_avx2.h"
#include "mc_dot_avx2.h"
#include "mc_dot_avx2_more.h"
#include "mc_dot_neon.h"
#include "mc_dot_scalar.h"
#include "mc_dispatch.h"
#include "mc_gemm_vnni.h"
#include "mc_gemm_zmm.h"
#include "mc_gemm_zmm41.h"
#include "mc_gemm_float.h"
#include "mc_pool.h"

/* dequantize one row with the fastest path `simd` allows */
static void mc_dequant_row_simd(int t, const uint8_t *row, int K, float *y, int simd) {
#if defined(MC_X86)
    if (MC_IS_AVX2(simd) && mc_dequant_row_avx2(t, row, K, y)) return;
#endif
    (void)simd;
    mc_dequant_row(t, row, K, y);
}

/* Fewest x rows for the 8-row kernels (GEMM, dot8), whose groups are padded to 8: below
 * it each x row takes the 4-weight-row kernel.  SmolLM2's layers, 2 threads: 2 rows
 * 4.9 ms vs 8.8 padded, 3: 6.7 vs 8.9, 4: 8.6 vs 9.2, 5: 10.5 vs 9.4; each row one by
 * one adds ~1.9 ms, a padded group ~4. */
#define MC_BATCH_MIN_ROWS 5
/* x rows past the last full group of 8 that go through a padded group (fewer: one by one;
 * 8 + 3 rows: 14.2 ms one by one, 12.5 padded) */
#define MC_PAD_MIN_ROWS 3

/* Row tiles: MC_TR weight rows x MC_TN activation rows per inner step. */
#define MC_TR 16
#define MC_TN 32

typedef struct {
    int t, M, K, n, failed, simd;
    int tr; /* weight rows per tile (a chunk of the pool) */
    const uint8_t *W;
    int64_t row_stride;
    const float *x;     /* (n, K) float activations (exact path, F32/F16) */
    const void *xbase;  /* quantized (or float) activation rows */
    size_t xstride;     /* bytes between activation rows in xbase */
    float *y;           /* (n, M) */
    mc_dot_fn dot;
    mc_dot4_fn dot4;
    mc_dot8_fn dot8;      /* 8 x rows at once (32-element types), or NULL */
    int gemm;             /* VNNI GEMM (mc_gemm_vnni.h) for the groups of 8 x rows */
    const void *ilv;      /* the weights repacked 8 rows to a group (mc_gemm_repack), read
                           * instead of W by the repacked kernels (mc_job_aux), or NULL */
    mc_dotr4_fn dotr4;    /* 4 weight rows at once against one x row, or NULL */
    const void *xp;       /* (n / 8, K / 32): the mc_q8 rows repacked (mc_q8x8 or mc_q8t8); with
                           * repacked Q8_0 weights (n, K / 32) ints: 128 x each block's sum */
    mc_dot_fn fdot;       /* exact path, few x rows: fused dequant + dot, or NULL */
    struct mc_outl *outl; /* (n,) outliers kept out of the int8 rows, or NULL */
    int kw;               /* the K-quants on repacked weights against many x rows on AVX2
                           * (mc_gemm_kwide.h), x packed into xp */
    int fg;               /* F32 / F16 / BF16 weights through the float GEMM (AVX2 and up,
                           * any x row count; mc_gemm_float.h) */
} mc_matmul_job;

#include "mc_gemm_kwide.h"

/* Outlier decomposition (as LLM.int8()): the few activations of a row far above
 * its RMS are taken out before int8 quantization, so they no longer set their
 * block's scale, and added back in float: y += x_i * W[r, i]. */
#define MC_OUTL_MAX 4        /* per activation row */
#define MC_OUTL_SIGMA 6.0f  /* |x_i| > MC_OUTL_SIGMA * rms(x) */
struct mc_outl {
    int n;
    int idx[MC_OUTL_MAX];
    float val[MC_OUTL_MAX];
};

/* balanced mode: add back the outliers of x rows [j0, j1) for weight rows [ra, rb).
 * Rows of x share their outlier channels, so each weight row dequantizes each distinct
 * outlier position once. */
static void mc_outlier_rows(const mc_matmul_job *jb, int ra, int rb, int j0, int j1) {
    int pos[MC_TN * MC_OUTL_MAX], slot[MC_TN][MC_OUTL_MAX], np = 0;
    for (int j = j0; j < j1; j++) { /* j1 - j0 <= MC_TN */
        const struct mc_outl *o = jb->outl + j;
        for (int k = 0; k < o->n; k++) {
            int u = 0;
            while (u < np && pos[u] != o->idx[k]) u++;
            if (u == np) pos[np++] = o->idx[k];
            slot[j - j0][k] = u;
        }
    }
    if (np == 0) return;
    for (int r = ra; r < rb; r++) {
        const uint8_t *wr = jb->W + (size_t)r * jb->row_stride;
        float wv[MC_TN * MC_OUTL_MAX];
        for (int u = 0; u < np; u++) wv[u] = mc_elem(jb->t, wr, pos[u]);
        for (int j = j0; j < j1; j++) {
            const struct mc_outl *o = jb->outl + j;
            float c = 0.0f;
            for (int k = 0; k < o->n; k++) c += o->val[k] * wv[slot[j - j0][k]];
            if (o->n) jb->y[(size_t)j * jb->M + r] += c;
        }
    }
}

#if defined(MC_X86)
/* One tile of weight rows [r0, r1) (r0 a multiple of 8) on repacked weights: each group of
 * 8 rows meets every group of up to 8 x rows through `fn` while it sits in L1; two groups
 * (16 rows) at a time where there are two: the K-quants through zmm kernels `z` (not NULL),
 * from MC_ZMM_UNPACK_MIN_ROWS x rows on unpacked once into scratch first; Q4_1, Q8_0,
 * Q4_0, Q5_0, IQ4_NL and IQ4_XS through `f16` (not NULL, mc_gemm_zmm41.h); the tile's last
 * single group through `fn`. */
static void mc_repacked_tile(const mc_matmul_job *jb, int r0, int r1, mc_repacked_fn fn,
                             const mc_zmm_kernels *z, mc_repacked_fn f16) {
    const int M = jb->M, n = jb->n, nb = jb->K / 32;
    const size_t gbytes = mc_repack_block_bytes(jb->t) * (size_t)nb; /* one group of 8 rows */
    for (int r = r0; r < r1;) {
        const void *wg = (const char *)jb->ilv + gbytes * (size_t)(r / 8);
        /* group r / 8 + 1 holds rows below r1 */
        const int two = (z != NULL || f16 != NULL) && r1 - r > 8;
        mc_repacked16_fn fn16 = two && z != NULL ? z->fn : NULL;
        const void *w16 = wg;
        if (fn16 != NULL && n >= MC_ZMM_UNPACK_MIN_ROWS) { /* the pair unpacked once for all x rows */
            char *buf = (char *)mc_scratch(2, z->pre_bytes * (size_t)(nb / 8) + 64);
            if (buf != NULL) {
                void *u = buf + ((64 - ((uintptr_t)buf & 63)) & 63);
                z->unpack(nb, wg, gbytes, u);
                fn16 = z->fn_pre;
                w16 = u;
            }
        }
        for (int j = 0; j < n; j += 8) {
            const int na = mc_imin(8, n - j);
            const mc_q8 *xr[8];
            const int32_t *cx[8]; /* 128 times each x block's int sum where mc_repack_cx (mc_matmul_prep) */
            for (int a = 0; a < na; a++) {
                xr[a] = (const mc_q8 *)((const char *)jb->xbase + jb->xstride * (size_t)(j + a));
                cx[a] = (const int32_t *)jb->xp + (size_t)(j + a) * nb;
            }
            if (fn16 != NULL)
                fn16(na, nb, w16, gbytes, xr, jb->y + (size_t)j * M + r, (size_t)M, mc_imin(16, r1 - r));
            else
                (two ? f16 : fn)(na, nb, wg, xr, cx, jb->y + (size_t)j * M + r, (size_t)M,
                                 mc_imin(two ? 16 : 8, r1 - r));
        }
        r += two ? 16 : 8;
    }
}
#endif

/* one tile of jb->tr weight rows against all activation rows */
static void mc_matmul_chunk(void *ctx, int tile) {
    mc_matmul_job *jb = (mc_matmul_job *)ctx;
    const int M = jb->M, K = jb->K, n = jb->n;
    const int r0 = tile * jb->tr, r1 = mc_imin(M, r0 + jb->tr);
    float *y = jb->y;
#if defined(MC_X86)
    if (jb->fg) {
        if (mc_fg_tile(jb->t, jb->W + (size_t)r0 * jb->row_stride, jb->row_stride, r0, r1, K, jb->x, n, y, (size_t)M, jb->simd, MC_FG_PF) != 0)
            jb->failed = 1;
        return;
    }
#endif
    for (int j0 = 0; j0 < n; j0 += MC_TN) {
        const int j1 = mc_imin(n, j0 + MC_TN);
        int jr = j0; /* rows from jr on: the 4-row and 1-row kernels */
        if (jb->dot8 != NULL) {
            /* each group of 8 x rows (j0 is a multiple of 8) meets every weight row of the
             * tile while it sits in L1 */
            const int nb = K / 32;
            jr = j0 + ((j1 - j0) & ~7);
            if (j1 - jr >= MC_PAD_MIN_ROWS) jr = j1; /* the padded last group */
            for (int j = j0; j < jr; j += 8) {
                const mc_q8x8 *xg = (const mc_q8x8 *)jb->xp + (size_t)(j / 8) * nb;
                const int nu = mc_imin(8, jr - j);
                int r = r0;
                for (; r < r1; r++) {
                    const uint8_t *wr = jb->W + (size_t)r * jb->row_stride;
                    float o[8];
                    jb->dot8(K, wr, xg, o);
                    for (int u = 0; u < nu; u++) y[(size_t)(j + u) * M + r] = o[u];
                }
            }
        }
        int r = r0;
        if (jb->dotr4 != NULL && jr < j1)
            for (; r + 4 <= r1; r += 4) {
                const uint8_t *wr = jb->W + (size_t)r * jb->row_stride;
                for (int j = jr; j < j1; j++) {
                    float o[4];
                    jb->dotr4(K, wr, (size_t)jb->row_stride,
                              (const char *)jb->xbase + jb->xstride * j, o);
                    for (int u = 0; u < 4; u++) y[(size_t)j * M + r + u] = o[u];
                }
                if (jb->outl != NULL) mc_outlier_rows(jb, r, r + 4, j0, j1);
            }
        for (; r < r1; r++) {
            const uint8_t *wr = jb->W + (size_t)r * jb->row_stride;
            int j = jr;
            if (jb->dot4 != NULL) {
                for (; j + 4 <= j1; j += 4) {
                    float o[4];
                    jb->dot4(K, wr, (const char *)jb->xbase + jb->xstride * j, jb->xstride, o);
                    for (int u = 0; u < 4; u++) y[(size_t)(j + u) * M + r] = o[u];
                }
            }
            for (; j < j1; j++)
                y[(size_t)j * M + r] = jb->dot(K, wr, (const char *)jb->xbase + jb->xstride * j);
            if (jb->outl != NULL) mc_outlier_rows(jb, r, r + 1, j0, j1);
        }
    }
}

#if defined(MC_X86)
/* Rows of x per pass over a tile's weights: their packed groups stay in L2 while each
 * 4 weight rows are unpacked once per pass. */
#define MC_GEMM_JR 128

/* the VNNI GEMM over one tile of weight rows: groups of 8 x rows through mc_gemm_4x8,
 * the x rows past them (at most MC_PAD_MIN_ROWS - 1) through the 4-row single-x kernel */
/* res[u] lane v -> y[(j + v) * M + r + u] for u < nr, v < nu */
MC_VNNI static inline void mc_gemm_store(float *y, int M, int r, int nr, int j, int nu,
                                         const __m256 res[4]) {
    float o[4][8];
    for (int u = 0; u < nr; u++) {
        _mm256_storeu_ps(o[u], res[u]);
        for (int v = 0; v < nu; v++) y[(size_t)(j + v) * M + r + u] = o[u][v];
    }
}

MC_VNNI static void mc_matmul_gemm_chunk(void *ctx, int tile) {
    mc_matmul_job *jb = (mc_matmul_job *)ctx;
    const int M = jb->M, K = jb->K, n = jb->n, nb = K / 32, t = jb->t;
    const int r0 = tile * jb->tr, r1 = mc_imin(M, r0 + jb->tr);
    const int ngrp = n / 8 + (n % 8 >= MC_PAD_MIN_ROWS), jg = mc_imin(n, 8 * ngrp); /* rows in groups */
    const size_t st = (size_t)jb->row_stride;
    const mc_q8t8 *xp = (const mc_q8t8 *)jb->xp;
    float *y = jb->y;
    /* two buffers of 4 unpacked rows and their scales: one computed, one filled */
    const size_t wbytes = 4 * mc_gemm_row_bytes(nb), sbytes = (size_t)32 * nb;
    char *buf = (char *)mc_scratch(2, 2 * (wbytes + sbytes) + 64);
    if (buf == NULL) {
        jb->failed = 1;
        return;
    }
    uint8_t *wbuf[2];
    float *dbuf[2], *mbuf[2];
    wbuf[0] = (uint8_t *)(((uintptr_t)buf + 63) & ~(uintptr_t)63); /* aligned stores */
    wbuf[1] = wbuf[0] + wbytes;
    for (int b = 0; b < 2; b++) {
        dbuf[b] = (float *)(wbuf[0] + 2 * wbytes + (size_t)b * sbytes);
        mbuf[b] = dbuf[b] + 4 * nb;
    }
    for (int ja = 0; ja < jg; ja += MC_GEMM_JR) {
        const int jb1 = mc_imin(jg, ja + MC_GEMM_JR);
        int cur = 0;
        mc_gemm_unpack4(t, jb->W + (size_t)r0 * st, st, mc_imin(4, r1 - r0), nb, wbuf[0],
                        dbuf[0], mbuf[0]);
        for (int r = r0; r < r1; r += 4) {
            const int nr = mc_imin(4, r1 - r), nx = r + 4 < r1; /* next rows to unpack */
            for (int j = ja; j < jb1; j += 8) {
                __m256 res[4];
                const mc_q8t8 *xg = xp + (size_t)(j / 8) * nb;
                if (j == ja && nx)
                    mc_gemm_4x8_next(t, nb, wbuf[cur], dbuf[cur], mbuf[cur], xg, res,
                                     jb->W + (size_t)(r + 4) * st, st, mc_imin(4, r1 - r - 4),
                                     wbuf[1 - cur], dbuf[1 - cur], mbuf[1 - cur]);
                else
                    mc_gemm_4x8(t, nb, wbuf[cur], dbuf[cur], mbuf[cur], xg, res);
                mc_gemm_store(y, M, r, nr, j, mc_imin(8, n - j), res);
            }
            cur = 1 - cur;
        }
    }
    for (int j = jg; j < n; j++) { /* the x rows past the groups (fewer than MC_PAD_MIN_ROWS) */
        const void *xr = (const char *)jb->xbase + jb->xstride * j;
        int r = r0;
        for (; r + 4 <= r1; r += 4) {
            float o[4];
            jb->dotr4(K, jb->W + (size_t)r * jb->row_stride, (size_t)jb->row_stride, xr, o);
            for (int u = 0; u < 4; u++) y[(size_t)j * M + r + u] = o[u];
        }
        for (; r < r1; r++) y[(size_t)j * M + r] = jb->dot(K, jb->W + (size_t)r * jb->row_stride, xr);
    }
    if (jb->outl != NULL)
        for (int j0 = 0; j0 < n; j0 += MC_TN) mc_outlier_rows(jb, r0, r1, j0, mc_imin(n, j0 + MC_TN));
}
#endif

/* quantize activation row j into the job's buffer */
static void mc_quantize_chunk(void *ctx, int j) {
    mc_matmul_job *jb = (mc_matmul_job *)ctx;
    char *dst = (char *)jb->xbase + jb->xstride * j;
    const int K = jb->K;
    const float *xr = jb->x + (size_t)j * K;
    if (jb->outl != NULL) {
        struct mc_outl *o = jb->outl + j;
        o->n = 0;
        double ss = 0.0;
        for (int i = 0; i < K; i++) ss += (double)xr[i] * xr[i];
        const float thr = MC_OUTL_SIGMA * (float)sqrt(ss / K);
        /* the MC_OUTL_MAX largest |x_i| above thr, kept sorted by |x| descending */
        for (int i = 0; i < K; i++) {
            const float a = fabsf(xr[i]);
            if (!(a > thr) || (o->n == MC_OUTL_MAX && a <= fabsf(o->val[MC_OUTL_MAX - 1])))
                continue;
            int k = o->n < MC_OUTL_MAX ? o->n++ : MC_OUTL_MAX - 1;
            for (; k > 0 && fabsf(o->val[k - 1]) < a; k--) {
                o->val[k] = o->val[k - 1];
                o->idx[k] = o->idx[k - 1];
            }
            o->val[k] = xr[i];
            o->idx[k] = i;
        }
        if (o->n) {
            float *tmp = (float *)mc_scratch(1, (size_t)K * sizeof(float));
            if (tmp != NULL) {
                memcpy(tmp, xr, (size_t)K * sizeof(float));
                for (int k = 0; k < o->n; k++) tmp[o->idx[k]] = 0.0f;
                xr = tmp;
            } else {
                o->n = 0;
            }
        }
    }
#if defined(MC_X86)
    if (mc_act_q8k(jb->t) && MC_IS_AVX2(jb->simd))
        mc_quantize_q8k_avx2(xr, K, (mc_q8k *)dst);
    else
#endif
    if (mc_act_q8k(jb->t))
        mc_quantize_q8k(xr, K, (mc_q8k *)dst);
#if defined(MC_X86)
    else if (MC_IS_AVX2(jb->simd))
        mc_quantize_q8_avx2(xr, K, (mc_q8 *)dst);
#endif
    else
        mc_quantize_q8(xr, K, (mc_q8 *)dst);
}

/* exact path: dequantize each weight row once, float dots against every x row (AVX2 and up,
 * from MC_FG_MIN_ROWS x rows: the tile's rows dequantized, then the float GEMM) */
static void mc_matmul_exact_chunk(void *ctx, int tile) {
    mc_matmul_job *jb = (mc_matmul_job *)ctx;
    const int M = jb->M, K = jb->K, n = jb->n;
    const int r0 = tile * jb->tr, r1 = mc_imin(M, r0 + jb->tr);
#if defined(MC_X86)
    if (n >= MC_FG_MIN_ROWS && mc_fg_takes(MC_F32, K, jb->simd)) { /* the tile's rows dequantized, then the float GEMM */
        float *wt = (float *)mc_scratch(1, (size_t)16 * K * sizeof(float)); /* 16 rows at a time */
        for (int rs = r0; rs < r1 && wt != NULL; rs += 16) {
            const int re = mc_imin(r1, rs + 16);
            for (int r = rs; r < re; r++)
                mc_dequant_row_simd(jb->t, jb->W + (size_t)r * jb->row_stride, K, wt + (size_t)(r - rs) * K, jb->simd);
            if (mc_fg_tile(MC_F32, (const uint8_t *)wt, (int64_t)K * 4, rs, re, K, jb->x, n, jb->y, (size_t)M, jb->simd, 0) != 0)
                wt = NULL;
        }
        if (wt == NULL) jb->failed = 1;
        return;
    }
#endif
    float *wrow = (float *)mc_scratch(1, (size_t)K * sizeof(float));
    if (wrow == NULL) {
        jb->failed = 1;
        return;
    }
    for (int r = r0; r < r1; r++) {
        if (jb->fdot != NULL && n < 4) { /* same arithmetic as below, no row buffer */
            for (int j = 0; j < n; j++)
                jb->y[(size_t)j * M + r] =
                    jb->fdot(K, jb->W + (size_t)r * jb->row_stride, jb->x + (size_t)j * K);
            continue;
        }
        mc_dequant_row_simd(jb->t, jb->W + (size_t)r * jb->row_stride, K, wrow, jb->simd);
        int j = 0;
        if (jb->dot4 != NULL) {
            for (; j + 4 <= n; j += 4) {
                float o[4];
                jb->dot4(K, (const uint8_t *)wrow, jb->x + (size_t)j * K, (size_t)K * sizeof(float), o);
                for (int u = 0; u < 4; u++) jb->y[(size_t)(j + u) * M + r] = o[u];
            }
        }
        for (; j < n; j++)
            jb->y[(size_t)j * M + r] = jb->dot(K, (const uint8_t *)wrow, jb->x + (size_t)j * K);
    }
}

/* Relative RMS error that quantizing x row j introduced: sqrt(sum_b n_b d_b^2 / 12 / sum x^2),
 * rounding error being uniform in +-d/2 (an estimate: exact for no single value). */
static double mc_act_noise(const mc_matmul_job *jb, int j) {
    const float *xr = jb->x + (size_t)j * jb->K;
    const char *q = (const char *)jb->xbase + jb->xstride * j;
    double sig = 0.0, noise = 0.0;
    for (int i = 0; i < jb->K; i++) sig += (double)xr[i] * xr[i];
    if (mc_act_q8k(jb->t)) {
        const mc_q8k *b = (const mc_q8k *)q;
        for (int i = 0; i < jb->K / 256; i++) noise += 256.0 * b[i].d * b[i].d;
    } else {
        const mc_q8 *b = (const mc_q8 *)q;
        for (int i = 0; i < (jb->K + 31) / 32; i++) noise += 32.0 * b[i].d * b[i].d;
    }
    return sig > 0.0 ? sqrt(noise / 12.0 / sig) : 0.0;
}

MC_API int mc_matmul(int t, const uint8_t *W, int64_t row_stride, int M, int K, const float *x,
                     int n, float *y, int simd, int nth, float tol);

/* balanced mode, some rows (not all) too noisy for int8: recompute those rows on the
 * exact path (gathered, then scattered back), as each would be alone */
static int mc_matmul_redo_exact(const mc_matmul_job *jb, int nth, float tol) {
    const int n = jb->n, K = jb->K, M = jb->M;
    int *rows = (int *)malloc(sizeof(int) * (size_t)n);
    int m = 0;
    if (rows == NULL) return -2;
    for (int j = 0; j < n; j++)
        if (mc_act_noise(jb, j) > tol) rows[m++] = j;
    float *xs = (float *)malloc(sizeof(float) * (size_t)m * ((size_t)K + (size_t)M));
    if (xs == NULL) {
        free(rows);
        return -2;
    }
    float *ys = xs + (size_t)m * K;
    for (int u = 0; u < m; u++) memcpy(xs + (size_t)u * K, jb->x + (size_t)rows[u] * K, sizeof(float) * K);
    const int rc = mc_matmul(jb->t, jb->W, jb->row_stride, M, K, xs, m, ys, jb->simd, nth, 0.0f);
    for (int u = 0; u < m && rc == 0; u++)
        memcpy(jb->y + (size_t)rows[u] * M, ys + (size_t)u * M, sizeof(float) * M);
    free(xs);
    free(rows);
    return rc;
}

/* y (n, M) = x (n, K) @ W^T, W = M rows of `row_stride` bytes of type t.
 *
 * tol == 0 ("exact"): activations stay float32; each weight row is dequantized
 *     once into a row buffer and meets every x row in a float dot product (the
 *     result of x @ dequant(W)^T up to float32 summation order).
 * tol > 0: activations are quantized to int8 blocks and the dots are integer
 *     (fast), except for the rows of x whose quantization is estimated to add a
 *     relative RMS error above tol (activations with outliers): those rows take the
 *     exact path, each row's result the same as alone.  A huge tol ("fast") always takes the integer path.
 * Work is split in tiles of jb.tr output rows over up to nth threads.
 * Returns 0, -1 for an unknown type, -2 when out of memory. */
/* Activations for the fast and balanced paths: x quantized once (and packed for the
 * batched kernels) into the job's buffers; the kernels picked.  `*exact` starts as
 * whether the call is exact and becomes 1 when every row is too noisy for int8
 * (balanced), `*nnoisy` counts those rows.  jb: t, K, n, x, simd, dot set.
 * Returns 0 or -2 (out of memory). */
static int mc_matmul_prep(mc_matmul_job *jb, int nth, float tol, int *exact, int *nnoisy) {
    const int t = jb->t, K = jb->K, n = jb->n, simd = jb->simd;
    const float *x = jb->x;
    if (!*exact) {
        jb->dot4 = mc_pick_dot4(t, simd);
        /* quantize the activations once (rows in parallel when there are many) */
        if (mc_is_float(t)) {
            jb->xstride = (size_t)K * sizeof(float);
            jb->xbase = x;
#if defined(MC_X86)
            jb->fg = mc_fg_takes(t, K, simd);
#endif
        } else {
            jb->xstride = mc_act_q8k(t) ? (size_t)(K / 256) * sizeof(mc_q8k)
                                                        : (size_t)((K + 31) / 32) * sizeof(mc_q8);
            const int outl = tol < 1e30f; /* balanced: outlier decomposition */
            const size_t qbytes = (jb->xstride * (size_t)n + 63) & ~(size_t)63;
            const size_t obytes = outl ? sizeof(struct mc_outl) * (size_t)n : 0;
            jb->dotr4 = K % 32 == 0 ? mc_pick_dotr4(t, simd) : NULL;
#if defined(MC_X86)
            jb->gemm = n >= MC_BATCH_MIN_ROWS && jb->ilv == NULL && K % 32 == 0 &&
                       simd == MC_SIMD_VNNI && mc_gemm_type(t);
#endif
            jb->dot8 = n >= MC_BATCH_MIN_ROWS && K % 32 == 0 && !jb->gemm && jb->ilv == NULL
                           ? mc_pick_dot8(t, simd)
                           : NULL;
            /* groups of 8 rows; a last group of MC_PAD_MIN_ROWS-7 rows is padded with zero rows */
            const size_t nb = (size_t)K / 32, ngrp = (size_t)n / 8 + (n % 8 >= MC_PAD_MIN_ROWS);
#if defined(MC_X86)
            jb->kw = jb->ilv != NULL && mc_kw_takes(t, K, n, simd);
#endif
            const size_t dbytes = jb->kw             ? mc_kw_x_bytes(n, K)
                                  : jb->ilv != NULL ? (mc_repack_cx(t, simd) ? sizeof(int32_t) * nb * (size_t)n : 0)
                                  : jb->gemm  ? ngrp * nb * sizeof(mc_q8t8)
                                  : jb->dot8 ? ngrp * nb * sizeof(mc_q8x8)
                                            : 0;
            char *xq = (char *)mc_scratch(0, qbytes + ((obytes + 63) & ~(size_t)63) + dbytes + 64);
            if (xq == NULL) return -2;
            jb->xbase = xq;
            jb->outl = outl ? (struct mc_outl *)(xq + qbytes) : NULL;
            mc_parallel(n >= 16 ? nth : 1, n, mc_quantize_chunk, jb);
            if (tol < 1e30f) { /* balanced: each row decides for itself */
                for (int j = 0; j < n; j++) *nnoisy += mc_act_noise(jb, j) > tol;
                *exact = *nnoisy == n;
            }
#if defined(MC_X86)
            if ((jb->gemm || jb->ilv != NULL) && !*exact) {
                const uintptr_t at = (uintptr_t)(xq + qbytes + ((obytes + 63) & ~(uintptr_t)63));
                char *xp = (char *)((at + 63) & ~(uintptr_t)63);
                jb->xp = xp;
                if (jb->kw) {
                    mc_parallel(n >= 64 ? nth : 1, (n + 7) / 8, mc_kw_pack_chunk, jb);
                } else if (jb->ilv == NULL) {
                    for (size_t g = 0; g < ngrp; g++)
                        mc_gemm_pack8(xq + jb->xstride * g * 8, jb->xstride, mc_imin(8, n - (int)g * 8),
                                      (int)nb, mc_gemm_offset(t), (mc_q8t8 *)xp + g * nb);
                } else if (mc_repack_cx(t, simd)) { /* 128 x each block's int sum, for the
                                                     * weights' + 128 (Q4_0, Q5_0: - 8, - 16) */
                    int32_t *cx = (int32_t *)xp;
                    for (int j = 0; j < n; j++) {
                        const mc_q8 *xr = (const mc_q8 *)(xq + jb->xstride * (size_t)j);
                        for (size_t i = 0; i < nb; i++) cx[(size_t)j * nb + i] = 128 * mc_q8_isum(xr + i);
                    }
                }
            }
#endif
            if (jb->dot8 != NULL && !*exact) { /* each group of 8 rows, block by block */
                const uintptr_t at = (uintptr_t)(xq + qbytes + ((obytes + 63) & ~(size_t)63));
                mc_q8x8 *xp = (mc_q8x8 *)((at + 63) & ~(uintptr_t)63); /* aligned loads */
                /* the unsigned-weight offset of mc_dot8_* (AVX2: Q8_0 stays signed) */
                const int off = t == MC_Q8_0 ? 0 : mc_gemm_offset(t);
                static const int lane[8] = {0, 4, 1, 5, 2, 6, 3, 7}; /* row -> lane */
                memset(xp, 0, ngrp * nb * sizeof(mc_q8x8));             /* padding rows */
                for (size_t g = 0; g < ngrp; g++)
                    for (int u = 0; u < 8 && g * 8 + u < (size_t)n; u++) {
                        const mc_q8 *xr = (const mc_q8 *)(xq + jb->xstride * (g * 8 + u));
                        for (size_t i = 0; i < nb; i++) {
                            mc_q8x8 *o = xp + g * nb + i;
                            o->d[lane[u]] = xr[i].d;
                            o->s[lane[u]] = xr[i].s;
                            o->cs[lane[u]] = off * mc_q8_isum(xr + i);
                            memcpy(o->lo[u / 2] + 16 * (u % 2), xr[i].qs, 16);
                            memcpy(o->hi[u / 2] + 16 * (u % 2), xr[i].qs + 16, 16);
                        }
                    }
                jb->xp = xp;
            }
        }
    }
    return 0;
}

/* Long runs per thread: fewer runs start fewer prefetch streams and GEMM pipelines, more
 * even out a late thread (SmolLM2 layers, 2 threads: 1 run -7%, 2 -5%, 8 +3% time vs 4). */
#define MC_RUNS_PER_THREAD 2

/* Tiles of jb->tr weight rows.  Few x rows, or the GEMM (which unpacks each 4 weight
 * rows once for all x rows): each weight byte is read from memory once, so long
 * ascending runs (MC_RUNS_PER_THREAD per thread) keep the hardware prefetchers going.  The
 * other kernels with many x rows: MC_TR-row tiles that stay in L1 while every group of
 * x rows meets them.  Returns the number of tiles. */
static int mc_matmul_tiles(mc_matmul_job *jb, int use, int exact) {
    jb->tr = MC_TR;
    if (jb->kw && !exact) { /* compute-bound: short tiles even out the threads */
        jb->tr = MC_KW_TR;
    } else if (jb->fg && jb->n >= 8) {
        jb->tr = MC_FG_TR;
    } else if (jb->n < 8 || ((jb->gemm || jb->ilv != NULL) && !exact)) {
        const int want = (jb->M + MC_RUNS_PER_THREAD * use - 1) / (MC_RUNS_PER_THREAD * use);
        jb->tr = ((want + MC_TR - 1) / MC_TR) * MC_TR;
        if (jb->tr < MC_TR) jb->tr = MC_TR;
    }
    return (jb->M + jb->tr - 1) / jb->tr;
}

/* the fast and balanced paths' kernel for one tile of a prepared job */
static void mc_matmul_tile(void *ctx, int tile) {
#if defined(MC_X86)
    const mc_matmul_job *jb = (const mc_matmul_job *)ctx;
    if (jb->kw) { /* the K-quants against many x rows on AVX2 */
        const int r0 = tile * jb->tr;
        mc_kw_tile((mc_matmul_job *)jb, r0, mc_imin(jb->M, r0 + jb->tr));
        return;
    }
    if (jb->ilv != NULL) { /* repacked weights (mc_job_aux) */
        const int vnni = jb->simd == MC_SIMD_VNNI;
        const mc_repacked_fn fn = jb->t == MC_Q8_0   ? (vnni ? mc_gemm_q80x8 : mc_gemm_q80x8_avx2)
                                  : jb->t == MC_Q4_K ? (vnni ? mc_gemm_q4kx8 : mc_gemm_q4kx8_avx2)
                                  : jb->t == MC_Q5_K ? (vnni ? mc_gemm_q5kx8 : mc_gemm_q5kx8_avx2)
                                  : jb->t == MC_Q3_K ? (vnni ? mc_gemm_q3kx8 : mc_gemm_q3kx8_avx2)
                                  : jb->t == MC_Q2_K ? (vnni ? mc_gemm_q2kx8 : mc_gemm_q2kx8_avx2)
                                  : jb->t == MC_IQ4_NL ? (vnni ? mc_gemm_iq4nlx8 : mc_gemm_iq4nlx8_avx2)
                                  : jb->t == MC_Q4_0 ? (vnni ? mc_gemm_q40x8 : mc_gemm_q40x8_avx2)
                                  : jb->t == MC_Q5_0 ? (vnni ? mc_gemm_q50x8 : mc_gemm_q50x8_avx2)
                                  : jb->t == MC_Q5_1 ? (vnni ? mc_gemm_q51x8 : mc_gemm_q51x8_avx2)
                                  : jb->t == MC_IQ4_XS ? (vnni ? mc_gemm_iq4xsx8 : mc_gemm_iq4xsx8_avx2)
                                  : jb->t == MC_MXFP4 ? (vnni ? mc_gemm_mxfp4x8 : mc_gemm_mxfp4x8_avx2)
                                  : jb->t == MC_Q6_K ? (vnni ? mc_gemm_q6kx8 : mc_gemm_q6kx8_avx2)
                                                     : (vnni ? mc_gemm_q41x8 : mc_gemm_q41x8_avx2);
        /* Q4_K, Q5_K, Q6_K on VNNI: 16 weight rows a step on zmm registers (mc_gemm_zmm.h),
         * Q4_1, Q8_0, Q4_0, Q5_0, IQ4_* too (mc_gemm_zmm41.h); the other types, and every
         * type on AVX2, have only the 8-row kernels */
        const mc_zmm_kernels *z = !vnni || jb->n < MC_ZMM_MIN_ROWS ? NULL
                                  : jb->t == MC_Q4_K               ? &mc_zmm_q4k
                                  : jb->t == MC_Q5_K               ? &mc_zmm_q5k
                                  : jb->t == MC_Q6_K               ? &mc_zmm_q6k
                                  : jb->t == MC_Q3_K               ? &mc_zmm_q3k
                                  : jb->t == MC_Q2_K               ? &mc_zmm_q2k
                                                                   : NULL;
        const int r0 = tile * jb->tr;
        mc_repacked_tile(jb, r0, mc_imin(jb->M, r0 + jb->tr), fn, z,
                         z != NULL ? NULL : mc_repacked16_pick(jb->t, jb->simd));
        return;
    }
    if (jb->gemm) {
        mc_matmul_gemm_chunk(ctx, tile);
        return;
    }
#endif
    mc_matmul_chunk(ctx, tile);
}

/* a job for x (n, K) against weights of type t: -1 when no kernel takes type t */
static int mc_job_init(mc_matmul_job *jb, int t, int K, int n, const float *x, int simd) {
    memset(jb, 0, sizeof *jb);
    jb->t = t;
    jb->K = K;
    jb->n = n;
    jb->x = x;
    jb->simd = simd;
    jb->dot = mc_pick_dot(t, simd);
    return jb->dot == NULL ? -1 : 0;
}

/* The GEMM's per-weight data `aux` (NULL: none) into a job: weights repacked 8 rows to a
 * group (mc_gemm_repack) where mc_repack_simd has kernels for them, which then read it
 * instead of W, with the same results.  Fast mode only (the balanced mode's outlier rows
 * read W). */
static void mc_job_aux(mc_matmul_job *jb, const void *aux, float tol) {
    if (aux != NULL && tol >= 1e30f && mc_repack_simd(jb->t, jb->simd)) jb->ilv = aux;
}

/* mc_matmul with the weights' GEMM data `aux` (mc_job_aux; NULL: none) */
MC_API int mc_matmul_aux(int t, const uint8_t *W, int64_t row_stride, int M, int K, const float *x,
                         int n, float *y, int simd, int nth, float tol, const void *aux) {
    mc_matmul_job jb;
    if (mc_job_init(&jb, t, K, n, x, simd) != 0) return -1;
    mc_job_aux(&jb, aux, tol);
    jb.M = M;
    jb.W = W;
    jb.row_stride = row_stride;
    jb.y = y;
    const int use = (double)M * K * n < 262144.0 ? 1 : nth; /* ~10 us: not worth a wake-up */
    int exact = !(tol > 0.0f) && !mc_is_float(t); /* F32/F16/BF16: float paths already */
    int nnoisy = 0; /* balanced: rows whose quantization would add more than tol */
    if (mc_matmul_prep(&jb, nth, tol, &exact, &nnoisy) != 0) return -2;
    const int ntiles = mc_matmul_tiles(&jb, use, exact);
    if (exact) {
        jb.dot = mc_pick_dot_f32(simd);
        jb.dot4 = mc_pick_dot4(MC_F32, simd);
        jb.fdot = mc_pick_fdot(t, simd);
        mc_parallel(use, ntiles, mc_matmul_exact_chunk, &jb);
        return jb.failed ? -2 : 0;
    }
    mc_parallel(use, ntiles, mc_matmul_tile, &jb);
    if (jb.failed) return -2;
    if (nnoisy > 0) return mc_matmul_redo_exact(&jb, nth, tol);
    return 0;
}

MC_API int mc_matmul(int t, const uint8_t *W, int64_t row_stride, int M, int K, const float *x,
                     int n, float *y, int simd, int nth, float tol) {
    return mc_matmul_aux(t, W, row_stride, M, K, x, n, y, simd, nth, tol, NULL);
}

typedef struct {
    mc_matmul_job *jobs; /* one per weight, sharing the prepared activations */
    const int *offs;     /* (nw + 1,) first tile of each weight */
    int nw;
} mc_matmul_multi_job;

static void mc_matmul_multi_tile(void *ctx, int c) {
    const mc_matmul_multi_job *mj = (const mc_matmul_multi_job *)ctx;
    int s = 0;
    while (s + 1 < mj->nw && mj->offs[s + 1] <= c) s++;
    mc_matmul_tile(&mj->jobs[s], c - mj->offs[s]);
}

#define MC_MULTI_MAX 16

/* ys[s] (n, Ms[s]) = x (n, K) @ Ws[s]^T for nw weights of one type t: the products
 * of one activation that several weights share (attention's Q, K and V; the MLP's gate
 * and up).  Fast mode: x is quantized and packed once and every weight's tiles go to
 * the pool as one job; each result is bit-identical to mc_matmul's.  F32 / F16 / BF16
 * weights (float x, any mode) too.  The exact and balanced modes of the quantized types run
 * mc_matmul per weight.  Returns as mc_matmul. */
MC_API int mc_matmul_multi(int t, int nw, const uint8_t *const *Ws, const int64_t *strides,
                           const int *Ms, int K, const float *x, int n, float *const *ys,
                           int simd, int nth, float tol, const void *const *auxs) {
    if ((!(tol >= 1e30f) && !mc_is_float(t)) || nw < 2 || nw > MC_MULTI_MAX) {
        for (int s = 0; s < nw; s++) {
            const int rc = mc_matmul_aux(t, Ws[s], strides[s], Ms[s], K, x, n, ys[s], simd, nth,
                                         tol, auxs != NULL ? auxs[s] : NULL);
            if (rc != 0) return rc;
        }
        return 0;
    }
    mc_matmul_job jb;
    if (mc_job_init(&jb, t, K, n, x, simd) != 0) return -1;
    int all = auxs != NULL; /* the GEMM data: for every weight or none (one x packing) */
    for (int s = 0; all && s < nw; s++) all = auxs[s] != NULL;
    mc_job_aux(&jb, all ? auxs[0] : NULL, tol);
    int exact = 0, nnoisy = 0;
    if (mc_matmul_prep(&jb, nth, tol, &exact, &nnoisy) != 0) return -2;
    double work = 0.0;
    for (int s = 0; s < nw; s++) work += (double)Ms[s] * K * n;
    const int use = work < 262144.0 ? 1 : nth;
    mc_matmul_job jobs[MC_MULTI_MAX];
    int offs[MC_MULTI_MAX + 1];
    offs[0] = 0;
    for (int s = 0; s < nw; s++) {
        jobs[s] = jb;
        jobs[s].W = Ws[s];
        jobs[s].row_stride = strides[s];
        jobs[s].M = Ms[s];
        jobs[s].y = ys[s];
        if (all) mc_job_aux(&jobs[s], auxs[s], tol);
        offs[s + 1] = offs[s] + mc_matmul_tiles(&jobs[s], use, 0);
    }
    mc_matmul_multi_job mj = {jobs, offs, nw};
    mc_parallel(use, offs[nw], mc_matmul_multi_tile, &mj);
    for (int s = 0; s < nw; s++)
        if (jobs[s].failed) return -2;
    return 0;
}

/* out (nids, K) = dequantized rows ids of W, or (aux not NULL) of the same weights
 * repacked (mc_gemm_repack: each row put back in its bytes first, so the values are the
 * same).  Returns 0, or -2 when out of memory. */
MC_API int mc_get_rows(int t, const uint8_t *W, int64_t row_stride, int K, const int64_t *ids,
                       int nids, float *out, int simd, const void *aux) {
    uint8_t *row = NULL;
    if (aux != NULL && (row = (uint8_t *)malloc((size_t)(K / 32) * 34)) == NULL) return -2;
    for (int i = 0; i < nids; i++) {
        const uint8_t *src = W + (size_t)ids[i] * row_stride;
        if (row != NULL) {
            mc_repack_row(t, aux, K, (int)ids[i], row);
            src = row;
        }
        mc_dequant_row_simd(t, src, K, out + (size_t)i * K, simd);
    }
    free(row);
    return 0;
}

#endif /* MC_QUANT_H */
