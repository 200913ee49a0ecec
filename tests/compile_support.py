"""Helpers for tests/test_compile.py: build a ``modelc compile`` project, run its program.

``python -m tests.compile_support PACKAGE...`` (with the project directories on
PYTHONPATH) compares each compiled forward with modelc's own runtime on the same
artifact, in one process, and prints one JSON line: whether every output was
bit-identical, per package.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from modelc.bench.procs import ServerStartError, wait_healthy

ROOT = Path(__file__).resolve().parent.parent


def run(cmd: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise AssertionError(
            f"{cmd} exited {p.returncode}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
        )
    return p.stdout


def compile_project(src: Path, out: Path, name: str) -> Path:
    """``modelc compile SRC -o OUT --name NAME`` through the CLI; the package directory."""
    run([sys.executable, "-m", "modelc.cli", "compile", str(src), "-o", str(out), "--name", name])
    (pkg,) = [p for p in out.iterdir() if p.name.endswith("_app")]
    return pkg


def fresh_venv(where: Path) -> Path:
    """A new venv that sees this venv's third-party packages but not modelc: a .pth line
    adds this site-packages directory, whose own .pth files (modelc's editable install)
    Python does not process.  Returns its python."""
    run([sys.executable, "-m", "venv", "--without-pip", str(where)])
    py = where / "bin" / "python"
    site = run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    (Path(site.strip()) / "project_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return py


# the in-place forwards are built without optimisation: gcc's -O3 on a generated forward
# takes ~4x the CPU time of -O0 and changes no result (``-ffp-contract=off``, no fast-math:
# the arithmetic is as written either way); the wheel's build keeps the project's flags
IN_PLACE_OPT = "-O0"


def build_in_place(projects: dict[str, tuple[Path, Path]]) -> dict[str, str]:
    """``modelc compile`` each ``name: (source, out)`` and build only its generated
    forward, in place, all in one child process (one interpreter start for all); the
    forward cimports the kernels' .pxd, the kernels extension itself comes from another
    project's build (:func:`use_kernels`).  Returns each project's package name."""
    spec = {n: [str(src), str(out)] for n, (src, out) in projects.items()}
    code = "from tests.compile_support import _build_in_place; _build_in_place()"
    out = run([sys.executable, "-c", code, json.dumps(spec)], ROOT)
    return dict(json.loads(out.splitlines()[-1]))


def build_one_in_place(name: str, src: Path, out: Path) -> str:
    """``modelc compile`` of ``src`` into ``out`` and its generated forward built in place,
    in this process (which modelc it imports is the one that compiles); the package name."""
    import importlib.util

    from setuptools import setup

    from modelc.compile import compile_model
    from modelc.resolve import resolve_model

    res = compile_model(resolve_model(str(src)), out, name=name)
    here = os.getcwd()
    os.chdir(out)
    try:
        mod_spec = importlib.util.spec_from_file_location(f"setup_{name}", "setup.py")
        assert mod_spec is not None and mod_spec.loader is not None
        mod = importlib.util.module_from_spec(mod_spec)
        mod_spec.loader.exec_module(mod)
        exts = mod.extensions(("_forward",))
        for ext in exts:  # see IN_PLACE_OPT
            ext.extra_compile_args = [
                IN_PLACE_OPT if a == "-O3" else a for a in ext.extra_compile_args
            ]
        setup(
            ext_modules=exts,
            cmdclass={"build_ext": mod.ParallelBuildExt},  # the project's own build (-g0)
            script_args=["build_ext", "--inplace", "-q"],
        )
    finally:
        os.chdir(here)
    return res.names.package


def _build_in_place() -> None:
    done = {}
    for name, (src, out) in json.loads(sys.argv[1]).items():
        done[name] = build_one_in_place(name, Path(src), Path(out))
    print(json.dumps(done))


def use_kernels(pkg: Path, kernels_so: Path) -> None:
    """Put another project's built kernels extension into ``pkg`` (the kernels' sources
    are the same in every project, only the package around them differs)."""
    shutil.copy(kernels_so, pkg / "_rt" / "_kernels" / kernels_so.name)


@dataclass
class Program:
    """One compiled program's server process on 127.0.0.1."""

    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    def wait_ready(self, timeout: float = 120.0) -> None:
        try:
            wait_healthy(self.url, self.proc, timeout)
        except ServerStartError as e:
            raise AssertionError(f"program: {e}:\n{self.tail()}") from e

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def start_program(cmd: list[str], port: int, cwd: Path, env: dict[str, str]) -> Program:
    log = cwd / f"program-{port}.log"
    with log.open("wb") as f:
        proc = subprocess.Popen(
            [*cmd, "--port", str(port), "--threads", "1"],
            cwd=cwd,
            env={**env, "MODELC_THREADS": "1"},
            stdout=f,
            stderr=subprocess.STDOUT,
        )
    prog = Program(proc, f"http://127.0.0.1:{port}", log)
    try:
        prog.wait_ready()
    except BaseException:
        prog.stop()
        raise
    return prog


