"""The small contract every architecture exports (see ``modelc.runtime.arch``).

A language model processes a **batch** of :class:`SeqChunk` per step: each chunk is
one sequence's next tokens (a prefill chunk or a single decode token) together with
that sequence's :class:`~modelc.runtime.kv_cache.KVCache`.  All chunks' tokens are
concatenated into one ``(n_tokens, d)`` activation matrix, so every weight matrix is
read once per step for the whole batch; attention runs per sequence over its own
cache.  Token ``i`` of a chunk sits at position ``cache.n + i``.

An embedding model maps token-id sequences to pooled vectors; a tensor model (MLP,
ONNX plan) maps input arrays to output arrays.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from modelc.errors import FormatError, UsageError
from modelc.formats.ir import DType, HParams, ModelIR
from modelc.formats.quants import dequantize
from modelc.runtime.backend import Backend, F32Array, Weight
from modelc.runtime.batch_sampler import BatchParams, Drawn, sample_batch
from modelc.runtime.kv_cache import KVBudget, KVCache, KVMode, KVShape
from modelc.runtime.seq_state import SeqState, StateShapes

IntArray = np.ndarray[Any, np.dtype[np.int64]]


@dataclass(frozen=True, slots=True)
class ImageSpan:
    """An image's embeddings in a sequence: positions ``start .. start + len(embeds) - 1``
    take these rows instead of their tokens' embeddings (llama.cpp's ``batch.embd``);
    ``bidirectional``: the span's positions attend to each other both ways (Gemma 3's
    image tokens; llama.cpp decodes them with causal attention off); ``grid``: the image's
    rows and columns of tokens, row by row, for M-RoPE positions (Qwen2.5-VL:
    :mod:`~modelc.runtime.arch.mrope`); (0, 0): one position per token; ``deep``: DeepStack
    features added after the first layers (Qwen3-VL: :mod:`~modelc.runtime.arch.deepstack`)."""

    start: int
    embeds: F32Array  # (n, d)
    bidirectional: bool = False
    grid: tuple[int, int] = (0, 0)
    deep: F32Array | None = None  # (layers, n, d)

    @property
    def end(self) -> int:
        return self.start + len(self.embeds)

    @property
    def key(self) -> int:
        """A negative number naming the embeddings (a hash of them): the prefix cache
        compares it in place of the positions' token ids."""
        raw = np.ascontiguousarray(self.embeds).tobytes()
        return -1 - (int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "little") >> 1)


@dataclass(slots=True)
class SeqChunk:
    """One sequence's tokens for this step.

    ``logit_rows``: indices into ``tokens`` whose next-token logits are returned;
    ``None`` means the last token only (the usual case), ``()`` none (a prefill
    chunk that is not the prompt's last).  ``images``: the sequence's image spans
    (absolute positions; those this chunk reaches replace its rows' embeddings; a
    bidirectional span is never split between chunks).
    """

    cache: KVCache
    tokens: Sequence[int] | IntArray
    logit_rows: tuple[int, ...] | None = None
    images: Sequence[ImageSpan] = ()

    def rows(self) -> tuple[int, ...]:
        return (len(self.tokens) - 1,) if self.logit_rows is None else self.logit_rows

    def spans(self) -> list[tuple[ImageSpan, int, int]]:
        """The image spans this chunk reaches: (span, first row, end row) in chunk rows."""
        p0, n = self.cache.n, len(self.tokens)
        out = []
        for im in self.images:
            a, b = max(im.start, p0), min(im.end, p0 + n)
            if a < b:
                out.append((im, a - p0, b - p0))
        return out


def place_images(batch: Sequence[SeqChunk], slices: Sequence[slice], x: F32Array) -> None:
    """Overwrite the rows of ``x`` (n, d) at image positions with the images' embeddings
    (after any embedding scale: llama.cpp scales token embeddings only)."""
    for c, sl in zip(batch, slices, strict=True):
        for im, a, b in c.spans():
            off = c.cache.n + a - im.start
            x[sl.start + a : sl.start + b] = im.embeds[off : off + b - a]


@runtime_checkable
class LanguageModel(Protocol):
    """A causal LM: llama, gpt2."""

    architecture: str
    hparams: HParams
    n_vocab: int
    n_ctx: int

    def new_cache(
        self,
        mode: KVMode | str = KVMode.F32,
        *,
        max_tokens: int | None = None,
        hot_window: int = 256,
        budget: KVBudget | None = None,
        full: bool = False,
    ) -> KVCache:
        """An empty cache for one sequence (``max_tokens`` defaults to ``n_ctx``); ``full``:
        sliding-window layers keep every position too."""
        ...

    def forward(self, batch: Sequence[SeqChunk]) -> F32Array:
        """Run one step; append every chunk to its cache; logits (sum of rows, n_vocab)."""
        ...

    def shift_context(self, cache: KVCache, n_keep: int, n_discard: int) -> None:
        """Drop ``n_discard`` tokens after the first ``n_keep`` (see kv_cache)."""
        ...


