"""What the tiny vision-language generators share (``tests/gen_{gemma3vl,qwen25vl,qwen3vl,
pixtral,smolvlm,lfm2vl}.py``): the random draws, a llama-shaped decoder's weights, the
HF directory, the ``mmproj`` GGUF's common header and the made-once cache entry; and
what their tests share: a chat with an image through modelc's template path, placed.

Each generator keeps what is its family's own (config, tensor names, the converter's
renames); what is here is written once so the six cannot drift apart.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from modelc.formats import load_model
from modelc.runtime.prompt import PromptFormat
from modelc.vision import PlacedPrompt, VisionModel
from tests.assets import cache_lock
from tests.gguf_support import gguf_file

Arrays = dict[str, np.ndarray[Any, Any]]


class VlmRand:
    """The random parts of a tiny VLM, drawn in call order from one seed (the scales the
    vision generators use: weights of 0.25 unless told, norms about 1)."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def w(self, *shape: int, s: float = 0.25) -> np.ndarray[Any, Any]:
        return (s * self.rng.standard_normal(shape)).astype(np.float32)

    def norm(self, n: int) -> np.ndarray[Any, Any]:
        return (1 + 0.2 * self.rng.standard_normal(n)).astype(np.float32)

    def ln(self, n: int) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """A LayerNorm's weight and bias."""
        return self.norm(n), self.w(n, s=0.1)


def decoder_weights(
    r: VlmRand,
    prefix: str,
    t: Mapping[str, Any],
    n_vocab: int,
    head_dim: int,
    *,
    qkv_bias: bool = False,
    qk_norm: bool = False,
) -> Arrays:
    """A llama-shaped text decoder under ``prefix`` (``embed_tokens``, ``layers.{i}.*``,
    ``norm``) from the HF text config ``t``: Q/K/V biases (Qwen2) or Q/K norms (Qwen3)
    where asked, and a large final gain, for decisive logits, so greedy answers hold
    against llama.cpp."""
    d, ff = t["hidden_size"], t["intermediate_size"]
    nq, nkv = t["num_attention_heads"] * head_dim, t["num_key_value_heads"] * head_dim
    out = {prefix + "embed_tokens.weight": r.w(n_vocab, d, s=0.5)}
    for i in range(t["num_hidden_layers"]):
        p = f"{prefix}layers.{i}."
        out[p + "input_layernorm.weight"] = r.norm(d)
        for x, rows in (("q", nq), ("k", nkv), ("v", nkv)):
            out[p + f"self_attn.{x}_proj.weight"] = r.w(rows, d)
            if qkv_bias:
                out[p + f"self_attn.{x}_proj.bias"] = r.w(rows, s=0.1)
        out[p + "self_attn.o_proj.weight"] = r.w(d, nq)
        if qk_norm:
            out[p + "self_attn.q_norm.weight"] = r.norm(head_dim)
            out[p + "self_attn.k_norm.weight"] = r.norm(head_dim)
        out[p + "post_attention_layernorm.weight"] = r.norm(d)
        out[p + "mlp.gate_proj.weight"] = r.w(ff, d)
        out[p + "mlp.up_proj.weight"] = r.w(ff, d)
        out[p + "mlp.down_proj.weight"] = r.w(d, ff)
    out[prefix + "norm.weight"] = r.norm(d) * np.float32(4.0)
    return out


def write_hf(
    hf: Path,
    weights: Arrays,
    *,
    tokenizer: Callable[[Path], None],
    config: Mapping[str, Any],
    preprocessor: Mapping[str, Any],
    processor: Mapping[str, Any] | None = None,
    template: str | None = None,
) -> None:
    """An HF directory: ``tokenizer(hf)``'s files, ``config.json``,
    ``preprocessor_config.json``, ``processor_config.json`` and ``chat_template.jinja``
    where given, and the weights (``model.safetensors`` last, so its presence means done)."""
    from safetensors.numpy import save_file

    hf.mkdir(parents=True, exist_ok=True)
    tokenizer(hf)
    (hf / "config.json").write_text(json.dumps(config, indent=2))
    (hf / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=2))
    if processor is not None:
        (hf / "processor_config.json").write_text(json.dumps(processor, indent=2))
    if template is not None:
        (hf / "chat_template.jinja").write_text(template)
    save_file(weights, str(hf / "model.safetensors.tmp"), metadata={"format": "pt"})
    os.replace(hf / "model.safetensors.tmp", hf / "model.safetensors")


