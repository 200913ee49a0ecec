"""Models from the Hugging Face Hub: ``hf.co/{user}/{repo}[:{quant}]``.

A name may be written ``hf.co/u/r``, ``huggingface.co/u/r`` (as Ollama takes them) or
``hf://u/r``, with an optional ``:QUANT`` tag (``:latest`` is no tag).  The GGUF file is picked as llama.cpp's
``-hf`` does (``common/download.cpp``): the first model GGUF (not ``mmproj``,
``imatrix``, ...) whose path contains the tag followed by ``.`` or ``-``, compared
without case; with no tag ``Q4_K_M``, then ``Q8_0``, then the first model GGUF.  A split
GGUF (``-00001-of-0000N.gguf``) is fetched whole; the GGUF reader joins its parts; an
``mmproj`` GGUF beside it is fetched too (:func:`pick_mmproj`) and kept with the model.  A
repository with no GGUF but a ``config.json`` and ``*.safetensors`` is fetched as a
Hugging Face directory (config, tokenizer, shards).

Files go through ``huggingface_hub``'s cache (``HF_HOME`` / ``HF_HUB_CACHE``), from
``HF_ENDPOINT`` with ``HF_TOKEN``; with ``HF_HUB_OFFLINE=1`` the repository's cached
snapshot is used and nothing is asked of the network.  huggingface_hub downloads into a
per-process temporary file that a killed process leaves behind unused, so a blob is
downloaded here into ``blobs/<etag>.incomplete``, resumed with a Range request by the
next pull, checked against the Hub's sha256 (LFS files) and renamed into place; the
library then links it into the snapshot.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from modelc.errors import DownloadError, ModelNotFoundError, UsageError

# (file path in the repository, its sha256 when the Hub gives one, bytes done, bytes total)
FileProgress = Callable[[str, str | None, int, int | None], None]

_REF = re.compile(
    r"^(?:hf\.co/|huggingface\.co/|hf://)"
    r"(?P<repo>[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*)"
    r"(?::(?P<tag>[A-Za-z0-9._-]+))?$",
    re.IGNORECASE,
)
_PREFIX = re.compile(r"^(?:hf\.co/|huggingface\.co/|hf://)", re.IGNORECASE)
_SPLIT = re.compile(r"^(.+)-([0-9]{5})-of-([0-9]{5})$", re.IGNORECASE)
_QUANT = re.compile(r"[-.]([A-Z0-9_]+)$", re.IGNORECASE)
_NOT_MODEL = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")
_DEFAULT_TAGS = ("Q4_K_M", "Q8_0")
_HF_DIR_FILES = re.compile(
    r"^(?:[^/]+\.json|[^/]+\.safetensors|tokenizer\.model|[^/]+\.jinja|vocab\.txt|merges\.txt)$"
)
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True, slots=True)
class HubRef:
    """A parsed ``hf.co/{user}/{repo}[:{tag}]``."""

    repo_id: str
    tag: str | None

    @property
    def store_ref(self) -> str:
        """The store's ``name:version`` for this pull: ``user-repo:tag`` (``latest`` untagged)."""
        name = re.sub(r"[^a-z0-9._-]+", "-", self.repo_id.lower().replace("/", "-")).strip("-._")
        return f"{name[:128]}:{(self.tag or 'latest').lower()}"

    def __str__(self) -> str:
        return f"hf.co/{self.repo_id}" + (f":{self.tag}" if self.tag else "")


@dataclass(frozen=True, slots=True)
class HubFile:
    path: str  # in the repository
    size: int | None
    sha256: str | None  # LFS files: the sha256 the Hub keeps


def is_hub_ref(s: str) -> bool:
    """True for ``hf.co/...``, ``huggingface.co/...`` and ``hf://...`` names."""
    return _PREFIX.match(s) is not None


def parse_hub_ref(s: str) -> HubRef:
    m = _REF.match(s)
    if m is None:
        raise UsageError(
            f"{s!r} is not a Hugging Face model name; write hf.co/USER/REPO or hf.co/USER/REPO:QUANT"
        )
    tag = m.group("tag")
    return HubRef(m.group("repo"), None if tag is None or tag.lower() == "latest" else tag)


def _split(path: str) -> tuple[str, str, int, int] | None:
    """(prefix, quant tag, part index, part count) of a ``.gguf`` path, else None."""
    if not path.endswith(".gguf"):
        return None
    prefix, index, count = path[: -len(".gguf")], 1, 1
    if m := _SPLIT.match(prefix):
        prefix, index, count = m.group(1), int(m.group(2)), int(m.group(3))
    q = _QUANT.search(prefix)
    return prefix, q.group(1).upper() if q else "", index, count


def _is_model_gguf(path: str) -> bool:
    base = path.rsplit("/", 1)[-1]
    return _split(path) is not None and not any(w in base for w in _NOT_MODEL)


