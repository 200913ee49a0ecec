"""Adding a family the way a newcomer would (issue 32, must-show 1): its own module under
``modelc/families/`` and its registry entry, then it runs on the CPU, WebGPU and the CUDA
path and through ``modelc compile`` with no other edit.

The test copies the ``modelc`` package into a temporary directory, writes a throwaway
family there (``tinyfam``: OLMo 2's layers as data, :class:`DecoderTraits`, under a name of
its own) and adds it to the copy's registry, then runs :func:`check` in a child process
that imports the copy.  The reference is OLMo 2 on the same weights (the same description
under another name: logits equal bit for bit on the CPU); WebGPU (lavapipe in CI, skipped
without an adapter unless ``MODELC_REQUIRE_WEBGPU``) agrees within the log-prob tolerance;
the CUDA path is the one ``--device cuda`` takes (the device-resident forward: OLMo 2's
post-norms alone and whole-projection Q/K norms are among what it runs), checked without a
GPU; the compiled program's forward equals the runtime's bit for bit
(tests/compile_support.py).  Cost: ~20 s, most
of it building the program's Cython forward.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

from tests.compile_support import ROOT, run
from tests.gen_olmo2 import ensure_model, weights, write_gguf

FAMILY_MODULE = '''"""Tinyfam: OLMo 2's layers under a name of its own (a throwaway family of a test)."""

import gguf

from modelc.families.contract import DecoderTraits, Family
from modelc.families.olmo2 import FAMILY as OLMO2

FAMILY = Family(
    name="tinyfam",
    kind="text",
    decoder=DecoderTraits(post_norms=True, pre_norms=False),
    gguf_arch=gguf.MODEL_ARCH.OLMO2,
    gguf_names=("tinyfam",),
    from_gguf=OLMO2.from_gguf,
    required=OLMO2.required,
    output_required=True,
    shapes=OLMO2.shapes,
)
'''


def add_family(pkg: Path) -> None:
    """What the newcomer writes: the module, and the registry's import and entry."""
    (pkg / "families" / "tinyfam.py").write_text(FAMILY_MODULE)
    reg = pkg / "families" / "registry.py"
    text = reg.read_text()
    text, n_import = re.subn(r"(\n    smollm3,\n)", r"\1    tinyfam,\n", text)
    text, n_entry = re.subn(r"(\n        olmo2\.FAMILY,\n)", r"\1        tinyfam.FAMILY,\n", text)
    assert n_import == n_entry == 1, "the registry's layout changed: update this test"
    reg.write_text(text)


def test_a_new_family_runs_everywhere_with_no_other_edit(tmp_path: Path) -> None:
    src = Path(__import__("modelc").__file__).parent
    shutil.copytree(src, tmp_path / "modelc", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "cyx").symlink_to(ROOT / "cyx")  # the kernel sources modelc compile copies
    add_family(tmp_path / "modelc")
    gguf = tmp_path / "tinyfam.gguf"
    write_gguf(weights(), gguf, arch="tinyfam")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    env |= {"MODELC_CACHE": str(tmp_path / "cache"), "MODELC_THREADS": "1"}
    env.setdefault("XDG_RUNTIME_DIR", str(tmp_path))  # Mesa's WSI (lavapipe) wants one
    code = "import sys; from tests.test_new_family import check; check(*sys.argv[1:])"
    args = [str(gguf), str(ensure_model()[1]), str(tmp_path / "prog")]
    got = json.loads(run([sys.executable, "-c", code, *args], tmp_path, env).splitlines()[-1])
    assert got["modelc"] == str(tmp_path / "modelc")  # the copy, not this checkout
    assert got["architecture"] == "tinyfam" and got["cpu"] is True
    if got["webgpu"] is None:
        assert not os.environ.get("MODELC_REQUIRE_WEBGPU")
    else:
        assert got["webgpu"] is True
    assert got["cuda"] == "a head size of 16"  # its post-norms alone run there (32..256)
    assert "the compiled loop does not run post-norms without pre-norms" in got["note"]
    assert got["compiled"] == {
        "architecture": "tinyfam",
        "class": "tinyfam_app._forward",
        "f32": True,
        "f16": True,
        "int8": True,
        "short": True,
        "windowed": True,
    }


def check(gguf: str, olmo2_gguf: str, out: str) -> None:
    """In the child process (the copy of modelc first on the path): tinyfam against OLMo 2
    on the CPU, on WebGPU against the CPU, its CUDA path, its compiled program; one JSON line."""
    import importlib

    import numpy as np

    import modelc
    from modelc.compile.spec import forward_note
    from modelc.errors import UsageError
    from modelc.formats import load_model
    from modelc.runtime.arch import build
    from modelc.runtime.backends.cpu import CpuBackend
    from modelc.runtime.backends.cuda_offload import fused_lacks
    from modelc.runtime.backends.numpy_ref import NumpyBackend
    from modelc.runtime.model import SeqChunk
    from tests.compile_support import _compare, build_one_in_place, use_kernels
    from tests.runtime_support import make_backend, same_as_reference

    ir, ref_ir = load_model(gguf), load_model(olmo2_gguf)
    res: dict[str, Any] = {"modelc": str(Path(modelc.__file__).parent)}
    res["architecture"] = ir.architecture
    model, ref = build(ir, CpuBackend(threads=1)), build(ref_ir, CpuBackend(threads=1))
    caches = [model.new_cache(), ref.new_cache()]
    toks, same = [5, 17, 99, 3, 250, 8, 42], True
    for _ in range(6):  # a prompt, then greedy steps
        a, b = (m.forward([SeqChunk(c, toks)]) for m, c in zip((model, ref), caches, strict=True))
        same = same and bool(np.array_equal(a, b))
        toks = [int(a[0].argmax())]
    res["cpu"] = same
    try:
        from modelc.runtime.backends.webgpu import WebGPUBackend

        gpu = WebGPUBackend()
    except (ImportError, UsageError):
        res["webgpu"] = None
    else:
        cpu = build(ir, make_backend("cpu-exact"))
        same_as_reference(cpu, build(ir, gpu), [5, 17, 99, 3, 250, 8, 42, 7, 1], 6)
        res["webgpu"] = True
    res["cuda"] = fused_lacks(build(ir, NumpyBackend()))
    pkg = build_one_in_place("tinyfam", Path(gguf), Path(out))  # modelc compile, built
    res["note"] = forward_note(json.loads((Path(out) / pkg / "spec.json").read_text()))
    kernels = Path(modelc.__file__).parent / "_kernels"
    use_kernels(Path(out) / pkg, next(kernels.glob("kernels.*.so")))  # the runtime's own
    sys.path.insert(0, out)
    importlib.invalidate_caches()
    res["compiled"] = _compare(pkg)
    print(json.dumps(res))
