/* The recurrent layers' per-token kernels: a causal depthwise convolution (LFM2's short
 * convolution, the input convolution of Gated DeltaNet and Mamba-2), the gated delta rule
 * (Qwen3.5 / Qwen3-Next) and Mamba-2's selective scan (Granite 4).
 *
 * Each is the loop of its numpy twin in modelc/runtime/backends/numpy_ref.py, element for
 * element in the same float steps (-ffp-contract=off: no fused multiply-adds) but for the
 * sums over a head's rows or state (numpy's matrix products sum in their own order), so the
 * two agree to f32 rounding.  The scans thread over heads: a head's state goes through all
 * of a call's tokens on one thread (it stays in cache), and no head's result depends on
 * which thread ran it or on how a sequence's tokens are split into calls -- batched equals
 * alone, and a prefill split at checkpoints equals one call, bit for bit.  The loop bodies
 * are written once (always inline) and compiled for AVX2 and for the portable baseline;
 * the vectoriser keeps each element's steps, and the delta rule's AVX2 twin takes the same
 * steps by hand, so the scans give the same bits on every path.  The convolution's silu
 * takes a vectorised exp on AVX2 (within an ulp or two of expf).
 */
#ifndef MC_RECUR_H
#define MC_RECUR_H

#include "mc_common.h"
#include "mc_ops.h"
#include "mc_pool.h"

#define MC_RECUR_INLINE static inline __attribute__((always_inline))
#define MC_RECUR_MIN_WORK 65536 /* multiply-adds a call below which it stays on the caller */
#define MC_DELTA_MAX_DV 1024   /* the widest value head mc_delta_scan takes */

/* ---- causal depthwise convolution ---------------------------------------------------- */

typedef struct {
    const float *x;  /* (w-1+m, ch): the inputs the kernel sees, the state's w-1 rows first */
    const float *kt; /* (w, ch): the kernel transposed */
    const float *bias; /* (ch,) or NULL */
    float *out;        /* (m, ch) */
    int m, ch, w, silu, simd;
} mc_conv_job;

#define MC_CONV_ROWS 16 /* output rows a chunk */

/* rows [t0, t1) of out[t] = act(sum_j x[t+j] * k[:, j] (+ bias)), the sum from 0 in j's order */
MC_RECUR_INLINE void mc_conv_body(const mc_conv_job *jb, int t0, int t1) {
    const int ch = jb->ch;
    for (int t = t0; t < t1; t++) {
        float *restrict o = jb->out + (size_t)t * ch;
        for (int c = 0; c < ch; c++) o[c] = 0.0f;
        for (int j = 0; j < jb->w; j++) {
            const float *restrict xr = jb->x + (size_t)(t + j) * ch;
            const float *restrict kr = jb->kt + (size_t)j * ch;
            for (int c = 0; c < ch; c++) o[c] += xr[c] * kr[c];
        }
        if (jb->bias != NULL) {
            const float *restrict b = jb->bias;
            for (int c = 0; c < ch; c++) o[c] += b[c];
        }
        if (jb->silu)
            for (int c = 0; c < ch; c++) o[c] = o[c] / (1.0f + expf(-o[c]));
    }
}

#if defined(MC_X86)
/* the sums as mc_conv_body's; silu's exp vectorised (mc_exp256, as mc_silu_mul's) */
MC_AVX2 static void mc_conv_avx2(const mc_conv_job *jb, int t0, int t1) {
    mc_conv_job plain = *jb;
    plain.silu = 0;
    mc_conv_body(&plain, t0, t1);
    if (!jb->silu) return;
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    float *o = jb->out + (size_t)t0 * jb->ch;
    const int64_t len = (int64_t)(t1 - t0) * jb->ch;
    int64_t i = 0;
    for (; i + 8 <= len; i += 8) {
        const __m256 y = _mm256_loadu_ps(o + i);
        _mm256_storeu_ps(o + i, _mm256_div_ps(y, _mm256_add_ps(one, mc_exp256(_mm256_sub_ps(zero, y)))));
    }
    for (; i < len; i++) o[i] = o[i] / (1.0f + expf(-o[i]));
}
#endif
static void mc_conv_base(const mc_conv_job *jb, int t0, int t1) { mc_conv_body(jb, t0, t1); }

