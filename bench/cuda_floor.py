"""The floor of a batch-1 decode step on this GPU: a model's weight bytes read as the step
reads them, with no arithmetic, under two structures -- so that what a kernel design could
reach at best is measured before it is written (issue 35, must-show 1's 60 % of the copy).

A GGUF's matrices are grouped as a decode step reads them (a layer's Q+K+V, O, gate+up,
down; then the output head) into one device buffer of the same bytes, and one step is
timed (a CUDA graph replayed; the buffer is far larger than L2, so no step finds the last
one's bytes):

- ``one read``: the whole buffer in one kernel: what a step's bytes cost at best.
- ``kernels``: a kernel a matrix, launched as the CUDA backend launches (programmatic
  dependent launch: each block prefetches its first 16 KB into L2, then waits for the
  kernel before), with ``--small`` dependent small kernels a layer between them (each
  reads a 16 KB vector, reduces it, writes it: a norm's, RoPE's, attention's chain), as
  today's ~9 kernels a layer.
- ``persistent``: one kernel for the whole step, every block resident, a grid-wide barrier
  after each matrix and each small op (5 a layer: QKV, attention, O, gate+up, down); before
  each barrier a block either does nothing (``wait``), prefetches its first 16 KB of the next
  matrix into L2 (``l2``), or loads them into registers (``regs``: a GEMV's weights do not
  depend on the barrier, only its x does) -- the "megakernel" whose overlap across matrices
  the kernel-a-step design lacks; or (``smem``) copies as many of its chunks of the next
  matrix as ``--stage-kb`` of shared memory holds (``cp.async``, not waited for), so the
  weights stream on through the barrier and the small ops: the whole of a layer's QKV or
  O at 2 blocks an SM and ~100 KB a block (~26 MB on 132 SMs), the first part of gate+up
  and down -- what a megakernel could reach if its barriers were hidden by the next
  matrix's reads.

Usage (on the GPU machine): ``python -m bench.cuda_floor --gguf llama8b-q4_k_m.gguf``.
"""

from __future__ import annotations

import argparse
import json
from types import SimpleNamespace
from typing import Any

import numpy as np

CHUNK16 = 1024  # uint4s a block reads a pass (16 KB: 256 threads, 4 loads each)

