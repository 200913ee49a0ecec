/* Float32 kernels: norms, RoPE, softmax, activations, attention over a KV cache.
 *
 * Reductions accumulate in double where the row is summed once (norms,
 * softmax), so results agree with numpy's pairwise sums to ~1e-7 relative.
 */
#ifndef MC_OPS_H
#define MC_OPS_H

#include "mc_common.h"
#include "mc_pool.h"

/* rows [i0, i1) of y (n, d) = x / sqrt(mean(x^2) + eps) * w */
static void mc_rms_norm_rows(const float *x, const float *w, float *y, int i0, int i1, int d, float eps) {
    for (int i = i0; i < i1; i++) {
        const float *xr = x + (size_t)i * d;
        float *yr = y + (size_t)i * d;
        double acc[8] = {0}; /* 8 running sums: one chain of d dependent adds took ~5 us a
                              * call for 8 rows of 576 */
        int j = 0;
        for (; j + 8 <= d; j += 8)
            for (int u = 0; u < 8; u++) acc[u] += (double)xr[j + u] * xr[j + u];
        double ss = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
        for (; j < d; j++) ss += (double)xr[j] * xr[j];
        const float s = (float)(1.0 / sqrt(ss / d + (double)eps));
        for (int j = 0; j < d; j++) yr[j] = xr[j] * s * w[j];
    }
}

/* Row-wise and elementwise ops over many rows (a prefill's) split across threads: each
 * row's or element's result is the same whichever thread computes it.  Chunks of
 * MC_EW_ROWS rows / MC_EW_CHUNK elements. */
#define MC_EW_ROWS 16
#define MC_EW_CHUNK 32768

typedef struct {
    const float *a, *b, *w;
    float *out;
    int64_t len;
    int d, simd, op;
    float eps;
} mc_ew_job;

enum { MC_EW_RMS, MC_EW_SILU_MUL, MC_EW_GELU, MC_EW_GELU_ERF };

static void mc_ew_run(const mc_ew_job *jb, int64_t i0, int64_t i1);

/* rows (rms) or elements a chunk */
static inline int64_t mc_ew_per(const mc_ew_job *jb) { return jb->op == MC_EW_RMS ? MC_EW_ROWS : MC_EW_CHUNK; }

static void mc_ew_chunk(void *ctx, int c) {
    const mc_ew_job *jb = (const mc_ew_job *)ctx;
    const int64_t per = mc_ew_per(jb), i0 = (int64_t)c * per;
    mc_ew_run(jb, i0, i0 + per < jb->len ? i0 + per : jb->len);
}

/* jb's op over rows / elements [0, len), on nth threads where there are two chunks and
 * two chunks' worth of elements (a decode step's few rows stay on the caller's thread) */
static void mc_ew(const mc_ew_job *jb, int nth) {
    const int64_t per = mc_ew_per(jb), chunks = (jb->len + per - 1) / per;
    const int64_t elems = jb->op == MC_EW_RMS ? jb->len * jb->d : jb->len;
    if (nth > 1 && chunks > 1 && elems >= 2 * MC_EW_CHUNK && chunks <= (1 << 30))
        mc_parallel(nth, (int)chunks, mc_ew_chunk, (void *)jb);
    else
        mc_ew_run(jb, 0, jb->len);
}

/* y (n, d) = x / sqrt(mean(x^2) + eps) * w */
MC_API void mc_rms_norm(const float *x, const float *w, float *y, int n, int d, float eps, int nth) {
    const mc_ew_job jb = {x, NULL, w, y, n, d, 0, MC_EW_RMS, eps};
    mc_ew(&jb, nth);
}

/* y (n, d) = (x - mean) / sqrt(var + eps) * w + b */
MC_API void mc_layer_norm(const float *x, const float *w, const float *b, float *y, int n, int d,
                          float eps, int nth) {
    (void)nth; /* a norm is memory-bound and cheap next to the matmuls around it */
    for (int i = 0; i < n; i++) {
        const float *xr = x + (size_t)i * d;
        float *yr = y + (size_t)i * d;
        double sum = 0.0;
        for (int j = 0; j < d; j++) sum += xr[j];
        const double mean = sum / d;
        double var = 0.0;
        for (int j = 0; j < d; j++) {
            const double c = xr[j] - mean;
            var += c * c;
        }
        const float rstd = (float)(1.0 / sqrt(var / d + (double)eps));
        const float m = (float)mean;
        for (int j = 0; j < d; j++) yr[j] = (xr[j] - m) * rstd * w[j] + b[j];
    }
}

/* RoPE's angles: cs, sn (n, half) = cos, sin of pos[t] * inv_freq[i] (made once a step:
 * every layer's Q and K rotate by the same ones). */
MC_API void mc_rope_table(const int64_t *pos, const float *inv_freq, int n, int half, float *cs,
                          float *sn) {
    for (int t = 0; t < n; t++) {
        const float p = (float)pos[t];
        for (int i = 0; i < half; i++) {
            const float th = p * inv_freq[i]; /* float32 product, as numpy / HF */
            cs[(size_t)t * half + i] = (float)cos((double)th);
            sn[(size_t)t * half + i] = (float)sin((double)th);
        }
    }
}

/* In place: x (n, n_heads, hd); pairs rotated by the angles of mc_rope_table, i < half.
 * neox: pairs (i, i + half); else adjacent pairs (2i, 2i + 1). */
