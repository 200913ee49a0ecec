"""The local model store: named, versioned ``.modelc`` files.

Layout under the store directory (``Config.store_dir``)::

    <name>/<version>.modelc     one packed model version
    <name>/current              text file: the version ``<name>`` alone refers to
    .blobs/sha256-<hex>         files pushed by digest (:mod:`modelc.blobs`)

Every write is atomic (temp file in the same directory, fsync, rename), so the
store never holds a partial entry: a failed pack or copy leaves it unchanged.
Files are immutable once added, so ``cp`` may hard-link them.
"""

from __future__ import annotations

import contextlib
import operator
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from modelc.artifact import PackOptions, open_artifact, write_artifact
from modelc.artifact.atomic import atomic_output, fsync_dir, sweep_stale, write_text_atomic
from modelc.artifact.inspect import quant_label
from modelc.blobs import BlobStore
from modelc.errors import ModelcError, ModelNotFoundError, StoreError, UsageError
from modelc.formats.ir import ModelIR

DEFAULT_VERSION = "latest"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
SUFFIX = ".modelc"
MMPROJ_SUFFIX = ".mmproj.gguf"  # a version's vision projector, kept beside its artifact


def mmproj_beside_path(artifact: Path) -> Path:
    return artifact.with_name(artifact.name.removesuffix(SUFFIX) + MMPROJ_SUFFIX)


def mmproj_beside(artifact: Path) -> Path | None:
    """The vision projector kept with a store artifact (pulled beside its GGUF), if any."""
    p = mmproj_beside_path(artifact)
    return p if artifact.name.endswith(SUFFIX) and p.is_file() else None


def parse_ref(ref: str) -> tuple[str, str | None]:
    """Split ``name[:version]`` and check both parts."""
    name, sep, version = ref.partition(":")
    check_name(name, "model name")
    if sep:
        check_name(version, "version")
        return name, version
    return name, None


def check_name(s: str, what: str) -> None:
    if not _NAME_RE.match(s) or s.endswith(".tmp"):
        raise UsageError(
            f"invalid {what} {s!r}: use letters, digits, '.', '_' or '-' (starting with a letter or digit)"
        )


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """One version of one model, as ``list`` shows it."""

    name: str
    version: str
    path: Path
    current: bool
    architecture: str
    n_params: int
    size: int
    quantization: str
    compression: str
    created: str
    error: str | None = None  # set when the file cannot be opened (`modelc verify` says why)

    @property
    def ref(self) -> str:
        return f"{self.name}:{self.version}"


def entry_for(path: Path, name: str, version: str, current: bool) -> ModelEntry:
    try:
        art = open_artifact(path)
    except ModelcError as e:  # list it anyway, so the user can see and rm it
        return ModelEntry(
            name=name,
            version=version,
            path=path,
            current=current,
            architecture="unreadable",
            n_params=0,
            size=path.stat().st_size,
            quantization="-",
            compression="-",
            created="",
            error=str(e),
        )
    try:
        pack = art.manifest.pack
        return ModelEntry(
            name=name,
            version=version,
            path=path,
            current=current,
            architecture=art.manifest.architecture,
            n_params=art.n_params,
            size=art.size,
            quantization=quant_label(art),
            compression=pack.compression
            if pack.compression == "none"
            else f"{pack.compression}-{pack.compression_level}",
            created=art.manifest.created,
        )
    finally:
        art.close()


_SIZE_RE = re.compile(r"^(>=|<=|>|<|=)(\d+(?:\.\d+)?)([kKmMgGtT]?)([bB]?)$")
_MULT = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


def _size_filter(term: str) -> Callable[[ModelEntry], bool] | None:
    """``>100M`` compares parameters, ``<500MB`` compares file size (a trailing B means bytes)."""
    m = _SIZE_RE.match(term)
    if not m:
        return None
    op, num, unit, b = m.groups()
    value = float(num) * _MULT[unit.lower()]
    ops: dict[str, Callable[[float, float], bool]] = {
        ">": operator.gt,
        "<": operator.lt,
        ">=": operator.ge,
        "<=": operator.le,
        "=": operator.eq,
    }
    cmp = ops[op]

    def by_size(e: ModelEntry) -> bool:
        return cmp(e.size, value)

    def by_params(e: ModelEntry) -> bool:
        return cmp(e.n_params, value)

    return by_size if b else by_params


def _term_filter(term: str) -> Callable[[ModelEntry], bool]:
    key, sep, val = term.partition(":")
    low = val.lower() if sep else term.lower()

    def arch(e: ModelEntry) -> bool:
        return e.architecture.lower() == low

    def quant(e: ModelEntry) -> bool:
        return low in e.quantization.lower()

    def word(e: ModelEntry) -> bool:
        return (
            low in e.name.lower() or low == e.architecture.lower() or low in e.quantization.lower()
        )

    if sep and key == "arch":
        return arch
    if sep and key == "quant":
        return quant
    return word


