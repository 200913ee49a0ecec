"""``modelc compile`` (issue 17): a model as its own program.

SmolLM2 is compiled, built into a wheel with ``pip wheel`` and installed into a fresh
venv where ``import modelc`` fails; its server's greedy chat equals ``modelc run``'s on
the same artifact, token for token (and log-prob for log-prob).  GPT-2, Qwen2 (Q/K/V
biases), Qwen3 (Q/K norms), Mistral (sliding window), Gemma 2 and 3 (post norms, GELU,
soft-caps, windows with their own RoPE base), Phi-3 (fused Q/K/V and gate/up), BERT and an MLP are compiled and
their generated forward built in place (the kernels extension reused from the SmolLM2
build: its sources are the same in every project; built on the second core while the
wheel builds), then compared with modelc's runtime bit for bit; BERT's and the MLP's programs answer over
HTTP, run by the venv without modelc.  gpt-oss (sinks, MXFP4 experts), LFM2 (short
convolutions) and Qwen 3.5 (Gated DeltaNet) use parts the compiled loop does not run: their
programs' forward is the runtime's decoder (the ``runtime`` template), held to the same
bit-for-bit comparison.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tests import net
from tests.assets import minilm_dir, smollm2_gguf
from tests.compile_support import (
    ROOT,
    Program,
    build_in_place,
    compile_project,
    fresh_venv,
    run,
    start_program,
    use_kernels,
)
from tests.gen_families import ensure_family
from tests.gen_gpt2 import ensure_gpt2_random
from tests.server_fixtures import Server, free_port, start
from tests.tiny_families import TINY

pytestmark = pytest.mark.slow


@dataclass
class Wheel:
    out: Path  # the project
    package: str
    python: Path  # the fresh venv's interpreter (no modelc)
    script: Path  # the console script the wheel installed
    kernels_so: Path  # the kernels extension the wheel build made


@dataclass
class Builds:
    smol: Wheel
    projects: dict[str, tuple[Path, str]]  # name -> (project dir, package), built in place
    mlp_source: Path


def _wheel(tmp: Path) -> Wheel:
    out = tmp / "smol"
    pkg = compile_project(smollm2_gguf(), out, "smol")
    pip = [sys.executable, "-m", "pip"]
    wheel_cmd = [*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q"]
    run([*wheel_cmd, "-w", str(out / "dist"), str(out)])
    (wheel,) = (out / "dist").glob("*.whl")
    py = fresh_venv(tmp / "venv")
    run([*pip, "--python", str(py), "install", "-q", "--no-deps", "--no-index", str(wheel)])
    (so,) = (out / "build").rglob("kernels.*.so")
    return Wheel(out, pkg.name, py, py.parent / "smol-serve", so)


def _mlp_source(tmp: Path) -> Path:
    from safetensors.numpy import save_file

    rng = np.random.default_rng(7)
    sizes = [8, 16, 12, 4]
    tensors = {}
    for i, j in enumerate((0, 2, 4)):  # nn.Sequential(Linear, ReLU, Linear, ReLU, Linear)
        tensors[f"{j}.weight"] = rng.normal(0, 0.5, (sizes[i + 1], sizes[i])).astype(np.float32)
        tensors[f"{j}.bias"] = rng.normal(0, 0.1, (sizes[i + 1],)).astype(np.float32)
    src = tmp / "mlp.safetensors"
    save_file(tensors, str(src))
    return src


def _in_place(tmp: Path, sources: dict[str, Path]) -> dict[str, tuple[Path, str]]:
    pkgs = build_in_place({name: (src, tmp / name) for name, src in sources.items()})
    return {name: (tmp / name, pkgs[name]) for name in sources}


@pytest.fixture(scope="session")
def builds(tmp_path_factory: pytest.TempPathFactory) -> Builds:
    tmp = tmp_path_factory.mktemp("compile")
    mlp = _mlp_source(tmp)
    sources = {
        "gpt2-tiny": ensure_gpt2_random(),
        "tiny-qwen2": ensure_family("qwen2")[1],
        "tiny-qwen3": ensure_family("qwen3")[1],
        "tiny-mistral": ensure_family("mistral")[1],
        "tiny-gemma2": ensure_family("gemma2")[1],
        "tiny-gemma3": ensure_family("gemma3")[1],
        "tiny-phi3": ensure_family("phi3")[1],
        "tiny-moe": ensure_family("qwen3moe")[1],
        "tiny-gptoss": TINY["gptoss-mxfp4"](),  # the runtime template from here on
        "tiny-lfm2": TINY["lfm2"](),
        "tiny-qwen35": TINY["qwen35"](),
        "minilm": minilm_dir(),
        "mlp": mlp,
    }
    for p in sources.values():
        assert p.exists(), f"{p} is missing: run python -m tests.assets"
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # the C compiles on both cores
        wheel = pool.submit(_wheel, tmp)
        in_place = pool.submit(_in_place, tmp, sources)
        smol, projects = wheel.result(), in_place.result()
    for out, pkg in projects.values():
        use_kernels(out / pkg, smol.kernels_so)
    return Builds(smol, projects, mlp)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["MODELC_THREADS"] = "1"
    return env


def test_wheel_serves_without_modelc(builds: Builds, tmp_path: Path) -> None:
    """The installed program imports no modelc module, and its constants are the model's."""
    smol = builds.smol
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
    r = net.post(
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
    builds: Builds, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Server, Program]]:
    from modelc.resolve import resolve_model

    ref = start(str(resolve_model(str(smollm2_gguf()))), "--max-concurrent", "4")
    try:
        cwd = tmp_path_factory.mktemp("prog")
        cmd = [str(builds.smol.script), "--max-concurrent", "4"]
        prog = start_program(cmd, free_port(), cwd, _env())
    except BaseException:
        ref.stop()
        raise
    yield ref, prog
    ref.stop()
    assert prog.stop() == 0  # SIGTERM: drained and exited cleanly


