"""Embeddings over HTTP, modelc against llama.cpp's server on the same BERT GGUF.

    .venv/bin/python -m bench.embed_side_by_side [--ftypes f32,f16,q8_0] [--rounds 5]
        [--threads 2] [--workloads 1x16,32x128,8x500]

all-MiniLM-L6-v2 is converted to GGUF as llama.cpp's converter writes a BERT
(``tests/gen_bert_gguf.py``) once per ``--ftypes`` entry; ``modelc run`` and llama.cpp's
server (xllamacpp, ``--embedding``, 8 slots, ``OMP_WAIT_POLICY=passive`` so that its idle
threads do not spin while modelc is measured) serve that file side by side.  A workload
``BxL`` is one ``/v1/embeddings`` request (the official ``openai`` client) of B texts of
about L tokens each (random whole words of the vocabulary, seeded).  Each round times every
workload on both servers, the order alternating round by round (a first round warms
up); reported: the median tokens/s (B x L / request time) per server and the median of the
per-round ratios.
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import openai

from bench.llamacpp_peer import LlamaCppServer
from modelc.bench.procs import wait_healthy
from modelc.bench.timing import median_ratio, time_alternating
from tests.assets import minilm_dir
from tests.gen_bert_gguf import write

ROOT = Path(__file__).resolve().parents[1]


def texts(n: int, length: int, seed: int) -> list[str]:
    """n texts of ``length`` - 2 whole-word pieces (with [CLS] / [SEP]: about ``length`` tokens)."""
    words = [
        w
        for w in (minilm_dir() / "vocab.txt").read_text(encoding="utf-8").split("\n")[1000:]
        if w.isalpha() and w.isascii()
    ]
    rng = random.Random(seed)
    return [" ".join(rng.choice(words) for _ in range(max(1, length - 2))) for _ in range(n)]


def embed(client: openai.OpenAI, model: str, batch: list[str]) -> None:
    out = client.embeddings.create(model=model, input=batch)
    assert len(out.data) == len(batch)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(gguf: Path, args: argparse.Namespace, log_dir: Path) -> list[str]:
    work = [tuple(int(v) for v in w.split("x")) for w in args.workloads.split(",")]
    batches = {(b, n): texts(b, n, seed=b * 1000 + n) for b, n in work}
    port = free_port()
    env = dict(os.environ, MODELC_THREADS=str(args.threads))
    log = (log_dir / f"modelc-{gguf.stem}.log").open("wb")
    srv = subprocess.Popen(
        [sys.executable, "-m", "modelc.cli", "run", str(gguf), "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    rows = []
    try:
        wait_healthy(f"http://127.0.0.1:{port}", srv, 120.0, poll=0.1)
        with LlamaCppServer(
            gguf,
            threads=args.threads,
            n_parallel=8,
            n_ctx=8192,
            log=log_dir / f"llamacpp-{gguf.stem}.log",
            env={"OMP_WAIT_POLICY": "passive"},
            embedding=True,
        ) as peer:
            clients = {
                "modelc": openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x"),
                "llama.cpp": openai.OpenAI(base_url=f"{peer.url}/v1", api_key="x"),
            }
            models = {k: c.models.list().data[0].id for k, c in clients.items()}
            for key, batch in batches.items():
                b, n = key
                ts = time_alternating(  # round 0 warms up
                    {
                        side: functools.partial(embed, c, models[side], batch)
                        for side, c in clients.items()
                    },
                    args.rounds,
                )
                ours, theirs = ts["modelc"], ts["llama.cpp"]
                ratio, lo, hi = median_ratio(theirs.seconds, ours.seconds)
                rows.append(
                    f"| {gguf.stem} | {b} x {n} | {ours.rate(b * n):,.0f}"
                    f" | {theirs.rate(b * n):,.0f} | **{ratio:.2f}x** ({lo:.2f}-{hi:.2f}) |"
                )
                print(rows[-1], flush=True)
    finally:
        srv.send_signal(signal.SIGTERM)
        try:
            srv.wait(30)
        except subprocess.TimeoutExpired:
            srv.kill()
        log.close()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ftypes", default="f32,f16,q8_0")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workloads", default="1x16,32x128,8x500", help="BxL: B texts of ~L tokens")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="modelc-embed-") as tmp:
        rows = [
            "| GGUF | texts x tokens | modelc tok/s | llama.cpp tok/s | modelc / llama.cpp (range) |"
        ]
        rows.append("|---|---|---|---|---|")
        for ft in args.ftypes.split(","):
            gguf = write(minilm_dir(), Path(tmp) / f"minilm-{ft}.gguf", ft)
            rows += run(gguf, args, Path(tmp))
        print("\n".join(rows))


if __name__ == "__main__":
    main()
