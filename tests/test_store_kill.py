"""kill -9 at random points of every store-writing command (issue 15).

``pack``, ``pull`` (file://), ``cp``, ``switch`` and ``rm`` are started as real processes
and killed with SIGKILL after a random delay (seeded; ``KILL_ITERATIONS`` per command,
default 2).  After each kill the next command (``list``) sweeps the dead writer's temp
files, ``verify --all`` is clean, the model nobody touched is byte-for-byte what it was,
and the model being written is either absent or whole (it verifies).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import assets
from tests.cli_support import Cli

ITERATIONS = int(os.environ.get("KILL_ITERATIONS", "2"))


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    c = Cli(tmp_path / "home", tmp_path / "cache", tmp_path)
    smol = str(assets.smollm2_gguf())
    c("pack", smol, "--name", "base")
    c("cp", "base", "keep")
    c("cp", "base", "base:q8")  # a second version to switch to
    return c


def _store(cli: Cli) -> Path:
    return Path(cli.env["MODELC_HOME"]) / "models"


def _snapshot(cli: Cli, name: str) -> dict[Path, tuple[int, int]]:
    return {
        p: (p.stat().st_size, p.stat().st_mtime_ns)
        for p in (_store(cli) / name).rglob("*")
        if p.is_file()
    }


def _names(cli: Cli) -> dict[str, dict[str, object]]:
    out = json.loads(cli("list", "--json").stdout)
    return {str(e["name"]): e for e in out}


def _killed(cli: Cli, args: list[str], delay: float) -> int:
    proc = subprocess.Popen(
        [sys.executable, "-m", "modelc.cli", *args],
        env=cli.env,
        cwd=cli.cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    return proc.wait(30)


@pytest.mark.parametrize("op", ["pack", "pull", "cp", "switch", "rm"])
def test_kill_9_anywhere_leaves_a_consistent_store(cli: Cli, op: str) -> None:
    smol = assets.smollm2_gguf()
    rng = random.Random(f"kill-{op}")
    kept = _snapshot(cli, "keep")
    commands = {
        "pack": ["pack", str(smol), "--name", "new", "--compress"],
        "pull": ["pull", smol.as_uri(), "--name", "new"],
        "cp": ["cp", "base", "new"],
        "switch": ["switch", "base", "q8"],
        "rm": ["rm", "new", "--all"],
    }
    fast = {"switch", "rm"}
    outcomes = []
    for _ in range(ITERATIONS):
        if op == "rm":
            cli("cp", "base", "new")
        # metadata commands finish soon after Python starts: kill them earlier
        rc = _killed(cli, commands[op], rng.uniform(*((0.1, 0.7) if op in fast else (0.3, 2.0))))
        outcomes.append("killed" if rc == -signal.SIGKILL else f"exit {rc}")
        names = _names(cli)  # the next command: sweeps what the dead writer left
        left = [p for p in _store(cli).rglob("*") if p.name.endswith(".tmp")]
        assert not left, f"temp files after {op} was killed: {left}"
        verify = cli("verify", "--all", ok=False)
        assert verify.returncode == 0, f"verify --all after {op} was killed:\n{verify.stdout}"
        assert "keep" in names and _snapshot(cli, "keep") == kept
        assert "base" in names
        if "new" in names:  # written whole or not at all
            assert "ok new" in cli("verify", "new").stdout
            cli("rm", "new", "--all")
        if op == "switch":
            cli("switch", "base", "latest")
    print(op, outcomes)
