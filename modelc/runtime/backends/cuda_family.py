"""What the GPU runs of a decoder's one description: the refusal of the rest in one place
(before any GPU work), and the context a model runs in there."""

from __future__ import annotations

from modelc.errors import UnsupportedError
from modelc.formats.ir import ModelIR
from modelc.runtime.arch import build
from modelc.runtime.arch.decoder import Decoder, refuse_unsupported
from modelc.runtime.arch.decoder_spec import GQA_FEATURES
from modelc.runtime.backends.cuda_backend import new_families_on
from modelc.runtime.backends.numpy_ref import NumpyBackend

# what the GPU forward runs of the decoder's description (a feature added to it is refused
# here until this backend runs it)
CUDA_RUNS = GQA_FEATURES | {"moe"}
# the families' parts written in session 37 with no GPU lent, each held to the CPU by a GPU
# test in tests/test_cuda.py that has not run yet: opt-in (MODELC_CUDA_NEW_FAMILIES=1) until
# they have. gpt-oss (sinks, the attention output's bias, its experts), SmolLM3 (NoPE),
# OLMo 2 / 3 (post-norms alone, whole-projection Q/K norms, YaRN on the full layers),
# Mistral 3 (the attention temperature), Phi-4-mini and GLM-4.5 (partial RoPE; GLM's
# routing and shared expert, its Q/K/V biases before its Q/K norms)
NEW_FEATURES = frozenset(
    {"attn_sinks", "attn_out_bias", "moe_oai", "nope", "no_pre_norms", "qk_norm_whole"}
    | {"attn_temp", "yarn_full_only", "partial_rope", "moe_routing", "qkv_bias+qk_norm"}
)


def cuda_runs() -> frozenset[str]:
    """What the device-resident forward runs: :data:`CUDA_RUNS`, and :data:`NEW_FEATURES`
    with :func:`~.cuda_backend.new_families_on`."""
    return frozenset(CUDA_RUNS | (NEW_FEATURES if new_families_on() else frozenset()))


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
