# cython: language_level=3
"""Cython wrappers over the C kernels declared in ``mc_api.h`` (``mc_quant.h``, ``mc_ops.h``,
``mc_recur.h``).

Every wrapper releases the GIL around its C call.  Shapes and dtypes are checked
by ``modelc.runtime.backends.cpu``; here only what would corrupt memory is checked.
Weights arrive as uint8 ``(rows, row_bytes)`` views whatever their dtype.
"""

from cpython.buffer cimport (PyBUF_C_CONTIGUOUS, PyBUF_FORMAT, PyBUF_WRITABLE, PyBuffer_Release,
                             PyObject_GetBuffer)
from libc.stdint cimport int32_t, int64_t, uint8_t
from libc.stdlib cimport free, malloc


cdef extern from "mc_api.h" nogil:
    int mc_matmul(int t, const uint8_t *W, int64_t row_stride, int M, int K, const float *x,
                  int n, float *y, int simd, int nth, float tol)
    int mc_matmul_aux(int t, const uint8_t *W, int64_t row_stride, int M, int K, const float *x,
                      int n, float *y, int simd, int nth, float tol, const void *aux)
    void mc_gemm_repack(int t, const uint8_t *W, int64_t row_stride, int M, int K, void *out)
    size_t mc_repack_block_bytes(int t)
    int mc_repack_simd(int t, int simd)
    int mc_matmul_multi(int t, int nw, const uint8_t *const *Ws, const int64_t *strides,
                        const int *Ms, int K, const float *x, int n, float *const *ys, int simd,
                        int nth, float tol, const void *const *auxs)
    int mc_get_rows(int t, const uint8_t *W, int64_t row_stride, int K, const int64_t *ids,
                    int nids, float *out, int simd, const void *aux)
    int mc_simd_best()
    int mc_has_kernel(int t, int simd)
    int mc_num_procs()
    int mc_release_pages(const void *p, size_t n)

cdef extern from "mc_api.h" nogil:
    int64_t mc_quantize_rows(int type, const float *src, uint8_t *dst, int64_t nrow,
                              int64_t n_per_row, const float *imatrix)

cdef extern from "mc_api.h" nogil:
    int64_t mc_vocab_pairs(const uint8_t *text, const int64_t *off, int32_t n, int32_t *tok,
                           int32_t *left, int32_t *right, int64_t cap)

cdef extern from "mc_api.h" nogil:
    void mc_pool_backoff(int on)
    void mc_pool_stats(long long out[3])

cdef extern from "mc_api.h" nogil:
    void mc_rms_norm(const float *x, const float *w, float *y, int n, int d, float eps, int nth)
    void mc_layer_norm(const float *x, const float *w, const float *b, float *y, int n, int d,
                       float eps, int nth)
    void mc_rope_table(const int64_t *pos, const float *inv_freq, int n, int half, float *cs,
                       float *sn)
    void mc_rope_apply(float *x, const float *cs, const float *sn, int n, int n_heads, int hd,
                 int half, int neox)
    void mc_softmax(float *x, int n, int d, int simd)
    void mc_silu_mul(const float *g, const float *u, float *out, int64_t length, int simd, int nth)
    void mc_gelu(const float *x, float *out, int64_t length, int simd, int nth)
    void mc_gelu_erf(const float *x, float *out, int64_t length, int simd, int nth)
    void mc_tanh(const float *x, float *out, int64_t length, int simd)
    void mc_attention(const float *q, const void *k, const void *v, float *out, int n_q,
                      int n_head, int n_kv, int n_head_kv, int hd, int q_pos0, float scale,
                      int window, float softcap, const float *sinks, int kv_f16, int nth,
                      int simd)
    int mc_attention_batch(int n_seq, const float *const *qs, const void *const *ks,
                           const void *const *vs, float *const *outs, const int *n_qs,
                           const int *n_kvs, const int *q_pos0s, int n_head, int n_head_kv,
                           int hd, float scale, int window, float softcap, const float *sinks,
                           int kv_f16, int nth, int simd)
    int mc_attention_append(int n_seq, const float *q, const float *k_new, const float *v_new,
                            void *const *kst, void *const *vst, const int *starts,
                            const int *counts, float *out, int n_head, int n_head_kv, int hd,
                            float scale, int window, float softcap, const float *sinks,
                            int kv_f16, int nth, int simd)

cdef extern from "mc_api.h" nogil:
    int mc_causal_conv1d(const float *x, const float *k, const float *bias, float *out, int m,
                         int ch, int w, int silu, int simd, int nth)
    int mc_delta_scan(const float *q, const float *k, const float *v, const float *beta,
                      const float *decay, float *s, float *out, int m, int heads, int dk, int dv,
                      int simd, int nth)
    void mc_ssm_scan(const float *x, const float *b, const float *c, const float *dt,
                     const float *decay, const float *d_skip, float *s, float *out, int m,
                     int heads, int p, int n, int simd, int nth)