static void mc_conv_chunk(void *ctx, int c) {
    const mc_conv_job *jb = (const mc_conv_job *)ctx;
    const int t0 = c * MC_CONV_ROWS, t1 = mc_imin(t0 + MC_CONV_ROWS, jb->m);
#if defined(MC_X86)
    if (MC_IS_AVX2(jb->simd)) {
        mc_conv_avx2(jb, t0, t1);
        return;
    }
#endif
    mc_conv_base(jb, t0, t1);
}

/* out (m, ch) = the causal convolution of x (w-1+m, ch) with k (ch, w), plus bias (or
 * NULL), through silu when `silu`.  Returns 0, or -2 when the transposed kernel cannot be
 * allocated. */
MC_API int mc_causal_conv1d(const float *x, const float *k, const float *bias, float *out, int m,
                            int ch, int w, int silu, int simd, int nth) {
    float *kt = (float *)malloc(sizeof(float) * (size_t)w * ch);
    if (kt == NULL) return -2;
    for (int c = 0; c < ch; c++)
        for (int j = 0; j < w; j++) kt[(size_t)j * ch + c] = k[(size_t)c * w + j];
    const mc_conv_job jb = {x, kt, bias, out, m, ch, w, silu, simd};
    const int chunks = (m + MC_CONV_ROWS - 1) / MC_CONV_ROWS;
    const int64_t work = (int64_t)m * ch * w;
    mc_parallel(work < MC_RECUR_MIN_WORK ? 1 : nth, chunks, mc_conv_chunk, (void *)&jb);
    free(kt);
    return 0;
}

/* ---- the gated delta rule ------------------------------------------------------------ */

typedef struct {
    const float *q, *k; /* (m, heads, dk): per value head, l2-normed (q also scaled) */
    const float *v;     /* (m, heads, dv) */
    const float *beta, *decay; /* (m, heads) */
    float *s;                  /* (heads, dk, dv): updated in place */
    float *out;                /* (m, heads, dv) */
    int m, heads, dk, dv, simd;
} mc_delta_job;

/* head h through tokens [0, m): S = decay S;  S += k (beta (v - k^T S))^T;  o = q^T S */
MC_RECUR_INLINE void mc_delta_body(const mc_delta_job *jb, int h) {
    const int H = jb->heads, dk = jb->dk, dv = jb->dv;
    float *restrict s = jb->s + (size_t)h * dk * dv;
    float mem[MC_DELTA_MAX_DV], delta[MC_DELTA_MAX_DV];
    for (int t = 0; t < jb->m; t++) {
        const float *restrict k = jb->k + ((size_t)t * H + h) * dk;
        const float *restrict q = jb->q + ((size_t)t * H + h) * dk;
        const float *restrict v = jb->v + ((size_t)t * H + h) * dv;
        float *restrict o = jb->out + ((size_t)t * H + h) * dv;
        const float g = jb->decay[(size_t)t * H + h], b = jb->beta[(size_t)t * H + h];
        for (int j = 0; j < dv; j++) mem[j] = 0.0f;
        for (int i = 0; i < dk; i++) { /* S *= g, and what S recalls for k */
            float *restrict r = s + (size_t)i * dv;
            const float ki = k[i];
            for (int j = 0; j < dv; j++) {
                r[j] = r[j] * g;
                mem[j] += ki * r[j];
            }
        }
        for (int j = 0; j < dv; j++) {
            delta[j] = (v[j] - mem[j]) * b;
            o[j] = 0.0f;
        }
        for (int i = 0; i < dk; i++) { /* S += k delta^T, and the output q^T S */
            float *restrict r = s + (size_t)i * dv;
            const float ki = k[i], qi = q[i];
            for (int j = 0; j < dv; j++) {
                r[j] = r[j] + ki * delta[j];
                o[j] += qi * r[j];
            }
        }
    }
}

