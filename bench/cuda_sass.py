"""The SASS of modelc's CUDA kernels, read on the CPU (no GPU needed): the source NVRTC
compiles at run time (:func:`modelc.runtime.backends.cuda_src.source`, with the environment's
compile-time settings) to PTX, ptxas to a cubin for sm_90a, ``cuobjdump -sass``; for each
kernel named, its instruction count and its opcodes by count.

    python -m bench.cuda_sass gemvw_12_1 gemvw_14_1 [--arch sm_90a] [--dump DIR]

What a kernel's instructions cost is what session 32 found the wide GEMV bound by (a 6 % cut
of ``gemvw_12_1``'s instructions gave 5-8 % on an H100), so a change to a hot loop can be
weighed here before a GPU call measures it.  Tools: NVRTC and ptxas as
``tests/test_cuda_compile.py`` finds them (the test extra's wheels, ``MODELC_NVRTC``,
``MODELC_PTXAS``), cuobjdump from ``MODELC_CUOBJDUMP``, the PATH, or the
``nvidia-cuda-cuobjdump`` wheel, with nvdisasm beside it (``pip install
nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm``).
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from modelc.runtime.backends import cuda_src

INSTRUCTION = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")


def _tool(env: str, name: str, wheel: str) -> str:
    """A CUDA tool's path: ``env``, the PATH, or the nvidia wheel ``wheel``'s bin/."""
    found = os.environ.get(env) or shutil.which(name)
    if found:
        return found
    try:
        import importlib

        mod = importlib.import_module(wheel)
        for base in getattr(mod, "__path__", []):
            path = Path(base) / "bin" / name
            if path.exists():
                return str(path)
    except ImportError:
        pass
    sys.exit(f"no {name} here: set {env}, or pip install the nvidia-cuda-{name} wheel")


def ptx(source: str, out: Path) -> Path:
    """``source`` compiled by NVRTC to PTX for compute_90 (CuPy's options) into ``out``."""
    from tests.test_cuda_compile import _nvrtc

    lib = _nvrtc()
    if lib is None:
        sys.exit("no NVRTC here: set MODELC_NVRTC to libnvrtc.so")
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"modelc.cu", 0, None, None):
        sys.exit("NVRTC would not take the source")
    opts = [b"-std=c++17", b"--gpu-architecture=compute_90"]
    rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    if rc:
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        sys.exit(log.value.decode()[-4000:])
    lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
    buf = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetPTX(prog, buf)
    out.write_bytes(buf.value)
    return out


def sass(cubin: Path, kernel: str) -> list[str]:
    """The kernel's SASS instructions' opcodes, in order."""
    dump = _tool("MODELC_CUOBJDUMP", "cuobjdump", "nvidia.cu13")
    env = dict(os.environ)  # cuobjdump runs nvdisasm: found beside it (the wheels' bin/)
    env["PATH"] = f"{Path(dump).parent}{os.pathsep}{env.get('PATH', '')}"
    run = subprocess.run(
        [dump, "-sass", "-fun", kernel, str(cubin)], capture_output=True, text=True, env=env
    )
    if run.returncode:
        sys.exit(f"cuobjdump: {run.stderr.strip()}")
    text = run.stdout
    return INSTRUCTION.findall(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kernels", nargs="+")
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--dump", type=Path, help="keep the PTX, cubin and each kernel's SASS here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        where = args.dump or Path(tmp)
        where.mkdir(parents=True, exist_ok=True)
        p = ptx(cuda_src.source(), where / "modelc.ptx")
        from tests.test_cuda_compile import _wheel_file

        ptxas = os.environ.get("MODELC_PTXAS") or _wheel_file("nvidia.cuda_nvcc", "bin/ptxas")
        cubin = where / "modelc.cubin"
        subprocess.run(
            [str(ptxas or _tool("MODELC_PTXAS", "ptxas", "nvidia.cuda_nvcc")),
             f"-arch={args.arch}", str(p), "-o", str(cubin)],
            check=True,
        )  # fmt: skip
        print("| kernel | instructions | opcodes by count |\n|---|---:|---|")
        for k in args.kernels:
            ops = sass(cubin, k)
            counts = collections.Counter(op.split(".")[0] for op in ops)
            top = ", ".join(f"{op} {n}" for op, n in counts.most_common(12))
            print(f"| {k} | {len(ops)} | {top} |")
            if args.dump:
                (where / f"{k}.sass").write_text("\n".join(ops) + "\n")


if __name__ == "__main__":
    main()