MC_API void mc_rope_apply(float *x, const float *cst, const float *snt, int n, int n_heads, int hd,
                          int half, int neox) {
    for (int t = 0; t < n; t++) {
        const float *cs = cst + (size_t)t * half, *sn = snt + (size_t)t * half;
        for (int h = 0; h < n_heads; h++) {
            float *v = x + ((size_t)t * n_heads + h) * hd;
            if (neox) {
                for (int i = 0; i < half; i++) {
                    const float a = v[i], b = v[i + half];
                    v[i] = a * cs[i] - b * sn[i];
                    v[i + half] = a * sn[i] + b * cs[i];
                }
            } else {
                for (int i = 0; i < half; i++) {
                    const float a = v[2 * i], b = v[2 * i + 1];
                    v[2 * i] = a * cs[i] - b * sn[i];
                    v[2 * i + 1] = a * sn[i] + b * cs[i];
                }
            }
        }
    }
}

/* The exact GELU x * Phi(x) = x / 2 * (1 + erf(x / sqrt 2)) that BERT uses, erf by
 * Numerical Recipes' erfc (a Chebyshev fit, |error| < 1.2e-7) in float32: the numpy twin's
 * formula (modelc.runtime.backends.numpy_ref.erf, which evaluates it in float64) */
static const float mc_erf_c[10] = {-1.26551223f, 1.00002368f, 0.37409196f, 0.09678418f, -0.18628806f,
                                   0.27886807f,  -1.13520398f, 1.48851587f, -0.82215223f, 0.17087277f};

static void mc_gelu_erf_tail(const float *x, float *out, int64_t len) {
    const float *c = mc_erf_c;
    for (int64_t i = 0; i < len; i++) {
        const float u = x[i] * 0.70710678118654752f, z = fabsf(u);
        const float t = 1.0f / (1.0f + 0.5f * z);
        float p = c[9];
        for (int k = 8; k >= 0; k--) p = p * t + c[k];
        const float r = 1.0f - t * expf(p - z * z);
        out[i] = 0.5f * x[i] * (1.0f + (u < 0.0f ? -r : r));
    }
}

#if defined(MC_X86)
/* exp(x) for 8 floats: Cephes' expf (range reduction by ln 2, degree-5
 * polynomial), about 1 ulp; inputs below -88.38 give ~0, above 88.38 clamp. */
MC_AVX2 static inline __m256 mc_exp256(__m256 x) {
    x = _mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f));
    x = _mm256_max_ps(x, _mm256_set1_ps(-88.3762626647949f));
    __m256 fx = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f));
    fx = _mm256_floor_ps(fx);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    const __m256 z = _mm256_mul_ps(x, x);
    __m256 y = _mm256_set1_ps(1.9875691500E-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
    y = _mm256_fmadd_ps(y, z, x);
    y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(0x7f));
    e = _mm256_slli_epi32(e, 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

/* tanh(x) for 8 floats, as Cephes' tanhf: for |x| < 0.625 the odd polynomial
 * x + x^3 P(x^2) (1 - 2 / (exp(2|x|) + 1) would cancel there, losing the relative
 * accuracy of small results), else 1 - 2 / (exp(2|x|) + 1); both of |x|, then x's sign
 * put on.  Within 1 ulp of the exact tanh over the test's range (glibc's tanhf: 2).
 * |x| >= 44.2: exp(2|x|) hits mc_exp256's clamp (inf), 2 / inf = 0, so exactly +-1.
 * A NaN stays NaN (the polynomial's lane is taken: NaN >= 0.625 is false). */
MC_AVX2 static inline __m256 mc_tanh256(__m256 x) {
    const __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
    const __m256 z = _mm256_andnot_ps(sign, x); /* |x| */
    const __m256 e = mc_exp256(_mm256_add_ps(z, z));
    const __m256 big = _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, one)));
    const __m256 s = _mm256_mul_ps(z, z);
    __m256 p = _mm256_set1_ps(-5.70498872745E-3f);
    p = _mm256_fmadd_ps(p, s, _mm256_set1_ps(2.06390887954E-2f));
    p = _mm256_fmadd_ps(p, s, _mm256_set1_ps(-5.37397155531E-2f));
    p = _mm256_fmadd_ps(p, s, _mm256_set1_ps(1.33314422036E-1f));
    p = _mm256_fmadd_ps(p, s, _mm256_set1_ps(-3.33332819422E-1f));
    const __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(p, s), z, z);
    const __m256 t = _mm256_blendv_ps(small, big, _mm256_cmp_ps(z, _mm256_set1_ps(0.625f), _CMP_GE_OQ));
    return _mm256_or_ps(t, _mm256_and_ps(x, sign)); /* tanh(|x|) >= 0 takes x's sign (-0 too) */
}

/* y = tanh(x) over len floats (y may be x) */
MC_AVX2 static void mc_tanh_avx2(const float *x, float *y, int64_t len) {
    int64_t i = 0;
    for (; i + 8 <= len; i += 8) _mm256_storeu_ps(y + i, mc_tanh256(_mm256_loadu_ps(x + i)));
    if (i < len) { /* the tail through one padded vector, so every element rounds alike */
        float t[8] = {0};
        for (int64_t j = i; j < len; j++) t[j - i] = x[j];
        _mm256_storeu_ps(t, mc_tanh256(_mm256_loadu_ps(t)));
        for (int64_t j = i; j < len; j++) y[j] = t[j - i];
    }
}

MC_AVX2 static void mc_softmax_avx2(float *x, int n, int d) {
    for (int i = 0; i < n; i++) {
        float *r = x + (size_t)i * d;
        float m = -INFINITY;
        for (int j = 0; j < d; j++) m = r[j] > m ? r[j] : m;
        const __m256 vm = _mm256_set1_ps(m);
        double sum = 0.0;
        int j = 0;
        for (; j + 8 <= d; j += 8) {
            const __m256 e = mc_exp256(_mm256_sub_ps(_mm256_loadu_ps(r + j), vm));
            _mm256_storeu_ps(r + j, e);
            __m128 h = _mm_add_ps(_mm256_castps256_ps128(e), _mm256_extractf128_ps(e, 1));
            h = _mm_add_ps(h, _mm_movehl_ps(h, h));
            h = _mm_add_ss(h, _mm_movehdup_ps(h));
            sum += _mm_cvtss_f32(h);
        }
        for (; j < d; j++) {
            r[j] = expf(r[j] - m);
            sum += r[j];
        }
        const float inv = (float)(1.0 / sum);
        for (j = 0; j < d; j++) r[j] *= inv;
    }
}