def _compare(package: str) -> dict[str, object]:
    """The compiled forward against modelc's runtime on the package's artifact."""
    from modelc.artifact import load_artifact
    from modelc.runtime.arch import build
    from modelc.runtime.backends.cpu import CpuBackend
    from modelc.runtime.kv_cache import KVCache
    from modelc.runtime.model import SeqChunk

    app = importlib.import_module(f"{package}.app")
    fw = importlib.import_module(f"{package}._forward")
    art = importlib.import_module(f"{package}._rt.artifact")
    cpu = importlib.import_module(f"{package}._rt.runtime.backends.cpu")
    mm = importlib.import_module(f"{package}._rt.runtime.model")
    ref = build(load_artifact(app.ARTIFACT), CpuBackend(threads=1))
    com = fw.Compiled(art.load_artifact(app.ARTIFACT), cpu.CpuBackend(threads=1))
    rng = np.random.default_rng(0)
    res: dict[str, object] = {"architecture": fw.ARCHITECTURE, "class": type(com).__module__}
    if fw.ARCHITECTURE == "bert":
        batch = [[int(t) for t in rng.integers(0, ref.n_vocab, size=k)] for k in (7, 3, 12)]
        res["embed"] = bool(np.array_equal(ref.embed(batch), com.embed(batch)))
        return res
    if fw.ARCHITECTURE == "mlp":
        x = rng.normal(0, 1, (5, ref.n_in)).astype(np.float32)
        res["run"] = bool(np.array_equal(ref.run({"x": x})["output"], com.run({"x": x})["output"]))
        return res
    for mode in ("f32", "f16", "int8"):  # int8: the compiled class runs the runtime's loop
        cr = [ref.new_cache(mode, max_tokens=48) for _ in range(3)]
        cc = [com.new_cache(mode, max_tokens=48) for _ in range(3)]
        prompts = [[int(t) for t in rng.integers(0, ref.n_vocab, size=k)] for k in (5, 9, 1)]
        lr = ref.forward([SeqChunk(c, p) for c, p in zip(cr, prompts, strict=True)])
        lc = com.forward([mm.SeqChunk(c, p) for c, p in zip(cc, prompts, strict=True)])
        same, greedy = bool(np.array_equal(lr, lc)), []
        for _ in range(8):  # greedy decode, three sequences in one batch
            toks = [[int(t)] for t in lr.argmax(-1)]
            greedy.append(toks)
            lr = ref.forward([SeqChunk(c, t) for c, t in zip(cr, toks, strict=True)])
            lc = com.forward([mm.SeqChunk(c, t) for c, t in zip(cc, toks, strict=True)])
            same = same and bool(np.array_equal(lr, lc))
        res[mode] = same
    # short sequences (at most 7 tokens: inside Mistral's test window of 8, so a windowed
    # model takes the compiled loop too, not only the runtime's masked one)
    cr = [ref.new_cache("f16", max_tokens=8) for _ in range(3)]
    cc = [com.new_cache("f16", max_tokens=8) for _ in range(3)]
    toks = [[int(t) for t in rng.integers(0, ref.n_vocab, size=k)] for k in (2, 3, 1)]
    same = True
    for _ in range(5):
        lr = ref.forward([SeqChunk(c, t) for c, t in zip(cr, toks, strict=True)])
        lc = com.forward([mm.SeqChunk(c, t) for c, t in zip(cc, toks, strict=True)])
        same = same and bool(np.array_equal(lr, lc))
        toks = [[int(t)] for t in lr.argmax(-1)]
    res["short"] = same
    # sliding-window caches whose windowed layers move their rows to the front every few
    # tokens (Mistral: every layer, window 8; 3 rows of slack, 1 kept): the compiled loop
    # takes each cache's start (n - base), as the runtime's attention does
    kvc = importlib.import_module(f"{package}._rt.runtime.kv_cache")
    wins = getattr(ref, "kv_windows", ()) or None
    cr = [KVCache(ref.kv_shape, 48, "f16", windows=wins, window_slack=3, window_keep=1)]
    cc = [kvc.KVCache(com.kv_shape, 48, "f16", windows=wins, window_slack=3, window_keep=1)]
    if ref.state_shapes:  # recurrent layers: each sequence's state beside its cache
        from modelc.runtime.seq_state import SeqState

        vendored = importlib.import_module(f"{package}._rt.runtime.seq_state")
        cr[0].state, cc[0].state = SeqState(ref.state_shapes), vendored.SeqState(com.state_shapes)
    cf = [ref.new_cache("f16", max_tokens=48, full=True)]
    toks = [[int(t) for t in rng.integers(0, ref.n_vocab, size=5)]]
    same = True
    for _ in range(40):
        lr = ref.forward([SeqChunk(cr[0], toks[0])])
        lc = com.forward([mm.SeqChunk(cc[0], toks[0])])
        lf = ref.forward([SeqChunk(cf[0], toks[0])])
        same = same and bool(np.array_equal(lr, lc)) and bool(np.array_equal(lr, lf))
        toks = [[int(t)] for t in lr.argmax(-1)]
    res["windowed"] = same and (wins is None or cr[0].held_from(0) > 0)
    return res


def _refusal(package: str, artifact: str) -> str:
    """The error the package's compiled model gives for another model's artifact."""
    from modelc.artifact import load_artifact as modelc_load

    fw = importlib.import_module(f"{package}._forward")
    art = importlib.import_module(f"{package}._rt.artifact")
    cpu = importlib.import_module(f"{package}._rt.runtime.backends.cpu")
    errors = importlib.import_module(f"{package}._rt.errors")
    assert modelc_load(Path(artifact)).architecture  # a readable artifact
    try:
        fw.Compiled(art.load_artifact(Path(artifact)), cpu.CpuBackend(threads=1))
    except errors.UnsupportedError as e:
        return str(e)
    return "accepted"


if __name__ == "__main__":
    # PACKAGE: compare; PACKAGE=ARTIFACT: load another model's artifact into PACKAGE
    os.environ.setdefault("MODELC_THREADS", "1")
    out: dict[str, object] = {}
    for arg in sys.argv[1:]:
        pkg, _, other = arg.partition("=")
        out[arg] = _refusal(pkg, other) if other else _compare(pkg)
    print(json.dumps(out))