# type codes of mc_common.h
F32 = 0
F16 = 1
Q4_0 = 2
Q4_1 = 3
Q5_0 = 4
Q8_0 = 5
Q4_K = 6
Q6_K = 7
INT8 = 8
Q5_1 = 9
Q2_K = 10
Q3_K = 11
Q5_K = 12
BF16 = 13
IQ4_NL = 14
IQ4_XS = 15
MXFP4 = 16

SIMD_SCALAR = 0
SIMD_AVX2 = 1
SIMD_NEON = 2
SIMD_VNNI = 3


def simd_best():
    """The best SIMD level this CPU runs (0 scalar, 1 AVX2, 2 NEON, 3 AVX2 + AVX512-VNNI)."""
    return mc_simd_best()


def has_kernel(int wtype, int simd):
    """Whether the C dispatch has a matmul kernel for weight type ``wtype`` at SIMD level
    ``simd`` (else ``matmul`` refuses the type)."""
    return mc_has_kernel(wtype, simd) != 0


def pool_backoff(bint on):
    """Turn the thread pool's stall back-off on or off (see mc_pool.h); for benchmarks."""
    mc_pool_backoff(on)


def pool_stats():
    """The thread pool's counters: jobs offered to it, jobs its stall back-off ran on the
    calling thread alone, back-offs started (see mc_pool.h)."""
    cdef long long out[3]
    mc_pool_stats(out)
    return {"jobs": out[0], "solo": out[1], "stalls": out[2]}


def num_procs():
    return mc_num_procs()


cdef const void *_aux_ptr(int wtype, const uint8_t[:, ::1] aux, int M, int K) except? NULL:
    """A weight's ``repack`` (M rows of K) as ``aux``; NULL for None."""
    if aux is None:
        return NULL
    cdef int nb = K // 32
    cdef size_t per = mc_repack_block_bytes(wtype)
    ok = per and aux.shape[0] == (M + 7) // 8 and aux.shape[1] == <Py_ssize_t>(nb * per)
    if not ok or K % 32:
        raise ValueError("matmul: GEMM data does not match the weights")
    return &aux[0, 0]


def matmul(int wtype, const uint8_t[:, ::1] W, int K, const float[:, ::1] x, float[:, ::1] out,
           int simd, int nth, float tol=1e38, const uint8_t[:, ::1] aux=None):
    """out (n, M) = x (n, K) @ W^T; W (M, row_bytes) raw rows of type ``wtype``.

    ``tol`` 0 keeps x in float32 (dequantize each weight row once, float dots);
    otherwise x is quantized to int8 blocks and the dots are integer, unless that
    quantization is estimated to add a relative RMS error above ``tol`` to some
    row of x, when the call keeps x in float32 too (see mc_quant.h).  ``aux``: the
    weight's ``repack`` for the VNNI kernels (Q4_1, Q8_0; results unchanged).
    """
    cdef int M = W.shape[0]
    cdef int n = x.shape[0]
    cdef int rc
    cdef int64_t stride = W.strides[0]
    if x.shape[1] != K or out.shape[0] != n or out.shape[1] != M:
        raise ValueError("matmul: shape mismatch")
    if n == 0 or M == 0:
        return
    cdef const void *tp = _aux_ptr(wtype, aux, M, K)
    with nogil:
        rc = mc_matmul_aux(wtype, &W[0, 0], stride, M, K, &x[0, 0], n, &out[0, 0], simd, nth, tol,
                           tp)
    if rc == -1:
        raise ValueError(f"matmul: unsupported weight type code {wtype}")
    if rc == -2:
        raise MemoryError("matmul: activation buffer")


def repack_simd(int wtype, int simd):
    """Whether SIMD level ``simd`` has kernels for ``repack``ed weights of type ``wtype``."""
    return mc_repack_simd(wtype, simd) != 0