#if defined(MC_X86)
/* mc_delta_body in blocks of 32 columns of S, the block's sums held in registers: the same
 * steps on each element in the same order (no fused multiply-adds), so the same bits */
MC_AVX2 static void mc_delta_avx2(const mc_delta_job *jb, int h) {
    const int H = jb->heads, dk = jb->dk, dv = jb->dv;
    if (dv % 32) {
        mc_delta_body(jb, h);
        return;
    }
    float *s = jb->s + (size_t)h * dk * dv;
    float delta[MC_DELTA_MAX_DV];
    for (int t = 0; t < jb->m; t++) {
        const float *k = jb->k + ((size_t)t * H + h) * dk;
        const float *q = jb->q + ((size_t)t * H + h) * dk;
        const float *v = jb->v + ((size_t)t * H + h) * dv;
        float *o = jb->out + ((size_t)t * H + h) * dv;
        const __m256 g = _mm256_set1_ps(jb->decay[(size_t)t * H + h]);
        const __m256 b = _mm256_set1_ps(jb->beta[(size_t)t * H + h]);
        for (int j = 0; j < dv; j += 32) { /* S *= g, and what S recalls for k */
            __m256 m0 = _mm256_setzero_ps(), m1 = m0, m2 = m0, m3 = m0;
            for (int i = 0; i < dk; i++) {
                float *r = s + (size_t)i * dv + j;
                const __m256 ki = _mm256_set1_ps(k[i]);
                const __m256 r0 = _mm256_mul_ps(_mm256_loadu_ps(r), g);
                const __m256 r1 = _mm256_mul_ps(_mm256_loadu_ps(r + 8), g);
                const __m256 r2 = _mm256_mul_ps(_mm256_loadu_ps(r + 16), g);
                const __m256 r3 = _mm256_mul_ps(_mm256_loadu_ps(r + 24), g);
                _mm256_storeu_ps(r, r0);
                _mm256_storeu_ps(r + 8, r1);
                _mm256_storeu_ps(r + 16, r2);
                _mm256_storeu_ps(r + 24, r3);
                m0 = _mm256_add_ps(m0, _mm256_mul_ps(ki, r0));
                m1 = _mm256_add_ps(m1, _mm256_mul_ps(ki, r1));
                m2 = _mm256_add_ps(m2, _mm256_mul_ps(ki, r2));
                m3 = _mm256_add_ps(m3, _mm256_mul_ps(ki, r3));
            }
            _mm256_storeu_ps(delta + j, _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(v + j), m0), b));
            _mm256_storeu_ps(delta + j + 8, _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(v + j + 8), m1), b));
            _mm256_storeu_ps(delta + j + 16, _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(v + j + 16), m2), b));
            _mm256_storeu_ps(delta + j + 24, _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(v + j + 24), m3), b));
        }
        for (int j = 0; j < dv; j += 32) { /* S += k delta^T, and the output q^T S */
            const __m256 d0 = _mm256_loadu_ps(delta + j), d1 = _mm256_loadu_ps(delta + j + 8);
            const __m256 d2 = _mm256_loadu_ps(delta + j + 16), d3 = _mm256_loadu_ps(delta + j + 24);
            __m256 o0 = _mm256_setzero_ps(), o1 = o0, o2 = o0, o3 = o0;
            for (int i = 0; i < dk; i++) {
                float *r = s + (size_t)i * dv + j;
                const __m256 ki = _mm256_set1_ps(k[i]), qi = _mm256_set1_ps(q[i]);
                const __m256 r0 = _mm256_add_ps(_mm256_loadu_ps(r), _mm256_mul_ps(ki, d0));
                const __m256 r1 = _mm256_add_ps(_mm256_loadu_ps(r + 8), _mm256_mul_ps(ki, d1));
                const __m256 r2 = _mm256_add_ps(_mm256_loadu_ps(r + 16), _mm256_mul_ps(ki, d2));
                const __m256 r3 = _mm256_add_ps(_mm256_loadu_ps(r + 24), _mm256_mul_ps(ki, d3));
                _mm256_storeu_ps(r, r0);
                _mm256_storeu_ps(r + 8, r1);
                _mm256_storeu_ps(r + 16, r2);
                _mm256_storeu_ps(r + 24, r3);
                o0 = _mm256_add_ps(o0, _mm256_mul_ps(qi, r0));
                o1 = _mm256_add_ps(o1, _mm256_mul_ps(qi, r1));
                o2 = _mm256_add_ps(o2, _mm256_mul_ps(qi, r2));
                o3 = _mm256_add_ps(o3, _mm256_mul_ps(qi, r3));
            }
            _mm256_storeu_ps(o + j, o0);
            _mm256_storeu_ps(o + j + 8, o1);
            _mm256_storeu_ps(o + j + 16, o2);
            _mm256_storeu_ps(o + j + 24, o3);
        }
    }
}
#endif
static void mc_delta_base(const mc_delta_job *jb, int h) { mc_delta_body(jb, h); }

