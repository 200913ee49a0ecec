"""Turn a MODEL argument into a ``.modelc`` file.

A MODEL may be, in this order of precedence:

1. an existing path: a ``.modelc`` file (used as is), a raw model file (GGUF,
   safetensors, PyTorch ``.bin``, ONNX) or a Hugging Face model directory, which is
   packed on the fly into ``<cache>/packed/<key>.modelc``; the key hashes the
   absolute path, size and mtime of every file, so a second use is instant and an
   edited source is re-packed;
2. a store name, ``name[:version]``;
3. a catalog name (``smollm2-135m``, ``minilm-l6``), pulled into the store on first use;
4. a Hugging Face name ``hf.co/USER/REPO[:QUANT]``: the store's ``user-repo:quant``,
   pulled from the Hub on first use.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

from modelc.artifact import is_artifact, load_artifact, write_artifact
from modelc.artifact.atomic import sweep_stale
from modelc.catalog import CATALOG, cache_dir
from modelc.config import Config, load_config
from modelc.errors import ModelNotFoundError, UsageError
from modelc.formats.ir import ModelIR
from modelc.store import Store, parse_ref

PackProgress = Callable[[int, int, str], None]


def _source_key(p: Path) -> str:
    """Hash of a source's absolute path and the size + mtime of each of its files."""
    p = p.resolve()
    h = hashlib.blake2b(digest_size=16)
    h.update(str(p).encode())
    files = sorted(x for x in p.rglob("*") if x.is_file()) if p.is_dir() else [p]
    for f in files:
        st = f.stat()
        h.update(
            f"\0{f.relative_to(p) if p.is_dir() else ''}\0{st.st_size}\0{st.st_mtime_ns}".encode()
        )
    return h.hexdigest()


def packed_cache_path(src: Path) -> Path:
    return cache_dir() / "packed" / f"{_source_key(src)}.modelc"


def _looks_like_path(arg: str) -> bool:
    return (
        "/" in arg
        or arg.startswith(".")
        or arg.endswith((".gguf", ".safetensors", ".bin", ".onnx", ".modelc", ".pt", ".pth"))
    )


def resolve_model(
    arg: str,
    *,
    store: Store | None = None,
    config: Config | None = None,
    progress: PackProgress | None = None,
    quiet: bool = True,
) -> Path:
    """The ``.modelc`` path for a MODEL argument (packing or pulling it if needed)."""
    if not arg:
        raise UsageError("empty MODEL argument; give a store name, a catalog name or a model path")
    from modelc.hub import is_hub_ref, parse_hub_ref

    p = Path(arg).expanduser()
    if is_hub_ref(arg) and not p.exists():
        store = store or Store((config or load_config()).store_dir)
        ref = parse_hub_ref(arg).store_ref
        if store.exists(ref):
            return store.resolve(ref)
        from modelc.pull import pull

        return pull(arg, store, pack_progress=progress, quiet=quiet)[1]
    if p.exists():
        if p.is_file() and is_artifact(p):
            return p
        cached = packed_cache_path(p)
        sweep_stale(cached.parent, depth=0)
        if not cached.exists():
            from modelc.formats import load_model

            write_artifact(load_model(p), cached, progress=progress)
        return cached
    if _looks_like_path(arg) and ":" not in arg:
        raise ModelNotFoundError("no such file or directory", path=arg)
    cfg = config or load_config()
    store = store or Store(cfg.store_dir)
    try:
        name, _ = parse_ref(arg)
    except UsageError as e:
        raise ModelNotFoundError(
            f"{arg!r} is not a file, a store name or a catalog model; see `modelc list`"
        ) from e
    if store.exists(arg):
        return store.resolve(arg)
    if name in CATALOG and not store.versions(name):
        from modelc.pull import pull

        _, path = pull(name, store, name=arg, pack_progress=progress, quiet=quiet)
        return path
    if store.versions(name):
        return store.resolve(arg)  # raises: names the missing version
    known = ", ".join(sorted(CATALOG))
    raise ModelNotFoundError(
        f"no model named {arg!r}: not a file, not in the store (see `modelc list`), "
        f"and not a catalog model ({known})"
    )


def load_ir(arg: str, *, store: Store | None = None, config: Config | None = None) -> ModelIR:
    """The model for a MODEL argument, reading a raw file directly instead of packing it."""
    return open_ir(arg, store=store, config=config)[0]


def open_ir(
    arg: str, *, store: Store | None = None, config: Config | None = None
) -> tuple[ModelIR, Path | None]:
    """As :func:`load_ir`, and the ``.modelc`` file it was read from (None: a raw file)."""
    p = Path(arg).expanduser()
    if p.is_file() and not is_artifact(p):
        from modelc.formats import load_model

        return load_model(p), None
    path = resolve_model(arg, store=store, config=config)
    return load_artifact(path), path
