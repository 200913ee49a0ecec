# The kernels' C entry points, for a generated forward pass to cimport (modelc compile).
from libc.stdint cimport int64_t, uint8_t

cdef int k_matmul(int t, const uint8_t *W, int64_t stride, int M, int K, const float *x, int n,
                  float *y, int simd, int nth, float tol, const void *aux) noexcept nogil
cdef int k_matmul_multi(int t, int nw, const uint8_t *const *Ws, const int64_t *strides,
                        const int *Ms, int K, const float *x, int n, float *const *ys, int simd,
                        int nth, float tol, const void *const *auxs) noexcept nogil
cdef void k_rms_norm(const float *x, const float *w, float *y, int n, int d, float eps,
                     int nth) noexcept nogil
cdef void k_layer_norm(const float *x, const float *w, const float *b, float *y, int n, int d,
                       float eps, int nth) noexcept nogil
cdef void k_rope_apply(float *x, const float *cs, const float *sn, int n, int n_heads, int hd,
                       int half, int neox) noexcept nogil
cdef void k_silu_mul(const float *g, const float *u, float *out, int64_t length, int simd,
                     int nth) noexcept nogil
cdef void k_gelu(const float *x, float *out, int64_t length, int simd, int nth) noexcept nogil
cdef int k_attention_append(int n_seq, const float *q, const float *k_new, const float *v_new,
                            void *const *kst, void *const *vst, const int *starts,
                            const int *counts, float *out, int n_head, int n_head_kv, int hd,
                            float scale, int window, float softcap, int kv_f16, int nth,
                            int simd) noexcept nogil
