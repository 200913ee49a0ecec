"""Atomic file output: write a temp file next to the destination, fsync, rename.

A reader (or the store) therefore sees either the old file or the complete new one,
never a partial file, even if the writer is killed half way.  The file gets the mode
an ordinary ``open(path, "w")`` would give it (0666 less the umask), not the 0600 of
the temp file.
"""

from __future__ import annotations

import contextlib
import os
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
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
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


def write_text_atomic(dest: Path, text: str) -> None:
    with atomic_output(dest) as f:
        f.write(text.encode())