SRC = r"""
typedef unsigned long long u64;
#if __CUDA_ARCH__ >= 900
#define ENTER() asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory")
#else
#define ENTER()
#endif
#define CH 1024
__device__ __forceinline__ uint4 ldnc(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ void pf_chunk(const uint4* p, long long c, long long n16) {
  long long o = c * CH + threadIdx.x * 8;  // 128 lines of 128 bytes: threads 0..127
  if (threadIdx.x < 128 && o < n16) asm volatile("prefetch.global.L2 [%0];" :: "l"(p + o));
}
// chunk c of p (n16 uint4s) into v (four loads a thread, coalesced)
__device__ __forceinline__ void load_chunk(const uint4* p, long long c, long long n16, uint4* v) {
#pragma unroll
  for (int j = 0; j < 4; j++) {
    long long i = c * CH + j * 256 + threadIdx.x;
    v[j] = i < n16 ? ldnc(p + i) : make_uint4(0, 0, 0, 0);
  }
}
__device__ __forceinline__ unsigned fold(const uint4* v) {
  unsigned s = 0;
#pragma unroll
  for (int j = 0; j < 4; j++) s ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
  return s;
}
// chunks c0, c0 + step, ... of p; the first already in v when have
__device__ __forceinline__ unsigned read_chunks(const uint4* p, long long n16, long long c0, long long step,
                                                uint4* v, bool have) {
  unsigned s = 0;
  long long nc = (n16 + CH - 1) / CH;
  for (long long c = c0; c < nc; c += step) {
    if (!(have && c == c0)) load_chunk(p, c, n16, v);
    s ^= fold(v);
  }
  return s;
}
__device__ __forceinline__ void cp_async16(uint4* smem, const uint4* gmem) {
  unsigned a = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(a), "l"(gmem) : "memory");
}
// this block's first (at most m) chunks of p into st, in flight when it returns; how many
__device__ __forceinline__ int stage_chunks(const uint4* p, long long n16, int m, uint4* st) {
  long long nc = (n16 + CH - 1) / CH;
  int got = 0;
  for (long long c = blockIdx.x; c < nc && got < m; c += gridDim.x, got++) {
#pragma unroll
    for (int j = 0; j < 4; j++) {
      long long i = c * CH + j * 256 + threadIdx.x;
      if (i < n16) cp_async16(st + got * CH + j * 256 + threadIdx.x, p + i);
    }
  }
  asm volatile("cp.async.commit_group;" ::: "memory");
  return got;
}
// the g staged chunks, once landed
__device__ __forceinline__ unsigned fold_staged(const uint4* st, int g) {
  asm volatile("cp.async.wait_all;" ::: "memory");
  __syncthreads();
  unsigned s = 0;
  for (int c = 0; c < g; c++) {
#pragma unroll
    for (int j = 0; j < 4; j++) {
      uint4 v = st[c * CH + j * 256 + threadIdx.x];
      s ^= v.x ^ v.y ^ v.z ^ v.w;
    }
  }
  __syncthreads();  // the stage is free for the next matrix
  return s;
}
// a 16 KB vector read, reduced over the block, written (a small op's dependent chain)
__device__ __forceinline__ void small_op(const float* in, float* out, int n) {
  __shared__ float red[8];
  float s = 0.f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += in[i];
  for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = s;
  __syncthreads();
  float t = 0.f;
  for (int w = 0; w < 8; w++) t += red[w];
  for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = in[i] * 0.999f + t * 1e-9f;
  __syncthreads();
}
extern "C" __global__ void read_k(const uint4* __restrict__ p, long long n16, unsigned* out) {
  pf_chunk(p, blockIdx.x, n16);
  ENTER();
  uint4 v[4];
  unsigned s = read_chunks(p, n16, blockIdx.x, gridDim.x, v, false);
  if (s == 0x9e3779b9u) out[0] = s;  // keeps the loads; never true of these bytes in practice
}
extern "C" __global__ void small_k(const float* __restrict__ in, float* __restrict__ out, int n) {
  ENTER();
  small_op(in, out, n);  // every block writes the same values: a chain, not work
}
// the whole step: phase k reads [off[k], off[k] + n16[k]) of p, or (n16 0) is a small op of
// the first 32 blocks; a phase after a norm (norm[k]) has every block read and reduce the
// 16 KB vector first (a norm each block does itself: no barrier of its own); a grid barrier
// after each phase; mode 0 wait, 1 L2 prefetch, 2 registers, 3 shared memory (stage_chunks:
// the dynamic shared memory's stage16 uint4s, whole chunks of CH)
extern "C" __global__ void persist(const uint4* __restrict__ p, const long long* __restrict__ off,
                                   const long long* __restrict__ n16, const int* __restrict__ norm,
                                   int phases, int mode, unsigned* bar, float* vec, unsigned* out,
                                   int stage16) {
  __shared__ float red[8];
  extern __shared__ uint4 stage[];
  uint4 v[4];
  int have = -1;  // the phase whose first chunk v holds (mode 2) or whose chunks stage does (3)
  int staged = 0;  // mode 3: how many chunks
  unsigned s = 0;
  for (int k = 0; k < phases; k++) {
    long long n = n16[k];
    if (norm[k]) {  // x's sum of squares, each block for itself
      float q = 0.f;
      for (int i = threadIdx.x; i < 4096; i += blockDim.x) q += vec[i] * vec[i];
      for (int o = 16; o; o >>= 1) q += __shfl_xor_sync(0xffffffffu, q, o);
      if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = q;
      __syncthreads();
      if (red[0] == -1.f) s ^= 1u;  // uses the sum
      __syncthreads();
    }
    if (n && mode == 3) {
      long long c0 = blockIdx.x;
      if (have == k) {
        s ^= fold_staged(stage, staged);
        c0 += (long long)staged * gridDim.x;
      }
      s ^= read_chunks(p + off[k], n, c0, gridDim.x, v, false);
    } else if (n) s ^= read_chunks(p + off[k], n, blockIdx.x, gridDim.x, v, have == k);
    else if (blockIdx.x < 32) small_op(vec + (k & 1) * 4096, vec + ((k + 1) & 1) * 4096, 4096);
    // the next read phase's first chunk, before the barrier (it does not depend on it)
    int nk = k + 1;
    while (nk < phases && n16[nk] == 0) nk++;
    if (nk < phases && have < nk) {
      if (mode == 1) pf_chunk(p + off[nk], blockIdx.x, n16[nk]);
      if (mode == 2 && blockIdx.x < (n16[nk] + CH - 1) / CH) {
        load_chunk(p + off[nk], blockIdx.x, n16[nk], v);
        have = nk;
      }
      if (mode == 3) {
        staged = stage_chunks(p + off[nk], n16[nk], stage16 / CH, stage);
        have = nk;
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      unsigned target = (unsigned)(k + 1) * gridDim.x;
      atomicAdd(bar, 1u);
      unsigned seen;
      long long spins = 0;
      do {
        asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(seen) : "l"(bar));
        // not every block resident: give up (and every later barrier at once)
        if (++spins > (1LL << 26) || *(volatile unsigned*)(out + 1)) { out[1] = 1; break; }
      } while (seen < target);
    }
    __syncthreads();
  }
  if (s == 0x9e3779b9u) out[0] = s;
}
"""


