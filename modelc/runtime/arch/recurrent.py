"""The recurrent layers a decoder block may have in place of attention, each keeping a
per-sequence state (:mod:`modelc.runtime.seq_state`): Gated DeltaNet (qwen35, qwen3next:
:mod:`.deltanet`) and short convolutions (lfm2: :mod:`.shortconv`).  The decoder loads and
runs them through these two functions."""

from __future__ import annotations

from collections.abc import Sequence

from modelc.families.contract import DecoderTraits
from modelc.formats.ir import HParams
from modelc.runtime.arch.deltanet import DeltaNet, deltanet, load_deltanet
from modelc.runtime.arch.shortconv import ShortConv, load_shortconv, shortconv
from modelc.runtime.backend import Backend, F32Array
from modelc.runtime.model import SeqChunk, TensorSource

__all__ = ["Mixer", "load_mixer", "mixer_forward"]

Mixer = DeltaNet | ShortConv


def load_mixer(src: TensorSource, i: int, hp: HParams, traits: DecoderTraits) -> Mixer | None:
    """Block ``i``'s recurrent layer, or None for an attention block."""
    if traits.short_conv:
        return load_shortconv(src, i, hp)
    return load_deltanet(src, i, hp, traits.grouped_heads)


def mixer_forward(
    be: Backend,
    mixer: Mixer,
    batch: Sequence[SeqChunk],
    slices: list[slice],
    li: int,
    h: F32Array,
    eps: float,
) -> F32Array:
    """Layer ``li`` on the normed activations ``h`` (n, d), each sequence through its own
    state; a fresh (n, d) output."""
    if isinstance(mixer, ShortConv):
        return shortconv(be, mixer, batch, slices, li, h)
    return deltanet(be, mixer, batch, slices, li, h, eps)