static void mc_delta_head(void *ctx, int h) {
    const mc_delta_job *jb = (const mc_delta_job *)ctx;
#if defined(MC_X86)
    if (MC_IS_AVX2(jb->simd)) {
        mc_delta_avx2(jb, h);
        return;
    }
#endif
    mc_delta_base(jb, h);
}

/* m tokens of one sequence through the gated delta rule, its state s in place.  Returns 0,
 * or -1 when dv > MC_DELTA_MAX_DV. */
MC_API int mc_delta_scan(const float *q, const float *k, const float *v, const float *beta,
                          const float *decay, float *s, float *out, int m, int heads, int dk,
                          int dv, int simd, int nth) {
    if (dv > MC_DELTA_MAX_DV) return -1;
    const mc_delta_job jb = {q, k, v, beta, decay, s, out, m, heads, dk, dv, simd};
    const int64_t work = (int64_t)m * heads * dk * dv;
    mc_parallel(work < MC_RECUR_MIN_WORK ? 1 : nth, heads, mc_delta_head, (void *)&jb);
    return 0;
}

/* ---- Mamba-2's selective scan -------------------------------------------------------- */

typedef struct {
    const float *x;            /* (m, heads, p) */
    const float *b, *c;        /* (m, heads, n): each head's group's B and C */
    const float *dt, *decay;   /* (m, heads) */
    const float *d_skip;       /* (heads,) */
    float *s;                  /* (heads, p, n): updated in place */
    float *out;                /* (m, heads, p) */
    int m, heads, p, n, simd;
} mc_ssm_job;

/* head h through tokens [0, m): S = decay S + dt x B^T;  y = S C + D x.  The sum over the
 * state runs in 8 lanes, then pairwise, whatever the SIMD path. */
MC_RECUR_INLINE void mc_ssm_body(const mc_ssm_job *jb, int h) {
    const int H = jb->heads, P = jb->p, N = jb->n;
    float *restrict s = jb->s + (size_t)h * P * N;
    for (int t = 0; t < jb->m; t++) {
        const float *restrict x = jb->x + ((size_t)t * H + h) * P;
        const float *restrict b = jb->b + ((size_t)t * H + h) * N;
        const float *restrict c = jb->c + ((size_t)t * H + h) * N;
        float *restrict o = jb->out + ((size_t)t * H + h) * P;
        const float g = jb->decay[(size_t)t * H + h], dt = jb->dt[(size_t)t * H + h];
        const float dsk = jb->d_skip[h];
        for (int i = 0; i < P; i++) {
            float *restrict r = s + (size_t)i * N;
            const float u = dt * x[i];
            float acc[8] = {0};
            int j = 0;
            for (; j + 8 <= N; j += 8)
                for (int l = 0; l < 8; l++) {
                    r[j + l] = r[j + l] * g + u * b[j + l];
                    acc[l] += r[j + l] * c[j + l];
                }
            float y = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
            for (; j < N; j++) {
                r[j] = r[j] * g + u * b[j];
                y += r[j] * c[j];
            }
            o[i] = y + dsk * x[i];
        }
    }
}