class Store:
    """A model store rooted at ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.blobs = BlobStore(self.root / ".blobs")  # pushed by digest (Ollama's /api/blobs)
        sweep_stale(self.root)  # what writers killed before they finished left behind

    # -- lookup ----------------------------------------------------------------
    def _dir(self, name: str) -> Path:
        d = self.root / name
        if d.is_symlink() or (d.exists() and not d.resolve().is_relative_to(self.root.resolve())):
            raise StoreError(
                f"the store entry {name!r} ({d}) is a symbolic link; modelc never writes, reads "
                "or removes through one: remove the link"
            )
        return d

    def versions(self, name: str) -> list[str]:
        """Versions of ``name``, oldest first (by file modification time)."""
        d = self._dir(name)
        if not d.is_dir():
            return []
        files = [
            p for p in d.glob(f"*{SUFFIX}") if not p.name.startswith(".") and not p.is_symlink()
        ]  # a planted link to a file elsewhere is not a version
        files.sort(key=lambda p: (p.stat().st_mtime_ns, p.name))
        return [p.name[: -len(SUFFIX)] for p in files]

    def current(self, name: str) -> str | None:
        versions = self.versions(name)
        if not versions:
            return None
        try:
            cur = (self._dir(name) / "current").read_text(encoding="utf-8").strip()
        except OSError:
            cur = ""
        return cur if cur in versions else versions[-1]

    def names(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(
            p.name
            for p in self.root.iterdir()
            if p.is_dir() and not p.is_symlink() and self.versions(p.name)
        )

    def exists(self, ref: str) -> bool:
        name, version = parse_ref(ref)
        versions = self.versions(name)
        return bool(versions) and (version is None or version in versions)

    def resolve(self, ref: str) -> Path:
        """Path of ``name[:version]`` (the current version when none is given)."""
        name, version = parse_ref(ref)
        versions = self.versions(name)
        if not versions:
            raise ModelNotFoundError(f"no model named {name!r} in the store; see `modelc list`")
        if version is None:
            version = self.current(name)
            assert version is not None
        elif version not in versions:
            raise ModelNotFoundError(
                f"model {name!r} has no version {version!r} (versions: {', '.join(versions)})"
            )
        return self._dir(name) / f"{version}{SUFFIX}"

    # -- listing ---------------------------------------------------------------
    def list_models(self) -> list[ModelEntry]:
        out: list[ModelEntry] = []
        for name in self.names():
            cur = self.current(name)
            for v in self.versions(name):
                out.append(entry_for(self._dir(name) / f"{v}{SUFFIX}", name, v, v == cur))
        return out

    def search(self, query: str) -> list[ModelEntry]:
        """Entries matching every term of ``query``.

        A term is ``>100M`` / ``<=1G`` (parameter count), ``<500MB`` (file size),
        ``arch:llama``, ``quant:q4_1``, or a word matched against the name,
        architecture and quantization (case-insensitive substring).
        """
        terms = query.split()
        if not terms:
            raise UsageError(
                "empty search query; give a name, an architecture or a size like '>100M'"
            )
        preds: list[Callable[[ModelEntry], bool]] = []
        for term in terms:
            size = _size_filter(term)
            if size is not None:
                preds.append(size)
                continue
            if term[:1] in "<>=" and len(term) > 1:
                raise UsageError(
                    f"bad size filter {term!r}: write e.g. '>100M' (parameters) or '<500MB' (bytes)"
                )
            preds.append(_term_filter(term))
        return [e for e in self.list_models() if all(p(e) for p in preds)]

    # -- changes ---------------------------------------------------------------
    def _set_current(self, name: str, version: str) -> None:
        write_text_atomic(self._dir(name) / "current", version + "\n")

    def add(
        self,
        src: Path | ModelIR,
        ref: str,
        opts: PackOptions | None = None,
        *,
        progress: Callable[[int, int, str], None] | None = None,
        mmproj: Path | None = None,
    ) -> Path:
        """Add a ``.modelc`` file (copied) or a model IR (packed) as ``name[:version]``, with
        its vision projector (``mmproj``) beside it; make it current."""
        name, version = parse_ref(ref)
        version = version or DEFAULT_VERSION
        d = self._dir(name)
        dest = d / f"{version}{SUFFIX}"
        d.mkdir(parents=True, exist_ok=True)
        try:
            if isinstance(src, ModelIR):
                write_artifact(src, dest, opts, progress=progress)
            else:
                open_artifact(src).close()  # refuse anything that is not a good artifact
                with atomic_output(dest) as f, Path(src).open("rb") as s:
                    shutil.copyfileobj(s, f, 1 << 20)
            side = mmproj_beside_path(dest)
            if mmproj is not None:
                with atomic_output(side) as f, mmproj.open("rb") as s:
                    shutil.copyfileobj(s, f, 1 << 20)
            else:  # a version replaced by one without a projector keeps none
                side.unlink(missing_ok=True)
        except BaseException:
            self._drop_if_empty(name)
            raise
        self._set_current(name, version)
        return dest

    def switch(self, name: str, version: str) -> None:
        check_name(name, "model name")
        check_name(version, "version")
        versions = self.versions(name)
        if not versions:
            raise ModelNotFoundError(f"no model named {name!r} in the store; see `modelc list`")
        if version not in versions:
            raise ModelNotFoundError(
                f"model {name!r} has no version {version!r} (versions: {', '.join(versions)})"
            )
        self._set_current(name, version)

    def cp(self, src: str, dst: str) -> Path:
        """Copy ``src`` (``name[:version]``) to ``dst`` (``name[:version]``, default: src's version)."""
        spath = self.resolve(src)
        sversion = spath.name[: -len(SUFFIX)]
        dname, dversion = parse_ref(dst)
        dversion = dversion or sversion
        dest = self._dir(dname) / f"{dversion}{SUFFIX}"
        if dest.exists():
            raise StoreError(
                f"{dname}:{dversion} already exists; remove it first or pick another name"
            )
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            try:
                # files are never modified in place, so a hard link is a safe copy
                tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
                os.link(spath, tmp)
                os.replace(tmp, dest)
                fsync_dir(dest.parent)
            except OSError:
                with atomic_output(dest) as f, spath.open("rb") as s:
                    shutil.copyfileobj(s, f, 1 << 20)
            if (side := mmproj_beside(spath)) is not None:
                with atomic_output(mmproj_beside_path(dest)) as f, side.open("rb") as s:
                    shutil.copyfileobj(s, f, 1 << 20)
        except BaseException:
            self._drop_if_empty(dname)
            raise
        if self.current(dname) == dversion or len(self.versions(dname)) == 1:
            self._set_current(dname, dversion)
        return dest

    def rm(self, ref: str, *, force: bool = False, all_versions: bool = False) -> list[str]:
        """Remove ``name:version``, or ``name`` (refused when it has several versions unless forced)."""
        name, version = parse_ref(ref)
        versions = self.versions(name)
        if not versions:
            raise ModelNotFoundError(f"no model named {name!r} in the store; see `modelc list`")
        if version is not None:
            if version not in versions:
                raise ModelNotFoundError(
                    f"model {name!r} has no version {version!r} (versions: {', '.join(versions)})"
                )
            (self._dir(name) / f"{version}{SUFFIX}").unlink()
            (self._dir(name) / f"{version}{MMPROJ_SUFFIX}").unlink(missing_ok=True)
            rest = [v for v in versions if v != version]
            if not rest:
                self._remove_dir(name)
            elif self.current(name) not in rest or _read(self._dir(name) / "current") == version:
                self._set_current(name, rest[-1])
            return [f"{name}:{version}"]
        if len(versions) > 1 and not (force or all_versions):
            raise StoreError(
                f"model {name!r} has {len(versions)} versions ({', '.join(versions)}); "
                f"remove one with `modelc rm {name}:VERSION`, or all with --all"
            )
        self._remove_dir(name)
        return [f"{name}:{v}" for v in versions]

    def _remove_dir(self, name: str) -> None:
        d = self._dir(name)
        # rename first, so the name disappears atomically even if deleting the files fails
        trash = Path(tempfile.mkdtemp(prefix=".trash-", dir=self.root))
        os.replace(d, trash / name)
        shutil.rmtree(trash, ignore_errors=True)
        fsync_dir(self.root)

    def _drop_if_empty(self, name: str) -> None:
        d = self._dir(name)
        with contextlib.suppress(OSError):
            if not any(p for p in d.iterdir() if not p.name.startswith(".")):
                shutil.rmtree(d)

    def verify_all(self) -> list[tuple[str, ModelcError | None]]:
        from modelc.artifact import verify_artifact

        out: list[tuple[str, ModelcError | None]] = []
        for name in self.names():
            for v in self.versions(name):
                try:
                    verify_artifact(self._dir(name) / f"{v}{SUFFIX}")
                    out.append((f"{name}:{v}", None))
                except ModelcError as e:
                    out.append((f"{name}:{v}", e))
        return out


def _read(p: Path) -> str:
    try:
        return p.read_text(encoding="utf-8").strip()
    except OSError:
        return ""


def open_store(config: object | None = None) -> Store:
    """The store configured by ``config`` (a :class:`modelc.config.Config`; loaded if None)."""
    from modelc.config import Config, load_config

    cfg = config if isinstance(config, Config) else load_config()
    return Store(cfg.store_dir)