def matrices(path: str) -> tuple[list[list[int]], int]:
    """Bytes of each matrix a decode step reads, a list a layer in the step's order (QKV, O,
    gate+up, down), and the output head's."""
    from gguf import GGUFReader

    t = {x.name: int(x.n_bytes) for x in GGUFReader(path).tensors}
    layers = []
    i = 0
    while f"blk.{i}.attn_q.weight" in t:
        b = f"blk.{i}."
        qkv = sum(t[b + f"attn_{k}.weight"] for k in "qkv")
        gu = t[b + "ffn_gate.weight"] + t[b + "ffn_up.weight"]
        layers.append([qkv, t[b + "attn_output.weight"], gu, t[b + "ffn_down.weight"]])
        i += 1
    return layers, t.get("output.weight", t["token_embd.weight"])


def copy_tbs(cp: Any) -> float:
    """The device-to-device copy's bytes read and written a second, in TB/s (4 GiB, ten
    eager copies): the limit the issue's fractions are of, here and in
    ``scripts/cuda_side_by_side.sh``'s ``copy_bw``. (Timed as a graph replay, the same copy
    came out at 2.43 TB/s on an H100 whose eager copy is 3.03: the first floor run's column
    was of that.)"""
    import time

    a = cp.empty(4 << 30, cp.uint8)
    b = cp.empty_like(a)
    b[:] = a
    cp.cuda.Device().synchronize()
    t = time.perf_counter()
    for _ in range(10):
        b[:] = a
    cp.cuda.Device().synchronize()
    return float(2 * a.nbytes / ((time.perf_counter() - t) / 10) / 1e12)


