# --- appended by modelc compile: the C entry points a generated forward pass cimports ---
# (declared in kernels.pxd).  Each is the very C function the Python wrappers above call,
# so the compiled forward and the runtime run the same kernels.


cdef int k_matmul(int t, const uint8_t *W, int64_t stride, int M, int K, const float *x, int n,
                  float *y, int simd, int nth, float tol, const void *aux) noexcept nogil:
    return mc_matmul_aux(t, W, stride, M, K, x, n, y, simd, nth, tol, aux)


cdef int k_matmul_multi(int t, int nw, const uint8_t *const *Ws, const int64_t *strides,
                        const int *Ms, int K, const float *x, int n, float *const *ys, int simd,
                        int nth, float tol, const void *const *auxs) noexcept nogil:
    return mc_matmul_multi(t, nw, Ws, strides, Ms, K, x, n, ys, simd, nth, tol, auxs)


cdef void k_rms_norm(const float *x, const float *w, float *y, int n, int d, float eps,
                     int nth) noexcept nogil:
    mc_rms_norm(x, w, y, n, d, eps, nth)


cdef void k_layer_norm(const float *x, const float *w, const float *b, float *y, int n, int d,
                       float eps, int nth) noexcept nogil:
    mc_layer_norm(x, w, b, y, n, d, eps, nth)


cdef void k_rope_apply(float *x, const float *cs, const float *sn, int n, int n_heads, int hd,
                       int half, int neox) noexcept nogil:
    mc_rope_apply(x, cs, sn, n, n_heads, hd, half, neox)


cdef void k_silu_mul(const float *g, const float *u, float *out, int64_t length, int simd,
                     int nth) noexcept nogil:
    mc_silu_mul(g, u, out, length, simd, nth)


cdef void k_gelu(const float *x, float *out, int64_t length, int simd, int nth) noexcept nogil:
    mc_gelu(x, out, length, simd, nth)


cdef int k_attention_append(int n_seq, const float *q, const float *k_new, const float *v_new,
                            void *const *kst, void *const *vst, const int *starts,
                            const int *counts, float *out, int n_head, int n_head_kv, int hd,
                            float scale, int window, float softcap, int kv_f16, int nth,
                            int simd) noexcept nogil:
    return mc_attention_append(n_seq, q, k_new, v_new, kst, vst, starts, counts, out, n_head,
                               n_head_kv, hd, scale, window, softcap, NULL, kv_f16, nth, simd)
