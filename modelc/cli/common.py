"""Helpers shared by the CLI's command modules: config, store, progress bars, tables.

Light to import (no numpy): ``modelc --version`` and shell completion import this.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from modelc.config import Config
    from modelc.store import Store


@functools.cache
def _config() -> Config:
    from modelc.config import load_config

    return load_config()


def _store() -> Store:
    from modelc.store import Store

    return Store(_config().store_dir)


def human_bytes(n: float) -> str:
    from modelc.artifact.inspect import human_bytes as hb  # lazy: keeps `modelc --version` fast

    return hb(n)


def human_count(n: int) -> str:
    from modelc.artifact.inspect import human_count as hc

    return hc(n)


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in [header, *rows]
    ]
    return "\n".join(lines)


def _tty() -> bool:
    return sys.stderr.isatty()


class _Bars:
    """Rich progress bars on stderr, one live display for all tasks of a command."""

    def __init__(self, progress: Any) -> None:
        self.progress = progress

    def pack(self, label: str) -> Callable[[int, int, str], None]:
        task = self.progress.add_task(label, total=None)

        def update(done: int, total: int, name: str) -> None:
            self.progress.update(
                task, completed=done, total=total, description=f"{label} {name[:24]:24s}"
            )

        return update

    def download(self, label: str) -> Callable[[int, int | None], None]:
        task = self.progress.add_task(label, total=None)

        def update(done: int, total: int | None) -> None:
            self.progress.update(task, completed=done, total=total)

        return update

    def files(self) -> Callable[[str, str | None, int, int | None], None]:
        """One download bar per file of a Hub pull, added as each file starts."""
        bars: dict[str, Callable[[int, int | None], None]] = {}

        def update(path: str, digest: str | None, done: int, total: int | None) -> None:
            if path not in bars:
                bars[path] = self.download(f"pulling {path.rsplit('/', 1)[-1][:40]}")
            bars[path](done, total)

        return update


@contextmanager
def progress_bars() -> Iterator[_Bars | None]:
    """Progress bars when stderr is a terminal, else None (no output at all)."""
    if not _tty():
        yield None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as prog:
        yield _Bars(prog)


@contextmanager
def pack_progress(label: str) -> Iterator[Callable[[int, int, str], None] | None]:
    with progress_bars() as bars:
        yield bars.pack(label) if bars else None


def _resolve(arg: str) -> Path:
    from modelc.resolve import resolve_model

    with pack_progress(f"packing {Path(arg).name}") as prog:
        return resolve_model(arg, store=_store(), config=_config(), progress=prog, quiet=True)


def standalone(register: Callable[[Any], None], argv: Sequence[str] | None = None) -> int:
    """Run one command module on its own (``python -m modelc.cli.generate ...``)."""
    import argparse

    from modelc.errors import ModelcError

    parser = argparse.ArgumentParser(prog="modelc")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except ModelcError as e:
        sys.stderr.write(f"modelc: error: {e}\n")
        return e.exit_code