def main() -> None:
    cp: Any = __import__("cupy")  # on the GPU machine only

    from bench.cuda_gemv_sweep import time_graph
    from modelc.runtime.backends.cuda_launch import Launcher

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--small", default="0,5", help="small kernels a layer, for 'kernels'")
    ap.add_argument("--blocks-per-sm", default="2,4", help="the persistent kernel's")
    ap.add_argument(
        "--stage-kb", default="96,48", help="the smem mode's stage a block, at 2 and 4 blocks an SM"
    )
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    layers, head = matrices(args.gguf)
    sizes = [b for ly in layers for b in ly] + [head]
    n16s = [-(-b // 16) for b in sizes]
    offs = np.concatenate([[0], np.cumsum(n16s)[:-1]]).astype(np.int64)
    total16 = int(sum(n16s))
    nbytes = sum(sizes)
    buf = cp.random.randint(0, 2**31, size=total16 * 4, dtype=cp.int32).view(cp.uint8)
    out = cp.zeros(2, cp.uint32)  # [1]: a persistent launch gave up waiting
    vec = cp.ones(2 * 4096, cp.float32)
    mod = cp.RawModule(code=SRC, options=("-std=c++17",))
    pdl = int(cp.cuda.Device().compute_capability) >= 90
    lc = Launcher(cp, gil=False, pdl=pdl)
    read_k, small_k, persist = (
        lc.wrap(mod.get_function(n)) for n in ("read_k", "small_k", "persist")
    )
    sms = int(cp.cuda.Device().attributes["MultiProcessorCount"])
    base = buf.data.ptr

    def timed(step: Any) -> float:
        """ms a step: the step captured once in a graph, replayed (cuda_gemv_sweep's timing)."""
        return 1e3 * time_graph(SimpleNamespace(cp=cp), lambda _: step(), n=1, reps=args.reps)

    def read(k: int) -> None:
        n = n16s[k]
        read_k((-(-n // CHUNK16),), (256,), (np.uint64(base + int(offs[k]) * 16), np.int64(n), out))

    def chain() -> None:
        small_k((32,), (256,), (vec, vec[4096:], np.int32(4096)))

    rows: list[tuple[str, float]] = []

    def one() -> None:
        read_k((sms * 8,), (256,), (buf, np.int64(total16), out))

    rows.append(("one read of every byte", timed(one)))
    for small in (int(v) for v in args.small.split(",")):  # 0 or 5 (a layer's as served)

        def kernels(small: int = small) -> None:
            k = 0
            for ly in layers:
                # small: norm, QKV, RoPE, attention, O, norm, gate+up, SiLU, down
                for j in range(len(ly)):
                    for _ in range(((1, 2, 1, 1) if small else (0, 0, 0, 0))[j]):
                        chain()
                    read(k)
                    k += 1
            chain()
            read(k)

        rows.append((f"kernels, {small} small a layer", timed(kernels)))
    bar = cp.zeros(1, cp.uint32)
    regs = int(persist.fn.num_regs)
    fit = min(8, 65536 // (256 * max(regs, 1)))  # blocks an SM by registers and threads
    for split in (False, True):
        # a layer's phases: QKV, attention (small), O, gate+up, down, each block norming x
        # itself before QKV and gate+up (5 barriers a layer); or (split) the two norms and
        # the SiLU as small phases of their own (8); then the output norm and the head
        ph: list[tuple[int, int, int]] = []  # (uint4s, offset, norm first) a phase
        k = 0
        for ly in layers:
            for j in range(len(ly)):
                if split and j in (0, 2, 3):  # norm, norm, SiLU
                    ph.append((0, 0, 0))
                ph.append((n16s[k], int(offs[k]), int(j in (0, 2) and not split)))
                k += 1
                if j == 0:  # attention
                    ph.append((0, 0, 0))
        if split:
            ph.append((0, 0, 0))
        ph.append((n16s[k], int(offs[k]), int(not split)))
        cols = np.array(ph, np.int64).T
        d_n, d_off, d_norm = (
            cp.asarray(cols[0]),
            cp.asarray(cols[1]),
            cp.asarray(cols[2].astype(np.int32)),
        )
        stage_kb = [int(v) for v in args.stage_kb.split(",")]
        for i, bpsm in enumerate(min(int(v), fit) for v in args.blocks_per_sm.split(",")):
            kb = stage_kb[min(i, len(stage_kb) - 1)]
            smem = kb * 1024 // (CHUNK16 * 16) * CHUNK16 * 16  # whole 16 KB chunks
            persist.fn.max_dynamic_shared_size_bytes = max(smem, 1)
            for mode, name in ((0, "wait"), (1, "l2"), (2, "regs"), (3, f"smem {kb} KB")):

                def persistent(mode: int = mode, bpsm: int = bpsm, d_n: Any = d_n, d_off: Any = d_off,
                               d_norm: Any = d_norm, nph: int = len(ph), smem: int = smem) -> None:  # fmt: skip
                    bar.fill(0)
                    persist(
                        (sms * bpsm,),
                        (256,),
                        (
                            buf,
                            d_off,
                            d_n,
                            d_norm,
                            np.int32(nph),
                            np.int32(mode),
                            bar,
                            vec,
                            out,
                            np.int32(smem // 16 if mode == 3 else 0),
                        ),
                        shared_mem=smem if mode == 3 else 0,
                    )

                ms = timed(persistent)
                if int(out[1].get()):
                    raise SystemExit(f"persistent, {bpsm} blocks an SM: not every block resident")
                what = f"{len(ph) // len(layers)} barriers a layer"
                rows.append((f"persistent, {what}, {bpsm} blocks an SM ({regs} regs), {name}", ms))
    copy_bw = copy_tbs(cp) * 1e12
    print(
        f"{args.gguf}: {len(layers)} layers, {nbytes / 1e9:.3f} GB a step; device copy {copy_bw / 1e12:.2f} TB/s"
    )
    print("| structure | ms a step | GB/s | of the copy |\n|---|---:|---:|---:|")
    for name, ms in rows:
        bw = nbytes / (ms / 1e3)
        print(f"| {name} | {ms:.3f} | {bw / 1e9:,.0f} | {100 * bw / copy_bw:.1f} % |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bytes": nbytes, "copy": copy_bw, "rows": rows}, f)


if __name__ == "__main__":
    main()