MC_AVX2 static void mc_silu_mul_avx2(const float *g, const float *u, float *out, int64_t len) {
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= len; i += 8) {
        const __m256 gv = _mm256_loadu_ps(g + i);
        const __m256 e = mc_exp256(_mm256_sub_ps(zero, gv));
        const __m256 sg = _mm256_div_ps(gv, _mm256_add_ps(one, e));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(sg, _mm256_loadu_ps(u + i)));
    }
    for (; i < len; i++) out[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* gelu_tanh with tanh(z) = 1 - 2 / (exp(2z) + 1) */
MC_AVX2 static void mc_gelu_avx2(const float *x, float *out, int64_t len) {
    const __m256 c = _mm256_set1_ps(0.7978845608028654f), k = _mm256_set1_ps(0.044715f);
    const __m256 one = _mm256_set1_ps(1.0f), two = _mm256_set1_ps(2.0f), half = _mm256_set1_ps(0.5f);
    int64_t i = 0;
    for (; i + 8 <= len; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        const __m256 v3 = _mm256_mul_ps(_mm256_mul_ps(v, v), v);
        const __m256 z = _mm256_mul_ps(c, _mm256_fmadd_ps(k, v3, v));
        const __m256 e = mc_exp256(_mm256_mul_ps(two, z));
        const __m256 th = _mm256_sub_ps(one, _mm256_div_ps(two, _mm256_add_ps(e, one)));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(half, v), _mm256_add_ps(one, th)));
    }
    const float cs = 0.7978845608028654f;
    for (; i < len; i++) {
        const float v = x[i];
        out[i] = 0.5f * v * (1.0f + tanhf(cs * (v + 0.044715f * v * v * v)));
    }
}

/* gelu_erf on 8 lanes: mc_gelu_erf_tail's formula, its exp by mc_exp256 */
MC_AVX2 static void mc_gelu_erf_avx2(const float *x, float *out, int64_t len) {
    const float *c = mc_erf_c;
    const __m256 one = _mm256_set1_ps(1.0f), half = _mm256_set1_ps(0.5f);
    const __m256 sign = _mm256_set1_ps(-0.0f), rs2 = _mm256_set1_ps(0.70710678118654752f);
    int64_t i = 0;
    for (; i + 8 <= len; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i), u = _mm256_mul_ps(v, rs2);
        const __m256 z = _mm256_andnot_ps(sign, u);
        const __m256 t = _mm256_div_ps(one, _mm256_add_ps(one, _mm256_mul_ps(half, z)));
        __m256 p = _mm256_set1_ps(c[9]);
        for (int k = 8; k >= 0; k--) p = _mm256_add_ps(_mm256_mul_ps(p, t), _mm256_set1_ps(c[k]));
        const __m256 e = mc_exp256(_mm256_sub_ps(p, _mm256_mul_ps(z, z)));
        const __m256 r = _mm256_or_ps(_mm256_sub_ps(one, _mm256_mul_ps(t, e)), _mm256_and_ps(sign, u));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(half, v), _mm256_add_ps(one, r)));
    }
    mc_gelu_erf_tail(x + i, out + i, len - i);
}
#endif

/* In place over rows of x (n, d) */
MC_API void mc_softmax(float *x, int n, int d, int simd) {
#if defined(MC_X86)
    if (MC_IS_AVX2(simd)) {
        mc_softmax_avx2(x, n, d);
        return;
    }
#endif
    (void)simd;
    for (int i = 0; i < n; i++) {
        float *r = x + (size_t)i * d;
        float m = -INFINITY;
        for (int j = 0; j < d; j++) m = r[j] > m ? r[j] : m;
        double sum = 0.0;
        for (int j = 0; j < d; j++) {
            r[j] = expf(r[j] - m);
            sum += r[j];
        }
        const float inv = (float)(1.0 / sum);
        for (int j = 0; j < d; j++) r[j] *= inv;
    }
}

