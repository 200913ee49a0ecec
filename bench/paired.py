"""modelc and llama.cpp measured in paired, alternating rounds on one GGUF.

On a shared machine whose read bandwidth swings 2x within minutes, one figure per side
taken minutes apart says more about the machine than about the engines (the 1B's
batch-1 ratio came out 1.38x in one run and 0.87x in the next).  Here both sides stay
loaded for the whole measurement -- modelc in this process (the runtime's batch API,
as ``modelc bench``), llama.cpp as its server in its own process, one per configuration
-- and every round measures each quantity on every side back to back, in an order that
alternates from round to round, each measurement the best of a few short runs:

* the machine's read bandwidth (``bench.bandwidth.ReadProbe``: best of 3 two-thread
  passes over 2 GiB), every server stopped (SIGSTOP) meanwhile;
* prefill tokens/s of one ``prefill_len``-token prompt (fresh cache; llama.cpp's
  ``prompt_ms``), best of 2;
* decode tokens/s at batch 1 and at batch 8: fresh sequences prefilled with 16-token
  prompts (not timed), then ``steps`` greedy steps (llama.cpp: ``/completion`` with
  ``ignore_eos``, its own ``predicted_ms``; 8 concurrent requests for batch 8), best of 3
  (batch 1) or 2 (batch 8).

A server runs only while it is measured (SIGCONT, the requests, SIGSTOP): llama.cpp's
OpenMP threads spin on after a request and would otherwise take the cores from
whatever is measured next; modelc's pool sleeps when idle.  Per round, the ratio is
modelc over the better llama.cpp configuration; the reported ratio is the median of the
rounds' ratios, and a batch-1 decode's share of the read bandwidth is weight bytes a token
x tok/s over that round's read, the median of the rounds.
"""

from __future__ import annotations

import contextlib
import os
import signal
import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bench.bandwidth import InProcess, ReadProbe, weight_bytes
from bench.llamacpp_peer import LlamaCppClient, LlamaCppServer
from modelc.bench.offline import prompt_tokens

KINDS = ("prefill", "decode_b1", "decode_b8")
BEST_OF = {"prefill": 2, "decode_b1": 3, "decode_b8": 2}


@dataclass
class Peer:
    """One llama.cpp configuration's server, stopped while it is not measured."""

    config: str
    server: LlamaCppServer
    client: LlamaCppClient

    @contextlib.contextmanager
    def running(self) -> Iterator[LlamaCppClient]:
        os.kill(self.server.pid, signal.SIGCONT)
        try:
            yield self.client
        finally:
            os.kill(self.server.pid, signal.SIGSTOP)


@dataclass
class Round:
    read_gbs: float
    modelc: dict[str, float] = field(default_factory=dict)  # kind -> tok/s
    peers: dict[str, dict[str, float]] = field(default_factory=dict)  # config -> kind -> tok/s

    def peer_best(self, kind: str) -> float:
        return max(p[kind] for p in self.peers.values())


@dataclass
class PairedResult:
    """The rounds of one model, and their medians."""

    label: str
    nbytes: int  # weight bytes batch-1 decode reads a token
    rounds: list[Round] = field(default_factory=list)

    def ratios(self, kind: str) -> list[float]:
        return [r.modelc[kind] / r.peer_best(kind) for r in self.rounds]

    def ratio(self, kind: str) -> float:
        return statistics.median(self.ratios(kind))

    def modelc_tps(self, kind: str) -> float:
        return statistics.median(r.modelc[kind] for r in self.rounds)

    def peer_tps(self, kind: str) -> float:
        return statistics.median(r.peer_best(kind) for r in self.rounds)

    def shares(self, peer: bool = False) -> list[float]:
        """Per round: batch-1 decode bytes/s over the round's read bandwidth."""
        return [
            self.nbytes
            * (r.peer_best("decode_b1") if peer else r.modelc["decode_b1"])
            / 1e9
            / r.read_gbs
            for r in self.rounds
        ]

    def share(self, peer: bool = False) -> float:
        return statistics.median(self.shares(peer))


