"""``modelc bench --url`` after ``pip install -e .`` without extras: it needs only the core
dependencies, and ``--plot`` without matplotlib fails before the load test starts."""

from __future__ import annotations

import http.server
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import ClassVar

import pytest

from tests.cli_support import Cli


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    return Cli(tmp_path / "home", tmp_path / "cache", tmp_path)


def _shadowing(tmp_path: Path, *modules: str) -> str:
    """A PYTHONPATH under which importing each of ``modules`` raises ImportError."""
    d = tmp_path / "shadow"
    for m in modules:
        (d / m).mkdir(parents=True)
        (d / m / "__init__.py").write_text(f"raise ImportError('{m} is not installed (test)')\n")
    return str(d)


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Answers every request with an empty model list, and records its path."""

    seen: ClassVar[list[str]] = []

    def _answer(self) -> None:
        self.seen.append(f"{self.command} {self.path}")
        body = b'{"object": "list", "data": []}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_bench_plot_without_matplotlib_fails_before_any_request(cli: Cli, tmp_path: Path) -> None:
    cli.env["PYTHONPATH"] = _shadowing(tmp_path, "matplotlib")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        live = f"http://127.0.0.1:{server.server_address[1]}"
        dead = f"http://127.0.0.1:{_free_port()}"
        for url in (live, dead):
            err = cli.fails(
                "bench", "--url", url, "--requests", "1", "--plot", "x.png",
                match=r"^modelc: error: --plot needs matplotlib",
            )  # fmt: skip
            assert "pip install 'modelc[bench]'" in err
        assert _Recorder.seen == []  # refused before the load test sent anything
        assert not (tmp_path / "x.png").exists()
        cli.env.pop("PYTHONPATH")
        cli.fails(
            "bench", "--url", live, "--plot", "no/such/dir/x.png",
            match=r"--plot: directory no/such/dir does not exist",
        )  # fmt: skip
        assert _Recorder.seen == []
    finally:
        server.shutdown()
        server.server_close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _core_closure() -> set[str]:
    """Distributions `pip install -e .` installs: pyproject's dependencies, transitively."""
    import importlib.metadata as md
    import tomllib

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    pyproject = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())
    todo = [Requirement(r) for r in pyproject["project"]["dependencies"]]
    seen: set[str] = set()
    while todo:
        req = todo.pop()
        name = str(canonicalize_name(req.name))
        if name in seen:
            continue
        seen.add(name)
        wanted = {"", *req.extras}
        try:
            reqs = md.requires(req.name) or []
        except md.PackageNotFoundError:
            continue
        for r in map(Requirement, reqs):
            if r.marker is None or any(r.marker.evaluate({"extra": e}) for e in wanted):
                todo.append(r)
    return seen


def _imported(lines: list[str]) -> set[str]:
    """Top-level modules named in ``-X importtime`` output."""
    return {
        ln.rsplit("|", 1)[1].strip().split(".")[0] for ln in lines if ln.startswith("import time:")
    }


def test_bench_load_test_needs_only_core_dependencies(cli: Cli, tmp_path: Path) -> None:
    """Every module `modelc bench --url` imports comes from modelc's core dependencies,
    and the extras' own packages are not needed (shadowed here, it still runs)."""
    import importlib.metadata as md

    from packaging.utils import canonicalize_name

    cli.env["PYTHONPATH"] = _shadowing(tmp_path, "matplotlib", "xllamacpp")
    cli.env["PYTHONPROFILEIMPORTTIME"] = "1"  # every import, on stderr
    url = f"http://127.0.0.1:{_free_port()}"
    proc = cli("bench", "--url", url, "--requests", "1", ok=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and lines[-1].startswith(f"modelc: error: cannot reach {url}"), (
        proc.stderr[-2000:]
    )
    imported = _imported(lines) - _imported(  # less what the interpreter imports at startup
        subprocess.run(
            [sys.executable, "-c", "pass"], env=cli.env, capture_output=True, text=True
        ).stderr.splitlines()
    )
    assert "httpx" in imported and "trio" in imported
    dists = md.packages_distributions()
    used = {str(canonicalize_name(d)) for m in imported for d in dists.get(m, [])}
    assert used - _core_closure() - {"modelc"} == set()