/* out = silu(g) * u over `len` elements */
static void mc_silu_mul_seq(const float *g, const float *u, float *out, int64_t len, int simd) {
#if defined(MC_X86)
    if (MC_IS_AVX2(simd)) {
        mc_silu_mul_avx2(g, u, out, len);
        return;
    }
#endif
    (void)simd;
    for (int64_t i = 0; i < len; i++) out[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* out = gelu_tanh(x) over `len` elements */
static void mc_gelu_seq(const float *x, float *out, int64_t len, int simd) {
#if defined(MC_X86)
    if (MC_IS_AVX2(simd)) {
        mc_gelu_avx2(x, out, len);
        return;
    }
#endif
    (void)simd;
    const float c = 0.7978845608028654f; /* sqrt(2/pi) */
    for (int64_t i = 0; i < len; i++) {
        const float v = x[i];
        out[i] = 0.5f * v * (1.0f + tanhf(c * (v + 0.044715f * v * v * v)));
    }
}

/* out = gelu_erf(x) over `len` elements */
static void mc_gelu_erf_seq(const float *x, float *out, int64_t len, int simd) {
#if defined(MC_X86)
    if (MC_IS_AVX2(simd)) {
        mc_gelu_erf_avx2(x, out, len);
        return;
    }
#endif
    (void)simd;
    mc_gelu_erf_tail(x, out, len);
}

static void mc_ew_run(const mc_ew_job *jb, int64_t i0, int64_t i1) {
    switch (jb->op) {
    case MC_EW_RMS: mc_rms_norm_rows(jb->a, jb->w, jb->out, (int)i0, (int)i1, jb->d, jb->eps); break;
    case MC_EW_SILU_MUL: mc_silu_mul_seq(jb->a + i0, jb->b + i0, jb->out + i0, i1 - i0, jb->simd); break;
    case MC_EW_GELU_ERF: mc_gelu_erf_seq(jb->a + i0, jb->out + i0, i1 - i0, jb->simd); break;
    default: mc_gelu_seq(jb->a + i0, jb->out + i0, i1 - i0, jb->simd); break;
    }
}

MC_API void mc_silu_mul(const float *g, const float *u, float *out, int64_t len, int simd, int nth) {
    const mc_ew_job jb = {g, u, NULL, out, len, 0, simd, MC_EW_SILU_MUL, 0.0f};
    mc_ew(&jb, nth);
}

MC_API void mc_gelu(const float *x, float *out, int64_t len, int simd, int nth) {
    const mc_ew_job jb = {x, NULL, NULL, out, len, 0, simd, MC_EW_GELU, 0.0f};
    mc_ew(&jb, nth);
}

MC_API void mc_gelu_erf(const float *x, float *out, int64_t len, int simd, int nth) {
    const mc_ew_job jb = {x, NULL, NULL, out, len, 0, simd, MC_EW_GELU_ERF, 0.0f};
    mc_ew(&jb, nth);
}

/* out = tanh(x) over `len` elements (out may be x); the soft-cap's tanh, exposed for
 * its test */
MC_API void mc_tanh(const float *x, float *out, int64_t len, int simd) {
#if defined(MC_X86)
    if (MC_IS_AVX2(simd)) {
        mc_tanh_avx2(x, out, len);
        return;
    }
#endif
    (void)simd;
    for (int64_t i = 0; i < len; i++) out[i] = tanhf(x[i]);
}

/* ---- attention over a KV cache -------------------------------------------------
 *
 * One work item is one query row and a group of g query heads that share a KV head
 * (grouped-query attention), so each cache row of that KV head is loaded (f16:
 * converted) once for all g heads; the portable f32 kernel takes one head per item,
 * the AVX2 kernel (mc_attn_avx2.h) a tile of mq rows times g heads.
 * Every head keeps its own online softmax in a fixed order, and f16 -> f32 conversion
 * is exact, so an f16 cache gives bit for bit what its values widened to f32 give,
 * whatever g is, on the same code path (AVX2 or portable). */

#define MC_ATT_CHUNK 64
#define MC_ATT_GMAX 16  /* query heads per work item at most */
#define MC_ATT_ACC 4096 /* floats of running sums per work item: g * hd <= MC_ATT_ACC */
/* query vectors an AVX2 tile aims at (mq = MC_ATT_MT / g rows): each chunk's K transpose
 * and V conversion serve them all.  A 1B Llama's causal prefill (32 heads over 8, hd 64),
 * 2 threads: 24 -> 64 took VNNI's tiles from 74-79 to 89-96 GMAC/s, AVX2's from 48-52 to
 * 56-58 (`bench/bench_attention.py --prefill 512,2048`). */
#define MC_ATT_MT 64
#define MC_ATT_MMAX 64  /* query vectors per AVX2 tile at most (>= MC_ATT_GMAX) */
#define MC_ATT_KT 16384 /* floats of an AVX2 tile's K chunk (transposed) or V chunk */

/* keys per chunk of the AVX2 kernel: 64, fewer where a KV head's chunk would not fit */
static inline int mc_att_nc(int hd) { return mc_imin(MC_ATT_CHUNK, MC_ATT_KT / hd); }

typedef struct {
    const float *q;     /* (n_q, n_head, hd) */
    const void *k, *v;  /* (n_kv, n_head_kv, hd), f32 or f16 */
    float *out;         /* (n_q, n_head, hd) */
    int n_q, n_head, n_kv, n_head_kv, hd, q_pos0;
    float scale;
    int window;    /* > 0: query at position p sees keys p - window + 1 .. p only */
    float softcap; /* > 0: each score s becomes softcap * tanh(s / softcap) */
    const float *sinks; /* (n_head,) or NULL: a logit per head in the denominator only */
    int simd;
    int kv_f16;
    int gs;    /* query heads per work item */
    int n_sub; /* items per (query rows, KV head): ceil(group / gs) */
    int mq;    /* query rows per work item (AVX2 kernel only; else 1) */
    int kvs;   /* KV heads per work item (AVX2 kernel, mq == 1 only; > 1: gs = group) */
} mc_att_job;

/* the heads of work item idx: query rows *i .. *i + mq - 1 (the last tile's rows first:
 * they see the most keys, so the threads finish together), KV heads *kh .. *kh + kvs - 1,
 * heads h0 .. h0 + g - 1 */
static inline int mc_att_item(const mc_att_job *jb, int idx, int *i, int *kh, int *h0) {
    const int group = jb->n_head / jb->n_head_kv;
    const int per_row = jb->n_head_kv / jb->kvs * jb->n_sub;
    const int r = idx % per_row, sub = r % jb->n_sub, n_rt = (jb->n_q + jb->mq - 1) / jb->mq;
    *i = (n_rt - 1 - idx / per_row) * jb->mq;
    *kh = r / jb->n_sub * jb->kvs;
    *h0 = *kh * group + sub * jb->gs;
    return jb->kvs > 1 ? jb->kvs * group : mc_imin(jb->gs, group - sub * jb->gs);
}

/* first key row that query row i sees (its window's start; 0 without a window) */
static inline int mc_att_lo(const mc_att_job *jb, int i) {
    const int p = jb->q_pos0 + i;
    return jb->window > 0 && p - jb->window + 1 > 0 ? p - jb->window + 1 : 0;
}

/* What head h's running sums acc are multiplied by at the end, the online softmax's max m
 * and sum l: 1 / l, or with a sink logit sk (gpt-oss) 1 / (l + exp(sk - m)), the sink a
 * key without a value (taken as the max where it is larger, so nothing overflows); 0 when
 * no key was seen (l == 0, m == -inf) and no sink. */
static inline float mc_att_inv(const mc_att_job *jb, int h, float m, float l) {
    if (jb->sinks == NULL) return l > 0.0f ? 1.0f / l : 0.0f;
    const float sk = jb->sinks[h];
    if (sk > m) {
        const float c = expf(m - sk); /* 0 when m is -inf */
        return c / (l * c + 1.0f);
    }
    const float d = l + expf(sk - m); /* 0: no key and a sink of -inf */
    return d > 0.0f ? 1.0f / d : 0.0f;
}

/* gemma2's soft-capped score cap * tanh(s / cap) (cap > 0); every kernel caps this way */
static inline float mc_att_cap(float s, float cap) { return cap * tanhf(s / cap); }

static inline void mc_att_softcap(float *s, int n, float cap) {
    for (int c = 0; c < n; c++) s[c] = mc_att_cap(s[c], cap);
}

/* f16 cache row `row` (of hd elements) converted into buf */
static inline const float *mc_att_row(const void *base, size_t row, int hd, float *buf) {
    const uint16_t *h = (const uint16_t *)base + row * (size_t)hd;
    int j = 0;
#if defined(MC_NEON)
    for (; j + 4 <= hd; j += 4)
        vst1q_f32(buf + j, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h + j))));
