"""The recurrent layers a decoder block may have in place of attention, each keeping a
per-sequence state (:mod:`modelc.runtime.seq_state`): Gated DeltaNet (qwen35, qwen3next:
:mod:`.deltanet`), short convolutions (lfm2: :mod:`.shortconv`) and Mamba-2
(granitehybrid: :mod:`.mamba2`).  The decoder loads and runs them through these two
functions."""

from __future__ import annotations

from collections.abc import Sequence

from modelc.families.contract import DecoderTraits
from modelc.formats.ir import HParams
from modelc.runtime.arch.deltanet import DeltaNet, deltanet, load_deltanet
from modelc.runtime.arch.mamba2 import Mamba2, load_mamba2, mamba2
from modelc.runtime.arch.shortconv import ShortConv, load_shortconv, shortconv
from modelc.runtime.backend import Backend, F32Array
from modelc.runtime.model import SeqChunk, TensorSource

__all__ = ["Mixer", "load_mixer", "mixer_feature", "mixer_forward"]

Mixer = DeltaNet | ShortConv | Mamba2


def load_mixer(src: TensorSource, i: int, hp: HParams, traits: DecoderTraits) -> Mixer | None:
    """Block ``i``'s recurrent layer, or None for an attention block."""
    if traits.short_conv:
        return load_shortconv(src, i, hp)
    if traits.mamba2:
        return load_mamba2(src, i, hp)
    return load_deltanet(src, i, hp, traits.grouped_heads)


def mixer_feature(mixer: Mixer | None) -> str:
    """The :data:`~modelc.runtime.arch.decoder_spec.FEATURES` name of a block's recurrent
    layer ("" for attention)."""
    if mixer is None:
        return ""
    if isinstance(mixer, ShortConv):
        return "short_conv"
    return "mamba2" if isinstance(mixer, Mamba2) else "gated_deltanet"


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
    if isinstance(mixer, Mamba2):
        return mamba2(be, mixer, batch, slices, li, h, eps)
    return deltanet(be, mixer, batch, slices, li, h, eps)
