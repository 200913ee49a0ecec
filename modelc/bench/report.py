"""Tables, JSON and plots for :mod:`modelc.bench` results."""

from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.table import Table

from modelc.bench.loadgen import LoadResult
from modelc.bench.offline import OfflineResult
from modelc.errors import UsageError


def _f(x: float, nd: int = 1) -> str:
    return "-" if math.isnan(x) else f"{x:,.{nd}f}"


def _asked(r: OfflineResult) -> str:
    """The placement asked for, as the flags that ask for it."""
    ngl = "" if r.n_gpu_layers == "auto" else f" -ngl {r.n_gpu_layers}"
    return f"--device {r.device}{ngl}"


def offline_table(r: OfflineResult) -> Table:
    cpu = f", {r.threads} threads, matmul {r.matmul}" if r.matmul is not None else ""
    t = Table(
        title=f"{Path(r.model).name}: {r.architecture} on {r.backend} ({_asked(r)})"
        f"{cpu}, KV cache {r.kv_cache}"
    )
    t.add_column("measurement")
    t.add_column("value", justify="right")
    for label, v, why in (
        ("import runtime (fresh process)", r.import_s, r.skipped.get("import_s")),
        ("load, cold (fresh process)", r.load_cold_s, r.skipped.get("load_cold_s")),
    ):
        t.add_row(label, f"{v * 1000:,.0f} ms" if v is not None else f"skipped: {why}")
    warm = (
        "load, warm (second open)" if r.device == "cpu" else f"load and place, once ({_asked(r)})"
    )
    t.add_row(warm, f"{r.load_warm_s * 1000:,.0f} ms")
    for n, v in r.prefill_tps.items():
        t.add_row(f"prefill {n} tokens", f"{_f(v)} tok/s")
    for b, v in r.decode_tps.items():
        t.add_row(f"decode batch {b} ({r.decode_steps} steps)", f"{_f(v)} tok/s")
    t.add_row("peak RSS", f"{r.peak_rss_mb:,.0f} MB")
    return t


def load_table(r: LoadResult) -> Table:
    t = Table(
        title=f"{r.url}{r.endpoint}: {r.model}, prompt ~{r.prompt_len} tok, {r.max_tokens} out"
    )
    for col in ("conc.", "ok/err", "req/s", "out tok/s", "latency", "mean", "p50", "p90", "p99"):
        t.add_column(col, justify="left" if col == "latency" else "right")
    for lv in r.levels:
        for i, (name, d) in enumerate(
            (("TTFT ms", lv.ttft), ("TPOT ms", lv.tpot), ("ITL ms", lv.itl), ("E2E ms", lv.e2e))
        ):
            head = (
                [
                    str(lv.concurrency),
                    f"{lv.completed}/{lv.errors}",
                    _f(lv.request_throughput, 2),
                    _f(lv.output_tps),
                ]
                if i == 0
                else ["", "", "", ""]
            )
            t.add_row(
                *head, name, *(_f(v, 0) for v in (d.mean, d.p50, d.p90, d.p99)), end_section=i == 3
            )
    return t


def load_markdown(r: LoadResult) -> str:
    """The load result as a Markdown table (p50 / p90 / p99 in ms)."""
    head = "| concurrency | ok / errors | req/s | output tok/s | TTFT p50 / p90 / p99 | TPOT p50 / p90 / p99 | ITL p50 / p90 / p99 | E2E p50 / p90 / p99 |"
    lines = [head, "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for lv in r.levels:
        ds = (lv.ttft, lv.tpot, lv.itl, lv.e2e)
        cells = [" / ".join(_f(v, 0) for v in (d.p50, d.p90, d.p99)) for d in ds]
        lines.append(
            f"| {lv.concurrency} | {lv.completed} / {lv.errors} | {_f(lv.request_throughput, 2)} "
            f"| {_f(lv.output_tps)} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines)


def _clean(x: Any) -> Any:
    """NaN -> None so the JSON is standard."""
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_clean(v) for v in x]
    return x


def load_json(r: LoadResult) -> dict[str, Any]:
    out: dict[str, Any] = _clean(asdict(r))
    return out


def plot_load(r: LoadResult, path: Path) -> None:
    """Latency (p50 and p90 of E2E, TTFT, TPOT) against output tokens/s, one point per level."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise UsageError(
            "--plot needs matplotlib: pip install 'modelc[bench]' (or matplotlib)"
        ) from e
    xs = [lv.output_tps for lv in r.levels]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for ax, key, label in zip(
        axes,
        ("e2e", "ttft", "tpot"),
        ("end-to-end latency", "time to first token", "time per output token"),
        strict=True,
    ):
        for pct, style in (("p50", "o-"), ("p90", "s--")):
            ys = [getattr(getattr(lv, key), pct) for lv in r.levels]
            ax.plot(xs, ys, style, label=pct)
            if pct == "p50":
                for lv, x, y in zip(r.levels, xs, ys, strict=True):
                    ax.annotate(
                        f"c={lv.concurrency}", (x, y), textcoords="offset points", xytext=(4, 4)
                    )
        ax.set_xlabel("output tokens/s (all streams)")
        ax.set_ylabel(f"{label} (ms)")
        ax.set_title(label)
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.suptitle(
        f"{Path(r.model).name} @ {r.url}{r.endpoint}: prompt ~{r.prompt_len}, {r.max_tokens} out"
    )
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=100)
    except OSError as e:
        raise UsageError(f"cannot write plot {path}: {e}") from e
    finally:
        plt.close(fig)