#endif
    for (; j < hd; j++) buf[j] = mc_fp16_to_fp32(h[j]);
    return buf;
}

#if defined(MC_X86)
/* mc_att_row for hd % 8 == 0 with F16C */
MC_AVX2 static inline const float *mc_att_row_avx2(const void *base, size_t row, int hd,
                                                   float *buf) {
    const uint16_t *h = (const uint16_t *)base + row * (size_t)hd;
    for (int j = 0; j < hd; j += 8)
        _mm256_storeu_ps(buf + j, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + j))));
    return buf;
}

/* Rows t0 .. t0 + rn - 1 of slice `pk` (of `w` elements; `pn` slices a row) of a K or V
 * cache as floats: an f16 cache's converted into buf (rn, w), an f32 cache's read in
 * place.  Returns row 0; *stride: floats between rows. */
MC_AVX2 static inline const float *mc_att_block(const void *base, int f16, int t0, int rn, int pn,
                                                int pk, int w, float *buf, size_t *stride) {
    if (f16) {
        for (int c = 0; c < rn; c++)
            mc_att_row_avx2(base, (size_t)(t0 + c) * pn + pk, w, buf + (size_t)c * w);
        *stride = (size_t)w;
        return buf;
    }
    *stride = (size_t)pn * w;
    return (const float *)base + (size_t)t0 * pn * w + (size_t)pk * w;
}

/* Prefetch rows t0 .. t0 + rn - 1 of KV head kh (hd elements of esize bytes each) of a
 * cache: a decode step's K/V come from memory (the weights streamed since pushed them
 * out of cache), and one head's slices of the rows are too sparse for the hardware
 * prefetcher to run ahead. */
static inline void mc_att_prefetch(const void *base, int t0, int rn, int n_head_kv, int kh,
                                   int hd, int esize) {
    const size_t row = (size_t)n_head_kv * hd * esize, len = (size_t)hd * esize;
    const char *p = (const char *)base + (size_t)t0 * row + (size_t)kh * len;
    for (int c = 0; c < rn; c++, p += row)
        for (size_t b = 0; b < len; b += 64) __builtin_prefetch(p + b, 0, 3);
}

#include "mc_attn_avx2.h"
#endif

/* one (query, head) pair: online softmax over its visible keys in chunks */
static void mc_attention_one(void *ctx, int idx) {
    const mc_att_job *jb = (const mc_att_job *)ctx;
    const int hd = jb->hd, n_head_kv = jb->n_head_kv;
    const int i = idx / jb->n_head, h = idx % jb->n_head, kh = h / (jb->n_head / n_head_kv);
    const float *qi = jb->q + (size_t)idx * hd;
    float acc[512]; /* (hd,) running sum of p * v */
    float s[MC_ATT_CHUNK];
    float m = -INFINITY, l = 0.0f;
    const int T = mc_imin(jb->q_pos0 + i + 1, jb->n_kv), cap = jb->softcap > 0.0f;
    for (int j = 0; j < hd; j++) acc[j] = 0.0f;
    for (int t0 = mc_att_lo(jb, i); t0 < T; t0 += MC_ATT_CHUNK) {
        const int cnt = mc_imin(MC_ATT_CHUNK, T - t0);
        float cmax = -INFINITY;
        for (int c = 0; c < cnt; c++) {
            const float *kt = (const float *)jb->k + ((size_t)(t0 + c) * n_head_kv + kh) * hd;
            float d = 0.0f;
#pragma omp simd reduction(+ : d)
            for (int j = 0; j < hd; j++) d += qi[j] * kt[j];
            s[c] = d * jb->scale;
            if (cap) s[c] = mc_att_cap(s[c], jb->softcap);
            cmax = s[c] > cmax ? s[c] : cmax;
        }
        if (cmax > m) {
            const float corr = expf(m - cmax); /* 0 when m is -inf */
            l *= corr;
            for (int j = 0; j < hd; j++) acc[j] *= corr;
            m = cmax;
        }
        for (int c = 0; c < cnt; c++) {
            const float p = expf(s[c] - m);
            const float *vt = (const float *)jb->v + ((size_t)(t0 + c) * n_head_kv + kh) * hd;
            l += p;
#pragma omp simd
            for (int j = 0; j < hd; j++) acc[j] += p * vt[j];
        }
    }
    float *o = jb->out + (size_t)idx * hd;
    const float inv = mc_att_inv(jb, h, m, l);
    for (int j = 0; j < hd; j++) o[j] = acc[j] * inv;
}