#if defined(MC_X86)
/* lanes 0..7 of the sum as mc_ssm_body adds them, then pairwise */
MC_AVX2 static inline float mc_ssm_lanes(__m256 acc) {
    float a[8];
    _mm256_storeu_ps(a, acc);
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

/* mc_ssm_body by hand, two rows of S at a time: the same steps on each element, the same
 * lanes, so the same bits */
MC_AVX2 static void mc_ssm_avx2(const mc_ssm_job *jb, int h) {
    const int H = jb->heads, P = jb->p, N = jb->n;
    if (N % 8 || P % 2) {
        mc_ssm_body(jb, h);
        return;
    }
    float *s = jb->s + (size_t)h * P * N;
    for (int t = 0; t < jb->m; t++) {
        const float *x = jb->x + ((size_t)t * H + h) * P;
        const float *b = jb->b + ((size_t)t * H + h) * N;
        const float *c = jb->c + ((size_t)t * H + h) * N;
        float *o = jb->out + ((size_t)t * H + h) * P;
        const float dt = jb->dt[(size_t)t * H + h], dsk = jb->d_skip[h];
        const __m256 g = _mm256_set1_ps(jb->decay[(size_t)t * H + h]);
        for (int i = 0; i < P; i += 2) {
            float *r0 = s + (size_t)i * N, *r1 = r0 + N;
            const __m256 u0 = _mm256_set1_ps(dt * x[i]), u1 = _mm256_set1_ps(dt * x[i + 1]);
            __m256 a0 = _mm256_setzero_ps(), a1 = a0;
            for (int j = 0; j < N; j += 8) {
                const __m256 bj = _mm256_loadu_ps(b + j), cj = _mm256_loadu_ps(c + j);
                const __m256 y0 = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(r0 + j), g), _mm256_mul_ps(u0, bj));
                const __m256 y1 = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(r1 + j), g), _mm256_mul_ps(u1, bj));
                _mm256_storeu_ps(r0 + j, y0);
                _mm256_storeu_ps(r1 + j, y1);
                a0 = _mm256_add_ps(a0, _mm256_mul_ps(y0, cj));
                a1 = _mm256_add_ps(a1, _mm256_mul_ps(y1, cj));
            }
            o[i] = mc_ssm_lanes(a0) + dsk * x[i];
            o[i + 1] = mc_ssm_lanes(a1) + dsk * x[i + 1];
        }
    }
}
#endif
static void mc_ssm_base(const mc_ssm_job *jb, int h) { mc_ssm_body(jb, h); }

static void mc_ssm_head(void *ctx, int h) {
    const mc_ssm_job *jb = (const mc_ssm_job *)ctx;
#if defined(MC_X86)
    if (MC_IS_AVX2(jb->simd)) {
        mc_ssm_avx2(jb, h);
        return;
    }
#endif
    mc_ssm_base(jb, h);
}

/* m tokens of one sequence through Mamba-2's selective scan, its state s in place */
MC_API void mc_ssm_scan(const float *x, const float *b, const float *c, const float *dt,
                        const float *decay, const float *d_skip, float *s, float *out, int m,
                        int heads, int p, int n, int simd, int nth) {
    const mc_ssm_job jb = {x, b, c, dt, decay, d_skip, s, out, m, heads, p, n, simd};
    const int64_t work = (int64_t)m * heads * p * n;
    mc_parallel(work < MC_RECUR_MIN_WORK ? 1 : nth, heads, mc_ssm_head, (void *)&jb);
}

#endif /* MC_RECUR_H */
