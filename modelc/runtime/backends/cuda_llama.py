"""The decoder on the GPU: every decoder-only family, run from its one description.

The host model (:class:`~modelc.runtime.arch.decoder.Decoder`, built on the numpy backend:
it checks the hyper-parameters and holds host views of the weights) gives the
:class:`~modelc.runtime.arch.decoder.DecoderSpec` this forward runs, with no family code
of its own: per-head Q/K norms, the embedding scale, norms after attention and FFN, GELU,
windowed layers with their own RoPE base, soft-capped scores and logits.  What the GPU does
not run yet (:data:`~.cuda_family.CUDA_RUNS` leaves it out) is refused before any GPU work.
A model with LongRoPE long factors runs within its original context (its short factors),
as llama.cpp does at that context size.

Weights are uploaded once in their GGUF blocks (Q/K/V stacked, gate/up stacked), KV caches
live in device memory (:class:`~.cuda_kv.CudaKVCache`), a step's activations stay on the
device: the host sends one int64 array (:func:`~.cuda_step.step_meta`) and gets back the
wanted rows' logits, or (:meth:`CudaLlama.forward_sample`) only the tokens sampled there.

Steps replay CUDA graphs (``MODELC_CUDA_GRAPHS=0``: never): decode steps padded to
:func:`~.cuda_step.graph_rows`' buckets (all captured by :meth:`CudaLlama.warm`), steps with
prompt chunks of up to :data:`~.cuda_step.MIXED_GRAPH_ROWS` rows to theirs
(:func:`~.cuda_step.run_shape`: from a shape's second step on, or all captured by warm with
``MODELC_CUDA_MIXED_KEY=rows``), at most :data:`MAX_GRAPHS` kept; longer steps, and those a
failed cuBLAS capture leaves (``graph_error``), run eagerly (docs/gpu.md).
``MODELC_CUDA_STEP_IO=graph``: a step carries its own I/O (:mod:`~.cuda_io`).
"""

from __future__ import annotations

import os
from collections import Counter, OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from modelc.errors import UnsupportedError, UsageError
from modelc.formats.ir import HParams, ModelIR
from modelc.runtime.arch.attn_temp import attn_temperature
from modelc.runtime.arch.decoder import Decoder
from modelc.runtime.arch.decoder_block import layer_inv_freqs, shift_keys
from modelc.runtime.arch.longrope import short_factors_ctx
from modelc.runtime.backend import F32Array
from modelc.runtime.backends import cuda_io, cuda_sampler
from modelc.runtime.backends.cuda_attn import tiles as tiles_of
from modelc.runtime.backends.cuda_backend import CudaBackend
from modelc.runtime.backends.cuda_family import cuda_host
from modelc.runtime.backends.cuda_kv import CudaKVCache
from modelc.runtime.backends.cuda_layer import DevLayer, blocks_bytes, pre_matmul, residual
from modelc.runtime.backends.cuda_step import (
    MIXED_GRAPH_ROWS,
    check_fits,
    graph_rows,
    mixed_runs,
    pad_tiles,
    run_shape,
    step_meta,
)
from modelc.runtime.backends.cuda_weights import DevWeight
from modelc.runtime.batch_sampler import BatchParams, Drawn, sample_batch
from modelc.runtime.kv_cache import KVBudget, KVCache, KVMode, KVShape
from modelc.runtime.model import CausalLM, SeqChunk, begin_step, end_step, logit_row_index

MAX_GRAPHS = 160  # captured steps kept (the decode buckets and the mixed steps' shapes)
GraphKey = tuple[int, int, int, bool]  # rows, logit rows, attention tiles, f16 cache


