"""The store's blobs: files pushed by content digest, as Ollama's ``/api/blobs/:digest`` takes them.

Layout under the store directory::

    .blobs/sha256-<64 hex>      one file, named by the SHA-256 of its bytes

(``.blobs`` can never be a model name: names start with a letter or a digit.)  A blob is
written through :func:`~modelc.artifact.atomic.atomic_output` and renamed into place only
once its bytes hash to the digest it was pushed under, so the directory never holds a
partial or mismatched file.  :meth:`BlobStore.staged` lays a set of blobs out under the
file names a model needs (``model.gguf``, or ``config.json`` + ``tokenizer.json`` +
``model.safetensors``...) as hard links in a private directory, removed afterwards.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from modelc.artifact.atomic import atomic_output
from modelc.errors import UsageError

_DIGEST = re.compile(r"^sha256[:-]([0-9a-fA-F]{64})$")


class DigestError(UsageError):
    """A blob's bytes do not hash to the digest it was pushed under."""


def parse_digest(digest: str) -> str:
    """The 64 lower-case hex digits of ``sha256:<hex>`` (or ``sha256-<hex>``)."""
    m = _DIGEST.match(digest)
    if m is None:
        raise UsageError(
            f"invalid digest format {digest!r}: write sha256:<64 hex digits>", param="digest"
        )
    return m.group(1).lower()


class BlobWriter:
    """Bytes being pushed under ``digest``: :meth:`write` them, then :meth:`commit`."""

    def __init__(self, f: BinaryIO, hexdigest: str) -> None:
        self._f = f
        self._want = hexdigest
        self._sha = hashlib.sha256()
        self.size = 0

    def write(self, chunk: bytes) -> None:
        self._f.write(chunk)
        self._sha.update(chunk)
        self.size += len(chunk)

    def check(self) -> None:
        got = self._sha.hexdigest()
        if got != self._want:
            raise DigestError(
                f'digest mismatch, expected "sha256:{self._want}", got "sha256:{got}"',
                param="digest",
            )


class BlobStore:
    """Content-addressed files under ``root`` (the store's ``.blobs``)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def path(self, digest: str) -> Path:
        return self.root / f"sha256-{parse_digest(digest)}"

    def has(self, digest: str) -> bool:
        return self.path(digest).is_file()

    def existing(self, digest: str, param: str) -> Path:
        """The blob's path; 400 naming ``param`` when it was never pushed."""
        p = self.path(digest)
        if not p.is_file():
            raise UsageError(
                f'blob "{digest}" not found: push it first (POST /api/blobs/{digest})',
                param=param,
            )
        return p

    def resolve(self, files: Mapping[str, str], param: str) -> dict[str, Path]:
        """Each file's blob (file name -> path); 400 for a name that is not a relative path
        or a blob never pushed."""
        return {_relative(name, param): self.existing(d, param) for name, d in files.items()}

    @contextlib.contextmanager
    def writer(self, digest: str) -> Iterator[BlobWriter]:
        """Write a blob; on a clean exit its hash is checked and it appears under its digest.
        A mismatch (:class:`DigestError`) or any failure leaves nothing behind."""
        dest = self.path(digest)
        with atomic_output(dest) as f:
            w = BlobWriter(f, parse_digest(digest))
            yield w
            w.check()

    @contextlib.contextmanager
    def staged(self, files: Mapping[str, str], param: str = "files") -> Iterator[Path]:
        """The blobs ``files`` names (file name -> digest) as files of one directory,
        hard-linked (copied where links are refused); the directory goes afterwards."""
        if not files:
            raise UsageError("no files provided to convert", param=param)
        sources = self.resolve(files, param)
        self.root.mkdir(parents=True, exist_ok=True)
        # named as atomic_output's temp files are, so that a killed writer's is swept away
        tmp = Path(tempfile.mkdtemp(prefix=f".stage.{os.getpid()}.", suffix=".tmp", dir=self.root))
        try:
            for name, src in sources.items():
                dest = tmp / name
                dest.parent.mkdir(parents=True, exist_ok=True)
                try:
                    os.link(src, dest)
                except OSError:
                    shutil.copyfile(src, dest)
            yield tmp
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def _relative(name: str, param: str) -> str:
    p = PurePosixPath(name)
    if not name or p.is_absolute() or any(part in ("", ".", "..") for part in p.parts):
        raise UsageError(f"file path must be relative: {name!r}", param=param)
    return str(p)
