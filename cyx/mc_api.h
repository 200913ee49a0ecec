/* The C entry points kernels.pyx calls.
 *
 * A split build (setup.py defines MC_SPLIT; see mc_common.h) compiles the kernels in the
 * units cyx/mc_unit_*.c and the Cython wrapper apart: the wrapper sees these declarations
 * only, the core unit (mc_unit_core.c) defines them.  Without MC_SPLIT this header pulls
 * in the whole of the kernels, and whoever includes it compiles them as one unit (a modelc
 * compile project's copy of kernels.pyx).
 */
#ifndef MC_API_H
#define MC_API_H

#if !defined(MC_SPLIT)
#include "mc_quant.h"
#include "mc_ops.h"
#include "mc_recur.h"
#include "mc_quantize.h"
#include "mc_vocab.h"
#else
#include <stddef.h>
#include <stdint.h>

#define MC_API_DECL __attribute__((visibility("hidden")))

/* mc_quant.h, mc_gemm_vnni.h, mc_dispatch.h, mc_common.h */
MC_API_DECL int mc_matmul(int t, const uint8_t *W, int64_t row_stride, int M, int K,
                          const float *x, int n, float *y, int simd, int nth, float tol);
MC_API_DECL int mc_matmul_aux(int t, const uint8_t *W, int64_t row_stride, int M, int K,
                              const float *x, int n, float *y, int simd, int nth, float tol,
                              const void *aux);
MC_API_DECL void mc_gemm_repack(int t, const uint8_t *W, int64_t st, int M, int K, void *out);
MC_API_DECL size_t mc_repack_block_bytes(int t);
MC_API_DECL int mc_repack_simd(int t, int simd);
MC_API_DECL int mc_matmul_multi(int t, int nw, const uint8_t *const *Ws, const int64_t *strides,
                                const int *Ms, int K, const float *x, int n, float *const *ys,
                                int simd, int nth, float tol, const void *const *auxs);
MC_API_DECL int mc_get_rows(int t, const uint8_t *W, int64_t row_stride, int K,
                            const int64_t *ids, int nids, float *out, int simd, const void *aux);
MC_API_DECL int mc_simd_best(void);
MC_API_DECL int mc_has_kernel(int t, int simd);
MC_API_DECL int mc_num_procs(void);
MC_API_DECL int mc_release_pages(const void *p, size_t n);

/* mc_pool.h */
MC_API_DECL void mc_pool_backoff(int on);
MC_API_DECL void mc_pool_stats(long long out[3]);

/* mc_ops.h */
MC_API_DECL void mc_rms_norm(const float *x, const float *w, float *y, int n, int d, float eps,
                             int nth);
MC_API_DECL void mc_layer_norm(const float *x, const float *w, const float *b, float *y, int n,
                               int d, float eps, int nth);
MC_API_DECL void mc_rope_table(const int64_t *pos, const float *inv_freq, int n, int half,
                               float *cs, float *sn);
MC_API_DECL void mc_rope_apply(float *x, const float *cst, const float *snt, int n, int n_heads,
                               int hd, int half, int neox);
MC_API_DECL void mc_softmax(float *x, int n, int d, int simd);
MC_API_DECL void mc_silu_mul(const float *g, const float *u, float *out, int64_t len, int simd,
                             int nth);
MC_API_DECL void mc_gelu(const float *x, float *out, int64_t len, int simd, int nth);
MC_API_DECL void mc_gelu_erf(const float *x, float *out, int64_t len, int simd, int nth);
MC_API_DECL void mc_tanh(const float *x, float *out, int64_t len, int simd);
MC_API_DECL void mc_attention(const float *q, const void *k, const void *v, float *out, int n_q,
                              int n_head, int n_kv, int n_head_kv, int hd, int q_pos0,
                              float scale, int window, float softcap, const float *sinks,
                              int kv_f16, int nth, int simd);
MC_API_DECL int mc_attention_batch(int n_seq, const float *const *qs, const void *const *ks,
                                   const void *const *vs, float *const *outs, const int *n_qs,
                                   const int *n_kvs, const int *q_pos0s, int n_head,
                                   int n_head_kv, int hd, float scale, int window, float softcap,
                                   const float *sinks, int kv_f16, int nth, int simd);
MC_API_DECL int mc_attention_append(int n_seq, const float *q, const float *k_new,
                                    const float *v_new, void *const *kst, void *const *vst,
                                    const int *starts, const int *counts, float *out, int n_head,
                                    int n_head_kv, int hd, float scale, int window,
                                    float softcap, const float *sinks, int kv_f16, int nth,
                                    int simd);

/* mc_recur.h */
MC_API_DECL int mc_causal_conv1d(const float *x, const float *k, const float *bias, float *out,
                                 int m, int ch, int w, int silu, int simd, int nth);
MC_API_DECL int mc_delta_scan(const float *q, const float *k, const float *v, const float *beta,
                              const float *decay, float *s, float *out, int m, int heads, int dk,
                              int dv, int simd, int nth);
MC_API_DECL void mc_ssm_scan(const float *x, const float *b, const float *c, const float *dt,
                             const float *decay, const float *d_skip, float *s, float *out, int m,
                             int heads, int p, int n, int simd, int nth);

/* mc_quantize.h */
MC_API_DECL int64_t mc_quantize_rows(int type, const float *src, uint8_t *dst, int64_t nrow,
                                      int64_t n_per_row, const float *imatrix);

/* mc_vocab.h */
MC_API_DECL int64_t mc_vocab_pairs(const uint8_t *text, const int64_t *off, int32_t n,
                                   int32_t *tok, int32_t *left, int32_t *right, int64_t cap);
#endif /* MC_SPLIT */

#endif /* MC_API_H */