class PairedModel:
    """modelc in this process and one llama.cpp server per configuration on one GGUF
    (a context manager: the servers start on entry, stopped until measured)."""

    def __init__(
        self,
        label: str,
        gguf: Path,
        encode: Callable[[str], list[int]],
        *,
        threads: int,
        mode: str,
        configs: dict[str, dict[str, str]],
        log_dir: Path,
        prefill_len: int = 512,
        steps: int = 64,
        ctx_per_seq: int = 1024,
    ) -> None:
        self.gguf, self.threads, self.mode, self.configs = gguf, threads, mode, configs
        self.log_dir, self.prefill_len, self.steps, self.ctx = (
            log_dir,
            prefill_len,
            steps,
            ctx_per_seq,
        )
        self.result = PairedResult(label, weight_bytes(str(gguf)))
        self._stack = contextlib.ExitStack()
        self.peers: list[Peer] = []
        self.modelc: InProcess | None = None
        self.encode = encode

    def __enter__(self) -> PairedModel:
        try:
            self._start()
        except BaseException:
            self._stack.close()  # the servers started so far
            raise
        return self

    def _start(self) -> None:
        for i, (name, env) in enumerate(self.configs.items()):
            srv = LlamaCppServer(
                self.gguf,
                self.threads,
                8,
                8 * self.ctx,
                self.log_dir / f"paired-{self.gguf.stem}-{i}.log",
                env,
            )
            self._stack.enter_context(srv)
            peer = Peer(name, srv, LlamaCppClient(srv.url))
            peer.client.completion([1, 2, 3], 4)  # warm-up
            os.kill(srv.pid, signal.SIGSTOP)
            self._stack.callback(os.kill, srv.pid, signal.SIGCONT)  # before it is told to exit
            self.peers.append(peer)
        from modelc.runtime.backends.cpu import CpuBackend

        self.modelc = InProcess(self.gguf, CpuBackend(threads=self.threads, matmul=self.mode))
        vocab = self.modelc.lm.n_vocab
        self.long = prompt_tokens(self.prefill_len, vocab, self.encode, self.prefill_len)
        self.short = [prompt_tokens(16, vocab, self.encode, 100 + i) for i in range(8)]
        self.modelc.decode(self.short[:1], 4)  # first touches, the repacked copies

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def _modelc(self, kind: str) -> float:
        m = self.modelc
        assert m is not None
        if kind == "prefill":
            return m.prefill(self.long)
        return m.decode(self.short[: 1 if kind == "decode_b1" else 8], self.steps)

    def _peer(self, c: LlamaCppClient, kind: str) -> float:
        if kind == "prefill":
            return c.prefill_tps(self.long, reps=1)
        return c.decode_once(self.short[: 1 if kind == "decode_b1" else 8], self.steps)

    def round(self, probe: ReadProbe, flip: bool) -> Round:
        """One round (every server stopped during the read); ``flip``: llama.cpp first."""
        rnd = Round(probe.gbs())
        for kind in KINDS:
            n = BEST_OF[kind]

            def ours(kind: str = kind, n: int = n) -> None:
                rnd.modelc[kind] = max(self._modelc(kind) for _ in range(n))

            def theirs(kind: str = kind, n: int = n) -> None:
                for p in self.peers:
                    with p.running() as c:
                        tps = max(self._peer(c, kind) for _ in range(n))
                    rnd.peers.setdefault(p.config, {})[kind] = tps

            for step in (theirs, ours) if flip else (ours, theirs):
                step()
        self.result.rounds.append(rnd)
        return rnd


def run_rounds(models: list[PairedModel], rounds: int, say: Callable[[str], None]) -> None:
    """``rounds`` rounds over ``models`` (all loaded together), the order flipping each round."""
    probe = ReadProbe()
    with contextlib.ExitStack() as stack:
        for m in models:
            say(f"loading {m.result.label}: llama.cpp ({', '.join(m.configs)}) and modelc")
            stack.enter_context(m)
        for r in range(rounds):
            for m in models:
                rnd = m.round(probe, flip=bool(r % 2))
                say(
                    f"round {r + 1}/{rounds} {m.result.label}: read {rnd.read_gbs:.1f} GB/s; "
                    + "; ".join(f"{k} {rnd.modelc[k]:.1f} vs {rnd.peer_best(k):.1f}" for k in KINDS)
                )
