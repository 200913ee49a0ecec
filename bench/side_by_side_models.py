"""Several GGUFs against llama.cpp in one run: how close a K-quant model comes to SmolLM2.

    .venv/bin/python -m bench.side_by_side --models smollm2,gemma3,PATH.gguf [--modes fast]
        [--rounds 2] [--llama-configs default,OMP_WAIT_POLICY=passive] [--no-write]

For each model (``smollm2``: SmolLM2-135M-Instruct Q4_1, ``gemma3``: Gemma 3 270M
Q4_K_M, both from ``tests.assets``; anything else a GGUF path, e.g. the random llama-1B
Q4_K_M of ``bench/big_models.py``) the offline rows of ``bench.side_by_side``: prefill
tokens/s of one prompt, decode tokens/s at batch 1 and 8, modelc (``modelc bench
--json``, first mode of ``--modes``) against llama.cpp's server (its own timings), same
file, same threads.  Rounds alternate over the models, llama.cpp then modelc each, so
all see the same machine load; each cell is the best of its rounds.  The table gives
each model's modelc / llama.cpp ratio and, for every model after the first, its ratio
divided by the first model's (issue 13's must-show 3: >= 0.9 for a K-quant model
against SmolLM2).  Written to the "K-quant vs SmolLM2" section of ``bench/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shlex
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.llamacpp_peer import LlamaCppClient, LlamaCppServer
from bench.side_by_side import (
    LLAMA_CONFIGS,
    LoadWatch,
    Side,
    best,
    git_commit,
    llamacpp_offline,
    run_modelc_offline,
    write_results,
)

HEADING = "## K-quant vs SmolLM2 side by side (issue 13)"
ROWS = (("decode_b1", "decode tok/s, batch 1"), ("decode_b8", "decode tok/s, batch 8"))
TARGET = 0.9


@dataclass
class ModelRun:
    label: str
    gguf: Path
    encode: Callable[[str], list[int]]
    modelc: list[Side]
    peer: list[Side]


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


def llamacpp(run: ModelRun, args: argparse.Namespace, log_dir: Path, config: str) -> Side:
    side = Side(f"llama.cpp ({config})")
    with LlamaCppServer(
        run.gguf,
        args.threads,
        8,
        8 * args.ctx_per_seq,
        log=log_dir / "llamacpp.log",
        env=LLAMA_CONFIGS[config],
    ) as s:
        llamacpp_offline(LlamaCppClient(s.url), side, args, run.encode, config)
    return side


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def table(runs: list[ModelRun], args: argparse.Namespace) -> str:
    rows = (("prefill", f"prefill tok/s, {args.prefill_len}-token prompt"), *ROWS)
    base = runs[0]
    head = ["measurement"]
    for r in runs:
        head += [f"{r.label}: modelc", "llama.cpp", "ratio"]
    head += [f"{r.label} ratio / {base.label} ratio" for r in runs[1:]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for attr, label in rows:
        cells = [label]
        ratios = []
        for r in runs:
            m, p = getattr(best(r.modelc), attr), getattr(best(r.peer), attr)
            ratios.append(ratio(m, p))
            cells += [f"{m:,.1f}", f"{p:,.1f}", f"{ratios[-1]:.2f}x"]
        for q in ratios[1:]:
            rr = ratio(q, ratios[0])
            cells.append(f"{rr:.2f} {'✓' if rr >= TARGET else '✗'}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def compare(args: argparse.Namespace) -> int:
    """``bench.side_by_side --models``: see the module docstring."""
    mode = args.modes.split(",")[0].strip()
    configs = [c for c in args.llama_configs.split(",") if c]
    runs = []
    for name in args.models.split(","):
        label, path = resolve(name.strip())
        runs.append(ModelRun(label, path, encoder(path), [], []))
    load = LoadWatch()
    started = dt.datetime.now(dt.UTC)
    with tempfile.TemporaryDirectory(prefix="modelc-sbs-") as d:
        for rnd in range(args.rounds):
            for run in runs:
                print(f"[models] round {rnd + 1}/{args.rounds}: {run.label}", file=sys.stderr)
                run.peer += [llamacpp(run, args, Path(d), c) for c in configs]
                run.modelc.append(run_modelc_offline(run.gguf, mode, args))
    loads = load.stop()
    secs = (dt.datetime.now(dt.UTC) - started).total_seconds()
    commit = git_commit()
    cmd = ".venv/bin/python -m bench.side_by_side " + shlex.join(sys.argv[1:])
    files = "\n".join(f"- {r.label}: `{r.gguf.name}` ({gguf_types(r.gguf)})" for r in runs)
    md = f"""{HEADING}

Command (run {started:%Y-%m-%d %H:%M} UTC, {secs:.0f} s, at commit {commit};
{os.cpu_count()} cores; 1-minute load average {load.before:.2f} before,
{min(loads):.2f} / {sum(loads) / len(loads):.2f} / {max(loads):.2f} min / mean / max during the run;
other jobs share the machine):

```sh
{cmd.strip()}
```

{files}

modelc `{mode}` mode (`modelc bench --json`) against llama.cpp's server (the better of
{", ".join(f"`{c}`" for c in configs)}), same file, {args.threads} threads each; offline
prefill of one {args.prefill_len}-token prompt, decode {args.decode_steps} greedy steps after a
16-token prompt; {args.rounds} rounds alternating over the models, each cell the best of its
rounds. The last columns divide each model's modelc / llama.cpp ratio by the first's
(target >= {TARGET}).

{table(runs, args)}
"""
    print(md)
    if not args.no_write:
        write_results(md, HEADING)
    return 0