def test_chat_same_as_modelc_run(programs: tuple[Server, Program]) -> None:
    """Greedy chat through the installed wheel equals modelc run's on the same artifact:
    text, finish reason and every token's log-probs; four requests at once (batched); and
    a plain /v1/completions."""
    ref, prog = programs
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        want = list(pool.map(lambda p: _chat(ref.url, p), PROMPTS))
        got = list(pool.map(lambda p: _chat(prog.url, p), PROMPTS))
    assert got == want
    assert all(g["lp"] for g in got)
    body = {"prompt": "The capital of France is", "max_tokens": 16, "temperature": 0}
    texts = [
        net.post(f"{u}/v1/completions", json=body, timeout=300).json()["choices"][0]["text"]
        for u in (ref.url, prog.url)
    ]
    assert texts[0] == texts[1] and texts[0]


def test_program_health_and_metrics(programs: tuple[Server, Program]) -> None:
    """/health answers as modelc run's does and /metrics exports the same metric families."""
    ref, prog = programs

    def families(url: str) -> set[str]:
        text = net.get(f"{url}/metrics", timeout=10).text
        return {ln.split()[2] for ln in text.splitlines() if ln.startswith("# TYPE")}

    assert net.get(f"{prog.url}/health").json() == net.get(f"{ref.url}/health").json()
    assert families(prog.url) == families(ref.url)
    ids = {m["id"] for m in net.get(f"{prog.url}/v1/models").json()["data"]}
    assert ids == {"smol"}


@pytest.fixture(scope="module")
def compared(builds: Builds) -> dict[str, dict[str, object]]:
    """Every in-place project's forward against modelc's runtime, in one process; and
    the Qwen2 program given Qwen3's artifact (``refused``: its error message)."""
    path = os.pathsep.join(str(out) for out, _ in builds.projects.values())
    env = {**os.environ, "PYTHONPATH": path, "MODELC_THREADS": "1"}
    pkgs = [pkg for _, pkg in builds.projects.values()]
    q2, q3 = builds.projects["tiny-qwen2"], builds.projects["tiny-qwen3"]
    wrong = f"{q2[1]}={q3[0] / q3[1] / 'model.modelc'}"
    got = json.loads(run([sys.executable, "-m", "tests.compile_support", *pkgs, wrong], ROOT, env))
    res: dict[str, dict[str, object]] = {n: got[pkg] for n, (_, pkg) in builds.projects.items()}
    res["refused"] = {"message": got[wrong]}
    return res


