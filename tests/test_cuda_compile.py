"""The CUDA backend's whole generated source (:func:`cuda_src.source`) compiled for sm_90 on a
machine without a GPU, so a syntax or type error in a kernel never first shows on the
lent H100/H200: NVRTC to PTX (every kernel of :func:`cuda_src.kernel_names` in it), then,
where ``ptxas`` is found, to a cubin with no register spills in any kernel.

Needs NVRTC, not a GPU: ``MODELC_NVRTC`` (the path of ``libnvrtc.so``), or the
``nvidia-cuda-nvrtc`` wheel of the ``test`` extra (CUDA 13's, 90 MB) in this Python;
``ptxas`` from ``MODELC_PTXAS``, the ``nvidia-cuda-nvcc`` wheel or the PATH (CUDA's
toolkit; without one the spill check skips); without NVRTC the module skips.  Cost:
~35 s of NVRTC and ~25 s of ptxas on a loaded 2-core machine.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from modelc.runtime.backends import cuda_src


def _wheel_file(package: str, rel: str) -> Path | None:
    try:
        mod = __import__(package, fromlist=["_"])
    except ImportError:
        return None
    for base in getattr(mod, "__path__", []):
        if (Path(base) / rel).exists():
            return Path(base) / rel
    return None


def _nvrtc() -> ctypes.CDLL | None:
    path = (
        os.environ.get("MODELC_NVRTC")
        or _wheel_file("nvidia.cu13", "lib/libnvrtc.so.13")  # the test extra's wheel
        or _wheel_file("nvidia.cuda_nvrtc", "lib/libnvrtc.so.12")
    )
    found = str(path) if path else ctypes.util.find_library("nvrtc")
    if not found:
        return None
    # NVRTC opens its builtins by name at compile time: loaded from beside it first, the
    # name resolves to the loaded library (no LD_LIBRARY_PATH needed)
    for builtins in sorted(Path(found).parent.glob("libnvrtc-builtins.so.*")):
        if ".alt." not in builtins.name:
            ctypes.CDLL(str(builtins), mode=ctypes.RTLD_GLOBAL)
    return ctypes.CDLL(found)


def compile_ptx(lib: ctypes.CDLL, source: str) -> tuple[bytes | None, str]:
    """``source`` compiled by NVRTC (``lib``: :func:`_nvrtc`'s) to PTX for compute_90, with
    CuPy's options: (the PTX, None where it failed; NVRTC's log).  ``bench/cuda_sass.py``
    compiles through it too."""
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"modelc.cu", 0, None, None):
        return None, "NVRTC would not take the source"
    opts = [b"-std=c++17", b"--gpu-architecture=compute_90"]  # CuPy's options, on sm_90
    rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    text = None
    if rc == 0:
        lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
        buf = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetPTX(prog, buf)
        text = buf.value
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return text, log.value.decode(errors="replace")


def find_ptxas() -> str | None:
    """ptxas: ``MODELC_PTXAS``, the ``nvidia-cuda-nvcc`` wheel's, or the PATH's."""
    found = os.environ.get("MODELC_PTXAS") or _wheel_file("nvidia.cuda_nvcc", "bin/ptxas")
    return str(found) if found else shutil.which("ptxas")


@pytest.fixture(scope="module")
def ptx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    lib = _nvrtc()
    if lib is None:
        pytest.skip("no NVRTC here (set MODELC_NVRTC to libnvrtc.so.12)")
    text, log = compile_ptx(lib, cuda_src.source())
    assert text is not None, log[-4000:]
    out = tmp_path_factory.mktemp("nvrtc") / "modelc.ptx"
    out.write_bytes(text)
    return out


def test_every_kernel_compiles_for_sm90(ptx: Path) -> None:
    entries = set(re.findall(r"\.entry\s+(\w+)\(", ptx.read_text()))
    names = cuda_src.kernel_names()
    assert len(names) == len(set(names))
    assert sorted(set(names) - entries) == []


def test_no_kernel_spills_registers(ptx: Path) -> None:
    ptxas = find_ptxas()
    if ptxas is None:
        pytest.skip("no ptxas here (set MODELC_PTXAS)")
    run = subprocess.run(
        [str(ptxas), "-v", "-arch=sm_90", "-o", str(ptx.with_suffix(".cubin")), str(ptx)],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    fn, spills, regs = "", [], {}
    for line in run.stderr.splitlines():
        if m := re.search(r"Function properties for (\w+)", line):
            fn = m.group(1)
        elif (m := re.search(r"(\d+) bytes spill stores", line)) and int(m.group(1)):
            spills.append(f"{fn}: {line.strip()}")
        elif m := re.search(r"Used (\d+) registers", line):
            regs[fn] = int(m.group(1))
    assert len(re.findall(r"Compiling entry function", run.stderr)) == len(cuda_src.kernel_names())
    assert spills == []
    # the register norms take up to MAX_THREADS a block (a 16,384-wide row): 64 registers a
    # thread at most, or the launch fails (CUDA error 701, met on an H100 in session 35)
    from modelc.runtime.backends.cuda_norm import MAX_THREADS, threads

    assert threads(16384) == MAX_THREADS
    big = {k: regs[k] for k in ("rms_norm_v4", "rms_norm_v4_q8") if regs[k] * MAX_THREADS > 65536}
    assert big == {}


def _entries(ptx: Path) -> dict[str, str]:
    """Each kernel's PTX body by name."""
    text = ptx.read_text()
    starts = [(m.group(1), m.start()) for m in re.finditer(r"\.entry\s+(\w+)\(", text)]
    ends = [s for _, s in starts[1:]] + [len(text)]
    return {name: text[s:e] for (name, s), e in zip(starts, ends, strict=True)}


def test_every_kernel_waits_for_the_one_before_it_first(ptx: Path) -> None:
    """Launched with programmatic dependent launch (``MODELC_CUDA_PDL``), a kernel may start
    while the kernel before it still runs: every kernel waits (``griddepcontrol.wait``)
    before it writes anything (a write before it could land under a read of the kernel
    before), and the GEMVs prefetch their weight rows into L2 before waiting."""
    early = {}
    for name, body in _entries(ptx).items():
        at = body.find("griddepcontrol.wait")
        assert at >= 0, f"{name} never waits for the kernel before it"
        writes = re.findall(r"\b(st\.global|red\.global|atom\.global|st\.shared)\S*", body[:at])
        if writes:
            early[name] = writes
        assert "griddepcontrol.launch_dependents" in body[at:], name
        if name.startswith(("gemvw_", "gemvq_", "gemv4_")):
            assert "prefetch.global.L2" in body[:at], f"{name} does not prefetch its rows"
    assert early == {}
