"""The project's shell scripts pass shellcheck at warning level: the GPU calls run them
on a lent machine, where a slip costs device time that cannot be had back."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_scripts_pass_shellcheck() -> None:
    scripts = [*sorted((ROOT / "scripts").glob("*.sh")), ROOT / ".ci" / "run"]
    assert len(scripts) > 5
    shellcheck = Path(sys.executable).parent / "shellcheck"
    run = subprocess.run(
        [str(shellcheck), "-S", "warning", *map(str, scripts)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
