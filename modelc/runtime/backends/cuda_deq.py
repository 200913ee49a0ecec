"""The CUDA backend's dequantizer before cuBLAS (CUDA C, appended after :mod:`.cuda_gemv`).

``deq_rows`` (in :mod:`.cuda_src`) gave each thread a whole 32-weight group: a warp's
stores were 32 scalar writes at a 64-byte (f16) stride between lanes, and the weight
blocks were read two bytes at a time (an H100 profile: 13.4 of a 17 ms step at 64
streams, ~0.2 TB/s).  ``deq8`` gives four lanes a group, eight consecutive weights each
(two ``deq4<T>``: the same float steps, so the f32 output is bit for bit ``deq_rows``'),
so a warp writes eight whole groups of one row back to back (512 bytes of f16) in 16-byte
stores; a block covers 256 x 8 weights of a single row, so no thread divides by the
width.  ``MODELC_CUDA_DEQ=deq32`` selects the old kernel (before/after figures).  A part in
:mod:`.cuda_gemvw`'s repacked layout takes the same launch (``deq8w_{type}_{f16}``, its
``deq4w<T>`` reading the repacked row).

``deq8_piece`` is the per-thread body, apart from the launch, so
``tests/test_cuda_quants_host.py`` runs it for every thread index on the CPU.
"""

from __future__ import annotations

DEQ_KINDS = ("deq8", "deq32")

SOURCE = r"""
// weights 4 sub .. 4 sub + 3 of group g of a row in cuda_gemvw's repacked layout (its
// specializations there), the float steps of deq4<T>
template <int T> __device__ __forceinline__ void deq4w(const u8* __restrict__ row, int cols, int g, int sub, float* w);

// piece c (8 weights: group c / 4, weights 8 (c % 4) ..) of row ids[i] (or i) -> out row i;
// vec: 16-byte stores (out and ldo aligned for them); L: the row in the repacked layout
template <int T, int F16O, int L>
__device__ __forceinline__ void deq8_piece(const u8* __restrict__ W, long long rb, int cols,
                                           const i64* __restrict__ ids, int i, int c,
                                           void* __restrict__ out, int ldo, int vec) {
  long long src = ids ? ids[i] : i;
  const u8* row = W + (size_t)src * rb;
  float w[8];
  if constexpr (L) {
    deq4w<T>(row, cols, c >> 2, (c & 3) * 2, w);
    deq4w<T>(row, cols, c >> 2, (c & 3) * 2 + 1, w + 4);
  } else {
    deq4<T>(row, c >> 2, (c & 3) * 2, w);
    deq4<T>(row, c >> 2, (c & 3) * 2 + 1, w + 4);
  }
  if (F16O) {
    u16* o = (u16*)out + (size_t)i * ldo + (size_t)c * 8;
    if (vec) {
      uint4 v;
      v.x = pack_h2(w[0], w[1]); v.y = pack_h2(w[2], w[3]);
      v.z = pack_h2(w[4], w[5]); v.w = pack_h2(w[6], w[7]);
      *(uint4*)o = v;
    } else {
#pragma unroll
      for (int k = 0; k < 8; k++) o[k] = f2h(w[k]);
    }
  } else {
    float* o = (float*)out + (size_t)i * ldo + (size_t)c * 8;
    if (vec) {
      float4 a, b;
      a.x = w[0]; a.y = w[1]; a.z = w[2]; a.w = w[3];
      b.x = w[4]; b.y = w[5]; b.z = w[6]; b.w = w[7];
      ((float4*)o)[0] = a; ((float4*)o)[1] = b;
    } else {
#pragma unroll
      for (int k = 0; k < 8; k++) o[k] = w[k];
    }
  }
}

// grid n * bpr blocks of 256: block b takes pieces (b % bpr) * 256 .. of row b / bpr
template <int T, int F16O, int L = 0>
__device__ __forceinline__ void deq8(const u8* __restrict__ W, long long rb, int cols,
                                     const i64* __restrict__ ids, int bpr, void* __restrict__ out,
                                     int ldo, int vec) {
  int i = blockIdx.x / bpr, c = (blockIdx.x % bpr) * blockDim.x + threadIdx.x;
  if (c < (cols >> 3)) deq8_piece<T, F16O, L>(W, rb, cols, ids, i, c, out, ldo, vec);
}
"""


def instances(types: tuple[int, ...]) -> str:
    return "\n".join(
        f'extern "C" __global__ void deq8_{t}_{f16}(const u8* W, long long rb, int cols, '
        "const i64* ids, int bpr, void* out, int ldo, int vec) "
        f"{{ ENTER(); deq8<{t}, {f16}>(W, rb, cols, ids, bpr, out, ldo, vec); }}"
        for t in types
        for f16 in (0, 1)
    )


def names(types: tuple[int, ...]) -> list[str]:
    return [f"deq8_{t}_{f}" for t in types for f in (0, 1)]


def launch_shape(n: int, cols: int) -> tuple[int, int]:
    """(blocks, blocks a row) for ``n`` rows of ``cols`` weights, 256 threads a block."""
    bpr = (cols // 8 + 255) // 256
    return n * bpr, bpr


def can_vec(ptr: int, ldo: int, itemsize: int) -> bool:
    """16-byte stores fit: the output starts and every row stays 16-byte aligned."""
    return ptr % 16 == 0 and (ldo * itemsize) % 16 == 0
