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
# here until this backend runs it)
CUDA_RUNS = GQA_FEATURES | {"moe"}


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
