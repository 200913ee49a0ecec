"""``modelc compile`` (issue 17): a model as its own program.

SmolLM2 is compiled, built into a wheel with ``pip wheel`` and installed into a fresh
venv where ``import modelc`` fails; its server's greedy chat equals ``modelc run``'s on
the same artifact, token for token (and log-prob for log-prob).  GPT-2, BERT and an MLP
are compiled and their generated forward built in place (the kernels extension reused
from the SmolLM2 build: its sources are the same in every project), then compared with
modelc's runtime bit for bit, and BERT's and the MLP's programs answer over HTTP.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.assets import minilm_dir, smollm2_gguf
from tests.compile_support import (
    ROOT,
    Program,
    build_forward_only,
    compile_project,
    fresh_venv,
    run,
    start_program,
)
from tests.gen_gpt2 import ensure_gpt2_random
from tests.server_fixtures import Server, free_port, minilm_server, start

__all__ = ["minilm_server"]

pytestmark = pytest.mark.slow


@dataclass
class Built:
    out: Path  # the project
    package: str
    python: Path  # the fresh venv's interpreter (no modelc)
    script: Path  # the console script the wheel installed
    kernels_so: Path  # the kernels extension the wheel build made


@pytest.fixture(scope="session")
def smol(tmp_path_factory: pytest.TempPathFactory) -> Built:
    tmp = tmp_path_factory.mktemp("compile")
    out = tmp / "smol"
    pkg = compile_project(smollm2_gguf(), out, "smol")
    pip = [sys.executable, "-m", "pip"]
    run(
        [
            *pip,
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-w",
            str(out / "dist"),
            str(out),
        ]
    )
    (wheel,) = (out / "dist").glob("*.whl")
    py = fresh_venv(tmp / "venv")
    run([*pip, "--python", str(py), "install", "-q", "--no-deps", "--no-index", str(wheel)])
    (so,) = (out / "build").rglob("kernels.*.so")
    return Built(out, pkg.name, py, py.parent / "smol-serve", so)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["MODELC_THREADS"] = "1"
    return env


def test_wheel_serves_without_modelc(smol: Built, tmp_path: Path) -> None:
    """The installed program imports no modelc module, and its constants are the model's."""
    code = f"""
import importlib.util, json, sys
assert importlib.util.find_spec("modelc") is None
from {smol.package} import app
from {smol.package}._rt.engine.options import EngineOptions
engine = app.make_engine(app.ARTIFACT, "smol", EngineOptions(threads=1))
print(json.dumps({{
    "modelc": sorted(m for m in sys.modules if m == "modelc" or m.startswith("modelc.")),
    "runtime": type(engine.model).__module__ + "." + type(engine.model).__name__,
    "spec": json.loads(app.ARTIFACT.with_name("spec.json").read_text()),
}}))
"""
    got = json.loads(run([str(smol.python), "-c", code], cwd=tmp_path, env=_env()))
    assert got["modelc"] == []
    assert got["runtime"] == f"{smol.package}._forward.Compiled"
    from modelc.artifact import load_artifact
    from modelc.resolve import resolve_model

    hp = load_artifact(resolve_model(str(smollm2_gguf()))).hparams
    s = got["spec"]
    assert (s["n_layer"], s["d"], s["n_head"], s["n_head_kv"], s["head_dim"]) == (
        hp.n_layer,
        hp.n_embd,
        hp.n_head,
        hp.n_head_kv,
        hp.head_dim or hp.n_embd // hp.n_head,
    )
    assert s["ff"] == [hp.n_ff] * hp.n_layer


PROMPTS = [
    "Name three primary colours.",
    "Write a haiku about compilers.",
    "What is 17 times 3? Answer briefly.",
    "Translate 'good morning' into French.",
]


def _chat(url: str, prompt: str) -> dict[str, object]:
    r = httpx.post(
        f"{url}/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": prompt}],
            "temperature": 0,
            "max_tokens": 24,
            "logprobs": True,
            "top_logprobs": 2,
        },
        timeout=300,
    )
    r.raise_for_status()
    c = r.json()["choices"][0]
    return {"text": c["message"]["content"], "finish": c["finish_reason"], "lp": c["logprobs"]}


@pytest.fixture(scope="module")
def programs(
    smol: Built, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Server, Program]]:
    from modelc.resolve import resolve_model

    artifact = resolve_model(str(smollm2_gguf()))
    ref = start(str(artifact), "--max-concurrent", "4")
    try:
        cwd = tmp_path_factory.mktemp("prog")
        prog = start_program([str(smol.script), "--max-concurrent", "4"], free_port(), cwd, _env())
    except BaseException:
        ref.stop()
        raise
    yield ref, prog
    ref.stop()
    assert prog.stop() == 0  # SIGTERM: drained and exited cleanly


