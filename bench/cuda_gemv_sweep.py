"""The decode GEMV kernels of the CUDA backend timed one by one, for each weight shape of
a 1.1B (TinyLlama) and an 8B (Llama 3) layer, each weight type, each kind of GEMV
(``--kinds``: gemv4, q8 = gemvq, wide = :mod:`~modelc.runtime.backends.cuda_gemvw`), each
count of x rows, each split of a row over warps (``wpr``; 0: the device's own choice, as
served) and each variant of the inner loops (``--unrolls`` for gemv4 / gemvq; for wide
``--wide-unrolls``, ``--wide-loads`` and ``--wide-blocks``, one x row's launch bound in
blocks an SM, labelled ``load@blocks``): which settings read the blocks fastest.

Each launch reads a different copy of the weight (copies enough to pass 120 MB, so the
50 MB L2 holds none of them), 40 launches captured in one CUDA graph; the figure is the
graph's time over 40 (launch gaps included, as in a captured decode step) and the GGUF
bytes read a second (the same bytes for every kind: a repacked row is the GGUF row's size,
or at most 15 bytes more).  The last table: each kind's fastest and as-served figures side
by side.

    python3 bench/cuda_gemv_sweep.py --types Q4_0,Q4_K,Q6_K --kinds q8,wide --rows 1,2,4,8
"""

from __future__ import annotations

import argparse
import re
from typing import Any

import numpy as np

from modelc.formats.ir import DType
from modelc.runtime.backend import Weight
from modelc.runtime.backends import cuda_gemvp, cuda_gemvw
from modelc.runtime.backends.cuda import device
from modelc.runtime.backends.cuda_gemvq import Q8_TYPES
from modelc.runtime.backends.cuda_src import source
from tests.gen_cuda_models import random_blocks

SHAPES = {
    "1b qkv": (2560, 2048),
    "1b wo": (2048, 2048),
    "1b gate+up": (11264, 2048),
    "1b down": (2048, 5632),
    "8b qkv": (6144, 4096),
    "8b wo": (4096, 4096),
    "8b gate+up": (28672, 4096),
    "8b down": (4096, 14336),
}
KERNEL = {"gemv4": "gemv4", "q8": "gemvq", "wide": "gemvw", "pipe": "gemvp"}
# the inner loops' unroll pragmas in the source, and what a variant puts there
UNROLLS = {
    "gemvq": r"#pragma unroll \d+(\n    for \(int g = k \* 8)",
    "gemv4": r"#pragma unroll \d+(\n    for \(int g = k \* 4)",
}


def variant(src: str, kind: str, u: int, load: str, blocks: int = 0) -> str:
    """The source with ``kind``'s inner loop unrolled ``u`` times (wide: U units a lane,
    every type, its weights' ``load`` and one x row's launch bound of ``blocks`` an SM; 0:
    as the source has it)."""
    if kind == "wide":
        unroll = dict.fromkeys(cuda_gemvw.WIDE_TYPES, u) if u else None
        old = cuda_gemvw.source()
        assert old in src
        return src.replace(old, cuda_gemvw.source(unroll, load, blocks))
    if not u or kind == "pipe":
        return src
    out, n = re.subn(UNROLLS[KERNEL[kind]], rf"#pragma unroll {u}\1", src)
    assert n == 1, kind
    return out


def time_graph(dev: Any, launch: Any, n: int = 40, reps: int = 5) -> float:
    """Seconds a launch, ``n`` launches (``launch(i)``) captured once and replayed."""
    cp = dev.cp
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        for i in range(3):
            launch(i)
        s.begin_capture()
        for i in range(n):
            launch(i)
        g = s.end_capture()
        g.launch(s)
        s.synchronize()
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record(s)
        for _ in range(reps):
            g.launch(s)
        b.record(s)
        b.synchronize()
    return float(cp.cuda.get_elapsed_time(a, b)) / 1e3 / (n * reps)


def time_gemv(dev: Any, copies: list[Any], x: Any, n: int, y: Any, q8: Any) -> float:
    """Seconds a GEMV of n rows of x, each launch on the next copy of the weight."""

    def launch(i: int) -> None:
        p = copies[i % len(copies)]
        dev._gemv(p, x, p.cols, n, y, p.rows, False, q8)

    return time_graph(dev, launch)


READ_SRC = r"""
extern "C" __global__ void read_all(const uint4* __restrict__ p, long long n16, unsigned* out) {
  unsigned s = 0;
  long long step = (long long)gridDim.x * blockDim.x;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n16; i += 4 * step) {
    uint4 v[4];
#pragma unroll
    for (int j = 0; j < 4; j++)
      if (i + j * step < n16)
        asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
            : "=r"(v[j].x), "=r"(v[j].y), "=r"(v[j].z), "=r"(v[j].w) : "l"(p + i + j * step));
      else v[j] = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int j = 0; j < 4; j++) s ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
  }
  if (s == 0x9e3779b9u) out[0] = s;  // keeps the loads; never true of random bytes in practice
}
"""


