"""Adaptive speculation (prompt lookup) on SmolLM2: does it pay where it should, and cost
nothing elsewhere? (issue 14, must-show 4)

Workloads (chat-templated, greedy, each request stops at its end of turn or max_tokens):

* ``code``: a code snippet and a small edit to make; the answer copies most of it;
* ``summary``: a passage of prose to summarise (some copying);
* ``long-qa``: a question about a passage, a poem inspired by it (SmolLM2 copies a
  good deal of the passage into these anyway);
* ``long-nocopy``: ~200 tokens of random words, then an unrelated task (nothing to
  copy: drafting has to switch itself off);
* ``chat``: short chats (below the prompt-length threshold: never draft);
* ``mixed (all)``: every request above.

Every request runs with speculation off and with the engine's default (``auto``),
alternating (off, auto, auto, off, ...), on one engine with the prefix cache off, so
each run prefills its prompt afresh. Per request: latency (submit to finish) and
decode tokens/s; the ratios auto/off are reported as medians per workload, and the
greedy tokens are checked to be identical. ``--concurrent N`` also runs the mixed set
with N clients at once, the whole set with speculation off vs auto (alternating sets).

    .venv/bin/python -m bench.spec_bench [--repeats 3] [--mode auto|fixed] [--concurrent 3]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import trio

from modelc.bench.timing import alternate, forward_seconds
from modelc.engine import EngineOptions, LLMEngine, build_engine
from modelc.engine.api import FinishEvent, GenerationRequest, TokenEvent
from modelc.runtime.sampling import SamplingParams

CODE = [
    (
        "Rename the variable `items` to `products` everywhere in this code and output the whole code.",
        """def total_price(items, tax_rate):
    subtotal = 0
    for item in items:
        subtotal = subtotal + item.price * item.quantity
    tax = subtotal * tax_rate
    return subtotal + tax


def average_price(items):
    if not items:
        return 0
    return sum(item.price for item in items) / len(items)


def most_expensive(items):
    best = None
    for item in items:
        if best is None or item.price > best.price:
            best = item
    return best
""",
    ),
    (
        "Add a docstring to the function `load_users` and output the whole code.",
        """import json
from pathlib import Path


def load_users(path):
    users = []
    with open(path) as f:
        for line in f:
            record = json.loads(line)
            if record.get("active"):
                users.append({"name": record["name"], "email": record["email"]})
    return users


def save_users(path, users):
    with open(path, "w") as f:
        for user in users:
            f.write(json.dumps(user) + "\\n")
""",
    ),
    (
        "Change the default port from 8080 to 9000 and output the whole code.",
        """import argparse
import logging

logger = logging.getLogger(__name__)


def parse_args():
    parser = argparse.ArgumentParser(description="Run the web server")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind")
    parser.add_argument("--port", type=int, default=8080, help="port to listen on")
    parser.add_argument("--workers", type=int, default=4, help="worker processes")
    parser.add_argument("--debug", action="store_true", help="verbose logging")
    return parser.parse_args()


def main():
    args = parse_args()
    level = logging.DEBUG if args.debug else logging.INFO
    logging.basicConfig(level=level)
    logger.info("listening on %s:%d with %d workers", args.host, args.port, args.workers)
""",
    ),
    (
        "Rename the class `Stack` to `LifoStack` and output the whole code.",
        """class Stack:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        if not self.items:
            raise IndexError("pop from an empty stack")
        return self.items.pop()

    def peek(self):
        if not self.items:
            return None
        return self.items[-1]

    def __len__(self):
        return len(self.items)


def reverse(values):
    stack = Stack()
    for v in values:
        stack.push(v)
    return [stack.pop() for _ in range(len(stack))]
""",
    ),
]

PASSAGES = [
    """The honeybee colony is a remarkable example of cooperation in nature. A single colony
can contain tens of thousands of worker bees, a few hundred drones and one queen. The
queen lays up to two thousand eggs a day during the height of summer, while the workers
take on different jobs as they age. Young workers clean cells and feed larvae; older
ones build wax comb, guard the entrance and finally leave the hive to collect nectar and
pollen. Foragers tell their sisters where to find flowers through the waggle dance, a
figure-of-eight movement whose angle points toward the food relative to the sun and
whose length tells the distance. In autumn the colony shrinks, the drones are driven
out, and the remaining bees cluster together through the winter, shivering their flight
muscles to keep the queen warm and living on the honey they stored during the summer.
Beekeepers have learned to work with these habits: they add boxes when the colony grows,
leave enough honey for the winter, and watch for signs of disease such as the varroa
mite, which has spread around the world and weakened many colonies.""",
    """In the early nineteenth century most long-distance travel on land was slow, expensive