@contextmanager
def mmproj_file(
    path: Path,
    projector: str,
    vision: Mapping[str, Any],
    proj_dim: int,
    mean: Sequence[float],
    std: Sequence[float],
    image_size: int | None = None,
) -> Iterator[gguf.GGUFWriter]:
    """:func:`gguf_file` (atomic) of an f32 ``mmproj`` begun as ``convert_hf_to_gguf.py
    --mmproj`` begins one: the encoder's shape from the HF ``vision`` config (SigLIP's and
    Pixtral's keys, or Qwen's ``depth`` / ``num_heads``), the projection width, the
    normalisation and the ``projector`` type; the caller adds its family's keys, then the
    quantization version and the tensors."""
    qwen = "depth" in vision
    with gguf_file(path, "clip", atomic=True) as w:
        w.add_type(gguf.GGUFType.MMPROJ)
        w.add_file_type(gguf.LlamaFileType.ALL_F32)
        w.add_clip_has_vision_encoder(True)
        w.add_vision_projection_dim(proj_dim)
        w.add_vision_image_size(vision["image_size"] if image_size is None else image_size)
        w.add_vision_patch_size(vision["patch_size"])
        w.add_vision_embedding_length(vision["hidden_size"])
        w.add_vision_feed_forward_length(vision["intermediate_size"])
        w.add_vision_block_count(vision["depth" if qwen else "num_hidden_layers"])
        w.add_vision_head_count(vision["num_heads" if qwen else "num_attention_heads"])
        w.add_vision_image_mean(list(mean))
        w.add_vision_image_std(list(std))
        w.add_clip_projector_type(projector)
        yield w


def ensure_vlm(
    dest: Path,
    stem: str,
    make_weights: Callable[[], Arrays],
    write_hf_dir: Callable[[Path, Arrays], None],
    write_text_gguf: Callable[[Arrays, Path], None],
    write_mmproj: Callable[[Arrays, Path], None],
) -> tuple[Path, Path, Path]:
    """``dest``'s HF directory, ``{stem}.gguf`` and ``mmproj-{stem}.gguf``, made once (under
    the cache lock) from one draw of the weights."""
    hf, gg, mm = dest / "hf", dest / f"{stem}.gguf", dest / f"mmproj-{stem}.gguf"
    with cache_lock(dest.name):
        if gg.exists() and mm.exists() and (hf / "model.safetensors").exists():
            return hf, gg, mm
        weights = make_weights()
        write_hf_dir(hf, weights)
        write_text_gguf(weights, gg)
        write_mmproj(weights, mm)
    return hf, gg, mm


def chat_format(model: Path) -> PromptFormat:
    """The prompt format (tokenizer and chat template) of the model GGUF ``model``."""
    ir = load_model(str(model))
    assert ir.tokenizer is not None
    return PromptFormat.build(ir.tokenizer, ir.chat_template)


def token_encoder(fmt: PromptFormat) -> Callable[[str], list[int]]:
    """Text -> ids as the server encodes a prompt's pieces (special tokens parsed)."""

    def enc(t: str) -> list[int]:
        return fmt.tokenizer.encode(t, add_special=False, parse_special=True)

    return enc


def place_chat(vision: VisionModel, fmt: PromptFormat, data: bytes, question: str) -> PlacedPrompt:
    """A user turn of the image ``data`` then ``question`` through ``fmt``'s chat template
    (modelc's template path), the image's embeddings placed at its marker."""
    msg = [{"type": "image", "data": data}, {"type": "text", "text": question}]
    chat = fmt.chat([{"role": "user", "content": msg}])
    return vision.place(chat.ids, chat.media, [vision.embed(data)], token_encoder(fmt))