def test_chat_same_as_modelc_run(programs: tuple[Server, Program]) -> None:
    """Greedy chat through the installed wheel equals modelc run's on the same artifact:
    text, finish reason and every token's log-probs; four requests at once (batched)."""
    ref, prog = programs
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        want = list(pool.map(lambda p: _chat(ref.url, p), PROMPTS))
        got = list(pool.map(lambda p: _chat(prog.url, p), PROMPTS))
    assert got == want
    assert all(g["lp"] for g in got)


def test_program_health_and_metrics(programs: tuple[Server, Program]) -> None:
    """/health answers as modelc run's does and /metrics exports the same metric families."""
    ref, prog = programs

    def families(url: str) -> set[str]:
        text = httpx.get(f"{url}/metrics", timeout=10).text
        return {ln.split()[2] for ln in text.splitlines() if ln.startswith("# TYPE")}

    assert httpx.get(f"{prog.url}/health").json() == httpx.get(f"{ref.url}/health").json()
    assert families(prog.url) == families(ref.url)
    ids = {m["id"] for m in httpx.get(f"{prog.url}/v1/models").json()["data"]}
    assert ids == {"smol"}


def _in_place(smol: Built, tmp: Path, src: Path, name: str) -> tuple[Path, str]:
    pkg = compile_project(src, tmp / name, name)
    build_forward_only(tmp / name, pkg, smol.kernels_so)
    return tmp / name, pkg.name


def _compare(out: Path, package: str) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(out), "MODELC_THREADS": "1"}
    return dict(
        json.loads(run([sys.executable, "-m", "tests.compile_support", package], ROOT, env))
    )


def test_gpt2_forward_bit_identical(smol: Built, tmp_path: Path) -> None:
    out, package = _in_place(smol, tmp_path, ensure_gpt2_random(), "gpt2-tiny")
    got = _compare(out, package)
    assert got == {
        "architecture": "gpt2",
        "class": f"{package}._forward",
        "f32": True,
        "f16": True,
        "int8": True,
    }


def test_bert_embeddings_equal_modelc_run(
    smol: Built, tmp_path: Path, minilm_server: Server
) -> None:
    out, package = _in_place(smol, tmp_path, minilm_dir(), "minilm")
    assert _compare(out, package)["embed"] is True
    env = {**_env(), "PYTHONPATH": str(out)}
    prog = start_program([str(smol.python), "-m", package], free_port(), tmp_path, env)
    try:
        body = {"input": ["a compiled encoder", "embeddings, exactly", "x"]}
        got = httpx.post(f"{prog.url}/v1/embeddings", json=body, timeout=60).json()
        want = httpx.post(f"{minilm_server.url}/v1/embeddings", json=body, timeout=60).json()
    finally:
        assert prog.stop() == 0
    assert [d["embedding"] for d in got["data"]] == [d["embedding"] for d in want["data"]]
    assert got["usage"] == want["usage"]


def test_mlp_infer_equals_runtime(smol: Built, tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    from modelc.formats import load_model
    from modelc.runtime.arch import build
    from modelc.runtime.backends.cpu import CpuBackend

    rng = np.random.default_rng(7)
    sizes = [8, 16, 12, 4]
    tensors = {}
    for i, j in enumerate((0, 2, 4)):  # nn.Sequential(Linear, ReLU, Linear, ReLU, Linear)
        tensors[f"{j}.weight"] = rng.normal(0, 0.5, (sizes[i + 1], sizes[i])).astype(np.float32)
        tensors[f"{j}.bias"] = rng.normal(0, 0.1, (sizes[i + 1],)).astype(np.float32)
    src = tmp_path / "mlp.safetensors"
    save_file(tensors, str(src))
    out, package = _in_place(smol, tmp_path, src, "mlp")
    assert _compare(out, package)["run"] is True
    x = rng.normal(0, 1, (6, 8)).astype(np.float32)
    want = build(load_model(src), CpuBackend(threads=1)).run({"x": x})["output"]
    env = {**_env(), "PYTHONPATH": str(out)}
    prog = start_program([str(smol.python), "-m", package], free_port(), tmp_path, env)
    try:
        r = httpx.post(f"{prog.url}/infer", json={"inputs": x.tolist()}, timeout=60)
    finally:
        assert prog.stop() == 0
    assert np.array_equal(np.asarray(r.json()["outputs"], np.float32), want)
