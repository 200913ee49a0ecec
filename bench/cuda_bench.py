"""CUDA decode throughput (issue 16, must-show 2): modelc's GPU path against the memory
bandwidth limit and against transformers ``generate`` (bf16) on the same GPU.

For each model (SmolLM2-135M Q4_1, random ~1.1B llama GGUFs in Q4_0 and Q8_0):

* batch 1: greedy decode steps (CUDA graph replay, argmax on the device), median step
  time over 3 runs of 128 steps after a 32-token prompt; bandwidth fraction =
  (bytes of weights one step reads) / step time / 4.8 TB/s (``--bw``: an H100 SXM's 3.35);
* aggregate at N = 8, 32, 64, 128 streams: N sequences decoding together, one batched
  step each token (the model level: what the engine's steps run), tokens/s = N * steps /
  time;
* transformers: ``LlamaForCausalLM`` of the same shape in bf16 (random weights; speed does
  not depend on their values), ``generate`` greedy, batch N, 32-token prompts; decode
  tokens/s from (time of 65 new tokens - time of 1) over 64 tokens;
* with ``--engine``: the unchanged engine on ``--device cuda`` (SmolLM2, 64 concurrent
  requests of 64 tokens, greedy and with llama-server's default sampler settings, each
  sampled on the GPU (``--device-sampling auto``) and on the host (``off``)): aggregate
  tokens/s;
* with ``--types Q5_K,IQ4_XS,Q4_K_M,...``: the random 1.1B in those types too (written to
  ``--dir`` if missing), in their own blocks; ``--model PATH`` (repeated) any GGUF;
* with ``--offload PATH [--ngl N]`` (partial offload, issue 35's must-show 4): batch-1
  greedy decode of that model (``python -m tests.gen_cuda_models DIR 8b`` writes an
  8B-shaped Q4_0) all on the CPU kernels and with its first N layers on the GPU (default
  half), tokens/s of each and how many greedy tokens agree (default mode: the CPU's int8
  activations; parity in exact mode is ``tests/test_cuda_offload.py``'s).

    python3 bench/cuda_bench.py --smollm2 PATH --dir DIR_OF_1B_GGUFS [--engine] [--json OUT]
    python3 bench/cuda_bench.py --offload DIR/llama8b-q4_0.gguf --ngl 16
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from modelc.formats import load_model
from modelc.formats.ir import DType, ModelIR
from modelc.runtime.backends.cuda_backend import CudaBackend
from modelc.runtime.backends.cuda_llama import CudaLlama
from modelc.runtime.model import SeqChunk

BW = 4.8e12
STREAMS = (1, 8, 32, 64, 128)


def decode_rate(model: CudaLlama, n: int, steps: int, reps: int = 3, prompt_len: int = 32) -> float:
    """Median seconds per batched decode step of ``n`` sequences after prompts of
    ``prompt_len`` tokens (the decode's attention reads that many positions and more)."""
    rng = np.random.default_rng(n)
    times = []
    for _ in range(reps):
        caches = [model.new_cache("f16", max_tokens=prompt_len + steps + 2) for _ in range(n)]
        prompts = [rng.integers(0, model.n_vocab, prompt_len).tolist() for _ in range(n)]
        for i in range(0, n, 16):  # prefill 16 prompts a step
            model.forward_greedy(
                [
                    SeqChunk(c, p)
                    for c, p in zip(caches[i : i + 16], prompts[i : i + 16], strict=True)
                ]
            )
        last = [p[-1] for p in prompts]
        model.forward_greedy([SeqChunk(c, [t]) for c, t in zip(caches, last, strict=True)])  # warm
        model.stream.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            last = model.forward_greedy(
                [SeqChunk(c, [int(t)]) for c, t in zip(caches, last, strict=True)]
            ).tolist()
        times.append((time.perf_counter() - t0) / steps)
        for c in caches:
            c.free()
    return statistics.median(times)


def greedy_rate(model: Any, prompt: list[int], n: int) -> tuple[list[int], float]:
    """``n`` greedy tokens after ``prompt`` (one sequence, f16 cache); decode tokens/s."""
    cache = model.new_cache("f16", max_tokens=len(prompt) + n + 1)
    out = [int(np.argmax(model.forward([SeqChunk(cache, prompt)])[0]))]
    t0 = time.perf_counter()
    while len(out) < n:
        out.append(int(np.argmax(model.forward([SeqChunk(cache, [out[-1]])])[0])))
    rate = (n - 1) / (time.perf_counter() - t0)
    cache.free()
    return out, rate


def offload_rows(path: Path, ngl: str, steps: int) -> list[dict[str, Any]]:
    """Batch-1 decode all on the CPU and with the first ``ngl`` layers on the GPU."""
    from modelc.runtime.arch import build
    from modelc.runtime.backends.cuda_offload import build_offload
    from modelc.runtime.backends.factory import get_backend

    ir = load_model(path)
    n = ir.hparams.n_layer
    k = n // 2 if ngl == "half" else int(ngl)
    prompt = np.random.default_rng(6).integers(0, ir.hparams.n_vocab or 32000, 32).tolist()
    split = build_offload(
        ir, k, get_backend, kv_mode="f16", max_context=1024, max_concurrent=1, kv_budget_bytes=None
    )
    assert split is not None
    toks_gpu, gpu_rate = greedy_rate(split, prompt, steps)
    del split
    toks_cpu, cpu_rate = greedy_rate(build(ir, get_backend()), prompt, steps)
    same = next(
        (i for i, (a, b) in enumerate(zip(toks_gpu, toks_cpu, strict=True)) if a != b), steps
    )
    name = path.name
    return [
        {"model": f"{name} all CPU", "streams": 1, "tok_s": cpu_rate},
        {"model": f"{name} -ngl {k} of {n}", "streams": 1, "tok_s": gpu_rate, "greedy_equal": same},
    ]


VARIANTS: list[tuple[str, dict[str, Any], tuple[int, ...]]] = [
    ("first GEMV (a lane a group)", {"gemv_kind": "gemv"}, (1, 8)),
    ("GEMV without split rows", {"split_k": False}, (1, 8)),
    ("no CUDA graphs", {"use_graphs": False}, (1, 8)),
    ("cuBLAS from 1 row", {"gemv_max": 0}, (8, 16)),
    ("GEMV passes up to 128 rows", {"gemv_max": 128}, (32, 64, 128)),
]


def variant_rate(model: CudaLlama, cfg: dict[str, Any], n: int, steps: int) -> float:
    dev = model.dev
    saved = (dev.gemv_kind, dev.gemv_max, model.use_graphs, dev.split_k)
    dev.gemv_kind = cfg.get("gemv_kind", dev.gemv_kind)
    dev.split_k = cfg.get("split_k", dev.split_k)
    dev.gemv_max = cfg.get("gemv_max", dev.gemv_max)
    model.use_graphs = cfg.get("use_graphs", model.use_graphs)
    model.reset_graphs()
    try:
        return decode_rate(model, n, steps)
    finally:
        dev.gemv_kind, dev.gemv_max, model.use_graphs, dev.split_k = saved
        model.reset_graphs()


def hf_rate(ir: ModelIR, n: int) -> float:
    """transformers generate, bf16, batch n: seconds per decode step."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    hp = ir.hparams
    cfg = LlamaConfig(
        vocab_size=hp.n_vocab,
        hidden_size=hp.n_embd,
        intermediate_size=hp.n_ff,
        num_hidden_layers=hp.n_layer,
        num_attention_heads=hp.n_head,
        num_key_value_heads=hp.n_head_kv or hp.n_head,
        max_position_embeddings=2048,
        rms_norm_eps=hp.norm_eps,
        rope_theta=hp.rope_theta,
        tie_word_embeddings="output.weight" not in ir.tensors,
    )
    key = (hp.n_embd, hp.n_layer, hp.n_vocab)
    if key not in _HF:
        _HF.clear()
        torch.manual_seed(0)
        _HF[key] = LlamaForCausalLM(cfg).to(device="cuda", dtype=torch.bfloat16).eval()
    m = _HF[key]
    ids = torch.randint(0, hp.n_vocab, (n, 32), device="cuda")

    def gen(k: int) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            m.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=k,
                min_new_tokens=k,
                do_sample=False,
                pad_token_id=0,
            )
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    gen(65)  # warm-up
    long = statistics.median(gen(65) for _ in range(3))
    short = statistics.median(gen(1) for _ in range(3))
    return (long - short) / 64


_HF: dict[Any, Any] = {}


# llama-server's default sampler settings (top-k 40, top-p 0.95, min-p 0.05, temperature 0.8)
LLAMA_DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}


def engine_rate(
    path: Path, n_streams: int, n_tokens: int, sampling: str = "auto", greedy: bool = True
) -> float:
    """Aggregate tokens/s of ``n_streams`` concurrent requests through the engine, sampled
    with ``--device-sampling sampling``: greedy, or seeded with llama-server's defaults."""
    import trio

    from modelc.engine import EngineOptions, build_engine
    from modelc.engine.api import GenerationRequest, TokenEvent
    from modelc.runtime.sampling import SamplingParams

    opt = EngineOptions(
        device="cuda",
        max_concurrent=n_streams,
        speculative=False,
        prefill_chunk=0,
        device_sampling=sampling,
    )
    eng = build_engine(path, opt)
    assert eng.tok is not None
    stamps: list[float] = []

    async def one(i: int) -> None:
        settings: dict[str, Any] = {"temperature": 0.0} if greedy else LLAMA_DEFAULTS
        p = SamplingParams(max_tokens=n_tokens, seed=i, **settings)
        prompt = eng.tok.encode(f"Story {i}: once upon a time in a land far away,")  # type: ignore[union-attr]
        async for ev in eng.submit(GenerationRequest(f"s{i}", prompt, p, ignore_eos=True)):
            if isinstance(ev, TokenEvent):
                stamps.append(time.perf_counter())

    async def main() -> None:
        async with trio.open_nursery() as n:
            await n.start(eng.run)
            async with trio.open_nursery() as m:
                for i in range(n_streams):
                    m.start_soon(one, i)
            n.cancel_scope.cancel()

    trio.run(main)
    stamps.sort()
    first = stamps[n_streams - 1]  # every stream has its first token
    later = [s for s in stamps if s > first]
    return len(later) / (later[-1] - first)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smollm2", type=Path)
    ap.add_argument("--dir", type=Path, help="folder of llama1b-q4_0.gguf / llama1b-q8_0.gguf")
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--prompt-len", type=int, default=32, help="tokens before the decode steps")
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--engine", action="store_true")
    ap.add_argument("--streams", default=",".join(map(str, STREAMS)))
    ap.add_argument("--variants", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--types", default="", help="more weight types for the random 1.1B")
    ap.add_argument("--model", type=Path, action="append", default=[], help="more GGUF files")
    ap.add_argument("--offload", type=Path, help="a GGUF to run with --ngl layers on the GPU")
    ap.add_argument("--ngl", default="half", help="--offload: layers on the GPU (half)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--bw", type=float, default=BW, help="the card's bytes/s (bandwidth share)")
    args = ap.parse_args()
    models: list[tuple[str, Path]] = []
    if args.smollm2:
        models.append(("SmolLM2-135M Q4_1", args.smollm2))
    if args.dir:
        models += [
            (f"random 1.1B {q}", args.dir / f"llama1b-{q.lower()}.gguf")
            for q in ("Q4_0", "Q8_0")
            if (args.dir / f"llama1b-{q.lower()}.gguf").exists() or not args.types
        ]
    for q in filter(None, args.types.split(",")):
        from tests.gen_cuda_models import Q4_K_M, write_random_llama

        path = args.dir / f"llama1b-{q.lower()}.gguf"
        if not path.exists():
            write_random_llama(path, Q4_K_M if q == Q4_K_M else DType[q])
        models.append((f"random 1.1B {q}", path))
    models += [(p.name, p) for p in args.model]
    rows: list[dict[str, Any]] = []
    if args.offload:
        for row in offload_rows(args.offload, args.ngl, args.steps):
            rows.append(row)
            print(json.dumps(row), flush=True)
    be = CudaBackend()
    for name, path in models:
        ir = load_model(path)
        model = CudaLlama(ir, be)
        for n in [int(v) for v in args.streams.split(",")]:
            steps = args.steps if n <= 16 else max(32, args.steps // 2)
            t = decode_rate(model, n, steps, prompt_len=args.prompt_len)
            row: dict[str, Any] = {
                "model": name,
                "streams": n,
                "step_ms": t * 1e3,
                "tok_s": n / t,
                "weight_bytes": model.weight_bytes,
                "prompt_len": args.prompt_len,
            }
            if n == 1:
                row["bw_fraction"] = model.weight_bytes / t / args.bw
            if not args.no_hf:
                th = hf_rate(ir, n)
                row["hf_tok_s"] = n / th
                row["ratio_vs_hf"] = th / t
            rows.append(row)
            print(json.dumps(row), flush=True)
        for label, cfg, ns in VARIANTS if args.variants else []:
            for n in ns:
                t = variant_rate(model, cfg, n, args.steps if n <= 16 else max(32, args.steps // 2))
                row = {
                    "model": f"{name}, {label}",
                    "streams": n,
                    "step_ms": t * 1e3,
                    "tok_s": n / t,
                }
                if n == 1:
                    row["bw_fraction"] = model.weight_bytes / t / args.bw
                rows.append(row)
                print(json.dumps(row), flush=True)
        print(f"{name}: graphs on the cuBLAS path: {model.graph_error or 'captured'}", flush=True)
        del model
        be.cp.get_default_memory_pool().free_all_blocks()
    if args.engine and args.smollm2:  # sampled on the GPU (auto) and on the host (off)
        for greedy in (True, False):
            for sampling in ("on", "off"):
                rate = engine_rate(args.smollm2, 64, 64, sampling, greedy)
                how = "greedy" if greedy else "t0.8 k40 p0.95 min-p0.05"
                name = f"SmolLM2 engine --device cuda, {how}, --device-sampling {sampling}"
                rows.append({"model": name, "streams": 64, "tok_s": rate})
                print(json.dumps(rows[-1]), flush=True)
    print(
        f"\n| model | streams | step ms | tok/s | of {args.bw / 1e12:.2f} TB/s | transformers bf16 tok/s | ratio |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        bw = f"{100 * r['bw_fraction']:.0f}%" if "bw_fraction" in r else ""
        hf = f"{r['hf_tok_s']:.0f}" if "hf_tok_s" in r else ""
        ratio = f"{r['ratio_vs_hf']:.2f}" if "ratio_vs_hf" in r else ""
        ms = f"{r['step_ms']:.3f}" if "step_ms" in r else ""
        print(
            f"| {r['model']} | {r['streams']} | {ms} | {r['tok_s']:.0f} | {bw} | {hf} | {ratio} |"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