def pick_gguf(ref: HubRef, paths: list[str]) -> list[str]:
    """The GGUF file(s) for ``ref.tag`` among ``paths``: every part of a split, in order."""
    models = [p for p in paths if _is_model_gguf(p)]
    firsts = [p for p in models if (s := _split(p)) is not None and s[2] == 1]
    chosen = None
    for tag in [ref.tag] if ref.tag else _DEFAULT_TAGS:
        pattern = re.compile(re.escape(tag) + "[.-]", re.IGNORECASE)
        chosen = next((p for p in firsts if pattern.search(p)), None)
        if chosen:
            break
    if chosen is None and not ref.tag and firsts:
        chosen = firsts[0]
    if chosen is None:
        quants = sorted({s[1] for p in firsts if (s := _split(p)) is not None and s[1]})
        raise ModelNotFoundError(
            f"{ref.repo_id} has no GGUF file for quant {ref.tag!r}; available: "
            + (", ".join(quants) if quants else "none")
        )
    prefix, _, _, count = _split(chosen) or ("", "", 1, 1)
    if count == 1:
        return [chosen]
    parts = sorted(p for p in models if (s := _split(p)) and s[0] == prefix and s[3] == count)
    if len(parts) != count:
        raise DownloadError(f"{ref.repo_id}: {chosen} is one of {count} parts, {len(parts)} found")
    return parts


def _bits(text: str) -> int:
    """The bits of a quant tag (``Q4_K_M`` -> 4, ``F16`` -> 16; 0 for none)."""
    m = re.search(r"[0-9]+", text)
    return int(m.group()) if m else 0


def pick_mmproj(model: str, paths: list[str], tag: str | None) -> str | None:
    """The vision projector llama.cpp's ``-hf`` fetches beside ``model`` (``common/
    download.cpp``'s ``find_best_sibling``): a GGUF with ``mmproj`` in its path, in the
    model's folder or one above it, the deepest first, then one named with the exact tag,
    then the one whose bits are closest to the tag's (or the model file's)."""
    model_dirs = model.split("/")[:-1]
    want = _bits(tag.upper()) if tag else _bits((_split(model) or ("", "", 0, 0))[1])
    best: tuple[int, bool, int] | None = None
    chosen = None
    for p in paths:
        dirs = p.split("/")[:-1]
        if not p.endswith(".gguf") or "mmproj" not in p or dirs != model_dirs[: len(dirs)]:
            continue
        exact = tag is not None and f"-{tag.upper()}." in p.upper()
        key = (len(dirs), exact, -abs(_bits((_split(p) or ("", "", 0, 0))[1]) - want))
        if best is None or key > best:
            best, chosen = key, p
    return chosen


def pick_files(ref: HubRef, files: list[HubFile]) -> list[HubFile]:
    """The files a pull of ``ref`` fetches: a GGUF (all its parts) or a safetensors directory."""
    by_path = {f.path: f for f in files}
    if any(_is_model_gguf(p) for p in by_path):
        return [by_path[p] for p in pick_gguf(ref, list(by_path))]
    if ref.tag:
        raise ModelNotFoundError(
            f"{ref.repo_id} has no GGUF files to pick quant {ref.tag!r} from; "
            f"pull hf.co/{ref.repo_id} (no tag) to pack its safetensors"
        )
    if "config.json" not in by_path or not any(p.endswith(".safetensors") for p in by_path):
        raise ModelNotFoundError(
            f"{ref.repo_id} has neither GGUF files nor config.json with *.safetensors"
        )
    return [f for p, f in sorted(by_path.items()) if _HF_DIR_FILES.match(p)]


def _hub_error(ref: HubRef, e: Exception) -> Exception:
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if isinstance(e, GatedRepoError):
        return DownloadError(f"{ref}: the repository is gated; accept its terms and set HF_TOKEN")
    if isinstance(e, RepositoryNotFoundError | RevisionNotFoundError):
        return ModelNotFoundError(
            f"{ref}: no such repository on the Hub (private ones need HF_TOKEN)"
        )
    if isinstance(e, LocalEntryNotFoundError):
        return DownloadError(
            f"{ref}: not in the Hugging Face cache and the Hub cannot be reached "
            "(HF_HUB_OFFLINE is set or no connection); pull it once online"
        )
    return DownloadError(f"{ref}: {str(e).splitlines()[0] if str(e) else type(e).__name__}")


def list_repo(ref: HubRef) -> tuple[str, list[HubFile]]:
    """(commit, files) of the repository's ``main``; offline, of its cached snapshot."""
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.constants import is_offline_mode

    if is_offline_mode():
        snap = Path(snapshot_download(ref.repo_id, local_files_only=True))
        files = [
            HubFile(p.relative_to(snap).as_posix(), p.stat().st_size, None)
            for p in sorted(snap.rglob("*"))
            if p.is_file()
        ]
        return snap.name, files
    info = HfApi().model_info(ref.repo_id, revision="main", files_metadata=True)
    files = [
        HubFile(s.rfilename, s.size, s.lfs.sha256 if s.lfs is not None else None)
        for s in info.siblings or []
    ]
    if not info.sha:
        raise DownloadError(f"{ref}: the Hub did not say which commit main is")
    return info.sha, files


