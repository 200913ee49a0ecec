"""The decoder on a WebGPU device, resident: weights, KV caches and a step's activations
stay in device buffers, and a step is one job (one submit).

The mirror of :mod:`~modelc.runtime.backends.cuda_llama` for ``--device webgpu`` /
``metal``: the host model (:class:`~modelc.runtime.arch.decoder.Decoder` on the numpy
backend) gives the :class:`~modelc.runtime.arch.decoder.DecoderSpec` run here, and what
this forward does not run (:data:`~.webgpu_layer.WEBGPU_RUNS` leaves it out; weight types without a
shader) is refused in one line, before any GPU work: the engine then runs the model op by
op on :class:`~modelc.runtime.backends.webgpu.WebGPUBackend` (``MODELC_WEBGPU_RESIDENT=0``
does so always).

Weights are uploaded once in their GGUF blocks (the backend's ``_chunks``: the matmul
shaders dequantize them), every sequence's KV cache is one device buffer
(:class:`~.webgpu_kv.WebGpuKVCache`, f16 or f32), and per step the host writes four small
int arrays (token ids, positions, each row's visible cache positions, the rows whose
logits are wanted), records every layer's dispatches into one command buffer, and reads back the
logits of the wanted rows only.  A cache that grows (every 256 positions) copies itself in
a submit of its own.  The shaders are the op-level backend's (``wgsl/``) plus
``kv_store.wgsl`` (K/V rows into a cache at their positions), ``rms_norm_rows`` (the logit
rows), ``add_bias``, ``gelu_mul``, ``scale`` (Gemma's scaled embeddings) and
``rms_norm_add`` (a post-norm added into the residual), the output and down products
otherwise adding into the residual stream in the matmul shader (``acc``); windowed layers
with a RoPE base of their own (Gemma 3) rotate by a second table a step; a mixture's
experts run in the step too (:mod:`~.webgpu_moe`); numerics are the op-level path's
(float32 throughout, an f16 cache rounded to nearest even as the CPU's).  Queries and keys
share one buffer (one RoPE dispatch), gate and up one weight where their types agree (one
product; the activation reads each row's halves).  A step's plan (``Gpu.plan``: bind
groups, uniforms) is kept by shape, so a decode step like the one before only rewrites
each cache's length and the scores' stride and encodes (``_plan``).
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from modelc.errors import UnsupportedError
from modelc.formats.ir import HParams, ModelIR, row_bytes
from modelc.runtime.arch.attn_temp import attn_temperature
from modelc.runtime.arch.decoder import Decoder
from modelc.runtime.arch.decoder_block import (
    finish_logits,
    layer_inv_freqs,
    shift_keys,
)
from modelc.runtime.arch.longrope import short_factors_ctx
from modelc.runtime.backend import F32Array, Weight
from modelc.runtime.backends.webgpu import WebGPUBackend
from modelc.runtime.backends.webgpu_attn import (
    StepRec,
    record_attention,
    record_g4_attention,
    record_latent_attention,
)
from modelc.runtime.backends.webgpu_conv import advance_states, record_shortconv, step_inputs
from modelc.runtime.backends.webgpu_device import (
    Dispatch,
    Job,
    Plan,
    aligned,
    flat,
    grid,
    shader_source,
    u32s,
    vec,
)
from modelc.runtime.backends.webgpu_gemma4 import Gemma4Step
from modelc.runtime.backends.webgpu_kv import WebGpuKVCache
from modelc.runtime.backends.webgpu_layer import Layer, webgpu_host
from modelc.runtime.backends.webgpu_moe import MoeLayer
from modelc.runtime.backends.webgpu_ops import SCORES_BYTES
from modelc.runtime.kv_cache import KVBudget, KVCache, KVMode, KVShape
from modelc.runtime.model import CausalLM, SeqChunk, begin_step, end_step, logit_row_index
from modelc.runtime.seq_state import SeqState

PLANS_KEPT = 8  # steps' plans kept (by shape) before they are dropped
_STORE_POS = 2  # the word of kv_store's uniforms that holds the cache's length (pos0)
_ATTN_SSTRIDE = 5  # the word of attention's uniforms that holds the scores' stride


def resident_wanted() -> bool:
    """Whether ``--device webgpu``/``metal`` tries the resident decoder
    (``MODELC_WEBGPU_RESIDENT=0``: the op-level path, for comparison)."""
    return os.environ.get("MODELC_WEBGPU_RESIDENT", "1") != "0"


class WebGpuLlama(CausalLM):
    """A decoder :class:`~modelc.runtime.model.LanguageModel` resident on a WebGPU device."""

    def __init__(self, ir: ModelIR, backend: WebGPUBackend, host: Decoder | None = None) -> None:
        host = host if host is not None else webgpu_host(ir)
        sp = host.spec
        self.architecture = sp.architecture
        self.hparams: HParams = host.hparams
        self.be, self.gpu = backend, backend.gpu
        self.n_vocab, self.d = sp.n_vocab, sp.d
        self.n_ctx = short_factors_ctx(host.n_ctx, sp.long_rope_after)  # LongRoPE: as CUDA
        self.nh, self.nkv, self.hd = sp.n_head, sp.n_head_kv, sp.head_dim
        self.eps, self.scale, self.neox = sp.eps, sp.scale, sp.neox
        self.gelu = sp.act == "gelu_tanh"
        mla = self.hparams.mla  # latent attention: one cached row of rank + rope a token
        self.kv_shape = (
            KVShape(len(host.blocks), 1, mla.kv_rank + mla.rope_dim)
            if mla is not None
            else KVShape(len(host.blocks), self.nkv, self.hd)
        )
        gpu = self.gpu
        # gemma4: layers of two head shapes in a cache of the largest, KV sharing, per-layer
        # inputs (webgpu_gemma4.py); the step's Q/K/V buffers are of the cache's shape
        self.g4 = None if host.g4 is None else Gemma4Step(gpu, host.g4, self.nh)
        if self.g4 is not None:
            self.kv_shape = host.kv_shape
            self.nkv, self.hd = self.g4.kc, self.g4.hc
        self.tok_embd, self.output = host.tok_embd, host.output
        backend._chunks(self.tok_embd)  # every weight placed now (the budget's checks)
        self.layers = [Layer(gpu, b, sp.moe_sigmoid_shared, mla, sp.eps) for b in host.blocks]
        # short convolutions (lfm2): their layers, and the states' shapes a cache keeps;
        # each attention layer's cache layer (a layer with a convolution keeps none)
        self.convs = [li for li, ly in enumerate(self.layers) if ly.conv is not None]
        self.state_shapes = host.state_shapes
        attn_layers = [li for li, ly in enumerate(self.layers) if ly.conv is None]
        self.cache_layer = {li: ci for ci, li in enumerate(attn_layers)}
        if self.convs:
            self.kv_shape = KVShape(len(attn_layers), self.nkv, self.hd)
        self.mlas = [ly.mla for ly in self.layers if ly.mla is not None]
        extra = [] if self.g4 is None else self.g4.mats()
        for w in [m for ly in self.layers for m in ly.mats()] + [self.output, *extra]:
            backend._chunks(w)
        self.output_norm = vec(gpu, host.output_norm, "output_norm")
        inv = np.asarray(host.inv_freq, np.float32)
        self.hn = len(inv)
        self.inv = vec(gpu, inv, "inv_freq")
        # the windowed layers' own RoPE base (gemma3): a second table a step (gemma4: of its
        # own length too, the windowed layers' head size)
        self.local = tuple(bool(x) for x in sp.local_rope) or (False,) * len(host.blocks)
        self.inv_local = vec(gpu, host.inv_freq_local, "inv_freq_local")
        self.hn_local = len(host.inv_freq_local)
        self.embd_scale = float(sp.embd_scale)  # gemma: sqrt(d); 0: none
        # YaRN's / LongRoPE's factor on the global table's cos and sin (Decoder.rope_mscale:
        # where only part of a head rotates), as its f32 bits; 0: none
        ms = host.rope_mscale
        self.mscale = 0 if ms is None else int(np.float32(ms).view(np.uint32))
        self.spec, self.softcap = sp, float(sp.attn_softcap)  # gemma2's capped scores
        self.nope = tuple(sp.nope) or (False,) * len(host.blocks)  # layers without RoPE
        n_cache = self.kv_shape.n_layer  # gemma4: a cache layer per layer writing K/V
        self.shift_invs = layer_inv_freqs(sp, host.inv_freq, host.inv_freq_local, 0, n_cache)
        self._rerotate = None if host.g4 is None else host.g4.rerotate
        self.ff = max(1, *(ly.ff for ly in self.layers))  # dense FFNs' (mixtures: their own)
        self.moes = [ly.moe for ly in self.layers if ly.moe is not None]
        self.moes += [] if self.g4 is None else self.g4.moes  # gemma4's beside the FFN
        self.windows = tuple(int(w) for w in sp.windows)  # per layer, 0: global (mistral: 4k)
        # per layer: attends within chunks of this many positions (llama 4), 0: not
        self.chunks = tuple(int(c) for c in sp.chunks) or (0,) * len(host.blocks)
        self.ones = vec(gpu, np.ones(self.hd, np.float32), "ones")  # a plain RMS norm's
        self.dummy = vec(gpu, np.zeros(4, np.float32), "no_sinks")
        self._pipes: dict[tuple[str, str], Any] = {}
        # steps' plans by shape (_plan), and how many were made (a test's count)
        self._plans: dict[tuple[Any, ...], tuple[Plan, list[list[int]], list[int]]] = {}
        self.plans_made = 0

    # -- the CausalLM surface ----------------------------------------------------------
    def new_cache(
        self,
        mode: KVMode | str = KVMode.F16,
        *,
        max_tokens: int | None = None,
        hot_window: int = 256,
        budget: KVBudget | None = None,
        full: bool = False,
    ) -> KVCache:
        n = min(max_tokens or self.n_ctx, self.n_ctx)
        cache = WebGpuKVCache(self.gpu, self.kv_shape, n, mode, budget=budget)
        if self.state_shapes:  # the recurrent layers' states, on the host (webgpu_conv.py)
            cache.state = SeqState(self.state_shapes)
        return cache

    def shift_context(self, cache: KVCache, n_keep: int, n_discard: int) -> None:
        """As :meth:`Decoder.shift_context`: the moved keys re-rotated on the host."""
        rope_from = self.mlas[0].rank if self.mlas else 0  # latent: the RoPE tail only
        fb, rerotate = self.be._fallback, self._rerotate

        def rotate(k: F32Array, angles: tuple[F32Array, F32Array], layer: int) -> None:
            assert rerotate is not None  # gemma4: each layer's own head size of the rows
            rerotate(fb, k, layer, angles, self.neox)

        shift_keys(
            cache, n_keep, n_discard, fb, self.shift_invs, self.neox,
            rotate if rerotate is not None else None, rope_from,
        )  # fmt: skip

    def forward(self, batch: Sequence[SeqChunk]) -> F32Array:
        """One step (prompt chunks and decode rows of any sequences): one submit; the
        logits of the wanted rows back."""
        for c in batch:
            if not isinstance(c.cache, WebGpuKVCache):
                raise UnsupportedError("the resident WebGPU model needs caches of its new_cache")
            if c.images:
                raise UnsupportedError("images run on the CPU decoder only")
        if len({c.cache.mode for c in batch}) != 1:
            raise UnsupportedError("one WebGPU step needs every cache in one mode")
        ids, pos, slices = begin_step(batch, self.n_vocab)  # caches grow here
        rows = logit_row_index(batch, slices)
        with self.gpu.lock:
            data = self.gpu.run_plan(self._plan(batch, ids, pos, slices, rows))
        if self.convs:  # the short convolutions' inputs, read back first: the states move
            advance_states(batch, slices, self.convs, data[: len(self.convs)], self.d)
        end_step(batch, slices)
        if not len(rows):
            return np.zeros((0, self.n_vocab), np.float32)
        logits = np.frombuffer(data[-1], np.float32).reshape(len(rows), self.n_vocab).copy()
        return finish_logits(self.spec, logits)  # gemma2's soft cap as the CPU's, on the host

    # -- the step ------------------------------------------------------------------------
    def _pipe(self, module: str, entry: str, *files: str) -> Any:
        hit = self._pipes.get((module, entry))
        if hit is None:
            src = shader_source(*(files or (module,)))
            hit = self._pipes[(module, entry)] = self.gpu.pipeline(module, entry, src)
        return hit

    def _buf(self, name: str, nbytes: int) -> tuple[Any, int]:
        buf, _ = self.gpu.scratch(f"res_{name}", nbytes)
        return buf, buf.size

    def _put(self, name: str, a: np.ndarray[Any, Any]) -> tuple[Any, int]:
        buf, _ = self.gpu.put(f"res_{name}", a)
        return buf, buf.size

    def _matmul(
        self,
        job: Job,
        w: Weight,
        x: Any,
        n: int,
        out: Any,
        acc: bool = False,
        stride: int = 0,
        col0: int = 0,
    ) -> None:
        """``out (+)= x @ dequant(w).T`` (``acc``: added into out, a residual); ``stride``
        (default the weight's rows) and ``col0``: out's row width and the first column
        written (two products into one buffer's halves)."""
        for d in self.be.matmul_dispatches(w, x, n, out, acc, stride, col0):
            job.add(d)

    def _get_rows(self, job: Job, table: Weight, ids: Any, n: int, out: Any) -> None:
        """``out = dequant(table)[ids]``: n rows of the table (embeddings) as stored."""
        emb = self.be._module(table.dtype, 1)
        pipe = self.gpu.pipeline(emb[0], "get_rows", emb[1])
        cols = table.shape[1]
        gy, gz = grid(n)
        for buf, r0, nr in self.be._chunks(table):
            params = u32s(nr, cols, n, row_bytes(table.dtype, cols), 0, r0, 0, 0)
            bind = {0: (buf, buf.size), 2: out, 4: ids}
            job.add(Dispatch(pipe, bind, params, 3, (math.ceil(math.ceil(cols / 4) / 64), gy, gz)))

    def _norm(
        self, job: Job, x: Any, w: Any, n: int, out: Any, sel: Any = None, width: int = 0
    ) -> None:
        """``out = rms_norm(x) * w`` over n rows of ``width`` (default d); ``sel``: the rows
        of x to take; ``x`` None: out normed in place."""
        gx, gy = grid(n)
        params = struct.pack("<IIIf", n, width or self.d, gx, self.eps)
        bind = {1: w, 3: out} if x is None else {0: x, 1: w, 3: out}
        if sel is not None:
            bind[5] = sel
        entry = "rms_norm_inplace" if x is None else "rms_norm" if sel is None else "rms_norm_rows"
        job.add(Dispatch(self._pipe("norm", entry), bind, params, 4, (gx, gy, 1)))

    def _elem(
        self, job: Job, entry: str, n: int, bind: dict[int, Any], extra: int = 0, f: float = 0.0
    ) -> None:
        gx, gy, gxs = flat(n)
        params = struct.pack("<3If", n, gxs, extra, f)
        job.add(Dispatch(self._pipe("elementwise", entry), bind, params, 3, (gx, gy, 1)))

    def _pre_norm(self, job: Job, x: Any, w: Any, n: int, h: Any) -> Any:
        """A branch's input: ``rms_norm(x) * w`` in ``h``, or ``x`` itself without a norm."""
        if w is None:
            return x
        self._norm(job, x, w, n, h)
        return h

    def _residual(self, job: Job, w: Weight, a: Any, n: int, x: Any, h: Any, post: Any) -> None:
        """``x += a @ w.T``, added in place by the product, or with a post-norm ``post``
        (gemma) ``x += rms_norm(a @ w.T) * post`` through ``h`` (free by then)."""
        if post is None:
            self._matmul(job, w, a, n, x, acc=True)
            return
        self._matmul(job, w, a, n, h)
        self._add_norm(job, h, post, n, x)

    def _add_norm(self, job: Job, h: Any, w: Any, n: int, x: Any) -> None:
        """``x += rms_norm(h) * w`` over n rows of d."""
        gx, gy = grid(n)
        params = struct.pack("<IIIf", n, self.d, gx, self.eps)
        bind = {0: h, 1: w, 3: x}
        job.add(Dispatch(self._pipe("norm", "rms_norm_add"), bind, params, 4, (gx, gy, 1)))

    def _plan(
        self,
        batch: Sequence[SeqChunk],
        ids: np.ndarray[Any, Any],
        pos: np.ndarray[Any, Any],
        slices: list[slice],
        rows: np.ndarray[Any, Any],
    ) -> Plan:
        """The step's plan: the step's small arrays written to the device, then the plan
        kept for a step of the same shape (the same rows, caches, buffers: a decode step
        after a decode step) with its varying uniforms rewritten (each cache's length,
        the scores' stride), else a fresh one from :meth:`_record`."""
        n, r, nh = len(ids), len(rows), self.nh
        # the step's small arrays up; its buffers (sized for n rows)
        bufs: dict[str, tuple[Any, ...]] = {
            "ids": self._put("ids", ids.astype(np.uint32)),
            "pos": self._put("pos", pos.astype(np.int32)),
        }
        info = np.zeros((n, 2), np.uint32)
        info[:, 1] = pos + 1  # each row sees its sequence's positions 0 .. its own
        bufs["info"] = self._put("info", info)
        for size in sorted(set(self.chunks) - {0}):  # a chunk: from its first position on
            lo = pos - pos % size
            bufs[f"chunk{size}"] = self._put(
                f"chunk{size}", np.stack([lo, pos + 1 - lo], 1).astype(np.uint32)
            )
        for w in sorted(set(self.windows) - {0}):  # a sliding window: its last w positions
            lo = np.maximum(pos - w + 1, 0)
            bufs[f"info{w}"] = self._put(
                f"info{w}", np.stack([lo, pos + 1 - lo], 1).astype(np.uint32)
            )
        if r:
            bufs["sel"] = self._put("sel", rows.astype(np.uint32))
        sp = self.spec
        if sp.attn_temp:  # each row's query scale (mistral3, llama4)
            temp = attn_temperature(pos, sp.attn_temp, sp.attn_temp_floor, sp.attn_temp_offset)
            bufs["temp"] = self._put("temp", temp.reshape(-1))
        qw, kw, ff, hn = nh * self.hd, self.nkv * self.hd, self.ff, self.hn
        for name, width in (("x", self.d), ("h", self.d), ("v", kw), ("attn", qw)):
            bufs[name] = self._buf(name, n * width * 4)
        bufs["gu"], bufs["act"] = self._buf("gu", n * 2 * ff * 4), self._buf("act", n * ff * 4)
        if self.moes:
            bufs |= {k: self._buf(k, b) for k, b in MoeLayer.sizes(self.moes, n).items()}
        if self.mlas:
            bufs |= {k: self._buf(k, b) for k, b in self.mlas[0].sizes(n).items()}
        if self.g4 is not None:
            sizes = self.g4.sizes(n, self.gpu.offset_align)
            bufs |= {k: self._buf(k, b) for k, b in sizes.items()}
        if self.convs:  # each row's sequence and index; each conv layer's states, inputs
            keep = self.layers[self.convs[0]].conv.width - 1  # type: ignore[union-attr]
            sc_rows, states = step_inputs(batch, slices, self.convs, keep, self.d)
            bufs["sc_rows"] = self._put("sc_rows", sc_rows)
            bufs["sc_bcx"], bufs["sc_y"] = (
                self._buf("sc_bcx", n * 3 * self.d * 4),
                self._buf("sc_y", n * self.d * 4),
            )
            for i, li in enumerate(self.convs):
                bufs[f"sc_state{li}"] = self._put(f"sc_state{li}", states[i])
                bufs[f"sc_bx{li}"] = self._buf(f"sc_bx{li}", n * self.d * 4)
        # queries then keys in one buffer (one RoPE dispatch for both), keys at an offset
        # the binding alignment allows
        align = self.gpu.offset_align
        k_at = aligned(n * qw * 4, align)
        qk, _ = self._buf("qk", k_at + n * kw * 4)
        bufs["q"], bufs["k"] = (qk, n * qw * 4), (qk, n * kw * 4, k_at)
        bufs["qk"] = (qk, k_at + n * kw * 4)
        bufs["cos"], bufs["sin"] = self._buf("cos", n * hn * 4), self._buf("sin", n * hn * 4)
        if any(self.local):
            hl = self.hn_local
            bufs["cos_l"], bufs["sin_l"] = (self._buf(f"{t}_l", n * hl * 4) for t in ("cos", "sin"))
        sstride = int(pos.max()) + 1
        chunk = max(1, min(65535, SCORES_BYTES // (nh * sstride * 4)))
        bufs["scores"] = self._buf("scores", min(chunk, n) * nh * sstride * 4)
        if r:
            bufs["hl"] = self._buf("hl", r * self.d * 4)
            bufs["logits"] = self._buf("logits", r * self.n_vocab * 4)
        # what the plan's static part depends on: every bound buffer (a grown scratch or
        # cache buffer is a new one), the rows, each sequence's rows and attention chunks
        key = (
            n,
            r,
            batch[0].cache.mode,
            chunk if n > 1 else 0,
            tuple((name, id(b[0]), b[1]) for name, b in bufs.items()),
            tuple(
                (id(c.cache.buf), c.cache.rows_alloc, sl.start, sl.stop)  # type: ignore[attr-defined]
                for c, sl in zip(batch, slices, strict=True)
            ),
        )
        kept = self._plans.get(key)
        if kept is None:
            job, stores, attns = self._record(batch, bufs, slices, n, r, sstride, chunk)
            plan = self.gpu.plan(job)
            if len(self._plans) >= PLANS_KEPT:
                self._plans.clear()
            kept = self._plans[key] = (plan, stores, attns)
            self.plans_made += 1
        plan, stores, attns = kept
        for c, slots in zip(batch, stores, strict=True):
            plan.params[slots, _STORE_POS] = c.cache.n
        plan.params[attns, _ATTN_SSTRIDE] = sstride
        return plan

    def _record(
        self,
        batch: Sequence[SeqChunk],
        bufs: dict[str, tuple[Any, ...]],
        slices: list[slice],
        n: int,
        r: int,
        sstride: int,
        chunk: int,
    ) -> tuple[Job, list[list[int]], list[int]]:
        """The step's dispatches, and the indices of those whose uniforms vary between
        steps of one shape: each sequence's ``kv_store`` ones (its cache length, word
        ``_STORE_POS``) and the attention ones (the scores' stride, ``_ATTN_SSTRIDE``)."""
        hn = self.hn
        f16 = batch[0].cache.mode is KVMode.F16
        ids_b, pos_b = bufs["ids"], bufs["pos"]
        x, h, gu, act = bufs["x"], bufs["h"], bufs["gu"], bufs["act"]
        cs, sn = bufs["cos"], bufs["sin"]
        stores: list[list[int]] = [[] for _ in batch]
        attns: list[int] = []
        job = Job(reuse_groups=True)  # the same bind groups step after step
        # embeddings, then the step's RoPE table
        self._get_rows(job, self.tok_embd, ids_b, n, x)
        if self.embd_scale:
            self._elem(job, "scale", n * self.d, {2: x}, f=self.embd_scale)
        tables = {False: (cs, sn, self.inv, self.mscale, hn)}  # the local table unscaled
        if any(self.local):
            tables[True] = (bufs["cos_l"], bufs["sin_l"], self.inv_local, 0, self.hn_local)
        for c_b, s_b, inv_b, f, hn_t in tables.values():
            gx, gy, gxs = flat(n * hn_t)
            params = u32s(n, 0, 0, hn_t, 0, gxs, f, 0)
            bind = {0: pos_b, 1: inv_b, 2: c_b, 3: s_b}
            job.add(Dispatch(self._pipe("rope", "rope_angles"), bind, params, 4, (gx, gy, 1)))
        g4 = self.g4
        if g4 is not None:  # the step's per-layer inputs
            g4.record_inputs(self, job, bufs, n)
        rec = StepRec(job, bufs, tables, batch, slices, stores, attns, n, f16, sstride, chunk)
        for li, ly in enumerate(self.layers):
            hin = self._pre_norm(job, x, ly.attn_norm, n, h)
            if g4 is not None:  # a layer's own head shape, KV sharing (gemma4)
                record = record_g4_attention
            elif ly.conv is not None:  # a short convolution in place of attention (lfm2)
                record = record_shortconv
            else:
                record = record_attention if ly.mla is None else record_latent_attention
            record(self, rec, ly, li, hin)  # added into x
            hin = self._pre_norm(job, x, ly.ffn_norm, n, h)
            entry = "gelu_mul" if self.gelu else "silu_mul"
            if ly.moe is not None:  # the experts' weighted sum added into x
                ly.moe.record(self, job, bufs, hin, x, n, entry)
                continue
            assert ly.gate is not None and ly.up is not None and ly.down is not None
            if ly.gate_up is not None:  # each row of gu: gate then up
                self._matmul(job, ly.gate_up, hin, n, gu)
            else:
                self._matmul(job, ly.gate, hin, n, gu, stride=2 * ly.ff)
                self._matmul(job, ly.up, hin, n, gu, stride=2 * ly.ff, col0=ly.ff)
            self._elem(job, entry, n * ly.ff, {0: gu, 1: gu, 2: act}, ly.ff)
            if g4 is not None and g4.side[li] is not None:  # a mixture beside (gemma4)
                g4.record_side_ffn(self, job, bufs, li, n, act, ly)
            else:
                self._residual(job, ly.down, act, n, x, h, ly.post[1])
            if g4 is not None:  # its per-layer input, its output scale
                g4.record_after_layer(self, job, bufs, li, n)
        if r:
            hl, logits = bufs["hl"], bufs["logits"]
            self._norm(job, x, self.output_norm, r, hl, bufs["sel"])
            self._matmul(job, self.output, hl, r, logits)
            job.reads.append((logits[0], r * self.n_vocab * 4))
        return job, stores, attns
