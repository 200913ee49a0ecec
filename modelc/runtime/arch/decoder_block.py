"""One decoder layer's weights (:class:`DecoderBlock`) and the helpers that read them:
optional tensors, row views of fused ones, each layer's sliding window; the output head
(:func:`output_logits`)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from modelc.formats.ir import HParams, ModelIR
from modelc.runtime.arch.decoder_spec import DecoderSpec
from modelc.runtime.arch.mla import LatentBlock
from modelc.runtime.arch.moe import Experts
from modelc.runtime.arch.recurrent import Mixer, mixer_feature
from modelc.runtime.backend import Backend, F32Array, Weight
from modelc.runtime.model import TensorSource, check_rows


@dataclass(slots=True)
class DecoderBlock:
    """One layer's weights (views into the model file); optional parts are None."""

    attn_norm: F32Array | None  # (d,); None: no pre-norm (olmo2)
    wq: Weight  # (n_head*hd, d)
    wk: Weight  # (n_head_kv*hd, d)
    wv: Weight  # (n_head_kv*hd, d)
    wo: Weight  # (d, n_head*hd)
    ffn_norm: F32Array | None  # (d,)
    w_gate: Weight | None  # (ff, d); None in a mixture of experts
    w_up: Weight | None  # (ff, d)
    w_down: Weight | None  # (d, ff)
    experts: Experts | None = None
    bq: F32Array | None = None  # (n_head*hd,)
    bk: F32Array | None = None  # (n_head_kv*hd,)
    bv: F32Array | None = None  # (n_head_kv*hd,)
    q_norm: F32Array | None = None  # (hd,), or (n_head*hd,) over the whole projection
    k_norm: F32Array | None = None  # (hd,), or (n_head_kv*hd,)
    post_attn_norm: F32Array | None = None  # (d,)
    post_ffw_norm: F32Array | None = None  # (d,)
    mla: LatentBlock | None = None  # latent attention: wq its Q, wk = wv its kv_a (unused)
    mixer: Mixer | None = None  # a recurrent layer in place of attention (wq..wo empty)
    bo: F32Array | None = None  # (d,)
    sinks: F32Array | None = None  # (n_head,)


def opt_vec(src: TensorSource, name: str) -> F32Array | None:
    return src.vec(name) if src.has(name) else None


def _rows(w: Weight, start: int, stop: int) -> Weight:
    """Rows ``start:stop`` of ``w`` sharing its memory (rows are independent in every
    dtype, quantized blocks included)."""
    return Weight(w.dtype, (stop - start, w.shape[1]), w.data[start:stop])


def split_rows(ir: ModelIR, w: Weight, name: str, sizes: Sequence[int]) -> list[Weight]:
    check_rows(ir, name, w, sum(sizes))
    edges = [int(e) for e in np.cumsum([0, *sizes])]
    return [_rows(w, a, b) for a, b in itertools.pairwise(edges)]


def layer_windows(hp: HParams) -> tuple[int, ...]:
    """Each layer's sliding window: ``sliding_window`` on ``window_layers`` (all if none)."""
    if not hp.sliding_window:
        return (0,) * hp.n_layer
    on = set(hp.window_layers) if hp.window_layers else set(range(hp.n_layer))
    return tuple(hp.sliding_window if i in on else 0 for i in range(hp.n_layer))


def block_fields(
    blocks: Sequence[DecoderBlock], head_dim: int, sigmoid_shared: bool
) -> dict[str, Any]:
    """The :class:`~modelc.runtime.arch.decoder_spec.DecoderSpec` fields read off the
    loaded blocks: which layers have biases, norms, experts, a recurrent mixer, sinks
    (``sigmoid_shared``: the family routes its experts so, llama4)."""
    moe = any(b.experts is not None for b in blocks)
    return {
        "moe_sigmoid_shared": sigmoid_shared and moe,
        "qkv_bias": tuple(b.bq is not None for b in blocks),
        "qk_norm": tuple(b.q_norm is not None for b in blocks),
        "qk_norm_whole": any(b.q_norm is not None and b.q_norm.size > head_dim for b in blocks),
        "moe": tuple(b.experts is not None for b in blocks),
        "moe_oai": any(b.experts is not None and b.experts.oai is not None for b in blocks),
        "recurrent": tuple(b.mixer is not None for b in blocks),
        "mixers": tuple(mixer_feature(b.mixer) for b in blocks),
        "attn_sinks": tuple(b.sinks is not None for b in blocks),
        "attn_out_bias": tuple(b.bo is not None for b in blocks),
    }