def _progress_class(report: Callable[[int, int | None], None]) -> type[Any]:
    """A tqdm class that draws nothing and hands each update to ``report``."""
    from huggingface_hub.utils.tqdm import tqdm

    class Bar(tqdm):  # type: ignore[misc,valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.done = int(kwargs.get("initial") or 0)
            self.size = kwargs.get("total")
            super().__init__(*args, **{**kwargs, "disable": True})  # type: ignore[no-untyped-call]
            report(self.done, self.size)

        def update(self, n: float | None = 1) -> bool | None:
            self.done += int(n or 0)
            report(self.done, self.size)
            return None

    return Bar


def _storage(repo_id: str) -> Path:
    from huggingface_hub.constants import HF_HUB_CACHE
    from huggingface_hub.file_download import repo_folder_name

    return Path(HF_HUB_CACHE) / repo_folder_name(repo_id=repo_id, repo_type="model")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def _fetch_blob(repo_id: str, commit: str, f: HubFile, progress: FileProgress | None) -> None:
    """Download ``f``'s blob into the cache (resuming ``<etag>.incomplete``) and verify it."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils._fixes import WeakFileLock
    from huggingface_hub.utils._headers import build_hf_headers

    url = hf_hub_url(repo_id, f.path, revision=commit)
    meta = get_hf_file_metadata(url)
    headers = build_hf_headers()
    if urlsplit(meta.location).netloc != urlsplit(url).netloc:
        headers.pop("authorization", None)  # a CDN the Hub redirects to gets no token
    if meta.etag is None:
        raise DownloadError(f"{repo_id}/{f.path}: the Hub sent no ETag")
    blobs = _storage(repo_id) / "blobs"
    blob = blobs / meta.etag
    if blob.exists():
        return
    blobs.mkdir(parents=True, exist_ok=True)
    part = blobs / f"{meta.etag}.incomplete"
    digest = f.sha256 or (meta.etag if _SHA256.match(meta.etag) else None)
    locks = _storage(repo_id).parent / ".locks" / _storage(repo_id).name
    locks.mkdir(parents=True, exist_ok=True)
    with WeakFileLock(locks / f"{meta.etag}.modelc.lock"):  # beside huggingface_hub's own
        have = part.stat().st_size if part.exists() else 0
        if meta.size is not None and have > meta.size:
            part.unlink()
            have = 0

        def report(done: int, total: int | None) -> None:
            if progress is not None:
                progress(f.path, digest, done, total if total is not None else meta.size)

        with part.open("ab") as out:
            http_get(
                meta.location,
                out,
                resume_size=have,
                headers=headers,
                expected_size=meta.size,
                displayed_filename=f.path,
                tqdm_class=_progress_class(report),
            )
            out.flush()
            os.fsync(out.fileno())
        report(part.stat().st_size, meta.size)
        if digest is not None and (got := _sha256(part)) != digest:
            part.unlink()
            raise DownloadError(
                f"{repo_id}/{f.path}: sha256 is {got}, the Hub says {digest}; "
                "the download was discarded, pull again"
            )
        os.replace(part, blob)


def fetch(ref: HubRef, progress: FileProgress | None = None) -> tuple[Path, Path | None]:
    """Fetch ``ref``'s files into the Hugging Face cache: the GGUF (first part) or directory,
    and the vision projector beside a GGUF where the repository has one (as ``-hf``)."""
    from httpx2 import HTTPError
    from huggingface_hub import hf_hub_download
    from huggingface_hub.constants import is_offline_mode
    from huggingface_hub.errors import HfHubHTTPError

    try:
        commit, files = list_repo(ref)
        try:
            wanted = pick_files(ref, files)
        except ModelNotFoundError as e:
            if not is_offline_mode():
                raise
            raise ModelNotFoundError(f"{e} (of the cached files: HF_HUB_OFFLINE is set)") from e
        mmproj = None
        if wanted[0].path.endswith(".gguf"):
            by_path = {f.path: f for f in files}
            mmproj = pick_mmproj(wanted[0].path, list(by_path), ref.tag)
            wanted += [by_path[mmproj]] if mmproj is not None else []
        paths = []
        for f in wanted:
            if not is_offline_mode():
                _fetch_blob(ref.repo_id, commit, f, progress)
            paths.append(Path(hf_hub_download(ref.repo_id, f.path, revision=commit)))
            if progress is not None:  # also for a file the cache already held
                size = paths[-1].stat().st_size
                progress(f.path, f.sha256, size, size)
        if not is_offline_mode():
            refs = _storage(ref.repo_id) / "refs"
            refs.mkdir(parents=True, exist_ok=True)
            (refs / "main.tmp").write_text(commit)
            os.replace(refs / "main.tmp", refs / "main")
    except (HfHubHTTPError, HTTPError, OSError, ValueError) as e:
        raise _hub_error(ref, e) from e
    if paths[0].suffix != ".gguf":
        return paths[0].parent, None
    return paths[0], paths[-1] if mmproj is not None else None
