"""Running the real ``modelc`` command in tests: MODELC_HOME / MODELC_CACHE in temp dirs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file


def _with_umask(mask: int) -> Callable[[], None]:
    def set_umask() -> None:
        os.umask(mask)

    return set_umask


class Cli:
    def __init__(self, home: Path, cache: Path, cwd: Path) -> None:
        self.env = {**os.environ, "MODELC_HOME": str(home), "MODELC_CACHE": str(cache)}
        self.env.pop("MODELC_CONFIG", None)
        self.cwd = cwd

    def __call__(
        self, *args: str, ok: bool = True, umask: int | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run ``modelc ARGS`` (under ``umask`` if given); with ``ok``, expect exit 0."""
        proc = subprocess.run(
            [sys.executable, "-m", "modelc.cli", *args],
            capture_output=True,
            text=True,
            env=self.env,
            cwd=self.cwd,
            timeout=300,
            check=False,
            preexec_fn=None if umask is None else _with_umask(umask),
        )
        if ok:
            assert proc.returncode == 0, (
                f"modelc {' '.join(args)} -> {proc.returncode}\n{proc.stderr}"
            )
        return proc

    def fails(self, *args: str, match: str) -> str:
        """Run, expect exit 2 with one clean error line matching ``match``."""
        proc = self(*args, ok=False)
        err = proc.stderr
        assert proc.returncode == 2, (args, proc.returncode, err)
        assert "Traceback" not in err, err
        assert len(err.strip().splitlines()) == 1, err
        assert err.startswith("modelc"), err
        assert re.search(match, err), (match, err)
        return err


def write_mlp(path: Path) -> dict[str, np.ndarray]:
    """A 32 -> 64 -> 8 MLP as a safetensors file; returns its arrays (source names)."""
    rng = np.random.default_rng(3)
    w = {
        "fc1.weight": rng.standard_normal((64, 32), dtype=np.float32),
        "fc1.bias": rng.standard_normal(64, dtype=np.float32),
        "fc2.weight": rng.standard_normal((8, 64), dtype=np.float32),
    }
    save_file(w, str(path))
    return w
