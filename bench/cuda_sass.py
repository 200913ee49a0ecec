"""The SASS of modelc's CUDA kernels, read on the CPU (no GPU needed): the source NVRTC
compiles at run time (:func:`modelc.runtime.backends.cuda_src.source`, with the environment's
compile-time settings) to PTX, ptxas to a cubin for sm_90a, ``cuobjdump -sass``; for each
kernel named, its instruction count and its opcodes by count.

    python -m bench.cuda_sass gemvw_12_1 gemvw_14_1 [--arch sm_90a] [--dump DIR] [--only]

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
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from modelc.runtime.backends import cuda_src
from tests.test_cuda_compile import _nvrtc, _wheel_file, compile_ptx, find_ptxas

# an entry point's head: its name (``--only`` makes the others static device functions, which
# NVRTC drops unreferenced: a kernel's SASS in ~5 s, not the whole module's ~60)
ENTRY = re.compile(r'extern "C" __global__ void (?:__launch_bounds__\([^)]*\)\s*)?(\w+)\s*\(')
INSTRUCTION = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")


def cuobjdump() -> str:
    """``MODELC_CUOBJDUMP``, the PATH's, or the ``nvidia-cuda-cuobjdump`` wheel's."""
    found = os.environ.get("MODELC_CUOBJDUMP") or shutil.which("cuobjdump")
    found = found or _wheel_file("nvidia.cu13", "bin/cuobjdump")
    if not found:
        sys.exit("no cuobjdump here: set MODELC_CUOBJDUMP, or pip install nvidia-cuda-cuobjdump")
    return str(found)


def only(source: str, keep: set[str]) -> str:
    """``source`` with every entry point but ``keep``'s made a static device function."""

    def head(m: re.Match[str]) -> str:
        name = m.group(1)
        return m.group(0) if name in keep else f"static __device__ void {name}("

    return ENTRY.sub(head, source)


def listing(cubin: Path, kernel: str) -> str:
    """The kernel's SASS as cuobjdump prints it."""
    dump = cuobjdump()
    env = dict(os.environ)  # cuobjdump runs nvdisasm: found beside it (the wheels' bin/)
    env["PATH"] = f"{Path(dump).parent}{os.pathsep}{env.get('PATH', '')}"
    run = subprocess.run(
        [dump, "-sass", "-fun", kernel, str(cubin)], capture_output=True, text=True, env=env
    )
    if run.returncode:
        sys.exit(f"cuobjdump: {run.stderr.strip()}")
    return run.stdout


def sass(cubin: Path, kernel: str) -> list[str]:
    """The kernel's SASS instructions' opcodes, in order."""
    return INSTRUCTION.findall(listing(cubin, kernel))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kernels", nargs="+")
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--dump", type=Path, help="keep the PTX, cubin and each kernel's SASS here")
    ap.add_argument("--only", action="store_true", help="compile the kernels named alone")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        where = args.dump or Path(tmp)
        where.mkdir(parents=True, exist_ok=True)
        lib, ptxas = _nvrtc(), find_ptxas()
        if lib is None or ptxas is None:
            sys.exit("no NVRTC or ptxas here: set MODELC_NVRTC, MODELC_PTXAS")
        src = cuda_src.source()
        text, log = compile_ptx(lib, only(src, set(args.kernels)) if args.only else src)
        if text is None:
            sys.exit(log[-4000:])
        p, cubin = where / "modelc.ptx", where / "modelc.cubin"
        p.write_bytes(text)
        subprocess.run([ptxas, f"-arch={args.arch}", str(p), "-o", str(cubin)], check=True)
        print("| kernel | instructions | opcodes by count |\n|---|---:|---|")
        for k in args.kernels:
            ops = sass(cubin, k)
            counts = collections.Counter(op.split(".")[0] for op in ops)
            top = ", ".join(f"{op} {n}" for op, n in counts.most_common(12))
            print(f"| {k} | {len(ops)} | {top} |")
            if args.dump:
                (where / f"{k}.sass").write_text(listing(cubin, k))


if __name__ == "__main__":
    main()
