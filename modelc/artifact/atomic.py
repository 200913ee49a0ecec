"""Atomic file output: write a temp file next to the destination, fsync, rename.

A reader (or the store) therefore sees either the old file or the complete new one,
never a partial file, even if the writer is killed half way.  The file gets the mode
an ordinary ``open(path, "w")`` would give it (0666 less the umask), not the 0600 of
the temp file.  A temp file's name carries its writer's pid (``.NAME.PID.XXXX.tmp``):
:func:`sweep_stale` removes those whose writer is gone (a ``kill -9``), and the store
and the pack cache sweep their directories whenever they are opened.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


def fsync_dir(path: Path) -> None:
    """Make a rename inside ``path`` durable (best effort where directories can't be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def current_umask() -> int:
    """The process umask, read from ``/proc`` where possible (setting it is process-wide)."""
    try:
        for line in Path("/proc/self/status").read_text(encoding="ascii").splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_output(dest: Path) -> Iterator[BinaryIO]:
    """Yield a binary file; on clean exit it is fsynced and renamed to ``dest``, else removed."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(
        prefix=f".{dest.name}.{os.getpid()}.", suffix=".tmp", dir=dest.parent
    )
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "w+b") as f:
            if hasattr(os, "fchmod"):  # mkstemp makes 0600; give the file the user's umask
                os.fchmod(f.fileno(), 0o666 & ~current_umask())
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_dir(dest.parent)


_TEMP = re.compile(r"^\..+\.(\d+)\.(?:[A-Za-z0-9_]+\.)?tmp$")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True  # someone else's process (or not a pid we can ask about): leave it
    return True


def sweep_stale(directory: Path, depth: int = 1) -> list[Path]:
    """Remove temp files (and temp directories named the same way, ``.NAME.PID.XXXX.tmp``)
    in ``directory`` (and ``depth`` levels below) whose writer died."""
    removed: list[Path] = []
    try:
        entries = list(directory.iterdir())
    except OSError:
        return removed
    for p in entries:
        m = _TEMP.match(p.name)
        if m is not None and not p.is_symlink() and not _alive(int(m.group(1))):
            with contextlib.suppress(OSError):
                if p.is_dir():
                    shutil.rmtree(p)
                else:
                    p.unlink()
                removed.append(p)
        elif depth > 0 and p.is_dir() and not p.is_symlink():
            removed += sweep_stale(p, depth - 1)
    return removed


def write_text_atomic(dest: Path, text: str) -> None:
    with atomic_output(dest) as f:
        f.write(text.encode())
