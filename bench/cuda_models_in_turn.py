"""Models built one after another in one process on the GPU, each freed before the next
(as a server that swaps models does): a prompt of 16 sequences (cuBLAS products) and a
few decode steps with each, the device synchronized after every stage so that a failure
names its stage.  Session 23 saw the third of three models (the 8B after two 1.1Bs, in
``bench/cuda_bench.py --model ... --model ... --model ...``) fail at its first cuBLAS
product with an illegal address; each alone ran.  Run it in a process of its own: an
illegal address leaves the process's CUDA context unusable.

    python3 bench/cuda_models_in_turn.py DIR/llama1b-q4_0.gguf DIR/llama1b-q4_k_m.gguf DIR/llama8b-q4_k_m.gguf
"""

from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path

import numpy as np

from modelc.formats import load_model
from modelc.runtime.backends.cuda_backend import CudaBackend
from modelc.runtime.backends.cuda_llama import CudaLlama
from modelc.runtime.model import SeqChunk


def run_one(path: Path, be: CudaBackend, collect: bool) -> None:
    stage = "load"
    try:
        model = CudaLlama(load_model(path), be)
        stage = "prompts"
        rng = np.random.default_rng(1)
        caches = [model.new_cache("f16", max_tokens=64) for _ in range(16)]
        prompts = [rng.integers(3, 1000, 32).tolist() for _ in caches]
        last = model.forward_greedy([SeqChunk(c, p) for c, p in zip(caches, prompts, strict=True)])
        model.stream.synchronize()
        stage = "decode"
        for _ in range(4):
            last = model.forward_greedy(
                [SeqChunk(c, [int(t)]) for c, t in zip(caches, last.tolist(), strict=True)]
            )
        model.stream.synchronize()
        print(f"{path.name}: ok", flush=True)
        stage = "free"
        for c in caches:
            c.free()
        del model, caches
        if collect:
            gc.collect()
        be.cp.cuda.Device().synchronize()
    except Exception as e:
        print(f"{path.name}: failed at {stage}: {type(e).__name__}: {e}", flush=True)
        sys.exit(1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", type=Path, nargs="+")
    ap.add_argument("--no-collect", action="store_true", help="no gc.collect() after a free")
    args = ap.parse_args()
    be = CudaBackend()
    for path in args.models:
        run_one(path, be, not args.no_collect)


if __name__ == "__main__":
    main()