/* f16 cache, one work item: mc_attention_one for each of its g heads, in step */
static void mc_attention_f16(void *ctx, int idx) {
    const mc_att_job *jb = (const mc_att_job *)ctx;
    const int hd = jb->hd, n_head_kv = jb->n_head_kv;
    int i, kh, h0;
    const int g = mc_att_item(jb, idx, &i, &kh, &h0);
    const float *qi = jb->q + ((size_t)i * jb->n_head + h0) * hd; /* (g, hd) */
    float acc[MC_ATT_ACC]; /* (g, hd) running sums of p * v */
    float s[MC_ATT_GMAX][MC_ATT_CHUNK], m[MC_ATT_GMAX], l[MC_ATT_GMAX], cmax[MC_ATT_GMAX];
    float kbuf[512], vbuf[512];
    const int T = mc_imin(jb->q_pos0 + i + 1, jb->n_kv), cap = jb->softcap > 0.0f;
    for (int a = 0; a < g; a++) {
        m[a] = -INFINITY;
        l[a] = 0.0f;
    }
    for (int j = 0; j < g * hd; j++) acc[j] = 0.0f;
    for (int t0 = mc_att_lo(jb, i); t0 < T; t0 += MC_ATT_CHUNK) {
        const int cnt = mc_imin(MC_ATT_CHUNK, T - t0);
        for (int a = 0; a < g; a++) cmax[a] = -INFINITY;
        for (int c = 0; c < cnt; c++) {
            const float *kt = mc_att_row(jb->k, (size_t)(t0 + c) * n_head_kv + kh, hd, kbuf);
            for (int a = 0; a < g; a++) {
                const float *qa = qi + (size_t)a * hd;
                float d = 0.0f;
#pragma omp simd reduction(+ : d)
                for (int j = 0; j < hd; j++) d += qa[j] * kt[j];
                s[a][c] = d * jb->scale;
                if (cap) s[a][c] = mc_att_cap(s[a][c], jb->softcap);
                cmax[a] = s[a][c] > cmax[a] ? s[a][c] : cmax[a];
            }
        }
        for (int a = 0; a < g; a++) {
            if (cmax[a] > m[a]) {
                float *acc_a = acc + (size_t)a * hd;
                const float corr = expf(m[a] - cmax[a]); /* 0 when m is -inf */
                l[a] *= corr;
                for (int j = 0; j < hd; j++) acc_a[j] *= corr;
                m[a] = cmax[a];
            }
        }
        for (int c = 0; c < cnt; c++) {
            const float *vt = mc_att_row(jb->v, (size_t)(t0 + c) * n_head_kv + kh, hd, vbuf);
            for (int a = 0; a < g; a++) {
                float *acc_a = acc + (size_t)a * hd;
                const float p = expf(s[a][c] - m[a]);
                l[a] += p;
#pragma omp simd
                for (int j = 0; j < hd; j++) acc_a[j] += p * vt[j];
            }
        }
    }
    for (int a = 0; a < g; a++) {
        float *o = jb->out + ((size_t)i * jb->n_head + h0 + a) * hd;
        const float inv = mc_att_inv(jb, h0 + a, m[a], l[a]);
        for (int j = 0; j < hd; j++) o[j] = acc[a * hd + j] * inv;
    }
}

/* heads per work item: one for the portable f32 kernel; otherwise whole KV-head groups
 * (each K/V row loaded or converted once per query row) when that still gives every
 * thread an item, else one.  Results are the same either way. */
static int mc_att_group_size(int n_head, int n_head_kv, int hd, int64_t rows, int kv_f16,
                             int nth, int simd) {
    if (!kv_f16 && !(MC_IS_AVX2(simd) && hd % 8 == 0)) return 1; /* mc_attention_one */
    const int group = n_head / n_head_kv;
    const int gs = mc_imin(mc_imin(group, MC_ATT_GMAX), MC_ATT_ACC / hd);
    const int n_sub = (group + gs - 1) / gs;
    return rows * n_head_kv * n_sub >= nth ? gs : 1;
}

/* query rows per work item of the AVX2 kernel: about MC_ATT_MT query vectors (each K
 * chunk transposed, each V chunk converted once for them all), no more than the longest
 * sequence's max_q rows, while every thread still gets 4 items; 1 for the portable
 * kernels.  Results are the same either way. */
static int mc_att_rows(int n_head, int n_head_kv, int gs, int hd, int64_t rows, int max_q, int nth,
                       int simd) {
    if (!(MC_IS_AVX2(simd) && hd % 8 == 0)) return 1;
    const int n_sub = (n_head / n_head_kv + gs - 1) / gs;
    int mq = mc_imin(MC_ATT_MT / gs, max_q);
    while (mq > 1 && (mq * gs > MC_ATT_MMAX || mq * gs * hd > MC_ATT_ACC ||
                      (rows + mq - 1) / mq * n_head_kv * n_sub < 4 * nth))
        mq--;
    return mq > 1 ? mq : 1;
}