def time_read(dev: Any, nbytes: int, grids: list[int]) -> list[tuple[int, float]]:
    """Seconds a pure streaming read of ``nbytes`` (16-byte loads, 4 in flight a thread, no
    arithmetic): the floor a GEMV of that many bytes could reach, launch and ramp included;
    each launch on another copy, as :func:`time_gemv`; for each grid size (0: one pass, a
    block of 256 threads for each 16 KB)."""
    cp = dev.cp
    fn = cp.RawModule(code=READ_SRC).get_function("read_all")
    n16 = nbytes // 16
    copies = [cp.empty(n16 * 16, cp.uint8) for _ in range(max(2, int(120e6 // nbytes) + 1))]
    out = cp.zeros(1, cp.uint32)
    res = []
    for g in grids:
        blocks = g or (n16 + 1023) // 1024

        def launch(i: int, blocks: int = blocks) -> None:
            fn((blocks,), (256,), (copies[i % len(copies)], np.int64(n16), out))

        res.append((g, time_graph(dev, launch)))
    return res


PLAN0 = (cuda_gemvp.TILE_BYTES, cuda_gemvp.STAGE_BYTES, cuda_gemvp.BLOCKS_PER_SM)


def set_plan(plan: str, dev: Any) -> None:
    """cuda_gemvp's plan constants from "TILE_KB:STAGES_KB:BLOCKS" ("": its own), or the wide
    GEMV's grid cap from "waves=N"."""
    dev.waves = int(plan[6:]) if plan.startswith("waves=") else 0
    if plan.startswith("waves="):
        plan = ""
    t, s, b = (int(v) for v in plan.split(":")) if plan else (0, 0, 0)
    cuda_gemvp.TILE_BYTES = t << 10 or PLAN0[0]
    cuda_gemvp.STAGE_BYTES = s << 10 or PLAN0[1]
    cuda_gemvp.BLOCKS_PER_SM = b or PLAN0[2]


def upload_copies(dev: Any, kind: str, w: Weight) -> list[Any]:
    """The weight uploaded as ``kind`` reads it, copies enough to pass 120 MB."""
    dev.gemv_kind = kind
    first = dev.upload([w]).parts[0]
    more = max(0, int(120e6 // first.data.nbytes))
    return [first] + [dev.upload([w]).parts[0] for _ in range(more)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--types", default="Q4_0,Q4_K,Q6_K,Q8_0")
    ap.add_argument("--kinds", default="q8,wide")  # of gemv4, q8, wide
    ap.add_argument("--rows", default="1")  # rows of x, e.g. 1,2,4,8
    ap.add_argument("--unrolls", default="0")  # gemv4 / gemvq; 0: the source as it is
    ap.add_argument("--wide-unrolls", default="0")  # wide's U; 0: cuda_gemvw.WIDE_UNROLL
    # wide's launch bound at one x row, blocks an SM (4: 64 registers a thread; 0: as served)
    ap.add_argument("--wide-blocks", default="0")
    ap.add_argument("--wide-loads", default=cuda_gemvw.LOAD)  # keys of cuda_gemvw.LOADS
    ap.add_argument("--wprs", default="0,1,2,4,8")  # 0: the device's own split
    ap.add_argument("--shapes", default=",".join(SHAPES))
    # pure reads of each shape's bytes beside the GEMVs: grid sizes (0: one pass; e.g. 1056
    # = 8 blocks an SM of an H100, persistent); empty: none
    ap.add_argument("--read-grids", default="")
    # the pipelined GEMV's plans: "TILE_KB:STAGES_KB:BLOCKS_A_SM" each (cuda_gemvp's
    # TILE_BYTES, STAGE_BYTES, BLOCKS_PER_SM); empty: the module's own
    ap.add_argument("--pipe-plans", default="")
    ap.add_argument("--waves", default="0")  # the wide GEMV's grid caps (MODELC_CUDA_GEMV_WAVES)
    args = ap.parse_args()
    dev = device()
    cp = dev.cp
    rng = np.random.default_rng(0)
    kinds = args.kinds.split(",")
    src = source()
    mods: dict[tuple[str, int, str], Any] = {}
    for kind in kinds:
        loads = args.wide_loads.split(",") if kind == "wide" else [""]
        us = args.wide_unrolls if kind == "wide" else args.unrolls
        blocks = [int(b) for b in args.wide_blocks.split(",")] if kind == "wide" else [0]
        for u in map(int, us.split(",")):
            for load, nb in ((ld, b) for ld in loads for b in blocks):
                vsrc = variant(src, kind, u, load or cuda_gemvw.LOAD, nb)
                plain = vsrc == src
                mods[kind, u, load + (f"@{nb}" if nb else "")] = (  # na@3: 3 blocks an SM
                    None if plain else cp.RawModule(code=vsrc, options=("-std=c++17",))
                )
    base_fn, wpr0 = dict(dev.fn), dev._wpr
    best: dict[tuple[str, str, int, str], tuple[float, float]] = {}  # (fastest, as served)
    print("| shape | type | rows | MB | kind | variant | wpr | us | GB/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for sname in args.shapes.split(","):
        rows, cols = SHAPES[sname]
        for tname in args.types.split(","):
            dt = DType[tname]
            data, _ = random_blocks(rng, dt, rows, cols, 0.02)
            w = Weight(dt, (rows, cols), data)
            nbytes = int(np.ascontiguousarray(data).nbytes)  # the GGUF bytes
            mb = nbytes / 1e6
            if args.read_grids:
                for g, t in time_read(dev, nbytes, [int(v) for v in args.read_grids.split(",")]):
                    print(f"| {sname} | {tname} | - | {mb:.1f} | read | grid {g or 'one pass'} | - | "
                          f"{t * 1e6:.2f} | {nbytes / t / 1e9:.0f} |")  # fmt: skip
            for kind in kinds:
                code = dev.upload([w]).parts[0].code
                if kind == "q8" and code not in Q8_TYPES:
                    continue
                if kind == "wide" and code not in cuda_gemvw.WIDE_TYPES:
                    continue
                copies = upload_copies(dev, kind, w)
                for n in map(int, args.rows.split(",")):
                    x = cp.asarray(rng.standard_normal((n, cols)).astype(np.float32))
                    y = cp.zeros((n, rows), np.float32)
                    q8 = dev._quant_q8(x, cols, n, cols) if kind != "gemv4" else None
                    for (k, u, load), mod in mods.items():
                        if k != kind:
                            continue
                        wprs = list(map(int, args.wprs.split(",")))
                        plans = [""]
                        if kind == "pipe":  # no warps-a-row choice: its plans instead
                            wprs, plans = [0], args.pipe_plans.split(",")
                        if kind == "wide":  # its grid: capped at N waves (0: none)
                            plans = [
                                f"waves={w}" if w != "0" else "" for w in args.waves.split(",")
                            ]
                        for wpr, plan in ((w, pl) for w in wprs for pl in plans):
                            set_plan(plan, dev)
                            if mod is not None:
                                for name in base_fn:
                                    if name.startswith(KERNEL[kind] + "_"):
                                        dev.fn[name] = mod.get_function(name)
                            if wpr:
                                setattr(dev, "_wpr", lambda p, per, w=wpr: w)  # noqa: B010
                                dev.wpr = wpr  # the wide GEMV's
                            name = f"{u or 'src'}{'/' + load if load else ''}{'/' + plan if plan else ''}"
                            try:
                                t = time_gemv(dev, copies, x, n, y, q8)
                            except Exception as e:  # a split the row cannot take
                                print(f"| {sname} | {tname} | {n} | {mb:.1f} | {kind} | {name} | "
                                      f"{wpr} | {type(e).__name__} | |")  # fmt: skip
                                continue
                            finally:
                                dev.fn.update(base_fn)
                                setattr(dev, "_wpr", wpr0)  # noqa: B010
                                dev.wpr = 0
                            gbs = nbytes / t / 1e9
                            print(f"| {sname} | {tname} | {n} | {mb:.1f} | {kind} | {name} | "
                                  f"{wpr or 'auto'} | {t * 1e6:.2f} | {gbs:.0f} |")  # fmt: skip
                            key = (sname, tname, n, kind)
                            fast, served = best.get(key, (0.0, 0.0))
                            as_served = not wpr and mod is None and not plan
                            best[key] = (max(fast, gbs), gbs if as_served else served)
                copies.clear()
                cp.get_default_memory_pool().free_all_blocks()
    dev.read_env()
    print("\n| shape | type | rows | " + " | ".join(f"{k} best | {k} served" for k in kinds) + " |")
    print("|---|---|---|" + "---|---|" * len(kinds))
    for sname, tname, n in dict.fromkeys((s, t, n) for s, t, n, _ in best):
        cells = [best.get((sname, tname, n, k), (0.0, 0.0)) for k in kinds]
        figs = " | ".join(f"{f:.0f} | {s:.0f}" for f, s in cells)
        print(f"| {sname} | {tname} | {n} | {figs} |")


if __name__ == "__main__":
    main()
