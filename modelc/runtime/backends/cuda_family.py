"""What the GPU runs of a decoder's one description: the refusal of the rest in one place
(before any GPU work), and the context a model runs in there."""

from __future__ import annotations

from modelc.errors import UnsupportedError
from modelc.formats.ir import ModelIR
from modelc.runtime.arch import build
from modelc.runtime.arch.decoder import Decoder, refuse_unsupported
from modelc.runtime.arch.decoder_spec import GQA_FEATURES
from modelc.runtime.backends.cuda_backend import gptoss_on
from modelc.runtime.backends.numpy_ref import NumpyBackend

# what the GPU forward runs of the decoder's description (a feature added to it is refused
# here until this backend runs it)
CUDA_RUNS = GQA_FEATURES | {"moe", "nope", "no_pre_norms", "qk_norm_whole", "attn_temp"}
CUDA_RUNS |= {"yarn_full_only", "partial_rope"}
# gpt-oss's parts (attention sinks, the attention output's bias, its experts' biases and
# clamped SwiGLU): written in session 37 and held to the CPU by tests/test_cuda.py's GPU
# tests, which no GPU has run yet; opt-in (MODELC_CUDA_GPTOSS=1) until one has
GPTOSS_FEATURES = frozenset({"attn_sinks", "attn_out_bias", "moe_oai"})


def cuda_runs() -> frozenset[str]:
    """What the device-resident forward runs: :data:`CUDA_RUNS`, and gpt-oss's parts with
    :func:`gptoss_on`."""
    return frozenset(CUDA_RUNS | (GPTOSS_FEATURES if gptoss_on() else frozenset()))


def cuda_host(ir: ModelIR) -> Decoder:
    """The host model of ``ir`` (numpy backend: no GPU work), after refusing in one line
    what the GPU does not run."""
    host = build(ir, NumpyBackend())
    if not isinstance(host, Decoder):
        raise UnsupportedError(
            f"{ir.architecture} models do not run on --device cuda yet; use --device cpu"
        )
    refuse_unsupported(host.spec, "--device cuda", cuda_runs(), "use --device cpu")
    return host