/* KV heads per work item of the AVX2 kernel when it takes one row (decode): all of a
 * row's (each cache row then read as one contiguous slice, which the hardware prefetcher
 * follows) while every thread still gets 2 items, else 1.  Results are the same. */
static int mc_att_kv_span(int n_head, int n_head_kv, int hd, int64_t rows, int mq, int nth,
                          int simd) {
    const int group = n_head / n_head_kv;
    if (!(MC_IS_AVX2(simd) && hd % 8 == 0) || mq > 1) return 1;
    for (int kvs = n_head_kv; kvs > 1; kvs--)
        if (n_head_kv % kvs == 0 && kvs * group <= MC_ATT_MMAX && kvs * group * hd <= MC_ATT_ACC &&
            kvs * hd * mc_att_nc(hd) <= MC_ATT_KT && rows * (n_head_kv / kvs) >= 2 * nth)
            return kvs;
    return 1;
}

static mc_chunk_fn mc_att_fn(int hd, int kv_f16, int simd) {
#if defined(MC_X86)
    if (MC_IS_AVX2(simd) && hd % 8 == 0) return mc_attention_grp_avx2_fn;
#endif
    (void)hd;
    (void)simd;
    return kv_f16 ? mc_attention_f16 : mc_attention_one;
}

static mc_att_job mc_att_make(const float *q, const void *k, const void *v, float *out, int n_q,
                              int n_head, int n_kv, int n_head_kv, int hd, int q_pos0, float scale,
                              int window, float softcap, const float *sinks, int kv_f16, int gs,
                              int mq, int kvs, int simd) {
    const int group = n_head / n_head_kv;
    const mc_att_job jb = {q,
                           k,
                           v,
                           out,
                           n_q,
                           n_head,
                           n_kv,
                           n_head_kv,
                           hd,
                           q_pos0,
                           scale,
                           window > 0 ? window : 0,
                           softcap > 0.0f ? softcap : 0.0f,
                           sinks,
                           simd,
                           kv_f16,
                           kvs > 1 ? group : gs,
                           kvs > 1 ? 1 : (group + gs - 1) / gs,
                           mq,
                           kvs};
    return jb;
}

/* work items of one sequence of n_q query rows */
static inline int mc_att_items(const mc_att_job *jb, int n_q) {
    return (n_q + jb->mq - 1) / jb->mq * (jb->n_head_kv / jb->kvs) * jb->n_sub;
}

/* keys one query row sees at most: the window, or the whole prefix */
static inline int64_t mc_att_span(int q_pos0, int n_q, int window) {
    return window > 0 && window < q_pos0 + n_q ? window : q_pos0 + n_q;
}

/* Causal grouped-query attention of one sequence over its cache.
 * q (n_q, n_head, hd); k, v (n_kv, n_head_kv, hd), f32 or (kv_f16) IEEE f16;
 * out (n_q, n_head, hd).  Query i (at position p = q_pos0 + i) sees cache rows
 * 0 .. p (clipped to n_kv), or with window > 0 only p - window + 1 .. p; with
 * softcap > 0 each score s = q.k * scale becomes softcap * tanh(s / softcap) before the
 * softmax (gemma2); sinks (n_head,), where not NULL, is a logit per head that joins each
 * softmax's denominator only (gpt-oss: mc_att_inv).  The only scratch is on the stack (hd <= 512); work items run in
 * parallel. */
MC_API void mc_attention(const float *q, const void *k, const void *v, float *out, int n_q,
                         int n_head, int n_kv, int n_head_kv, int hd, int q_pos0, float scale,
                         int window, float softcap, const float *sinks, int kv_f16, int nth,
                         int simd) {
    const int64_t work = (int64_t)n_q * n_head * mc_att_span(q_pos0, n_q, window) * hd;
    const int nt = work < 65536 ? 1 : nth;
    const int gs = mc_att_group_size(n_head, n_head_kv, hd, n_q, kv_f16, nt, simd);
    const int mq = mc_att_rows(n_head, n_head_kv, gs, hd, n_q, n_q, nt, simd);
    const int kvs = mc_att_kv_span(n_head, n_head_kv, hd, n_q, mq, nt, simd);
    const mc_att_job jb = mc_att_make(q, k, v, out, n_q, n_head, n_kv, n_head_kv, hd, q_pos0,
                                      scale, window, softcap, sinks, kv_f16, gs, mq, kvs, simd);
    mc_parallel(nt, mc_att_items(&jb, n_q), mc_att_fn(hd, kv_f16, simd), (void *)&jb);
}

typedef struct {
    const mc_att_job *jobs; /* (n_seq,) one per sequence */
    const int *offs;        /* (n_seq + 1,) first work item of each sequence */
    int n_seq;
    mc_chunk_fn fn;
} mc_att_batch;

/* work item idx of the whole batch -> its sequence's work item */
static void mc_attention_batch_one(void *ctx, int idx) {
    const mc_att_batch *b = (const mc_att_batch *)ctx;
    int lo = 0, hi = b->n_seq - 1; /* last s with offs[s] <= idx */
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (b->offs[mid] <= idx)
            lo = mid;
        else
            hi = mid - 1;
    }
    b->fn((void *)&b->jobs[lo], idx - b->offs[lo]);
}

/* mc_attention for n_seq sequences at once, each over its own cache: every work
 * item of every sequence is one item of a single pool job, so a decode step of
 * many short sequences wakes the pool once, not once per sequence.  Per head the
 * math is mc_attention's, so results are identical.  Returns 0, or -2 when the
 * job table cannot be allocated. */
