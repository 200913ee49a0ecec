"""Several GGUFs against llama.cpp in one run: how close a K-quant model comes to SmolLM2.

    .venv/bin/python -m bench.side_by_side --models smollm2,gemma3,PATH.gguf [--modes fast]
        [--pair-rounds 5] [--llama-configs default,OMP_WAIT_POLICY=passive] [--no-write]

For each model (``smollm2``: SmolLM2-135M-Instruct Q4_1, ``gemma3``: Gemma 3 270M
Q4_K_M, both from ``tests.assets``; anything else a GGUF path, e.g. the random llama-1B
Q4_K_M of ``bench/big_models.py``): prefill tokens/s of one prompt and decode tokens/s at
batch 1 and 8, modelc (first mode of ``--modes``, in this process) against llama.cpp's
server (its own timings), same file, same threads, in paired rounds (``bench.paired``):
every model and server stays loaded, and each round measures every model on both
sides back to back.  The table gives each model's median modelc / llama.cpp ratio and,
for every model after the first, the median over rounds of its ratio divided by the
first model's in the same round (issue 13's must-show 3: >= 0.9 for a K-quant model
against SmolLM2).  Written to the "several models in paired rounds" section of
``bench/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shlex
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from bench.paired import PairedModel, PairedResult, run_rounds
from bench.side_by_side import LLAMA_CONFIGS, LoadWatch, git_commit, write_results

HEADING = "## Side by side, several models in paired rounds (`bench.side_by_side --models`)"
ROWS = (("decode_b1", "decode tok/s, batch 1"), ("decode_b8", "decode tok/s, batch 8"))
TARGET = 0.9


def resolve(name: str) -> tuple[str, Path]:
    """A ``--models`` entry as (label, GGUF path)."""
    from tests.assets import gemma3_gguf, smollm2_gguf

    if name == "smollm2":
        return "SmolLM2-135M Q4_1", smollm2_gguf()
    if name == "gemma3":
        return "Gemma 3 270M Q4_K_M", gemma3_gguf()
    path = Path(name).expanduser()
    if not path.is_file():
        raise SystemExit(f"--models: {name!r} is neither smollm2, gemma3 nor a GGUF file")
    return path.stem, path


def encoder(gguf: Path) -> Callable[[str], list[int]]:
    from modelc.formats import load_model
    from modelc.runtime.tokenizer import Tokenizer

    spec = load_model(gguf).tokenizer
    assert spec is not None
    tok = Tokenizer(spec)
    return lambda s: list(tok.encode(s, add_special=False))


def gguf_types(gguf: Path) -> str:
    """The weight types of a GGUF's matrices with their share of its bytes, e.g. "Q4_K 62%"."""
    import gguf as g

    r = g.GGUFReader(str(gguf))
    sizes: dict[str, int] = {}
    for t in r.tensors:
        if len(t.shape) >= 2:
            sizes[t.tensor_type.name] = sizes.get(t.tensor_type.name, 0) + int(t.n_bytes)
    total = sum(sizes.values()) or 1
    return ", ".join(
        f"{k} {100 * v / total:.0f}%" for k, v in sorted(sizes.items(), key=lambda kv: -kv[1])
    )


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def table(runs: list[PairedResult], prefill_len: int) -> str:
    """Per quantity and model: median tok/s a side and of the rounds' ratios; per later
    model, the median of its ratio over the first model's, round by round."""
    rows = (("prefill", f"prefill tok/s, {prefill_len}-token prompt"), *ROWS)
    base = runs[0]
    head = ["measurement (median of the rounds)"]
    for r in runs:
        head += [f"{r.label}: modelc", "llama.cpp", "ratio"]
    head += [f"{r.label} ratio / {base.label} ratio (range)" for r in runs[1:]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for attr, label in rows:
        cells = [label]
        for r in runs:
            cells += [
                f"{r.modelc_tps(attr):,.1f}",
                f"{r.peer_tps(attr):,.1f}",
                f"{r.ratio(attr):.2f}x",
            ]
        for r in runs[1:]:
            rr = [ratio(q, b) for q, b in zip(r.ratios(attr), base.ratios(attr), strict=True)]
            m = statistics.median(rr)
            cells.append(f"{m:.2f} {'✓' if m >= TARGET else '✗'} ({min(rr):.2f}-{max(rr):.2f})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def compare(args: argparse.Namespace) -> int:
    """``bench.side_by_side --models``: see the module docstring."""
    mode = args.modes.split(",")[0].strip()
    configs = {c: LLAMA_CONFIGS[c] for c in args.llama_configs.split(",") if c}
    load = LoadWatch()
    started = dt.datetime.now(dt.UTC)
    with tempfile.TemporaryDirectory(prefix="modelc-sbs-") as d:
        models = []
        for name in args.models.split(","):
            label, path = resolve(name.strip())
            models.append(
                PairedModel(
                    label,
                    path,
                    encoder(path),
                    threads=args.threads,
                    mode=mode,
                    configs=configs,
                    log_dir=Path(d),
                    prefill_len=args.prefill_len,
                    steps=args.decode_steps,
                    ctx_per_seq=args.ctx_per_seq,
                )
            )
        run_rounds(models, args.pair_rounds, lambda m: print(f"[models] {m}", file=sys.stderr))
    runs = [m.result for m in models]
    loads = load.stop()
    secs = (dt.datetime.now(dt.UTC) - started).total_seconds()
    commit = git_commit()
    cmd = ".venv/bin/python -m bench.side_by_side " + shlex.join(sys.argv[1:])
    files = "\n".join(f"- {m.result.label}: `{m.gguf.name}` ({gguf_types(m.gguf)})" for m in models)
    md = f"""{HEADING}

Command (run {started:%Y-%m-%d %H:%M} UTC, {secs:.0f} s, at commit {commit};
{os.cpu_count()} cores; 1-minute load average {load.before:.2f} before,
{min(loads):.2f} / {sum(loads) / len(loads):.2f} / {max(loads):.2f} min / mean / max during the run;
other jobs share the machine):

```sh
{cmd.strip()}
```

{files}

modelc's `{mode}` mode (the runtime's batch API in the benchmark's own process) against
llama.cpp's server (one per configuration: {", ".join(f"`{c}`" for c in configs)}; its own
timings), same file, {args.threads} threads each, every model and server loaded for the whole
run. {args.pair_rounds} paired rounds (`bench.paired`): each round measures every model, on each
side back to back (the order flipping from round to round, a server stopped with SIGSTOP
while it is not measured): prefill of one {args.prefill_len}-token prompt (best of 2),
{args.decode_steps} greedy decode steps after 16-token prompts at batch 1 (best of 3) and
8 (best of 2). Each ratio is modelc over the better llama.cpp configuration; a cell is the
median of the rounds. The last columns divide, round by round, each model's ratio by the
first model's in the same round, and give the median and range (target >= {TARGET}).

{table(runs, args.prefill_len)}
"""
    print(md)
    if not args.no_write:
        write_results(md, HEADING)
    return 0