def test_program_refuses_another_models_artifact(compared: dict[str, dict[str, object]]) -> None:
    msg = str(compared["refused"]["message"])
    assert msg.startswith("this program was compiled for a model with ") and "modelc compile" in msg


@pytest.mark.parametrize(
    "name",
    [
        "gpt2-tiny",
        "tiny-qwen2",
        "tiny-qwen3",
        "tiny-mistral",
        "tiny-gemma2",
        "tiny-gemma3",
        "tiny-phi3",
        "tiny-moe",
        "tiny-gptoss",
        "tiny-lfm2",
        "tiny-qwen35",
    ],
)
def test_language_model_forward_bit_identical(
    builds: Builds, compared: dict[str, dict[str, object]], name: str
) -> None:
    """Prefill and 8 greedy steps of 3 sequences in one batch: logits equal bit for bit
    with f32 and f16 caches (the compiled loop, Mistral's sliding window of 8 in the
    attention kernel as in the runtime) and int8 (the runtime's loop); and 5 steps of
    short sequences (inside Mistral's window); and 40 steps over a cache whose windowed
    layers move their rows (Mistral), against the runtime and a full cache.  The families
    whose parts the compiled loop does not all run get the runtime's decoder."""
    out, pkg = builds.projects[name]
    template = json.loads((out / pkg / "spec.json").read_text())["template"]
    assert (template == "runtime") == (name in ("tiny-gptoss", "tiny-lfm2", "tiny-qwen35"))
    assert compared[name] | {"architecture": None} == {
        "architecture": None,
        "class": f"{pkg}._forward",
        "f32": True,
        "f16": True,
        "int8": True,
        "short": True,
        "windowed": True,
    }


def test_bert_embeddings_equal_modelc_run(
    builds: Builds, compared: dict[str, dict[str, object]], minilm_server: Server, tmp_path: Path
) -> None:
    assert compared["minilm"]["embed"] is True
    out, package = builds.projects["minilm"]
    env = {**_env(), "PYTHONPATH": str(out)}
    prog = start_program([str(builds.smol.python), "-m", package], free_port(), tmp_path, env)
    try:
        body = {"input": ["a compiled encoder", "embeddings, exactly", "x"]}
        got = net.post(f"{prog.url}/v1/embeddings", json=body, timeout=60).json()
        want = net.post(f"{minilm_server.url}/v1/embeddings", json=body, timeout=60).json()
    finally:
        assert prog.stop() == 0
    assert [d["embedding"] for d in got["data"]] == [d["embedding"] for d in want["data"]]
    assert got["usage"] == want["usage"]


def test_mlp_infer_equals_runtime(
    builds: Builds, compared: dict[str, dict[str, object]], tmp_path: Path
) -> None:
    from modelc.formats import load_model
    from modelc.runtime.arch import build
    from modelc.runtime.backends.cpu import CpuBackend

    assert compared["mlp"]["run"] is True
    x = np.random.default_rng(8).normal(0, 1, (6, 8)).astype(np.float32)
    want = build(load_model(builds.mlp_source), CpuBackend(threads=1)).run({"x": x})["output"]
    out, package = builds.projects["mlp"]
    env = {**_env(), "PYTHONPATH": str(out)}
    prog = start_program([str(builds.smol.python), "-m", package], free_port(), tmp_path, env)
    try:
        r = net.post(f"{prog.url}/infer", json={"inputs": x.tolist()}, timeout=60)
    finally:
        assert prog.stop() == 0
    assert np.array_equal(np.asarray(r.json()["outputs"], np.float32), want)


def test_compile_refuses_what_it_cannot_specialise(tmp_path: Path) -> None:
    """A family without a compiled forward (nomic-bert) is one line naming what to do
    instead, exit 2, and no project is written."""
    from tests.gen_bert_gguf import write_nomic

    gguf = write_nomic(minilm_dir(), tmp_path / "nomic.gguf")
    p = subprocess.run(
        [sys.executable, "-m", "modelc.cli", "compile", str(gguf), "-o", str(tmp_path / "x")],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 2
    assert p.stderr.count("\n") == 1 and "no compiled forward" in p.stderr
    assert "modelc run" in p.stderr
    assert not (tmp_path / "x").exists()