class CudaLlama(CausalLM):
    """A decoder :class:`~modelc.runtime.model.LanguageModel` computing on the GPU."""

    logits_on_device = True  # the engine samples here (forward_sample) unless told not to

    def __init__(
        self,
        ir: ModelIR,
        backend: CudaBackend,
        *,
        kv_bytes: int = 0,
        n_seqs: int = 0,
        host: Decoder | None = None,
    ) -> None:
        # the description and host views of the weights
        host = host if host is not None else cuda_host(ir)
        sp = host.spec
        self.architecture = sp.architecture
        self.hparams: HParams = host.hparams
        self.n_ctx = short_factors_ctx(sp.n_ctx, sp.long_rope_after)
        self.n_vocab, self.d = sp.n_vocab, sp.d
        self.nh, self.nkv, self.hd = sp.n_head, sp.n_head_kv, sp.head_dim
        self.eps, self.scale, self.neox = sp.eps, sp.scale, sp.neox
        self.gelu = sp.act == "gelu_tanh"
        self.embd_scale = sp.embd_scale
        self.attn_softcap = sp.attn_softcap
        self.qk_whole = sp.qk_norm_whole  # Q/K norms over the whole projection (olmo2)
        self.final_softcap = sp.final_softcap
        # the host's layers first .. stop-1 (all, unless a part of a split model): the
        # embedding where they start the model; the output norm and head where the host
        # holds them (where they end it, or in a split the GPU part: head_logits)
        self.first, self.stop = lo, hi = host.first, host.stop
        blocks, head = host.blocks[lo:hi], host.head
        self.head, self.ends = head, hi == len(host.blocks)  # ends: _run gives the logits
        if self.ends and not head:
            raise UnsupportedError("the GPU part that ends a model computes its head too")
        windows = sp.windows[lo:hi]
        # RoPE's rotated dimensions (fewer than a head's: partial RoPE, phi4mini) and each
        # layer's rotation magnitude: YaRN / LongRoPE's cos and sin factor where the scores
        # do not take it (the host's rope_mscale: partial RoPE, or olmo3's full-attention
        # layers only, the windowed ones' tables unscaled), else 1
        self.rot = sp.rot_dim
        ms = float(host.rope_mscale) if host.rope_mscale is not None else 1.0
        self.rope_ms = [1.0 if loc else ms for loc in sp.local_rope[lo:hi]]
        # queries scaled by position on these layers (mistral3's attention temperature)
        self.temp_layers = sp.attn_temp_layers[lo:hi] if sp.attn_temp else ()
        self.temp_args = (sp.attn_temp, sp.attn_temp_floor, sp.attn_temp_offset)
        self.shift_invs = layer_inv_freqs(sp, host.inv_freq, host.inv_freq_local, lo, hi)
        # a layer without RoPE (smollm3's NoPE) rotates by zero frequencies: sin 0 = 0 and
        # cos 0 = 1 leave every pair as it was, to the bit
        still = np.zeros_like(host.inv_freq)
        self.inv_freq_host = [still if f is None else f for f in self.shift_invs]
        self.kv_shape = KVShape(hi - lo, self.nkv, self.hd)
        self.be, self.dev, self.cp = backend, backend.dev, backend.cp
        cp = self.cp
        weights = blocks_bytes(blocks)
        ends = {
            id(w): w
            for w in (host.tok_embd if lo == 0 else None, host.output if head else None)
            if w is not None
        }
        weights += sum(int(w.data.nbytes) for w in ends.values())
        free = int(cp.cuda.runtime.memGetInfo()[0])
        check_fits(weights + (256 << 20), kv_bytes, n_seqs, free, f"{ir.architecture} model")
        freqs = {id(f): cp.asarray(f) for f in self.inv_freq_host}
        self.layers = [
            DevLayer(backend, b, w, freqs[id(f)])
            for b, w, f in zip(blocks, windows, self.inv_freq_host, strict=True)
        ]
        up = {k: backend.dev.upload([w]) for k, w in ends.items()}  # a tied table once
        self.tok_embd: DevWeight | None = up[id(host.tok_embd)] if lo == 0 else None
        self.output: DevWeight | None = up[id(host.output)] if head else None
        self.output_norm = cp.asarray(host.output_norm)
        self.ff = max((ly.ff for ly in self.layers), default=0)
        self.stream = cp.cuda.Stream(non_blocking=True)
        # a mixture picks its experts on the host each step: no graph can hold that
        moe = any(ly.experts is not None for ly in self.layers)
        self.use_graphs = os.environ.get("MODELC_CUDA_GRAPHS", "1") != "0" and not moe
        self._graphs: OrderedDict[GraphKey, Any] = OrderedDict()  # least recently replayed first
        self._seen: set[GraphKey] = set()
        self.graph_steps: Counter[str] = Counter()  # steps replayed, captured, run eagerly
        self._blas_graphs = backend.dev.blas is not None
        self.graph_error: str | None = None  # why steps on cuBLAS run without graphs, if so
        # prompt chunks' attention in tiles (MODELC_CUDA_ATTN_TILES=0: a block a row and head)
        self.attn_tiles = os.environ.get("MODELC_CUDA_ATTN_TILES", "1") != "0"
        # decode steps: RoPE and the KV store in the attention kernel (neox or even hd / 32)
        even = self.neox or (self.hd // 32) % 2 == 0
        plain = not self.temp_layers and self.rot == self.hd and set(self.rope_ms) == {1.0}
        self.rope_attn = os.environ.get("MODELC_CUDA_ROPE_ATTN", "0") == "1" and even and plain
        self._tiles = 0
        # decode steps padded to graph buckets (graph_rows), their padding rows' cache
        self.pad_graphs = os.environ.get("MODELC_CUDA_GRAPH_BUCKETS", "1") == "1"
        mixed = os.environ.get("MODELC_CUDA_MIXED_GRAPH_ROWS", str(MIXED_GRAPH_ROWS))
        self.mixed_rows = int(mixed) if self.pad_graphs else 0
        self.mixed_bucket = int(os.environ.get("MODELC_CUDA_MIXED_BUCKET", "8"))  # run_shape's
        self.mixed_fixed = os.environ.get("MODELC_CUDA_MIXED_KEY") == "rows"  # all warmed
        # a new shape captured at once: GEMV-only, or on cuBLAS once a cuBLAS step was
        self.capture_first = os.environ.get("MODELC_CUDA_CAPTURE_FIRST") == "1"
        self._blas_captured = False
        self.fused_sampler = cuda_sampler.enabled()
        self.step_io = cuda_io.enabled() and self.use_graphs  # meta in, picks out (cuda_io)
        self.io: cuda_io.StepIO | None = None
        self._pad_caches: dict[bool, CudaKVCache] = {}
        self._alloc(64)
        # the weights' uploads queue on the default stream (CuPy's asarray: async), which
        # this non-blocking stream does not wait for: done before any step reads them
        cp.cuda.Device().synchronize()

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights read by one decode step (every matrix once)."""
        head = 0 if self.output is None else self.output.nbytes
        return sum(ly.nbytes for ly in self.layers) + head

    # -- buffers -------------------------------------------------------------------------
    def _alloc(self, rows: int) -> None:
        with self.stream:  # zero fills ordered with the steps, whoever calls (warm, __init__)
            cp, m, width = self.cp, rows, (self.nh + 2 * self.nkv) * self.hd
            self.rows = m
            self.meta = cp.zeros(8 * m, np.int64)  # ids|pos|seq|base|cap|logit rows|tiles (2m)
            self.x = cp.zeros((m, self.d), np.float32)
            self.h = cp.zeros((m, self.d), np.float32)
            self.qkv = cp.zeros((m, width), np.float32)
            self.q = cp.zeros((m, self.nh * self.hd), np.float32)
            self.attn = cp.zeros((m, self.nh * self.hd), np.float32)
            self.gu = cp.zeros((m, 2 * self.ff), np.float32)
            self.g = cp.zeros((m, self.ff), np.float32)
            self.logits = cp.zeros((m, self.n_vocab if self.output is not None else 1), np.float32)
            self.tokens = cp.zeros(m, np.int64)
            self.temp = cp.zeros(m, np.float32)  # the rows' query scales (attn_temperature)
            self.io = cuda_io.StepIO(cp, m, len(self.meta)) if self.step_io else None
            self.dev.reserve_q8(m, max(self.d, self.nh * self.hd, self.ff))  # q8 GEMV's x
            self.reset_graphs()

    def reset_graphs(self) -> None:
        """Forget captured steps (their buffers were replaced, or the kernels chosen changed)."""
        self._graphs.clear()
        self._seen.clear()

    def new_cache(
        self,
        mode: KVMode | str = KVMode.F16,
        *,
        max_tokens: int | None = None,
        hot_window: int = 256,
        budget: KVBudget | None = None,
        full: bool = False,
    ) -> KVCache:
        """A GPU cache: every layer keeps every position (``full`` or not; a sliding
        window only masks)."""
        n = min(max_tokens or self.n_ctx, self.n_ctx)
        return CudaKVCache(self.cp, self.kv_shape, n, mode, budget=budget, stream=self.stream)

    # -- the step --------------------------------------------------------------------------
    def _pad_cache(self) -> tuple[int, int]:
        """(address, capacity) of the one-position cache padding rows write and read."""
        c = self._pad_caches.get(self._kv_f16)
        if c is None:
            mode = KVMode.F16 if self._kv_f16 else KVMode.F32
            c = self._pad_caches[self._kv_f16] = CudaKVCache(self.cp, self.kv_shape, 1, mode)
            c.reserve(1)
        return c.base_ptr, c.capacity

    def _upload_meta(
        self, batch: Sequence[SeqChunk], pad: bool = False
    ) -> tuple[GraphKey | None, int, int]:
        """Send the step's meta (:func:`step_meta`); the shape it runs as (with ``pad``, its
        graph bucket, :func:`run_shape`: the key of its graph; else None, run as it is),
        then the batch's own rows and logit rows."""
        ids, pos, slices = begin_step(batch, self.n_vocab)
        rows = logit_row_index(batch, slices)
        n, r = len(ids), len(rows)
        chunks = any(len(c.tokens) > 1 for c in batch)
        t = None
        if self.attn_tiles and chunks:  # a step with prompt chunks: attention in tiles of rows
            t = tiles_of(slices, self.dev.tile_rows(self._kv_f16))
        nt = 0 if t is None else len(t)
        shape = (
            run_shape(n, r, nt, not chunks, self.mixed_rows, self.mixed_bucket, self.mixed_fixed)
            if pad
            else None
        )
        run, r_run, t_run = shape or (n, r, nt)
        if run > self.rows:  # (the padding rows' sequence is one of the run's rows)
            self._alloc(max(run, 2 * self.rows))
        caches = []
        for c in batch:
            if not isinstance(c.cache, CudaKVCache):
                raise UnsupportedError("a CUDA model needs caches made by its own new_cache")
            caches.append((c.cache.base_ptr, c.cache.capacity))
        m = self.rows
        pad_cache = self._pad_cache() if run > n else (0, 0)
        host = step_meta(ids, pos, slices, caches, rows, m, run, pad_cache, r_run)
        if t is not None:
            host[6 * m : 6 * m + 2 * t_run] = pad_tiles(t, t_run, n).ravel()
        self._tiles = t_run
        if self.io is None:
            self.meta.set(host, stream=self.stream)  # after _alloc's fills (older CuPy: legacy)
        else:  # copied by the step itself (_body)
            self.io.meta[: len(host)] = host
        end_step(batch, slices)  # the caches count the new tokens (written by this step)
        key = None if shape is None else (run, r_run, t_run, self._kv_f16)
        return key, n, r

    def _body(self, n: int, r: int) -> None:
        """:meth:`_run`, with :attr:`io` between the meta's copy in and the picks' out."""
        if self.io is not None:
            self.io.send(self.meta, self.stream)
        self._run(n, r)
        if self.io is not None and self.ends and self.output is not None:
            self.io.pick(self.dev, self.logits, r, self.tokens, self.stream)

    def _run(self, n: int, r: int) -> None:
        """Every layer and the head for n rows; logits of the r wanted rows into ``logits``."""
        dev, m, meta = self.dev, self.rows, self.meta
        ids, rows_d = meta[:m], meta[5 * m :]
        kvmeta = (meta[m : 2 * m], meta[2 * m : 3 * m], meta[3 * m : 4 * m], meta[4 * m : 5 * m])
        f16 = self._kv_f16
        if self.tok_embd is not None:  # else x holds the part before's hidden state
            dev.dequant(self.tok_embd.parts[0], ids, n, self.x, self.d)
            if self.embd_scale:
                dev.scale(self.x, n * self.d, self.embd_scale)
        rope = dev.fn["rope_store_f16" if f16 else "rope_store_f32"]
        tiles = (meta[6 * m :], self._tiles) if self._tiles else None
        temp = None  # each row's query scale by its position (attn_temp_layers), in place
        if any(self.temp_layers):
            temp = attn_temperature(kvmeta[0][:n], *self.temp_args, self.temp[:n], self.cp)
            temp = temp.reshape(n, 1)
        for li, ly in enumerate(self.layers):
            pre_matmul(dev, self.x, self.h, self.eps, n, ly.attn_norm, ly.wqkv, self.qkv)
            bias = ly.bias if ly.bias is not None else np.uint64(0)
            if ly.bias is not None and ly.q_norm is not None:  # the biases before the norms
                self.qkv[:n] += ly.bias  # (glm4moe), so not again in RoPE
                bias = np.uint64(0)
            ly.norm_qk(dev, self.qkv, n, (self.nh, self.nkv, self.hd), self.eps, self.qk_whole)
            ra = None  # a decode step (no tiles: one row a sequence): RoPE in attention
            if self.rope_attn and self.attn_tiles and not self._tiles:
                ra = (self.qkv, bias, ly.inv_freq, self.neox)
            else:
                rope(
                    (n, -(-(self.nh + self.nkv) * self.hd // 256)),  # a pair a thread
                    (128,),
                    (self.qkv, bias, *kvmeta, ly.inv_freq, np.int32(self.nh), np.int32(self.nkv),
                     np.int32(self.hd), np.int32(int(self.neox)), np.int32(li), self.q,
                     np.int32(self.rot), np.float32(self.rope_ms[li])),
                )  # fmt: skip
            if temp is not None and self.temp_layers[li]:  # sharper past the original context
                self.q[:n] *= temp
            q8 = dev.attention(
                self.q, kvmeta, n, self.nh, self.nkv, self.hd, f16, self.scale, ly.window, li,
                self.attn, self.attn_softcap, then=ly.wo, tiles=tiles, rope=ra, sinks=ly.sinks,
            )  # fmt: skip
            residual(
                dev, self.x, self.h, self.eps, (ly.wo, self.attn, n), ly.post_attn_norm, q8, ly.bo
            )
            if ly.experts is not None:
                assert ly.ffn_norm is not None  # a mixture with its norm (the spec's)
                dev.rms_norm(self.x, None, n, ly.ffn_norm, self.eps, self.h)
                ly.experts.run(dev, self.cp, self.h, n, self.x)
                continue
            assert ly.wgu is not None and ly.wdown is not None
            gu, g = self.gu[:, : 2 * ly.ff], self.g[:, : ly.ff]
            if ly.ff != self.ff:
                gu, g = self.cp.ascontiguousarray(gu), self.cp.ascontiguousarray(g)
            pre_matmul(dev, self.x, self.h, self.eps, n, ly.ffn_norm, ly.wgu, gu)
            q8 = dev.act_mul(gu, n, ly.ff, g, self.gelu, then=ly.wdown)
            residual(dev, self.x, self.h, self.eps, (ly.wdown, g, n), ly.post_ffw_norm, q8)
        if r and self.ends and self.output is not None:
            dev.rms_norm(self.x, rows_d, r, self.output_norm, self.eps, self.h)
            dev.matmul(self.output, self.h, r, self.logits)
            if self.final_softcap:
                dev.softcap(self.logits, r * self.n_vocab, self.final_softcap)

    def _step(
        self, batch: Sequence[SeqChunk], hidden: F32Array | None = None, prm: Any = None
    ) -> tuple[int, int]:
        """Run one step on the stream, from ``hidden`` (rows, d) where this part does not
        start the model; its rows, and its logit rows (left in ``logits``); with :attr:`io`,
        sampled as ``prm`` says (None: greedily)."""
        modes = {c.cache.mode for c in batch}
        if len(modes) != 1:
            raise UnsupportedError("one CUDA step needs every cache in one mode")
        self._kv_f16 = modes.pop() is KVMode.F16
        decode = all(len(c.tokens) == 1 and c.rows() == (0,) for c in batch)
        pad = self.use_graphs and self.pad_graphs and hidden is None
        with self.stream:
            key, n_own, r_own = self._upload_meta(batch, pad and (decode or self.mixed_rows > 0))
            if self.io is not None:  # after any growth of the buffers (_alloc)
                self.io.set_params(prm)
            if hidden is not None:  # outside any graph, which reads x as it is
                self.x[:n_own].set(np.ascontiguousarray(hidden, np.float32), stream=self.stream)
            if key is None:  # unpadded: a decode step of its own size (graphs unpadded), or eager
                key = (n_own, r_own, self._tiles, self._kv_f16)
                graphable = self.use_graphs and decode
            else:
                graphable = self.use_graphs
            n, r = key[0], key[1]
            gemv = n <= self.dev.gemv_max
            first = self.capture_first and (gemv or self._blas_captured)  # captured at once
            if key in self._graphs:
                self._graphs.move_to_end(key)
                self._graphs[key].launch(self.stream)
                self.graph_steps["replayed"] += 1
            elif not (graphable and (gemv or self._blas_graphs)):
                self._body(n, r)
                self.graph_steps["eager"] += 1
            elif (not gemv or not decode) and key not in self._seen and not first:
                # cuBLAS sets itself up outside a capture; a prompt's shape may not recur
                self._seen.add(key)
                self._body(n, r)
                self.graph_steps["eager"] += 1
            else:
                self.graph_steps["captured"] += 1
                try:
                    graph = self._capture(n, r)
                except Exception as e:
                    if gemv:
                        raise
                    self._blas_graphs = False  # cuBLAS would not be captured here: run eagerly
                    self.graph_error = f"{type(e).__name__}: {e}"
                    self._body(n, r)
                else:
                    self._graphs[key], self._blas_captured = graph, self._blas_captured or not gemv
                    while len(self._graphs) > MAX_GRAPHS:
                        self._graphs.popitem(last=False)
                    graph.launch(self.stream)
        return n_own, r_own

    def warm(self, max_seqs: int, mode: KVMode | str = KVMode.F16) -> None:
        """With :attr:`pad_graphs`, capture the decode graph of every bucket up to
        ``max_seqs`` sequences now (a step of each on throwaway caches), so that a
        server's first steps of each size replay one instead of capturing it."""
        if not (self.use_graphs and self.pad_graphs) or self.tok_embd is None:
            return
        if self.mixed_rows > self.rows:  # buffers for the largest graphed step now: growing
            self._alloc(self.mixed_rows)  # them later would drop every graph captured
        for b in sorted({graph_rows(k) for k in range(1, max_seqs + 1)}):
            self._warm_step([1] * b, mode)
        if self.mixed_fixed:  # and one a row bucket of the steps with prompt chunks
            for run in mixed_runs(self.mixed_rows, self.mixed_bucket, self.n_ctx):
                self._warm_step([1, run - 2], mode)

    def _warm_step(self, lens: list[int], mode: KVMode | str) -> None:
        """Two steps of chunks of ``lens`` tokens on throwaway caches (cuBLAS: eager, then
        captured)."""
        for _ in range(2):
            caches = [self.new_cache(mode, max_tokens=max(lens) + 1) for _ in lens]
            try:
                self._step([SeqChunk(c, [0] * k) for c, k in zip(caches, lens, strict=True)])
            finally:
                self.stream.synchronize()
                for c in caches:
                    c.free()

    def _capture(self, n: int, r: int) -> Any:
        self.stream.begin_capture()
        try:
            self._body(n, r)
        finally:
            graph = self.stream.end_capture()
        return graph

    def forward(self, batch: Sequence[SeqChunk]) -> F32Array:
        return self.forward_part(batch, None)

    def forward_part(self, batch: Sequence[SeqChunk], hidden: F32Array | None) -> F32Array:
        """As :meth:`Decoder.forward_part`: the logits where this part ends the model,
        else the hidden state (rows, d), copied to the host."""
        if (hidden is None) != (self.tok_embd is not None):
            raise UsageError(f"layers {self.first}.. take the hidden state, not token ids")
        n, r = self._step(batch, hidden)
        dev_out = self.logits[:r] if self.ends else self.x[:n]
        out: F32Array = dev_out.get(stream=self.stream)
        self.stream.synchronize()
        return out

    def head_logits(self, hidden: F32Array) -> F32Array:
        """As :meth:`Decoder.head_logits`, on the device (eagerly: one norm, one product):
        the logits (r, vocab) of the hidden state (r, d) the last part gives."""
        if self.output is None:
            raise UsageError(f"layers {self.first}..{self.stop - 1} on the GPU hold no head")
        r = len(hidden)
        if r > self.rows:
            self._alloc(max(r, 2 * self.rows))
        with self.stream:
            if r:
                self.x[:r].set(np.ascontiguousarray(hidden, np.float32), stream=self.stream)
                self.dev.rms_norm(self.x, None, r, self.output_norm, self.eps, self.h)
                self.dev.matmul(self.output, self.h, r, self.logits)
                if self.final_softcap:
                    self.dev.softcap(self.logits, r * self.n_vocab, self.final_softcap)
            out: F32Array = self.logits[:r].get(stream=self.stream)
        self.stream.synchronize()
        return out

    def forward_greedy(self, batch: Sequence[SeqChunk]) -> np.ndarray[Any, Any]:
        """One step; the argmax token id of each wanted row, computed on the device."""
        if self.tok_embd is None or not self.ends:
            raise UsageError("greedy steps on the GPU need the whole model there")
        _, r = self._step(batch)
        with self.stream:
            self.dev.argmax(self.logits, r, self.tokens)
        out: np.ndarray[Any, Any] = self.tokens[:r].get(stream=self.stream)
        self.stream.synchronize()
        return out

    def forward_sample(self, batch: Sequence[SeqChunk], params: BatchParams) -> Drawn:
        """One step sampled on the device (the batched sampler over CuPy): only the chosen
        tokens, the log-probabilities asked for and the logits of rows the host samples
        (``params.host_rows``) come back."""
        on = self.io is not None and self.ends and cuda_sampler.fits(params) and not params.edited
        _, r = self._step(batch, prm=cuda_sampler.params(params, params.rows) if on else None)
        io = self.io if on else None  # after the step: one growing the buffers made a new one
        if io is not None:
            self.stream.synchronize()
            picks = io.picks[: len(params.rows)]
            if (picks >= 0).all():  # else handed back: the batched sampler below
                return cuda_sampler.drawn(picks.copy(), self.n_vocab)
        with self.stream:
            drawn = None  # in one launch (cuda_sampler; not again where io's handed back)
            if self.fused_sampler and io is None and cuda_sampler.takes(params):
                drawn = cuda_sampler.sample(self.dev, self.logits[:r], params, self.tokens)
            if drawn is None:
                drawn = sample_batch(self.cp, self.logits[:r], params)
        self.stream.synchronize()
        return drawn

    def shift_context(self, cache: KVCache, n_keep: int, n_discard: int) -> None:
        """As :meth:`Decoder.shift_context`, the moved keys re-rotated through the host."""
        self.stream.synchronize()
        shift_keys(cache, n_keep, n_discard, self.be, self.shift_invs, self.neox)
