"""``modelc bench``: offline on SmolLM2, the load generator against a real ``modelc run``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from modelc.bench.loadgen import Dist
from tests.assets import smollm2_gguf
from tests.server_fixtures import Server, free_port

ROOT = Path(__file__).resolve().parent.parent


def modelc(*args: str, home: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, MODELC_HOME=str(home), MODELC_THREADS="1")
    return subprocess.run(
        [sys.executable, "-m", "modelc.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_offline_json_on_smollm2(tmp_path: Path) -> None:
    r = modelc(
        "bench", str(smollm2_gguf()), "--json", "--prompt-lens", "8,24", "--batches", "1,3",
        "--steps", "3", "--reps", "1", "--threads", "1", "--matmul", "exact", home=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["architecture"] == "llama" and d["threads"] == 1 and d["matmul"] == "exact"
    assert d["kv_cache"] == "f16"  # as `modelc run`
    assert set(d["prefill_tps"]) == {"8", "24"} and set(d["decode_tps"]) == {"1", "3"}
    for v in [*d["prefill_tps"].values(), *d["decode_tps"].values()]:
        assert v > 0
    assert d["load_cold_s"] > 0 and d["load_warm_s"] > 0 and d["import_s"] > 0
    # the model's weights alone are ~97 MB, all resident after decoding
    assert 90 < d["peak_rss_mb"] < 4000


def test_offline_bad_args(tmp_path: Path) -> None:
    r = modelc("bench", str(smollm2_gguf()), "--batches", "0", home=tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "modelc: error: --batches takes positive integers, got '0'"
    ]
    r = modelc("bench", home=tmp_path)
    assert r.returncode == 2 and "give a MODEL" in r.stderr
    try:
        import cupy  # noqa: F401
    except ImportError:  # `--device cuda` places the model as `modelc run` does: one line
        r = modelc("bench", str(smollm2_gguf()), "--device", "cuda", home=tmp_path)
        assert r.returncode == 2
        assert r.stderr.strip().splitlines() == [
            "modelc: error: --device cuda: CuPy is not installed (pip install cupy-cuda13x, "
            "or cupy-cuda12x for CUDA 12); use --device cpu"
        ]


def test_offline_on_another_device_says_where_it_ran(tmp_path: Path) -> None:
    """``--device auto``: placed as ``modelc run`` places it; the result names the device
    asked, where the model ran (the CPU here, without a GPU) and why the fresh-process
    load timings were skipped."""
    r = modelc(
        "bench", str(smollm2_gguf()), "--device", "auto", "--json", "--prompt-lens", "8",
        "--batches", "1", "--steps", "2", "--reps", "1", "--threads", "1", home=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert (d["device"], d["n_gpu_layers"]) == ("auto", "auto")
    if not _has_cupy():
        assert d["backend"] == "cpu" and d["matmul"] is not None
    assert d["import_s"] is None and d["load_cold_s"] is None and d["load_warm_s"] > 0
    assert set(d["skipped"]) == {"import_s", "load_cold_s"}
    assert d["skipped"]["load_cold_s"].startswith("measured with --device cpu only")


def test_offline_gpu_layers_and_matmul_need_their_device(tmp_path: Path) -> None:
    for argv, line in (
        (
            ["-ngl", "2"],
            "--n-gpu-layers 2 needs --device cuda (or auto, with a GPU); "
            "--device cpu runs every layer itself",
        ),
        (
            ["--device", "auto", "--matmul", "exact"],
            "--matmul sets the CPU kernels of --device cpu; the CPU layers of --device auto "
            "take MODELC_MATMUL",
        ),
    ):
        r = modelc("bench", str(smollm2_gguf()), *argv, home=tmp_path)
        assert r.returncode == 2
        assert r.stderr.strip().splitlines() == [f"modelc: error: {line}"]


def test_placement_names_each_part_of_a_split_model() -> None:
    from modelc.bench.offline import OfflineResult, placement
    from modelc.bench.report import offline_table
    from modelc.formats import load_model
    from modelc.runtime.arch import build
    from modelc.runtime.split import split_decoder
    from tests.runtime_support import make_backend

    ir = load_model(smollm2_gguf())
    cpu = make_backend("cpu-exact")
    last = ir.hparams.n_layer - 1
    assert placement(build(ir, cpu), cpu) == "cpu"
    split = split_decoder(ir, 3, make_backend("numpy"), cpu)
    assert placement(split, cpu) == f"numpy layers 0-2 + cpu layers 3-{last}"

    why = "measured with --device cpu only (the fresh process builds on the CPU kernels)"
    res = OfflineResult(
        model="m.gguf", architecture="llama", device="cuda", n_gpu_layers=3,
        backend=f"cuda layers 0-2 + cpu layers 3-{last}", threads=2, matmul="fast",
        kv_cache="f16", load_cold_s=None, load_warm_s=0.5, import_s=None,
        skipped={"import_s": why, "load_cold_s": why},
    )  # fmt: skip
    from rich.console import Console

    console = Console(width=300, record=True)
    console.print(offline_table(res))
    text = console.export_text()
    assert f"m.gguf: llama on cuda layers 0-2 + cpu layers 3-{last} (--device cuda -ngl 3)" in text
    for row in ("import runtime (fresh process)", "load, cold (fresh process)"):
        line = next(ln for ln in text.splitlines() if row in ln)
        assert line.rstrip(" │").endswith(f"skipped: {why}")
    line = next(ln for ln in text.splitlines() if "load and place, once" in ln)
    assert "(--device cuda -ngl 3)" in line and line.rstrip(" │").endswith("500 ms")


def _has_cupy() -> bool:
    try:
        import cupy  # noqa: F401
    except ImportError:
        return False
    return True


def test_dist_matches_numpy_percentiles() -> None:
    rng = np.random.default_rng(0)
    xs = rng.exponential(0.05, size=101).tolist()
    d = Dist.of(xs)
    want = np.percentile(np.asarray(xs) * 1000, [50, 90, 99])
    assert np.allclose([d.p50, d.p90, d.p99], want) and d.n == 101
    assert np.isclose(d.mean, np.mean(xs) * 1000)
    assert np.isnan(Dist.of([]).p50)


def test_loadgen_against_modelc_run(smol_server: Server, tmp_path: Path) -> None:
    """``modelc bench --url`` against the shared server (its streams carry SSE comments)."""
    plot = tmp_path / "lat.png"
    r = modelc(
        "bench", "--url", smol_server.url, "--concurrency", "1,3", "--requests", "3",
        "--prompt-len", "12", "--max-tokens", "5", "--plot", str(plot), "--json", home=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["endpoint"] == "/v1/completions" and d["model"] == "SmolLM2-135M-Instruct.Q4_1"
    assert [lv["concurrency"] for lv in d["levels"]] == [1, 3]
    for lv in d["levels"]:
        assert lv["completed"] == 3 and lv["errors"] == 0
        assert lv["output_tokens"] == 15  # ignore_eos: exactly max_tokens each
        assert lv["input_tokens"] >= 3 * 12
        assert lv["output_tps"] > 0 and lv["request_throughput"] > 0
        for k in ("ttft", "tpot", "itl", "e2e"):
            s = lv[k]
            assert 0 < s["p50"] <= s["p90"] <= s["p99"], (k, s)
            assert s["mean"] > 0
        assert lv["ttft"]["p50"] < lv["e2e"]["p50"]
        assert lv["itl"]["n"] == 3 * 4  # 5 tokens per stream, 4 gaps
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_loadgen_sends_the_sampling_asked_for(smol_server: Server, tmp_path: Path) -> None:
    """``--temperature/--top-k/--top-p/--min-p`` go into every request (default greedy): a
    valid set is served (each stream its max_tokens), a top_p of 7 is refused by the server
    for every request (so the field reached it); the offline benchmark refuses them."""
    from modelc.bench.loadgen import request_body

    assert request_body("m", 5, {})["temperature"] == 0.0
    b = request_body("m", 5, {"temperature": 0.8, "top_k": 40, "top_p": 0.95})
    assert (b["temperature"], b["top_k"], b["top_p"], b["ignore_eos"]) == (0.8, 40, 0.95, True)
    for top_p, done in (("0.95", 2), ("7", 0)):
        r = modelc(
            "bench", "--url", smol_server.url, "--concurrency", "2", "--requests", "2",
            "--prompt-len", "6", "--max-tokens", "4", "--temperature", "0.8", "--top-k", "40",
            "--top-p", top_p, "--min-p", "0.05", "--json", home=tmp_path,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        (lv,) = json.loads(r.stdout)["levels"]
        assert (lv["completed"], lv["errors"]) == (done, 2 - done), lv
        assert lv["output_tokens"] == 4 * done
    r = modelc("bench", "model.gguf", "--top-k", "4", home=tmp_path, timeout=60)
    assert r.returncode == 2 and "set a load test's requests (--url)" in r.stderr, r.stderr


def test_loadgen_chat_table(smol_server: Server, tmp_path: Path) -> None:
    r = modelc(
        "bench", "--url", smol_server.url + "/v1/chat/completions", "--concurrency", "2",
        "--requests", "2", "--prompt-len", "6", "--max-tokens", "3", home=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "/v1/chat/completions" in r.stdout and "TTFT ms" in r.stdout and "2/0" in r.stdout


def test_loadgen_unreachable(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    r = modelc("bench", "--url", url, "--requests", "2", home=tmp_path, timeout=60)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"modelc: error: cannot reach {url}"), r.stderr


def test_loadgen_refuses_remote_hosts(tmp_path: Path) -> None:
    r = modelc("bench", "--url", "http://192.0.2.1:8080", home=tmp_path, timeout=60)
    assert r.returncode == 2 and "only loopback servers" in r.stderr


def test_side_by_side_models_table_and_section(tmp_path: Path, monkeypatch: Any) -> None:
    """``bench.side_by_side --models``: per model the median over paired rounds of modelc's
    tok/s, llama.cpp's (the better configuration each round) and their ratio; per later
    model the median of its ratio over the first's, round by round (issue 13's >= 0.9);
    the section it writes replaces only itself and keeps its hand-written notes."""
    from bench import side_by_side as sbs
    from bench.paired import PairedResult, Round
    from bench.side_by_side_models import HEADING, table

    def rnd(m: tuple[float, float, float], *peers: tuple[float, float, float]) -> Round:
        kinds = ("prefill", "decode_b1", "decode_b8")
        r = Round(50.0, dict(zip(kinds, m, strict=True)))
        r.peers = {f"c{i}": dict(zip(kinds, p, strict=True)) for i, p in enumerate(peers)}
        return r

    base = PairedResult("A", 10**9)
    base.rounds = [
        rnd((200, 100, 400), (100, 50, 100), (50, 100, 100)),  # ratios 2, 1, 4
        rnd((100, 100, 400), (100, 100, 200)),  # ratios 1, 1, 2
        rnd((300, 50, 300), (100, 100, 100)),  # ratios 3, 0.5, 3
    ]
    kq = PairedResult("K", 10**9)
    kq.rounds = [
        rnd((90, 45, 100), (50, 50, 50)),  # ratios 1.8, 0.9, 2
        rnd((90, 90, 100), (100, 100, 100)),  # ratios 0.9, 0.9, 1
        rnd((300, 50, 300), (100, 100, 100)),  # ratios 3, 0.5, 3
    ]
    assert base.ratios("decode_b1") == [1.0, 1.0, 0.5]
    assert base.share() == 100 * 1e9 / 1e9 / 50.0  # the median round: 100 tok/s x 1 GB / 50 GB/s
    rows = table([base, kq], 512).splitlines()
    assert rows[2].split(" | ")[1:4] == ["200.0", "100.0", "2.00x"]
    assert rows[2].endswith("| 0.90 ✓ (0.90-1.00) |")  # 1.8 / 2, 0.9 / 1, 3 / 3
    assert rows[3].endswith("| 0.90 ✓ (0.90-1.00) |")  # 0.9 / 1, 0.9 / 1, 0.5 / 0.5
    assert rows[4].endswith("| 0.50 ✗ (0.50-1.00) |")  # 2 / 4, 1 / 2, 3 / 3

    results = tmp_path / "bench" / "RESULTS.md"
    results.parent.mkdir()
    results.write_text("## Side by side: old\n\nx\n\n" + HEADING + "\n\nold\n\n### Notes\n\nkeep\n")
    monkeypatch.setattr(sbs, "ROOT", tmp_path)
    sbs.write_results(HEADING + "\n\nnew\n", HEADING)
    text = results.read_text()
    assert "## Side by side: old\n\nx\n" in text and "old\n\n###" not in text
    assert text.index("new") < text.index("### Notes\n\nkeep")
