"""The store's blobs (modelc.blobs): written under their SHA-256 only when the bytes hash to it,
nothing partial left by a mismatch, a failure or a killed writer; staged under file names."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from modelc.blobs import DigestError, parse_digest
from modelc.errors import UsageError
from modelc.store import Store

DATA = b"GGUF" + bytes(range(256)) * 64
DIGEST = f"sha256:{hashlib.sha256(DATA).hexdigest()}"


def files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_a_blob_is_kept_under_its_digest(tmp_path: Path) -> None:
    blobs = Store(tmp_path).blobs
    assert not blobs.has(DIGEST)
    with blobs.writer(DIGEST) as w:
        w.write(DATA[:100])
        w.write(DATA[100:])
    assert blobs.has(DIGEST)
    assert blobs.path(DIGEST).read_bytes() == DATA
    assert files(blobs.root) == [f"sha256-{DIGEST[7:]}"]
    assert blobs.has(DIGEST.replace(":", "-").upper().replace("SHA256-", "sha256-"))


def test_a_mismatch_or_a_failure_leaves_nothing(tmp_path: Path) -> None:
    blobs = Store(tmp_path).blobs
    other = f"sha256:{hashlib.sha256(b'other').hexdigest()}"
    with pytest.raises(DigestError, match="digest mismatch"), blobs.writer(other) as w:
        w.write(DATA)
    with pytest.raises(OSError), blobs.writer(DIGEST) as w:
        w.write(DATA[:10])
        raise OSError("the client went away")
    assert files(blobs.root) == []
    assert isinstance(DigestError("x"), UsageError)  # a 400


@pytest.mark.parametrize("bad", ["sha256:abc", "md5:" + "0" * 64, "0" * 64, "sha256:" + "g" * 64])
def test_digests_are_sha256(bad: str) -> None:
    with pytest.raises(UsageError, match="invalid digest format"):
        parse_digest(bad)


def test_staged_names_the_blobs_then_goes(tmp_path: Path) -> None:
    blobs = Store(tmp_path).blobs
    with blobs.writer(DIGEST) as w:
        w.write(DATA)
    with blobs.staged({"model.gguf": DIGEST, "sub/copy.bin": DIGEST}) as d:
        assert (d / "model.gguf").read_bytes() == DATA
        assert (d / "sub" / "copy.bin").read_bytes() == DATA
    assert not d.exists()
    assert files(blobs.root) == [f"sha256-{DIGEST[7:]}"]
    for name in ("../x.gguf", "/etc/x.gguf", "a/../../x"):
        with pytest.raises(UsageError, match="file path must be relative"):
            blobs.resolve({name: DIGEST}, "files")
    with pytest.raises(UsageError, match="not found"):
        blobs.resolve({"a.gguf": "sha256:" + "1" * 64}, "files")


def test_a_killed_writers_leftovers_are_swept(tmp_path: Path) -> None:
    """A stage directory or temp file whose process is gone goes when the store opens; a
    live process's stays."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    root = Store(tmp_path).blobs.root
    stage = root / f".stage.{dead.pid}.abc123.tmp"
    (stage / "sub").mkdir(parents=True)
    (stage / "sub" / "model.gguf").write_bytes(DATA)
    part = root / f".sha256-{DIGEST[7:]}.{dead.pid}.xyz.tmp"
    part.write_bytes(DATA[:10])
    mine = root / f".stage.{os.getpid()}.def456.tmp"
    mine.mkdir()
    Store(tmp_path)
    assert files(root) == [mine.name]
