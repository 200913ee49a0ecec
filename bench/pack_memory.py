"""Peak memory of ``modelc pack``: the SmolLM2 GGUF and a ~540 MB f32 safetensors model.

Usage::

    .venv/bin/python bench/pack_memory.py            # all cases, prints a markdown table

Each pack runs in a fresh subprocess (``--child``) that records, besides its wall
time:

* ``peak RSS``: VmHWM, the kernel's high-water mark of resident memory, including the
  *file-backed* pages of the memory-mapped source (the writer hands those back with
  ``madvise(MADV_DONTNEED)`` after each ~4 MB block, so they do not pile up);
* ``peak anon``: the highest RssAnon (private heap memory) seen by a thread
  sampling ``/proc/self/status`` every 2 ms; this is the memory packing really
  allocates, and the number that must stay near the largest tensor;
* the same two numbers measured just before packing (imports and model open), so
  the cost of packing itself is the difference.

The 540 MB model is generated in a temporary directory (never in the repo): a chain
of four 8192x4096 f32 linear layers (134 MB each), written tensor by tensor.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

MB = 1e6


def _status() -> dict[str, int]:
    out: dict[str, int] = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
                out[k] = int(v.split()[0]) * 1024
    return out


def child(src: str, dest: str, opts_json: str) -> None:
    from modelc.artifact import PackOptions, write_artifact
    from modelc.formats import load_model

    opts = PackOptions(**json.loads(opts_json))
    ir = load_model(src)
    largest = max(t.nbytes for t in ir.tensors.values())
    total = sum(t.nbytes for t in ir.tensors.values())
    base = _status()
    peak = {"anon": base["RssAnon"], "file": base["RssFile"]}
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            s = _status()
            peak["anon"] = max(peak["anon"], s["RssAnon"])
            peak["file"] = max(peak["file"], s["RssFile"])
            time.sleep(0.002)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    t0 = time.perf_counter()
    write_artifact(ir, dest, opts)
    secs = time.perf_counter() - t0
    stop.set()
    t.join()
    end = _status()
    print(
        json.dumps(
            {
                "model_bytes": total,
                "largest_tensor": largest,
                "out_bytes": Path(dest).stat().st_size,
                "seconds": secs,
                "base_rss": base["VmRSS"],
                "base_anon": base["RssAnon"],
                "peak_rss": end["VmHWM"],
                "peak_anon": peak["anon"],
                "peak_file": peak["file"],
            }
        )
    )


def make_big_safetensors(path: Path) -> None:
    """Four 8192x4096 f32 layers (537 MB), written one tensor at a time."""
    shapes = {
        "fc1.weight": (8192, 4096),
        "fc2.weight": (4096, 8192),
        "fc3.weight": (8192, 4096),
        "fc4.weight": (4096, 8192),
    }
    header: dict[str, Any] = {}
    pos = 0
    for name, shape in shapes.items():
        n = int(np.prod(shape)) * 4
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [pos, pos + n]}
        pos += n
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    rng = np.random.default_rng(0)
    with path.open("wb") as f:
        f.write(len(blob).to_bytes(8, "little"))
        f.write(blob)
        for shape in shapes.values():
            for _ in range(shape[0] // 1024):  # 16 MB at a time
                f.write((rng.standard_normal((1024, shape[1]), dtype=np.float32) * 0.02).tobytes())


def run_case(label: str, src: Path, dest: Path, opts: dict[str, Any]) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, __file__, "--child", str(src), str(dest), json.dumps(opts)],
        capture_output=True,
        text=True,
        check=True,
    )
    r: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    r["label"] = label
    dest.unlink()
    return r


def main() -> None:
    # the same download cache as the tests (tests/assets.py), so nothing is fetched twice
    os.environ.setdefault(
        "MODELC_CACHE", str(Path.home() / ".cache" / "modelc-test-assets" / "cache")
    )
    from modelc.catalog import resolve_catalog

    smol = resolve_catalog("smollm2-135m", quiet=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        big = Path(tmp) / "big.safetensors"
        make_big_safetensors(big)
        out = Path(tmp) / "out.modelc"
        cases = [
            ("SmolLM2-135M Q4_1 GGUF (97 MB)", smol, {}),
            ("SmolLM2-135M Q4_1 GGUF, --compress", smol, {"compress": True}),
            ("537 MB f32 safetensors", big, {}),
            ("537 MB f32 safetensors, --compress", big, {"compress": True}),
            ("537 MB f32 safetensors, --quantize q8_0", big, {"quantize": "q8_0"}),
        ]
        for label, src, opts in cases:
            rows.append(run_case(label, src, out, opts))
            r = rows[-1]
            print(f"{label}: peak anon {r['peak_anon'] / MB:.0f} MB", file=sys.stderr)
    print(
        "| case | model | largest tensor | output | time | peak RSS, VmHWM (before pack) | peak anon (before pack) | peak file-backed |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['label']} | {r['model_bytes'] / MB:.0f} MB | {r['largest_tensor'] / MB:.0f} MB "
            f"| {r['out_bytes'] / MB:.0f} MB | {r['seconds']:.1f} s | {r['peak_rss'] / MB:.0f} MB ({r['base_rss'] / MB:.0f} MB) "
            f"| {r['peak_anon'] / MB:.0f} MB ({r['base_anon'] / MB:.0f} MB) | {r['peak_file'] / MB:.0f} MB |"
        )


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        main()
