"""A sequence as the model runner keeps it (:class:`SeqRun`) and the key the prefix cache
compares its tokens by (:func:`prefix_key`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from modelc.engine.constraints import ConstraintState
from modelc.engine.prefix_cache import Block
from modelc.engine.spec_control import SpecController
from modelc.engine.speculative import Drafter
from modelc.runtime.kv_cache import KVCache
from modelc.runtime.model import ImageSpan
from modelc.runtime.sampling import Sampler


def prefix_key(tokens: list[int], images: tuple[ImageSpan, ...]) -> list[int]:
    """``tokens`` (from position 0) as the prefix cache compares them: each image's
    positions hold its key (a hash of its embeddings), so only the same image matches."""
    if not images:
        return tokens
    out = list(tokens)
    for im in images:
        n = min(len(im.embeds), max(0, len(out) - im.start))
        out[im.start : im.start + n] = [im.key] * n  # hashed on each call: a few ms at most
    return out


@dataclass(eq=False)
class SeqRun:
    """The runner's state of one sequence."""

    tokens: list[int]  # prompt + generated; tokens[:cache.n] are in the KV cache
    prompt_len: int
    sampler: Sampler
    prompt_logprobs: int | None = None  # top-n of every prompt row (None: not asked)
    constraint: ConstraintState | None = None
    drafter: Drafter | None = None
    spec: SpecController | None = None  # adaptive speculation (None: fixed or none)
    cache: KVCache | None = None  # made when the sequence is first scheduled
    prefix_blocks: list[Block] = field(default_factory=list)  # matched, loaded at admission
    cached_tokens: int = 0
    prefix_inserted: bool = False
    prefix_loaded: bool = False
    shifted: bool = False  # a context shift happened: the KV no longer matches a fresh run
    draft: list[int] = field(default_factory=list)
    draft_match: int = 0  # how the drafter found it (prompt lookup: the n-gram length)
    spec_drafted: int = 0
    spec_accepted: int = 0
    # the prompt's log-probabilities as prefill computes them (prompt_logprobs requests)
    prompt_lp: list[tuple[float, tuple[tuple[int, float], ...]]] = field(default_factory=list)
    # image embeddings at their prompt positions (the prefix cache keys them by their
    # hash, not their placeholder ids); such a sequence never shifts its context
    images: tuple[ImageSpan, ...] = ()
    # what the runner knows of the request's end, to run more steps of a plan on its own
    # (execute's ``steps``): tokens it may generate, those generated, the ids that end it
    max_new: int = 0
    generated: int = 0
    stop_ids: frozenset[int] = frozenset()

    @property
    def spans(self) -> tuple[tuple[int, int], ...]:
        """The positions that one prefill chunk must take whole (bidirectional images)."""
        return tuple((im.start, im.end) for im in self.images if im.bidirectional)

    @property
    def n_computed(self) -> int:
        """Tokens in the KV cache."""
        return self.cache.n if self.cache is not None else 0