and uncomfortable. A journey that now takes a few hours by train could take several
days by stagecoach, and goods moved even more slowly by canal barge or wagon. The first
public steam railways changed this within a single generation. Engineers learned to
build gentle gradients, long viaducts and deep cuttings so that heavy locomotives could
pull trains at steady speeds. Towns that gained a station grew quickly, while those
that were bypassed often declined. Railways also created the need for standard time:
before them every town kept its own local time based on the sun, which made timetables
confusing. Railway companies adopted a single time across their networks, and
governments soon followed. The new lines brought fresh food to cities, carried workers
to factories and allowed ordinary families to take holidays by the sea for the first
time. Critics worried about accidents, noise and the damage to the countryside, but
within fifty years railways had become the backbone of trade and travel in many
countries.""",
    """Sleep is not simply a period of rest in which the brain switches off. During the night
the brain passes through several cycles, each lasting about ninety minutes, that move
between light sleep, deep sleep and rapid eye movement sleep. Deep sleep appears to be
important for physical recovery and for clearing waste products that build up in the
brain during the day. Rapid eye movement sleep, when most vivid dreams happen, seems to
help with memory and emotional balance. Adults who regularly sleep less than seven
hours a night are more likely to have problems with attention, mood and long-term
health, including a higher risk of heart disease and diabetes. Good sleep habits are
simple but easy to neglect: going to bed and getting up at the same time each day,
keeping the bedroom dark and cool, avoiding caffeine late in the day and putting
screens away before bed. Short naps can help, but long naps late in the afternoon can
make it harder to fall asleep at night.""",
]

# long prompts whose answers have nothing to copy: a list of random words, then a task
WORDS = [
    "river",
    "window",
    "seven",
    "purple",
    "engine",
    "quietly",
    "market",
    "cloud",
    "forest",
    "ladder",
    "orange",
    "silver",
    "thunder",
    "pocket",
    "garden",
    "mirror",
    "candle",
    "violin",
    "harbor",
    "pepper",
    "saddle",
    "lantern",
    "marble",
    "basket",
]
STORIES = [
    "Ignore the words above. Write a short story about a cat who learns to fly.",
    "Ignore the words above. Describe your ideal weekend in a few sentences.",
    "Ignore the words above. Explain how a bicycle works to a child.",
]

CHATS = [
    "What is the capital of France?",
    "Give me three tips for sleeping better.",
    "Write a haiku about autumn leaves.",
    "Explain recursion in one paragraph.",
    "What is the difference between a list and a tuple in Python?",
    "Suggest a name for a small coffee shop.",
]


@dataclass
class Req:
    kind: str
    name: str
    text: str  # the user message
    answer_prefix: str = ""  # the assistant turn starts with this
    max_tokens: int = 256


@dataclass
class Run:
    latency: float
    tps: float
    tokens: list[int]
    drafted: int
    accepted: int


@dataclass
class Row:
    req: Req
    prompt_tokens: int = 0
    off: list[Run] = field(default_factory=list)
    auto: list[Run] = field(default_factory=list)


def workloads() -> list[Req]:
    out: list[Req] = []
    for i, (task, code) in enumerate(CODE):
        out.append(
            Req("code", f"code{i}", f"{task}\n```python\n{code}```", "```python\n", max_tokens=320)
        )
    for i, p in enumerate(PASSAGES):
        text = " ".join(p.split())
        out.append(
            Req("summary", f"summary{i}", f"Summarise this passage:\n\n{text}", max_tokens=160)
        )
        out.append(
            Req(
                "long-qa",
                f"question{i}",
                f"{text}\n\nIn one sentence, why does this matter to ordinary people?",
                max_tokens=96,
            )
        )
        out.append(
            Req(
                "long-qa",
                f"poem{i}",
                f"{text}\n\nWrite a short poem inspired by this passage.",
                max_tokens=128,
            )
        )
    rng = np.random.default_rng(0)
    for i, task in enumerate(STORIES):
        noise = " ".join(rng.choice(WORDS, size=160).tolist())
        out.append(Req("long-nocopy", f"story{i}", f"{noise}\n\n{task}", max_tokens=128))
    for i, c in enumerate(CHATS):
        out.append(Req("chat", f"chat{i}", c, max_tokens=96))
    return out


def prompt_ids(eng: LLMEngine, r: Req) -> list[int]:
    assert eng.prompt is not None
    msgs = [{"role": "user", "content": r.text}]
    if r.answer_prefix:  # the answer starts with it (assistant prefill)
        msgs.append({"role": "assistant", "content": r.answer_prefix})
    return eng.prompt.chat(msgs).ids


async def one(
    eng: LLMEngine, rid: str, ids: list[int], r: Req, spec: bool, out: dict[str, Run]
) -> None:
    assert eng.prompt is not None
    p = SamplingParams(
        temperature=0.0, max_tokens=r.max_tokens, stop_token_ids=sorted(eng.prompt.eog_ids)
    )
    stamps: list[float] = []
    toks: list[int] = []
    fin: FinishEvent | None = None
    t0 = time.perf_counter()
    async for ev in eng.submit(GenerationRequest(rid, ids, p, speculative=spec)):
        if isinstance(ev, TokenEvent):
            stamps.append(time.perf_counter())
            toks.append(ev.token_id)
        elif isinstance(ev, FinishEvent):
            fin = ev
    assert fin is not None
    lat = time.perf_counter() - t0
    tps = (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else 0.0
    out[rid] = Run(lat, tps, toks, fin.spec_drafted, fin.spec_accepted)


def fmt_ratio(xs: list[float]) -> str:
    return f"{statistics.median(xs):.3f}" if xs else "-"


async def sequential(
    eng: LLMEngine, reqs: list[Req], repeats: int, verbose: bool = False
) -> list[Row]:
    rows = [Row(r, len(prompt_ids(eng, r))) for r in reqs]
    n = 0
    for rep in range(repeats):
        for row in rows:
            ids = prompt_ids(eng, row.req)
            order = (False, True) if (rep + n) % 2 == 0 else (True, False)
            n += 1
            for spec in order:
                out: dict[str, Run] = {}
                await one(eng, f"{row.req.name}-{rep}-{spec}", ids, row.req, spec, out)
                run = next(iter(out.values()))
                (row.auto if spec else row.off).append(run)
                if verbose:
                    print(
                        f"  {row.req.name} {'auto' if spec else 'off '} {len(run.tokens)} tok "
                        f"{run.latency:.3f} s {run.tps:.1f} tok/s drafted {run.drafted} "
                        f"accepted {run.accepted}",
                        flush=True,
                    )
        print(f"repeat {rep + 1}/{repeats} done", flush=True)
    return rows


async def _worker(
    eng: LLMEngine, queue: list[tuple[int, Row]], tag: str, spec: bool, out: dict[str, Run]
) -> None:
    while queue:
        i, row = queue.pop(0)
        rid = f"c{i}-{tag}"
        await one(eng, rid, prompt_ids(eng, row.req), row.req, spec, out)
        (row.auto if spec else row.off).append(out[rid])


async def concurrent(eng: LLMEngine, reqs: list[Req], repeats: int, clients: int) -> list[Row]:
    """The mixed set through ``clients`` workers at once; the whole set with speculation
    off, then auto (then auto, off ...)."""
    rows = [Row(r, len(prompt_ids(eng, r))) for r in reqs]
    for rep in range(repeats):
        for spec in (False, True) if rep % 2 == 0 else (True, False):
            out: dict[str, Run] = {}
            queue = list(enumerate(rows))
            async with trio.open_nursery() as nursery:
                for _ in range(clients):
                    nursery.start_soon(_worker, eng, queue, f"{rep}-{spec}", spec, out)
        print(f"concurrent repeat {rep + 1}/{repeats} done", flush=True)
    return rows


def table(rows: list[Row], title: str) -> list[str]:
    lines = [
        f"\n{title}\n",
        "| workload | requests | prompt tokens | tokens/s off -> auto (median) | "
        "decode speed-up (median of per-request) | latency auto/off (median) | worst request "
        "latency auto/off | acceptance | identical tokens |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    kinds = ["code", "summary", "long-qa", "long-nocopy", "chat", "mixed (all)"]
    for kind in kinds:
        sel = [r for r in rows if kind == "mixed (all)" or r.req.kind == kind]
        if not sel:
            continue
        lat = [
            statistics.median(a.latency for a in r.auto)
            / statistics.median(o.latency for o in r.off)
            for r in sel
        ]
        spd = [
            statistics.median(a.tps for a in r.auto) / statistics.median(o.tps for o in r.off)
            for r in sel
        ]
        tps_off = statistics.median(o.tps for r in sel for o in r.off)
        tps_on = statistics.median(a.tps for r in sel for a in r.auto)
        drafted = sum(a.drafted for r in sel for a in r.auto)
        acc = sum(a.accepted for r in sel for a in r.auto)
        same = all(a.tokens == r.off[0].tokens for r in sel for a in [*r.auto, *r.off])
        plens = [r.prompt_tokens for r in sel]
        lines.append(
            f"| {kind} | {len(sel)} | {min(plens)}-{max(plens)} | {tps_off:.1f} -> {tps_on:.1f} | "
            f"{fmt_ratio(spd)}x | {fmt_ratio(lat)} | {max(lat):.3f} | "
            f"{acc / drafted if drafted else 0:.0%} ({acc}/{drafted}) | {same} |"
        )
    lines.append("\nper request (latency auto/off, median of the repeats):\n")
    lines.append(
        "  "
        + ", ".join(
            f"{r.req.name} {statistics.median(a.latency for a in r.auto) / statistics.median(o.latency for o in r.off):.2f}"
            for r in rows
        )
    )
    return lines


def step_costs(eng: LLMEngine, repeats: int = 25) -> list[str]:
    """Time of one forward of a decode step verifying ``k`` drafts over a plain one, for
    one sequence and for 4 (one of them drafting), at a few context lengths."""
    from modelc.runtime.kv_cache import KVCache
    from modelc.runtime.model import SeqChunk

    lm = eng.lm
    assert lm is not None
    rng = np.random.default_rng(0)
    ks = (0, 1, 2, 4, 8)
    lines = [
        "\nverification cost: forward time with k drafted rows / a plain decode step "
        f"(median of {repeats})\n",
        "| context | sequences | plain step | " + " | ".join(f"k={k}" for k in ks[1:]) + " |",
        "|---|---|---|" + "---|" * (len(ks) - 1),
    ]
    for ctx, nseq in ((64, 1), (300, 1), (1000, 1), (300, 4)):
        caches = []
        for _ in range(nseq):
            c = lm.new_cache(eng.mode, max_tokens=eng.max_context)
            toks = [int(t) for t in rng.integers(100, 10000, ctx)]
            for j in range(0, ctx, 256):
                lm.forward([SeqChunk(c, toks[j : j + 256], ())])
            caches.append(c)

        def verify(k: int, caches: list[KVCache] = caches, ctx: int = ctx) -> float:
            """Seconds of one forward with ``k`` drafted rows on the first sequence."""
            batch = [
                SeqChunk(
                    c,
                    [int(t) for t in rng.integers(100, 10000, (k if j == 0 else 0) + 1)],
                    tuple(range((k if j == 0 else 0) + 1)),
                )
                for j, c in enumerate(caches)
            ]
            took = forward_seconds(lm, batch)
            for c in caches:
                c.truncate(ctx)
            return took

        times = alternate({k: functools.partial(verify, k) for k in ks}, repeats)
        med = {k: statistics.median(v) for k, v in times.items()}
        lines.append(
            f"| {ctx} | {nseq} | {med[0] * 1000:.1f} ms | "
            + " | ".join(f"{med[k] / med[0]:.2f}" for k in ks[1:])
            + " |"
        )
        print(lines[-1], flush=True)
    return lines


async def main(args: argparse.Namespace) -> None:
    opts = EngineOptions(prefix_cache_bytes=0, spec_adaptive=args.mode == "auto")
    if args.gamma is not None:
        opts.spec_gamma = args.gamma
    if args.max_running is not None:
        opts.spec_max_running = args.max_running
    eng = build_engine(args.model, opts)
    reqs = workloads()
    if args.only:
        reqs = [r for r in reqs if r.kind in args.only.split(",")]
    lines: list[str] = step_costs(eng) if args.cost else []
    async with trio.open_nursery() as n:
        await n.start(eng.run)
        if not args.only_concurrent:
            rows = await sequential(eng, reqs, args.repeats, args.verbose)
            lines += table(
                rows, f"one request at a time, {args.repeats} runs each way, mode {args.mode}"
            )
        if args.concurrent:
            rows = await concurrent(eng, reqs, args.repeats, args.concurrent)
            lines += table(rows, f"{args.concurrent} clients at once, {args.repeats} runs each way")
        n.cancel_scope.cancel()
    print("\n".join(lines))


if __name__ == "__main__":
    from tests.assets import smollm2_gguf

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--mode", choices=["auto", "fixed"], default="auto")
    ap.add_argument("--gamma", type=int, default=None, help="longest draft (default: the engine's)")
    ap.add_argument("--concurrent", type=int, default=0, metavar="N")
    ap.add_argument("--only-concurrent", action="store_true")
    ap.add_argument(
        "--max-running", type=int, default=None, metavar="N", help="draft only while <= N run"
    )
    ap.add_argument("--cost", action="store_true", help="also time verification steps")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every run")
    ap.add_argument(
        "--only", default="", help="comma-separated kinds: code,summary,long-nocopy,chat"
    )
    a = ap.parse_args()
    if a.model is None:
        a.model = smollm2_gguf()
    trio.run(main, a)