def output_logits(
    be: Backend, sp: DecoderSpec, norm: F32Array, output: Weight, eps: float, hidden: F32Array
) -> F32Array:
    """The logits (r, vocab) of ``hidden`` (r, d), the state after the last layer: the
    output norm and head, [divided] (granite), [soft-capped] (gemma2); a fresh array."""
    if len(hidden) == 0:
        return np.zeros((0, sp.n_vocab), np.float32)
    h = be.rms_norm(np.ascontiguousarray(hidden), norm, eps)  # (r, d)
    return finish_logits(sp, be.matmul(output, h))  # (r, vocab)


def finish_logits(sp: DecoderSpec, logits: F32Array) -> F32Array:
    """The head's ``logits`` (r, vocab), in place: [divided] (granite), [soft-capped]
    (gemma2)."""
    if sp.logit_scale:
        logits /= np.float32(sp.logit_scale)
    if sp.final_softcap:
        cap = np.float32(sp.final_softcap)
        logits /= cap
        np.tanh(logits, out=logits)
        logits *= cap
    return logits


def layer_inv_freqs(
    sp: DecoderSpec, inv_freq: F32Array, inv_freq_local: F32Array, a: int, z: int
) -> list[F32Array | None]:
    """The RoPE base each of layers ``a``..``z`` rotates by: the windowed layers' own where
    they have one (gemma3), None for a layer without RoPE (smollm3)."""
    nope = sp.nope or (False,) * sp.n_layer
    return [
        None if nope[li] else inv_freq_local if sp.local_rope[li] else inv_freq
        for li in range(a, z)
    ]


def shift_keys(
    cache: Any,
    n_keep: int,
    n_discard: int,
    be: Backend,
    invs: Sequence[F32Array | None],
    neox: bool,
    rotate: Callable[[F32Array, tuple[F32Array, F32Array], int], object] | None = None,
    rope_from: int = 0,
) -> None:
    """A context shift: ``cache`` drops ``n_discard`` positions after the first ``n_keep``,
    and the keys moved back are re-rotated by ``-n_discard``, cache layer i by ``invs[i]``
    (:func:`layer_inv_freqs`; None: no RoPE, left as they are) with ``be.rope`` from each
    row's value ``rope_from`` on (latent attention's rows: the RoPE tail after the latent),
    or ``rotate(k, angles, i)`` (one rule for every backend: the GPUs' caches hand their
    keys to the host)."""
    cache.shift(n_keep, n_discard)
    if cache.n <= n_keep:
        return
    delta = np.full(cache.n - n_keep, -n_discard, np.int64)
    layers = iter(enumerate(invs))

    def rerotate(k: F32Array) -> None:  # called once per layer, in layer order
        layer, inv = next(layers)
        if inv is None:
            return
        angles = be.rope_angles(delta[: len(k)], inv)
        if rotate is not None:
            rotate(k, angles, layer)
        elif rope_from:
            part = np.ascontiguousarray(k[..., rope_from:])
            be.rope(part, angles, neox)
            k[..., rope_from:] = part
        else:
            be.rope(k, angles, neox)

    cache.update_keys(n_keep, rerotate)


def block_mats(b: DecoderBlock) -> list[Weight]:
    """A dense block's matrices (Q, K, V, output, gate, up, down) it has."""
    return [w for w in (b.wq, b.wk, b.wv, b.wo, b.w_gate, b.w_up, b.w_down) if w is not None]