def repack(int wtype, const uint8_t[:, ::1] W, int K, alloc=None):
    """((M + 7) / 8, K / 32 * block bytes): Q4_1 (160 bytes a block of 8 rows), Q8_0
    (272), Q4_0 and IQ4_NL (144), MXFP4 (136), Q5_0 (176), Q5_1 (192), Q2_K (84 per 32 columns), Q3_K (114), IQ4_XS (138), Q4_K (148), Q5_K (180) or Q6_K (210) rows repacked 8 at a time for
    the VNNI kernels (mc_gemm_repack); in ``alloc(shape)``'s uint8 array when given (else
    numpy's)."""
    import numpy as np
    cdef int M = W.shape[0]
    cdef size_t per = mc_repack_block_bytes(wtype)
    if per == 0:
        raise ValueError(f"repack: weight type code {wtype} is not repacked")
    row_bytes = {Q4_1: K // 32 * 20, Q8_0: K // 32 * 34, Q2_K: K // 256 * 84, Q3_K: K // 256 * 110,
                 IQ4_NL: K // 32 * 18, MXFP4: K // 32 * 17, Q4_0: K // 32 * 18, Q5_0: K // 32 * 22, Q5_1: K // 32 * 24, IQ4_XS: K // 256 * 136,
                 Q4_K: K // 256 * 144, Q5_K: K // 256 * 176, Q6_K: K // 256 * 210}
    if K % (256 if wtype in (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS) else 32) or W.shape[1] < row_bytes[wtype]:
        raise ValueError("repack: rows do not hold K elements of their type")
    shape = ((M + 7) // 8, (K // 32) * per)
    out = np.empty(shape, np.uint8) if alloc is None else alloc(shape)
    if out.shape != shape or out.dtype != np.uint8:
        raise ValueError(f"repack: alloc gave {out.dtype} {out.shape}, not uint8 {shape}")
    cdef uint8_t[:, ::1] o = out
    if M > 0 and K > 0:
        with nogil:
            mc_gemm_repack(wtype, &W[0, 0], W.strides[0], M, K, &o[0, 0])
    return out


def vocab_pairs(const uint8_t[::1] text, const int64_t[::1] off, int32_t[::1] tok,
                int32_t[::1] left, int32_t[::1] right):
    """The splits of a vocabulary's tokens into two tokens (``mc_vocab.h``): token ``i`` is
    ``text[off[i]:off[i + 1]]`` (UTF-8); fills ``tok``, ``left``, ``right`` (the same length)
    with as many triples as fit and returns how many there are."""
    if off.shape[0] < 1 or off.shape[0] > 2**31 or off[0] != 0:
        raise ValueError("offsets do not fit the text")
    cdef int32_t n = <int32_t>(off.shape[0] - 1), i
    for i in range(n):
        if off[i + 1] < off[i]:
            raise ValueError("offsets do not fit the text")
    if off[n] > text.shape[0]:
        raise ValueError("offsets do not fit the text")
    if tok.shape[0] != left.shape[0] or tok.shape[0] != right.shape[0]:
        raise ValueError("tok, left and right differ in length")
    cdef int64_t cap = tok.shape[0], found
    cdef const uint8_t *t = &text[0] if text.shape[0] else NULL
    cdef int32_t *pt = &tok[0] if cap else NULL
    cdef int32_t *pl = &left[0] if cap else NULL
    cdef int32_t *pr = &right[0] if cap else NULL
    with nogil:
        found = mc_vocab_pairs(t, &off[0], n, pt, pl, pr, cap)
    if found < 0:
        raise MemoryError("vocab_pairs: out of memory")
    return found


def release_pages(const uint8_t[:, ::1] W):
    """Let the OS reclaim the whole pages of a read-only file mapping W (weights a
    repacked copy has replaced; their contents stay, read back on a later touch).
    Returns whether it was done."""
    if W.shape[0] == 0 or W.shape[1] == 0:
        return False
    cdef size_t n = <size_t>(W.shape[0] - 1) * <size_t>W.strides[0] + <size_t>W.shape[1]
    return mc_release_pages(&W[0, 0], n) == 0


# GGML type id -> (weights, bytes) per block, of the types mc_quantize_rows writes
_QUANT_BLOCKS = {2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
                 10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210),
                 20: (32, 18), 23: (256, 136)}


def quantize_chunk(int ggml_type, const float[:, ::1] x, uint8_t[:, ::1] out,
                   const float[::1] imatrix=None):
    """out (rows, row_bytes) = x (rows, n_per_row) as GGML blocks of ``ggml_type`` (its GGML
    id), bit for bit as ggml_quantize_chunk; ``imatrix`` (n_per_row,) weighs the search as
    llama-quantize's importance matrix does."""
    if ggml_type not in _QUANT_BLOCKS:
        raise ValueError(f"no quantizer for GGML type {ggml_type}")
    bs, ts = _QUANT_BLOCKS[ggml_type]
    if x.shape[1] % bs or x.shape[0] != out.shape[0] or out.shape[1] != x.shape[1] // bs * ts:
        raise ValueError("x and out do not have the shapes of one quantized row block")
    cdef const float *im = NULL
    if imatrix is not None:
        if imatrix.shape[0] != x.shape[1]:
            raise ValueError("imatrix length differs from the row length")
        im = &imatrix[0]
    if x.shape[0] == 0 or x.shape[1] == 0:
        return
    with nogil:
        mc_quantize_rows(ggml_type, &x[0, 0], &out[0, 0], x.shape[0], x.shape[1], im)


def matmul_multi(int wtype, list Ws, int K, const float[:, ::1] x, list outs, int simd, int nth,
                 float tol=1e38, list auxs=None):
    """outs[s] (n, M_s) = x (n, K) @ Ws[s]^T for weights of one type sharing x (at most 16).

    Each result equals ``matmul``'s; in fast mode x is quantized once and all the
    products run as one pool job.  ``auxs``: each weight's ``aux`` (see ``matmul``) or None.
    """
    cdef int nw = len(Ws), s, rc = 0, n = x.shape[0]
    cdef const uint8_t[:, ::1] w
    cdef float[:, ::1] o
    if nw != len(outs) or nw > 16:
        raise ValueError("matmul_multi: one output per weight, at most 16")
    if nw == 0 or n == 0:
        return
    if x.shape[1] != K:
        raise ValueError("matmul_multi: shape mismatch")
    if auxs is not None and len(auxs) != nw:
        raise ValueError("matmul_multi: one aux per weight")
    cdef const uint8_t **wp = <const uint8_t **>malloc(nw * sizeof(uint8_t *))
    cdef float **yp = <float **>malloc(nw * sizeof(float *))
    cdef int64_t *strides = <int64_t *>malloc(nw * sizeof(int64_t))
    cdef int *ms = <int *>malloc(nw * sizeof(int))
    cdef const void **ap = <const void **>malloc(nw * sizeof(void *))
    try:
        if wp == NULL or yp == NULL or strides == NULL or ms == NULL or ap == NULL:
            raise MemoryError("matmul_multi: tables")
        for s in range(nw):
            w = Ws[s]
            o = outs[s]
            if w.shape[0] == 0 or o.shape[0] != n or o.shape[1] != w.shape[0]:
                raise ValueError("matmul_multi: shape mismatch")
            wp[s] = &w[0, 0]
            yp[s] = &o[0, 0]
            strides[s] = w.strides[0]
            ms[s] = w.shape[0]
            ap[s] = _aux_ptr(wtype, auxs[s], ms[s], K) if auxs is not None else NULL
        with nogil:
            rc = mc_matmul_multi(wtype, nw, wp, strides, ms, K, &x[0, 0], n, yp, simd, nth, tol,
                                 ap if auxs is not None else NULL)
    finally:
        free(ap)
        free(wp)
        free(yp)
        free(strides)
        free(ms)
    if rc == -1:
        raise ValueError(f"matmul_multi: unsupported weight type code {wtype}")
    if rc == -2:
        raise MemoryError("matmul_multi: activation buffer")


def get_rows(int wtype, const uint8_t[:, ::1] W, int K, const int64_t[::1] ids, float[:, ::1] out,
             int simd=0, const uint8_t[:, ::1] aux=None):
    """out (len(ids), K) = dequantized rows ``ids`` of W; read from W's ``repack`` when
    ``aux`` is given (the same values)."""
    cdef int nids = ids.shape[0], rc
    cdef int64_t stride = W.strides[0]
    cdef int i
    cdef const void *ap = _aux_ptr(wtype, aux, W.shape[0], K)
    if out.shape[0] != nids or out.shape[1] != K:
        raise ValueError("get_rows: shape mismatch")
    for i in range(nids):
        if ids[i] < 0 or ids[i] >= W.shape[0]:
            raise IndexError(f"get_rows: id {ids[i]} out of range 0..{W.shape[0] - 1}")
    if nids == 0:
        return
    with nogil:
        rc = mc_get_rows(wtype, &W[0, 0], stride, K, &ids[0], nids, &out[0, 0], simd, ap)
    if rc != 0:
        raise MemoryError("get_rows: row buffer")


def rms_norm(const float[:, ::1] x, const float[::1] w, float eps, float[:, ::1] out, int nth):
    cdef int n = x.shape[0], d = x.shape[1]
    if w.shape[0] != d or out.shape[0] != n or out.shape[1] != d:
        raise ValueError("rms_norm: shape mismatch")
    if n == 0:
        return
    with nogil:
        mc_rms_norm(&x[0, 0], &w[0], &out[0, 0], n, d, eps, nth)


def layer_norm(const float[:, ::1] x, const float[::1] w, const float[::1] b, float eps,
               float[:, ::1] out, int nth):
    cdef int n = x.shape[0], d = x.shape[1]
    if w.shape[0] != d or b.shape[0] != d or out.shape[0] != n or out.shape[1] != d:
        raise ValueError("layer_norm: shape mismatch")
    if n == 0:
        return
    with nogil:
        mc_layer_norm(&x[0, 0], &w[0], &b[0], &out[0, 0], n, d, eps, nth)


def rope_table(const int64_t[::1] pos, const float[::1] inv_freq):
    """(cos, sin), each (n, half) float32: RoPE's angles pos[t] * inv_freq[i]."""
    import numpy as np
    cdef int n = pos.shape[0], half = inv_freq.shape[0]
    cs, sn = np.empty((n, half), np.float32), np.empty((n, half), np.float32)
    cdef float[:, ::1] c = cs, s = sn
    if n > 0 and half > 0:
        with nogil:
            mc_rope_table(&pos[0], &inv_freq[0], n, half, &c[0, 0], &s[0, 0])
    return cs, sn


def rope(float[:, :, ::1] x, const float[:, ::1] cs, const float[:, ::1] sn, bint neox):
    """In place: x (n, heads, hd) rotated by ``rope_table``'s angles (n, half)."""
    cdef int n = x.shape[0], nh = x.shape[1], hd = x.shape[2], half = cs.shape[1]
    if cs.shape[0] != n or sn.shape[0] != n or sn.shape[1] != half or 2 * half > hd:
        raise ValueError("rope: shape mismatch")
    if n == 0 or half == 0:
        return
    with nogil:
        mc_rope_apply(&x[0, 0, 0], &cs[0, 0], &sn[0, 0], n, nh, hd, half, neox)


def softmax(float[:, ::1] x, int simd=0):
    if x.shape[0] == 0 or x.shape[1] == 0:
        return
    with nogil:
        mc_softmax(&x[0, 0], x.shape[0], x.shape[1], simd)


def silu_mul(const float[::1] g, const float[::1] u, float[::1] out, int simd=0, int nth=1):
    if g.shape[0] != u.shape[0] or out.shape[0] != g.shape[0]:
        raise ValueError("silu_mul: shape mismatch")
    if g.shape[0] == 0:
        return
    with nogil:
        mc_silu_mul(&g[0], &u[0], &out[0], g.shape[0], simd, nth)


def gelu(const float[::1] x, float[::1] out, int simd=0, int nth=1):
    if out.shape[0] != x.shape[0]:
        raise ValueError("gelu: shape mismatch")
    if x.shape[0] == 0:
        return
    with nogil:
        mc_gelu(&x[0], &out[0], x.shape[0], simd, nth)


def gelu_erf(const float[::1] x, float[::1] out, int simd=0, int nth=1):
    """out = x * Phi(x), the exact (erf) GELU; out may be x"""
    if out.shape[0] != x.shape[0]:
        raise ValueError("gelu_erf: shape mismatch")
    if x.shape[0] == 0:
        return
    with nogil:
        mc_gelu_erf(&x[0], &out[0], x.shape[0], simd, nth)


def tanh(const float[::1] x, float[::1] out, int simd=0):
    """out = tanh(x): the vectorised tanh the soft-capped attention scores go through."""
    if out.shape[0] != x.shape[0]:
        raise ValueError("tanh: shape mismatch")
    if x.shape[0] == 0:
        return
    with nogil:
        mc_tanh(&x[0], &out[0], x.shape[0], simd)


cdef int _window_check(int window, float softcap) except -1:
    if window < 0 or not softcap >= 0.0:
        raise ValueError(f"attention: window {window} and softcap {softcap} must be >= 0")
    return 0


cdef const float *_sinks_ptr(object sinks, int nh) except? NULL:
    """The sink logits' data (a C-contiguous float32 array of one per head), or NULL for
    None; the caller holds ``sinks`` for as long as it uses the pointer."""
    if sinks is None:
        return NULL
    cdef const float[::1] sv = sinks
    if sv.shape[0] != nh:
        raise ValueError(f"attention: {sv.shape[0]} sinks for {nh} heads")
    return &sv[0] if nh > 0 else NULL


cdef int _attention_check(int n_q, int nh, int hd, int n_kv, int nkh, int k2, int v0, int v1,
                          int v2, int q_pos0, int o0, int o1, int o2) except -1:
    if (k2 != hd or v0 != n_kv or v1 != nkh or v2 != hd or nkh == 0 or nh % nkh != 0
            or hd > 512 or q_pos0 < 0 or o0 != n_q or o1 != nh or o2 != hd):
        raise ValueError("attention: shape mismatch")
    if n_kv == 0 and n_q > 0 and nh > 0 and hd > 0:
        raise ValueError("attention: empty KV cache")
    return 0


cdef const void *_kv_data(object a, bint f16, int *shape, bint writable=False) except? NULL:
    """A K or V array's data (NULL when it has no rows) and (rows, heads, dim) into
    shape: C-contiguous float32, or float16 when ``f16``.  Through
    the buffer protocol (no memoryview object: ~1 us less a call, 16 calls a layer at 8
    sequences); the caller holds ``a`` for as long as it uses the pointer."""
    cdef Py_buffer view
    PyObject_GetBuffer(a, &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (PyBUF_WRITABLE if writable else 0))
    try:
        fmt = (<bytes>view.format).lstrip(b"<=@")
        if view.ndim != 3 or fmt != (b"e" if f16 else b"f"):
            raise ValueError(
                f"K/V stores must all be float32 or all float16 (rows, heads, dim) arrays; "
                f"expected {'float16' if f16 else 'float32'}, got {view.ndim} dims of "
                f"{fmt.decode()!r}")
        shape[0], shape[1], shape[2] = view.shape[0], view.shape[1], view.shape[2]
        return view.buf if shape[0] > 0 else NULL
    finally:
        PyBuffer_Release(&view)


def attention(const float[:, :, ::1] q, k, v, int q_pos0, float scale, float[:, :, ::1] out,
              int nth, int simd=0, bint kv_f16=False, int window=0, float softcap=0.0,
              sinks=None):
    """out (n_q, n_head, hd): causal GQA of q over cache rows k, v (n_kv, n_head_kv, hd):
    C-contiguous float32, or (``kv_f16``) float16.  ``window`` > 0: the query at position p
    sees rows p - window + 1 .. p only; ``softcap`` > 0: each score s becomes
    softcap * tanh(s / softcap) before the softmax; ``sinks`` (n_head,) float32, unless
    None: a logit per head in each softmax's denominator only (gpt-oss)."""
    cdef int n_q = q.shape[0], nh = q.shape[1], hd = q.shape[2]
    cdef int kshape[3]
    cdef int vshape[3]
    cdef const void *kp = _kv_data(k, kv_f16, kshape)
    cdef const void *vp = _kv_data(v, kv_f16, vshape)
    _attention_check(n_q, nh, hd, kshape[0], kshape[1], kshape[2], vshape[0], vshape[1],
                     vshape[2], q_pos0, out.shape[0], out.shape[1], out.shape[2])
    _window_check(window, softcap)
    cdef const float *sp = _sinks_ptr(sinks, nh)
    if n_q == 0 or nh == 0 or hd == 0:
        return
    with nogil:
        mc_attention(&q[0, 0, 0], kp, vp, &out[0, 0, 0], n_q, nh, kshape[0], kshape[1], hd,
                     q_pos0, scale, window, softcap, sp, kv_f16, nth, simd)


def attention_batch(list qs, list ks, list vs, list q_pos0s, float scale, list outs, int nth,
                    int simd=0, bint kv_f16=False, int window=0, float softcap=0.0,
                    sinks=None):
    """``attention`` for every sequence i at once: outs[i] from qs[i] over ks[i], vs[i]
    (``window``, ``softcap`` and ``sinks`` as ``attention``'s, the same for every sequence).

    All sequences share n_head, n_head_kv and hd; one pool job covers every work
    item.  With ``kv_f16`` every ks[i], vs[i] is a C-contiguous float16 array.
    The caller keeps the arrays alive.
    """
    cdef int n_seq = len(qs), i, rc = 0
    if len(ks) != n_seq or len(vs) != n_seq or len(q_pos0s) != n_seq or len(outs) != n_seq:
        raise ValueError("attention_batch: lists of different lengths")
    _window_check(window, softcap)
    if n_seq == 0:
        return
    cdef const float[:, :, ::1] q
    cdef float[:, :, ::1] o
    cdef int nh = qs[0].shape[1], hd = qs[0].shape[2], nkh = ks[0].shape[1]
    cdef int kshape[3]
    cdef int vshape[3]
    if nkh == 0 or nh % nkh != 0 or hd > 512:
        raise ValueError("attention_batch: shape mismatch")
    cdef const float *sp = _sinks_ptr(sinks, nh)
    cdef const float **qp = <const float **>malloc(n_seq * sizeof(float *))
    cdef const void **kp = <const void **>malloc(n_seq * sizeof(void *))
    cdef const void **vp = <const void **>malloc(n_seq * sizeof(void *))
    cdef float **op = <float **>malloc(n_seq * sizeof(float *))
    cdef int *ints = <int *>malloc(3 * n_seq * sizeof(int))
    try:
        if qp == NULL or kp == NULL or vp == NULL or op == NULL or ints == NULL:
            raise MemoryError("attention_batch: pointer tables")
        for i in range(n_seq):
            q, o = qs[i], outs[i]
            kp[i] = _kv_data(ks[i], kv_f16, kshape)
            vp[i] = _kv_data(vs[i], kv_f16, vshape)
            if (kshape[1] != nkh or q.shape[1] != nh or q.shape[2] != hd or kshape[2] != hd
                    or vshape[0] != kshape[0] or vshape[1] != nkh or vshape[2] != hd
                    or o.shape[0] != q.shape[0] or o.shape[1] != nh or o.shape[2] != hd
                    or q_pos0s[i] < 0):
                raise ValueError(f"attention_batch: shape mismatch in sequence {i}")
            if q.shape[0] > 0 and kshape[0] == 0:
                raise ValueError(f"attention_batch: empty KV cache in sequence {i}")
            # a null pointer for an empty sequence: it contributes no work items
            qp[i] = &q[0, 0, 0] if q.shape[0] > 0 else NULL
            op[i] = &o[0, 0, 0] if q.shape[0] > 0 else NULL
            ints[i] = q.shape[0]
            ints[n_seq + i] = kshape[0]
            ints[2 * n_seq + i] = q_pos0s[i]
        with nogil:
            rc = mc_attention_batch(n_seq, qp, kp, vp, op, &ints[0], &ints[n_seq],
                                    &ints[2 * n_seq], nh, nkh, hd, scale, window, softcap,
                                    sp, kv_f16, nth, simd)
        if rc == -2:
            raise MemoryError("attention_batch: job table")
    finally:
        free(qp)
        free(kp)
        free(vp)
        free(op)
        free(ints)


def attention_append(const float[:, :, ::1] q, const float[:, :, ::1] k_new,
                     const float[:, :, ::1] v_new, list k_stores, list v_stores, list starts,
                     list counts, float scale, float[:, :, ::1] out, int nth, int simd=0,
                     bint kv_f16=False, int window=0, float softcap=0.0, sinks=None):
    """Write each sequence's new K/V rows into its cache storage, then attend (one pool job).

    Sequence s owns ``counts[s]`` consecutive rows of q, k_new, v_new and out; its rows
    go to positions ``starts[s]`` .. of ``k_stores[s]`` / ``v_stores[s]`` ((capacity,
    n_head_kv, hd) float32, or float16 when ``kv_f16``), and its queries
    attend over positions 0 .. starts[s] + counts[s] - 1, as ``attention_batch`` does
    (``window``, ``softcap`` and ``sinks`` as ``attention``'s).
    """
    cdef int n_seq = len(k_stores), s, rc = 0, total = 0, st, cnt, cap
    cdef int nrows = q.shape[0], nh = q.shape[1], hd = q.shape[2], nkh = k_new.shape[1]
    if len(v_stores) != n_seq or len(starts) != n_seq or len(counts) != n_seq:
        raise ValueError("attention_append: lists of different lengths")
    _window_check(window, softcap)
    if (k_new.shape[0] != nrows or v_new.shape[0] != nrows or v_new.shape[1] != nkh
            or k_new.shape[2] != hd or v_new.shape[2] != hd or out.shape[0] != nrows
            or out.shape[1] != nh or out.shape[2] != hd or nkh == 0 or nh % nkh != 0
            or hd > 512):
        raise ValueError("attention_append: shape mismatch")
    cdef const float *sp = _sinks_ptr(sinks, nh)
    if n_seq == 0 or nrows == 0:
        return
    cdef int kshape[3]
    cdef int vshape[3]
    cdef void **kp = <void **>malloc(n_seq * sizeof(void *))
    cdef void **vp = <void **>malloc(n_seq * sizeof(void *))
    cdef int *ints = <int *>malloc(2 * n_seq * sizeof(int))
    try:
        if kp == NULL or vp == NULL or ints == NULL:
            raise MemoryError("attention_append: pointer tables")
        for s in range(n_seq):
            st, cnt = starts[s], counts[s]
            kp[s] = <void *>_kv_data(k_stores[s], kv_f16, kshape, True)  # the new rows go in
            vp[s] = <void *>_kv_data(v_stores[s], kv_f16, vshape, True)
            cap = kshape[0]
            if (kshape[1] != nkh or kshape[2] != hd or vshape[0] != cap or vshape[1] != nkh
                    or vshape[2] != hd):
                raise ValueError(f"attention_append: storage shape in sequence {s}")
            if st < 0 or cnt < 0 or st + cnt > cap or (st + cnt == 0 and cnt > 0):
                raise ValueError(f"attention_append: sequence {s} does not fit its storage")
            ints[s], ints[n_seq + s] = st, cnt
            total += cnt
        if total != nrows:
            raise ValueError("attention_append: counts do not add up to the rows of q")
        with nogil:
            rc = mc_attention_append(n_seq, &q[0, 0, 0], &k_new[0, 0, 0], &v_new[0, 0, 0], kp, vp,
                                     ints, ints + n_seq, &out[0, 0, 0], nh, nkh, hd, scale,
                                     window, softcap, sp, kv_f16, nth, simd)
    finally:
        free(kp)
        free(vp)
        free(ints)
    if rc == -2:
        raise MemoryError("attention_append: job table")


def causal_conv1d(const float[:, ::1] x, const float[:, ::1] k, bias, float[:, ::1] out,
                  bint silu, int simd=0, int nth=1):
    """out (m, ch) = the causal depthwise convolution of x (w-1+m, ch) with k (ch, w), plus
    ``bias`` (ch,) unless None, through silu when ``silu``."""
    cdef int m = out.shape[0], ch = out.shape[1], w = k.shape[1]
    cdef const float[::1] b
    cdef const float *bp = NULL
    cdef int rc
    if k.shape[0] != ch or x.shape[1] != ch or x.shape[0] != w - 1 + m or w < 1:
        raise ValueError("causal_conv1d: shape mismatch")
    if bias is not None:
        b = bias
        if b.shape[0] != ch:
            raise ValueError("causal_conv1d: bias shape mismatch")
        bp = &b[0] if ch > 0 else NULL
    if m == 0 or ch == 0:
        return
    with nogil:
        rc = mc_causal_conv1d(&x[0, 0], &k[0, 0], bp, &out[0, 0], m, ch, w, silu, simd, nth)
    if rc != 0:
        raise MemoryError("causal_conv1d: kernel buffer")


def delta_scan(const float[:, :, ::1] q, const float[:, :, ::1] k, const float[:, :, ::1] v,
               const float[:, ::1] beta, const float[:, ::1] decay, float[:, :, ::1] s,
               float[:, :, ::1] out, int simd=0, int nth=1):
    """The gated delta rule over m tokens: q, k (m, heads, dk), v and out (m, heads, dv),
    beta and decay (m, heads), the state s (heads, dk, dv) updated in place."""
    cdef int m = q.shape[0], nh = q.shape[1], dk = q.shape[2], dv = v.shape[2]
    cdef int rc
    if (k.shape[0] != m or k.shape[1] != nh or k.shape[2] != dk or v.shape[0] != m
            or v.shape[1] != nh or out.shape[0] != m or out.shape[1] != nh
            or out.shape[2] != dv or beta.shape[0] != m or beta.shape[1] != nh
            or decay.shape[0] != m or decay.shape[1] != nh or s.shape[0] != nh
            or s.shape[1] != dk or s.shape[2] != dv):
        raise ValueError("delta_scan: shape mismatch")
    if m == 0 or nh == 0 or dk == 0 or dv == 0:
        return
    with nogil:
        rc = mc_delta_scan(&q[0, 0, 0], &k[0, 0, 0], &v[0, 0, 0], &beta[0, 0], &decay[0, 0],
                           &s[0, 0, 0], &out[0, 0, 0], m, nh, dk, dv, simd, nth)
    if rc != 0:
        raise ValueError(f"delta_scan: value heads of {dv} are wider than the kernel takes")


def ssm_scan(const float[:, :, ::1] x, const float[:, :, ::1] b, const float[:, :, ::1] c,
             const float[:, ::1] dt, const float[:, ::1] decay, const float[::1] d_skip,
             float[:, :, ::1] s, float[:, :, ::1] out, int simd=0, int nth=1):
    """Mamba-2's selective scan over m tokens: x and out (m, heads, p), b and c (m, heads,
    n), dt and decay (m, heads), d_skip (heads,), the state s (heads, p, n) in place."""
    cdef int m = x.shape[0], nh = x.shape[1], p = x.shape[2], n = b.shape[2]
    if (b.shape[0] != m or b.shape[1] != nh or c.shape[0] != m or c.shape[1] != nh
            or c.shape[2] != n or dt.shape[0] != m or dt.shape[1] != nh
            or decay.shape[0] != m or decay.shape[1] != nh or d_skip.shape[0] != nh
            or s.shape[0] != nh or s.shape[1] != p or s.shape[2] != n or out.shape[0] != m
            or out.shape[1] != nh or out.shape[2] != p):
        raise ValueError("ssm_scan: shape mismatch")
    if m == 0 or nh == 0 or p == 0 or n == 0:
        return
    with nogil:
        mc_ssm_scan(&x[0, 0, 0], &b[0, 0, 0], &c[0, 0, 0], &dt[0, 0], &decay[0, 0],
                    &d_skip[0], &s[0, 0, 0], &out[0, 0, 0], m, nh, p, n, simd, nth)
