"""Prefix cache: keys/values of prompt blocks shared between requests.

A prompt is cut into blocks of ``block_tokens`` tokens.  Block ``i`` is keyed by a
chained hash ``h_i = H(h_{i-1} || tokens of block i)``, so a key names the whole
prefix up to and including its block (two prompts share a key exactly when they share
every token up to there).  Each block stores its keys and values for every layer as
``(n_layer, block_tokens, n_head_kv, head_dim)`` in the dtype the cache reads back
(float16 for an f16 cache, so a block costs what it costs in the cache, float32
otherwise).

* :meth:`PrefixCache.match` finds the longest run of cached blocks a prompt starts
  with and takes a reference on each (a referenced block is never evicted);
  :meth:`PrefixCache.load` copies them into a fresh sequence cache and
  :meth:`PrefixCache.release` drops the references.
* :meth:`PrefixCache.insert` copies the full blocks of a computed sequence out of its
  cache (blocks already present are only touched).  The engine inserts a prompt when
  its prefill completes and prompt + answer when the request finishes, so the next
  turn of a chat reuses both.
* Unreferenced blocks are evicted least-recently-used first when the RAM budget
  would be exceeded.  A match touches the deepest block first and the root last, so
  leaves age out before the prefixes they hang from.
* A GPU cache's blocks stay in GPU memory unless ``MODELC_CUDA_PREFIX=host``
  (:attr:`Block.on_device`: read out and loaded on the device, nothing copied to the host).

At least one prompt token is always left to compute, since the step needs that
token's logits.

Windowed layers (a sliding-window cache, see ``kv_cache``) no longer hold their oldest
positions, so a block copied out of such a cache may lack a windowed layer's rows, wholly
or from some row on: :attr:`Block.gaps` records them (layer -> window, first row held).
A run of blocks is loadable when every row a windowed layer needs after it (the last
``window - 1`` positions) is held; :meth:`PrefixCache.match` returns the longest loadable
run, :meth:`PrefixCache.load` copies global layers whole and windowed layers' needed rows
only (``KVCache.fill``), and an insert fills gaps of blocks already present when its
cache holds those rows.  The cache keeps ``window_keep`` (64) rows before each window, so
a sequence's last full block always loads (for blocks of up to 64 tokens).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Concatenate, ParamSpec, TypeVar

import numpy as np

from modelc.runtime.backend import KVArray
from modelc.runtime.kv_cache import KVCache, KVShape


@dataclass(slots=True, eq=False)
class Arena:
    """One host array several blocks are views of (:meth:`KVCache.read_blocks`: a
    sequence's new blocks read out at once); its bytes are counted once and freed with
    its last block."""

    nbytes: int
    live: int = 0  # its blocks still in the cache


@dataclass(slots=True, eq=False)
class Block:
    key: bytes
    # (n_layer, block_tokens, n_head_kv, head_dim) host arrays, or a GPU cache's device
    # arrays (on_device); v is k itself: shared values
    k: Any
    v: Any
    refs: int = 0
    # windowed layers whose rows are not all held: layer -> (window, first row held)
    gaps: dict[int, tuple[int, int]] = field(default_factory=dict)
    # a recurrent model's state after the block's last token (layer -> arrays), if kept
    state: dict[int, dict[str, np.ndarray[Any, Any]]] | None = None
    arena: Arena | None = None  # k and v are views of it (its bytes counted there)
    # k and v in a GPU's memory: read out by a cache whose ``device_blocks`` is set (a GPU's,
    # unless MODELC_CUDA_PREFIX=host), loaded by its ``fill_blocks``
    on_device: bool = False

    @property
    def nbytes(self) -> int:
        """The bytes this block alone holds (its arena's counted with the arena)."""
        held = sum(a.nbytes for d in (self.state or {}).values() for a in d.values())
        if self.arena is not None:
            return held
        return int(self.k.nbytes + (0 if self.v is self.k else self.v.nbytes) + held)


@dataclass(slots=True)
class PrefixStats:
    queries: int = 0
    hits: int = 0  # queries that reused at least one block
    hit_tokens: int = 0
    inserted_blocks: int = 0
    evicted_blocks: int = 0


def _host(a: Any) -> KVArray:
    """A block's array on the host (a device array copied: a block kept by a GPU cache
    loading into another kind of cache)."""
    return a if isinstance(a, np.ndarray) else a.get()


P = ParamSpec("P")
R = TypeVar("R")


def _locked(
    fn: Callable[Concatenate[PrefixCache, P], R],
) -> Callable[Concatenate[PrefixCache, P], R]:
    """Submissions (event loop) and steps (worker thread) both use the cache."""

    def wrapper(self: PrefixCache, /, *args: P.args, **kwargs: P.kwargs) -> R:
        with self.lock:
            return fn(self, *args, **kwargs)

    return wrapper


@dataclass(slots=True)
class PrefixCache:
    shape: KVShape
    budget_bytes: int
    block_tokens: int = 32
    blocks: OrderedDict[bytes, Block] = field(default_factory=OrderedDict)  # LRU order
    bytes_used: int = 0
    stats: PrefixStats = field(default_factory=PrefixStats)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    # the weights' identity: changed when a LoRA adapter is applied or removed, so
    # blocks computed with other weights are never matched again (LRU evicts them)
    salt: bytes = b""
    # a recurrent model (qwen35): a run of blocks loads only if its last block holds the
    # state there (see runtime.seq_state)
    recurrent: bool = False

    def block_keys(self, tokens: Sequence[int], n_blocks: int) -> list[bytes]:
        keys, prev = [], self.salt
        bt = self.block_tokens
        for i in range(n_blocks):
            chunk = np.asarray(tokens[i * bt : (i + 1) * bt], np.int64).tobytes()
            prev = hashlib.blake2b(prev + chunk, digest_size=16).digest()
            keys.append(prev)
        return keys

    @_locked
    def match(self, tokens: Sequence[int]) -> list[Block]:
        """The cached blocks ``tokens`` starts with (referenced; give them back with release)."""
        self.stats.queries += 1
        if self.budget_bytes <= 0:
            return []
        found: list[Block] = []
        for key in self.block_keys(tokens, (len(tokens) - 1) // self.block_tokens):
            b = self.blocks.get(key)
            if b is None:
                break
            found.append(b)
        while found and not self._loadable(found):
            found.pop()
        for b in reversed(found):
            b.refs += 1
            self.blocks.move_to_end(b.key)
        if found:
            self.stats.hits += 1
            self.stats.hit_tokens += len(found) * self.block_tokens
        return found

    def _loadable(self, blocks: Sequence[Block]) -> bool:
        """Whether every windowed layer holds the rows it needs after ``blocks`` (and a
        recurrent model's last block its state)."""
        if self.recurrent and blocks and blocks[-1].state is None:
            return False
        bt = self.block_tokens
        n = len(blocks) * bt
        for i, b in enumerate(blocks):
            for w, first in b.gaps.values():
                if first and i * bt + first > max(0, n - w + 1):  # a needed row is missing
                    return False
        return True

    @_locked
    def release(self, blocks: Sequence[Block]) -> None:
        for b in blocks:
            b.refs -= 1
            assert b.refs >= 0

    @_locked
    def load(self, blocks: Sequence[Block], cache: KVCache) -> int:
        """Copy ``blocks`` into the empty ``cache`` (positions 0..); the tokens loaded."""
        if not blocks:
            return 0
        assert cache.n == 0 and self._loadable(blocks)
        bt = self.block_tokens
        n = len(blocks) * bt
        # a GPU cache's own blocks (on_device), loaded on the device
        fill = getattr(cache, "fill_blocks", None) if blocks[0].on_device else None
        if fill is not None and all(b.on_device for b in blocks):
            fill(n, [(b.k, b.v) for b in blocks])
            return n

        def rows(layer: int, first: int) -> tuple[KVArray, KVArray]:
            """Positions first .. n-1 (n_rows, n_head_kv, head_dim)."""
            if first >= n:  # a layer that needs no rows (a recurrent one)
                empty = np.zeros((0, *blocks[0].k.shape[2:]), blocks[0].k.dtype)
                return empty, empty
            some = blocks[first // bt :]
            k = np.concatenate([_host(b.k[layer]) for b in some])[first % bt :]
            v = np.concatenate([_host(b.v[layer]) for b in some])[first % bt :]
            return k, v

        cache.fill(n, rows)
        state = blocks[-1].state
        if cache.state is not None and state is not None:
            cache.state.restore(n, state)
        return n

    @_locked
    def insert(self, tokens: Sequence[int], cache: KVCache) -> int:
        """Store the full blocks of ``tokens`` (whose KV is in ``cache``); blocks added."""
        if self.budget_bytes <= 0:
            return 0
        n_blocks = min(len(tokens), cache.n) // self.block_tokens
        keys = self.block_keys(tokens, n_blocks)
        missing = [i for i, key in enumerate(keys) if key not in self.blocks]
        bt, sh = self.block_tokens, self.shape
        held = [cache.held_from(layer) for layer in range(sh.n_layer)]
        # blocks already here with gaps this cache can fill
        patch = {
            key: self.blocks[key]
            for i, key in enumerate(keys)
            if key in self.blocks
            and any(held[li] - i * bt < first for li, (_, first) in self.blocks[key].gaps.items())
        }
        dtype = cache.dtype
        per_block = sh.kinds * sh.n_layer * bt * sh.n_head_kv * sh.head_dim * dtype.itemsize
        new: dict[bytes, Block] = {}
        arena = None
        if missing and not patch and self._make_room((n_blocks - missing[0]) * per_block):
            # the blocks from the first new one on, read out at once (a GPU cache: one
            # copy to the host), each new block a view of that array: no copy a block
            held_blocks = cache.read_blocks(n_blocks * bt, missing[0] * bt, bt)
            if held_blocks is not None:  # the room made may have evicted later ones too
                missing = [i for i in range(missing[0], n_blocks) if keys[i] not in self.blocks]
                arena = Arena(int(held_blocks.nbytes), len(missing))
                # an attribute read (an isinstance of a runtime Protocol took 2 % of a step)
                dev = bool(getattr(cache, "device_blocks", False))
                for i in missing:
                    k = held_blocks[i - missing[0], 0]
                    v = k if sh.kinds == 1 else held_blocks[i - missing[0], 1]
                    new[keys[i]] = Block(keys[i], k, v, arena=arena, on_device=dev)
        for i in missing if arena is None else ():
            if not self._make_room(per_block + len(new) * per_block):
                break
            blk = (sh.n_layer, bt, sh.n_head_kv, sh.head_dim)
            k = np.empty(blk, dtype)
            new[keys[i]] = Block(keys[i], k, k if sh.shared_values else np.empty(blk, dtype))
        if (new and arena is None) or patch:
            # each layer copied out before the next is read: an int8 cache dequantizes every
            # layer into the same scratch buffer; from the first block written on (a
            # finished sequence: its new blocks only)
            lo = min(i for i, key in enumerate(keys) if key in new or key in patch) * bt
            for layer, (kk, vv) in enumerate(cache.read_all(n_blocks * bt, lo)):
                h0 = held[layer]  # a windowed layer holds positions h0 .. only
                at = max(lo, h0)  # kk, vv: positions at .. n - 1
                for i, key in enumerate(keys):
                    b = new[key] if key in new else patch.get(key)
                    if b is None:
                        continue
                    first = min(bt, max(0, h0 - i * bt))  # the block's first row held
                    was = bt if key in new else b.gaps.get(layer, (0, 0))[1]
                    if first >= was and key not in new:
                        continue
                    b.k[layer, first:was] = kk[i * bt + first - at : i * bt + was - at]
                    b.v[layer, first:was] = vv[i * bt + first - at : i * bt + was - at]
                    if first:
                        b.gaps[layer] = (cache.bounded[layer], first)
                    else:
                        b.gaps.pop(layer, None)
        self._keep_state(keys, cache, new)
        self.bytes_used += arena.nbytes if arena is not None else 0
        for key in reversed(keys):  # deepest first, so the root ends up most recent
            if key in new:
                self.blocks[key] = new[key]
                self.bytes_used += new[key].nbytes
            elif key in self.blocks:
                self.blocks.move_to_end(key)
        self.stats.inserted_blocks += len(new)
        return len(new)

    def _keep_state(self, keys: list[bytes], cache: KVCache, new: dict[bytes, Block]) -> None:
        """A recurrent cache's last boundary checkpoint onto the block ending there."""
        mark = cache.state.checkpoint() if cache.state is not None else None
        if (
            mark is None
            or mark[0] % self.block_tokens
            or not 0 < mark[0] <= len(keys) * (self.block_tokens)
        ):
            return
        key = keys[mark[0] // self.block_tokens - 1]
        b = new.get(key) or self.blocks.get(key)
        if b is not None and b.state is None:
            b.state = {li: {k: np.array(a) for k, a in d.items()} for li, d in mark[1].items()}
            if key not in new:
                self.bytes_used += sum(a.nbytes for d in b.state.values() for a in d.values())

    def _make_room(self, nbytes: int) -> bool:
        """Room for ``nbytes`` more, least recently used unreferenced blocks evicted until
        there is (all of them where that is not enough: False).  The blocks are scanned
        only as far as the eviction needs: an insert calls this once a block it adds, and a
        scan of every block each time cost 10 % of a loaded server's time."""
        if nbytes > self.budget_bytes:
            return False
        over = self.bytes_used + nbytes - self.budget_bytes
        if over <= 0:
            return True
        victims = []
        left: dict[int, int] = {}  # an arena's blocks left once these victims go
        for k, b in self.blocks.items():  # oldest first
            if b.refs == 0:
                victims.append(k)
                over -= b.nbytes
                if (a := b.arena) is not None:
                    left[id(a)] = left.get(id(a), a.live) - 1
                    over -= a.nbytes if left[id(a)] == 0 else 0
                if over <= 0:
                    break
        for k in victims:
            b = self.blocks.pop(k)
            self.bytes_used -= b.nbytes
            if (a := b.arena) is not None:
                a.live -= 1
                self.bytes_used -= a.nbytes if a.live == 0 else 0
            self.stats.evicted_blocks += 1
        return over <= 0