MC_API int mc_attention_batch(int n_seq, const float *const *qs, const void *const *ks,
                              const void *const *vs, float *const *outs, const int *n_qs,
                              const int *n_kvs, const int *q_pos0s, int n_head, int n_head_kv,
                              int hd, float scale, int window, float softcap, const float *sinks,
                              int kv_f16, int nth, int simd) {
    if (n_seq <= 0) return 0;
    mc_att_job *jobs = (mc_att_job *)malloc(sizeof(mc_att_job) * (size_t)n_seq);
    int *offs = (int *)malloc(sizeof(int) * ((size_t)n_seq + 1));
    if (jobs == NULL || offs == NULL) {
        free(jobs);
        free(offs);
        return -2;
    }
    int64_t work = 0, rows = 0;
    int max_q = 1; /* the longest sequence's rows: tiles of more do not occur */
    for (int s = 0; s < n_seq; s++) {
        work += (int64_t)n_qs[s] * n_head * mc_att_span(q_pos0s[s], n_qs[s], window) * hd;
        rows += n_qs[s];
        max_q = n_qs[s] > max_q ? n_qs[s] : max_q;
    }
    const int nt = work < 65536 ? 1 : nth;
    const int gs = mc_att_group_size(n_head, n_head_kv, hd, rows, kv_f16, nt, simd);
    const int mq = mc_att_rows(n_head, n_head_kv, gs, hd, rows, max_q, nt, simd);
    const int kvs = mc_att_kv_span(n_head, n_head_kv, hd, rows, mq, nt, simd);
    offs[0] = 0;
    for (int s = 0; s < n_seq; s++) {
        jobs[s] = mc_att_make(qs[s], ks[s], vs[s], outs[s], n_qs[s], n_head, n_kvs[s], n_head_kv,
                              hd, q_pos0s[s], scale, window, softcap, sinks, kv_f16, gs, mq, kvs,
                              simd);
        offs[s + 1] = offs[s] + mc_att_items(&jobs[s], n_qs[s]);
    }
    mc_att_batch b = {jobs, offs, n_seq, mc_att_fn(hd, kv_f16, simd)};
    if (offs[n_seq] > 0) mc_parallel(nt, offs[n_seq], mc_attention_batch_one, &b);
    free(jobs);
    free(offs);
    return 0;
}

/* y (n,) = x as IEEE half, rounding to nearest even */
#if defined(MC_X86)
MC_AVX2 static void mc_f32_to_f16_avx2(const float *x, uint16_t *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < n; i++) y[i] = mc_fp32_to_fp16(x[i]);
}
#endif

static void mc_f32_to_f16(const float *x, uint16_t *y, int64_t n, int simd) {
#if defined(MC_X86)
    if (MC_IS_AVX2(simd)) {
        mc_f32_to_f16_avx2(x, y, n);
        return;
    }
#endif
    (void)simd;
    for (int64_t i = 0; i < n; i++) y[i] = mc_fp32_to_fp16(x[i]);
}

/* One layer's decode/prefill attention for n_seq sequences with their new K/V.
 * Sequence s owns counts[s] consecutive rows of q, k_new, v_new and out (q, out:
 * (rows, n_head, hd); k_new, v_new: (rows, n_head_kv, hd)).  Its new K/V rows are
 * first written at positions starts[s] .. of its cache storage kst[s] / vst[s]
 * ((capacity, n_head_kv, hd), f32, or IEEE half when kv_f16, rounded to nearest even),
 * then its queries attend over positions 0 .. starts[s] + counts[s] - 1 (window and
 * softcap and sinks as mc_attention's) exactly as mc_attention_batch does.  The caller checks that every sequence fits its storage.
 * Returns 0 or -2 (out of memory). */
MC_API int mc_attention_append(int n_seq, const float *q, const float *k_new, const float *v_new,
                               void *const *kst, void *const *vst, const int *starts,
                               const int *counts, float *out, int n_head, int n_head_kv, int hd,
                               float scale, int window, float softcap, const float *sinks,
                               int kv_f16, int nth, int simd) {
    if (n_seq <= 0) return 0;
    const float **qs = (const float **)malloc(sizeof(float *) * (size_t)n_seq);
    float **outs = (float **)malloc(sizeof(float *) * (size_t)n_seq);
    int *n_kvs = (int *)malloc(sizeof(int) * (size_t)n_seq);
    if (qs == NULL || outs == NULL || n_kvs == NULL) {
        free(qs), free(outs), free(n_kvs);
        return -2;
    }
    const size_t qrow = (size_t)n_head * hd, kvrow = (size_t)n_head_kv * hd;
    size_t r = 0;
    for (int s = 0; s < n_seq; s++) {
        const size_t cnt = (size_t)counts[s], at = (size_t)starts[s] * kvrow;
        if (kv_f16) {
            mc_f32_to_f16(k_new + r * kvrow, (uint16_t *)kst[s] + at, (int64_t)(cnt * kvrow), simd);
            mc_f32_to_f16(v_new + r * kvrow, (uint16_t *)vst[s] + at, (int64_t)(cnt * kvrow), simd);
        } else {
            memcpy((float *)kst[s] + at, k_new + r * kvrow, sizeof(float) * cnt * kvrow);
            memcpy((float *)vst[s] + at, v_new + r * kvrow, sizeof(float) * cnt * kvrow);
        }
        qs[s] = q + r * qrow;
        outs[s] = out + r * qrow;
        n_kvs[s] = starts[s] + counts[s];
        r += cnt;
    }
    const int rc = mc_attention_batch(n_seq, qs, (const void *const *)kst, (const void *const *)vst,
                                      outs, counts, n_kvs, starts, n_head, n_head_kv, hd, scale,
                                      window, softcap, sinks, kv_f16, nth, simd);
    free(qs), free(outs), free(n_kvs);
    return rc;
}

#endif /* MC_OPS_H */
