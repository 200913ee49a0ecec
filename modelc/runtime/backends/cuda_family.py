"""What the GPU runs of a decoder's one description: the refusal of the rest in one place
(before any GPU work), and the context a model runs in there."""

from __future__ import annotations

from modelc.errors import UnsupportedError
from modelc.formats.ir import ModelIR
from modelc.runtime.arch import build
from modelc.runtime.arch.decoder import Decoder, refuse_unsupported
from modelc.runtime.arch.decoder_spec import GQA_FEATURES
from modelc.runtime.backends.numpy_ref import NumpyBackend

# what the GPU forward runs of the decoder's description (a feature added to it is refused
# here until this backend runs it), each held to the CPU by a GPU test in tests/test_cuda.py:
# the llama-like features and softmax top-k mixtures; gpt-oss (sinks, the attention
# output's bias, its experts), SmolLM3 (NoPE), OLMo 2 / 3 (post-norms alone,
# whole-projection Q/K norms, YaRN on the full layers), Mistral 3 (the attention
# temperature), Phi-4-mini and GLM-4.5 (partial RoPE; GLM's routing and shared expert, its
# Q/K/V biases before its Q/K norms): written in session 37, first run on a GPU in 38
CUDA_RUNS = frozenset(
    GQA_FEATURES
    | {"moe", "attn_sinks", "attn_out_bias", "moe_oai", "nope", "no_pre_norms", "qk_norm_whole"}
    | {"attn_temp", "yarn_full_only", "partial_rope", "moe_routing", "qkv_bias+qk_norm"}
)


def cuda_host(ir: ModelIR) -> Decoder:
    """The host model of ``ir`` (numpy backend: no GPU work), after refusing in one line
    what the GPU does not run."""
    host = build(ir, NumpyBackend())
    if not isinstance(host, Decoder):
        raise UnsupportedError(
            f"{ir.architecture} models do not run on --device cuda yet; use --device cpu"
        )
    refuse_unsupported(host.spec, "--device cuda", CUDA_RUNS, "use --device cpu")
    return host
