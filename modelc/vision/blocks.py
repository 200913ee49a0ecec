"""A ViT block's weights as the mmproj stores them: pre-norm layer norms with biases,
Q/K/V/O projections with biases, a two-matrix FFN.  Gemma 3's, SmolVLM's and LFM2-VL's
SigLIP towers and Qwen3-VL's tower (its fused ``attn_qkv`` split into row views) all load
into it; a leaf module, so each tower's module can use it without importing the others.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

F32 = np.ndarray[Any, np.dtype[np.float32]]


@dataclass(frozen=True, slots=True)
class VisionBlock:
    ln1_w: F32  # (width,)
    ln1_b: F32
    wq: F32  # (width, width), each with its bias (width,)
    bq: F32
    wk: F32
    bk: F32
    wv: F32
    bv: F32
    wo: F32
    bo: F32
    ln2_w: F32
    ln2_b: F32
    w_up: F32  # (ff, width)
    b_up: F32
    w_down: F32  # (width, ff)
    b_down: F32