@runtime_checkable
class EmbeddingModel(Protocol):
    """An encoder producing one pooled vector per input sequence: bert."""

    architecture: str
    hparams: HParams

    def embed(
        self,
        batch: Sequence[Sequence[int]],
        token_types: Sequence[Sequence[int]] | None = None,
        *,
        normalize: bool | None = None,
    ) -> F32Array:
        """Pooled embeddings (batch, d), L2-normalised if ``normalize`` says so (None: if the
        model says so)."""
        ...


@runtime_checkable
class TensorModel(Protocol):
    """Array in, array out: mlp and ONNX plans."""

    architecture: str

    def run(self, inputs: dict[str, np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]: ...


# --- helpers shared by the architectures ----------------------------------------------


def _plain_f32(ir: ModelIR, name: str) -> F32Array:
    """Tensor ``name`` as f32: BF16 widened, a quantized one dequantized (converters and
    llama-quantize may quantize a 2-D table, such as a BERT's position embeddings)."""
    t = ir.tensors[name]
    data = t.data()
    if t.dtype is DType.BF16:
        data = (np.asarray(data, np.uint16).astype(np.uint32) << 16).view(np.float32)
    elif t.dtype.is_quantized:
        data = dequantize(data, t.dtype, tuple(t.shape))
    return np.ascontiguousarray(data, dtype=np.float32).reshape(t.shape)


@dataclass(slots=True)
class TensorSource:
    """Typed access to an IR's tensors with clear errors for missing ones."""

    ir: ModelIR
    used: set[str] = field(default_factory=set)

    def has(self, name: str) -> bool:
        return name in self.ir.tensors

    def _get(self, name: str) -> None:
        if name not in self.ir.tensors:
            raise FormatError(
                f"{self.ir.architecture} model is missing tensor {name!r}; "
                "the file is incomplete or not this architecture",
                path=self.ir.source.path,
            )
        self.used.add(name)

    def vec(self, name: str) -> F32Array:
        """A norm weight or bias, f32."""
        self._get(name)
        return _plain_f32(self.ir, name).reshape(-1)

    def weight(self, name: str) -> Weight:
        """A matrix (out, in), kept in its stored (possibly quantized) dtype."""
        self._get(name)
        t = self.ir.tensors[name]
        if len(t.shape) != 2:
            raise FormatError(
                f"{name}: expected a matrix, got shape {t.shape}", path=self.ir.source.path
            )
        shape = (int(t.shape[0]), int(t.shape[1]))
        if t.dtype in (DType.F32, DType.F16, DType.BF16):  # BF16: raw uint16 bits, read in C
            return Weight(t.dtype, shape, np.ascontiguousarray(t.data()).reshape(shape))
        if t.dtype.is_quantized:
            return Weight(t.dtype, shape, np.ascontiguousarray(t.data()))
        return Weight(DType.F32, shape, _plain_f32(self.ir, name).reshape(shape))

    def experts(self, name: str) -> list[Weight]:
        """A stack of matrices (n, out, in), such as a mixture's experts, as n row views."""
        self._get(name)
        t = self.ir.tensors[name]
        if len(t.shape) != 3:
            raise FormatError(
                f"{name}: expected (experts, rows, columns), got shape {t.shape}",
                path=self.ir.source.path,
            )
        n, rows, cols = (int(v) for v in t.shape)
        if t.dtype.is_quantized or t.dtype in (DType.F32, DType.F16, DType.BF16):
            data = np.ascontiguousarray(t.data()).reshape(n, rows, -1)
            dtype = t.dtype
        else:
            data, dtype = _plain_f32(self.ir, name).reshape(n, rows, cols), DType.F32
        return [Weight(dtype, (rows, cols), data[e]) for e in range(n)]

    def array(self, name: str) -> F32Array:
        """A plain tensor of any shape, f32."""
        self._get(name)
        return _plain_f32(self.ir, name)


def check_heads(ir: ModelIR, n_head: int, n_head_kv: int, d: int) -> None:
    """Raise FormatError unless the head counts are usable for a width ``d``."""
    if n_head <= 0 or n_head_kv <= 0 or n_head % n_head_kv or d % n_head:
        raise FormatError(
            f"{ir.architecture} model has unusable attention heads "
            f"(n_head={n_head}, n_head_kv={n_head_kv}, n_embd={d}); the metadata is wrong",
            path=ir.source.path,
        )


def check_rows(ir: ModelIR, name: str, w: Weight, rows: int) -> None:
    if w.shape[0] != rows:
        raise FormatError(
            f"{name} has {w.shape[0]} rows, the hyper-parameters say {rows}", path=ir.source.path
        )


class Scratch:
    """Grow-only f32 buffers reused across steps: ``get(name, shape)`` is a view."""

    def __init__(self) -> None:
        self._bufs: dict[str, F32Array] = {}

    def get(self, name: str, shape: tuple[int, ...]) -> F32Array:
        n = int(np.prod(shape))
        buf = self._bufs.get(name)
        if buf is None or buf.size < n:
            buf = np.empty(max(n, 2 * buf.size if buf is not None else n), np.float32)
            self._bufs[name] = buf
        return buf[:n].reshape(shape)


def chunk_positions(batch: Sequence[SeqChunk]) -> tuple[IntArray, IntArray, list[slice]]:
    """Concatenated token ids (N,), their positions (N,), and each chunk's row slice."""
    ids, pos, slices = [], [], []
    start = 0
    seen: set[int] = set()
    for c in batch:
        n = len(c.tokens)
        if n == 0:
            raise ValueError("empty chunk in batch")
        if id(c.cache) in seen:
            raise ValueError("a sequence appears twice in one batch")
        seen.add(id(c.cache))
        ids.append(np.asarray(c.tokens, np.int64))
        pos.append(np.arange(c.cache.n, c.cache.n + n, dtype=np.int64))
        slices.append(slice(start, start + n))
        start += n
    return np.concatenate(ids), np.concatenate(pos), slices


def logit_row_index(batch: Sequence[SeqChunk], slices: list[slice]) -> IntArray:
    """Rows of the (N, d) activations whose logits the batch asks for, in order."""
    rows = [sl.start + r for c, sl in zip(batch, slices, strict=True) for r in c.rows()]
    return np.asarray(rows, np.int64)


def begin_step(batch: Sequence[SeqChunk], n_vocab: int) -> tuple[IntArray, IntArray, list[slice]]:
    """Check a step's token ids and make room in every cache: ``chunk_positions`` + checks."""
    ids, pos, slices = chunk_positions(batch)
    if ids.min() < 0 or ids.max() >= n_vocab:
        raise UsageError(f"token id out of range 0..{n_vocab - 1}")
    for c in batch:
        c.cache.reserve(c.cache.n + len(c.tokens))
    return ids, pos, slices


def attend(
    be: Backend,
    batch: Sequence[SeqChunk],
    slices: list[slice],
    layer: int,
    q: F32Array,
    k: F32Array,
    v: F32Array,
    scale: float,
    out: F32Array,
    window: int = 0,
    softcap: float = 0.0,
    sinks: F32Array | None = None,
) -> None:
    """One layer's attention: each sequence writes its new K/V (n, n_head_kv, hd) to its
    own cache, then every sequence attends over its cache in one backend call; results go
    to ``out`` (n, n_head, hd).  Caches held as plain f32/f16 arrays take one
    ``attention_append`` call (writes included); quantized ones write, read back, then
    ``attention_batch``.  ``window`` > 0: the query at position p sees positions
    ``p - window + 1 .. p`` only (a sliding window); ``softcap`` > 0: scores become
    ``softcap * tanh(score / softcap)`` (gemma2); ``sinks`` (n_head,): a logit per head in
    every softmax's denominator (gpt-oss; image spans, recomputed here, take none).  The
    kernels get storage rows, which a
    windowed cache layer numbers from its ``base``: the first query's is
    ``KVCache.start(layer)`` (``n - base``), windows and causality being relative."""
    stores = [c.cache.storage(layer) for c in batch]
    dtypes = {st[0].dtype for st in stores if st is not None}
    if None not in stores and len(dtypes) == 1:
        be.attention_append(
            q,
            k,
            v,
            [st[0] for st in stores if st is not None],
            [st[1] for st in stores if st is not None],
            [c.cache.start(layer) for c in batch],  # n - the layer's base (windowed)
            [len(c.tokens) for c in batch],
            scale,
            out,
            window=window,
            softcap=softcap,
            sinks=sinks,
        )
        _attend_images(batch, slices, layer, q, scale, out, window, softcap)
        return
    ks, vs, p0s = [], [], []
    for c, sl in zip(batch, slices, strict=True):
        p0 = c.cache.n
        c.cache.write(layer, p0, k[sl], v[sl])
        kk, vv = c.cache.read(layer, p0 + len(c.tokens))  # (rows, n_head_kv, hd) from base
        ks.append(kk)
        vs.append(vv)
        p0s.append(c.cache.start(layer))
    qs = [np.ascontiguousarray(q[sl]) for sl in slices]  # each (n, n_head, hd)
    outs = [out[sl] for sl in slices]  # written in place
    be.attention_batch(
        qs, ks, vs, p0s, scale, outs=outs, window=window, softcap=softcap, sinks=sinks
    )
    _attend_images(batch, slices, layer, q, scale, out, window, softcap)


def _attend_images(
    batch: Sequence[SeqChunk],
    slices: list[slice],
    layer: int,
    q: F32Array,
    scale: float,
    out: F32Array,
    window: int,
    softcap: float,
) -> None:
    """Recompute the rows of bidirectional image spans (their K/V already in the cache):
    a query of the span sees every earlier position and the whole span (within the
    window: keys after ``p - window``, as transformers' ``sliding_window_overlay``)."""
    for c, sl in zip(batch, slices, strict=True):
        for im, a, b in c.spans():
            if not im.bidirectional:
                continue
            p0 = c.cache.n
            end = p0 + b  # the span's end in this chunk (never split: b - a is the span)
            kk, vv = c.cache.read(layer, end)  # (rows, n_head_kv, hd) from base
            base = end - len(kk)
            kk, vv = np.asarray(kk, np.float32), np.asarray(vv, np.float32)
            qs = q[sl.start + a : sl.start + b]  # (m, n_head, hd)
            m, nh, hd = qs.shape
            g = nh // kk.shape[1]
            qg = qs.reshape(m, kk.shape[1], g, hd)
            s = np.einsum("mkgd,rkd->kgmr", qg, kk) * np.float32(scale)  # (kv, g, m, rows)
            if softcap:
                s = np.float32(softcap) * np.tanh(s / np.float32(softcap))
            if window:
                pos = p0 + np.arange(a, b)[:, None]  # (m, 1)
                key = base + np.arange(len(kk))[None, :]  # (1, rows)
                s = np.where(key > pos - window, s, np.float32(-np.inf))
            s -= s.max(axis=-1, keepdims=True)
            e = np.exp(s)
            e /= e.sum(axis=-1, keepdims=True)
            o = np.einsum("kgmr,rkd->mkgd", e, vv)  # (m, kv, g, hd)
            out[sl.start + a : sl.start + b] = o.reshape(m, nh, hd)


def end_step(batch: Sequence[SeqChunk], slices: list[slice]) -> IntArray:
    """Advance every cache past its chunk; the activation rows whose logits are wanted."""
    for c in batch:
        c.cache.advance(len(c.tokens))
    return logit_row_index(batch, slices)


class CausalLM:
    """What llama and gpt2 share beyond their forward pass: per-sequence caches."""

    kv_shape: KVShape
    n_ctx: int
    kv_windows: tuple[int, ...] = ()  # each layer's sliding window (0: global); () none
    state_shapes: StateShapes | None = None  # recurrent layers' per-sequence state; None: none
    # the logits live on a device and reach the host by a copy: sampling there saves it
    # (the engine's --device-sampling auto)
    logits_on_device: bool = False

    def forward(self, batch: Sequence[SeqChunk]) -> F32Array:
        """Run one step (see :class:`LanguageModel`); each architecture has its own."""
        raise NotImplementedError

    def forward_sample(self, batch: Sequence[SeqChunk], params: BatchParams) -> Drawn:
        """Run one step; sample the logit rows ``params.rows`` with the batched sampler,
        the other rows' logits coming back beside them (``Drawn.logits``).  Here over
        numpy, on the host's logits; a model whose logits live on a device samples there."""
        return sample_batch(np, self.forward(batch), params)

    def new_cache(
        self,
        mode: KVMode | str = KVMode.F32,
        *,
        max_tokens: int | None = None,
        hot_window: int = 256,
        budget: KVBudget | None = None,
        full: bool = False,
    ) -> KVCache:
        """An empty cache for one sequence, at most ``n_ctx`` tokens long; its windowed
        layers keep only their window (plus slack) unless ``full``."""
        cache = KVCache(
            self.kv_shape,
            min(max_tokens or self.n_ctx, self.n_ctx),
            mode,
            hot_window=hot_window,
            budget=budget,
            windows=None if full else self.kv_windows or None,
        )
        if self.state_shapes:  # a sequence's recurrent state lives beside its KV cache
            cache.state = SeqState(self.state_shapes)
        return cache
