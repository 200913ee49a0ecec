"""all-MiniLM-L6-v2 (the HF directory the catalog pins) as a GGUF, written the way llama.cpp's
``convert_hf_to_gguf.py`` writes a BERT (its ``BertModel``), with gguf-py only (no torch):

* ``bert.*`` hyper-parameters, ``bert.attention.causal`` false, ``bert.pooling_type`` from
  the sentence-transformers pooling config (1 mean, 2 CLS);
* the WordPiece vocabulary as llama.cpp's ``bert`` tokenizer takes it: ``##`` pieces lose
  their ``##``, every other non-control token gets the phantom space ``\u2581``; control
  tokens ([PAD] [UNK] [CLS] [SEP] [MASK]) kept; the special ids as ``gguf.SpecialVocab``
  reads them from the directory;
* tensors renamed by gguf-py's BERT name map (``pooler.*`` dropped, as the converter does),
  norms, biases and the position and token-type tables in f32, the other matrices in
  ``ftype`` (F32, F16 or Q8_0, as ``--outtype``); ``tables=True`` quantizes the two tables
  too, as other tools may.

``write_nomic`` writes a tiny random ``nomic-bert`` (nomic-embed-text's graph) with the same
vocabulary.  The differential test (``tests/test_bert_gguf.py``) serves the results with
llama.cpp and with modelc; ``python -m tests.gen_bert_gguf OUT.gguf [f32|f16|q8_0|nomic]``
writes one.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from safetensors.numpy import load_file

from tests.gguf_support import add_matrix, gguf_file

FTYPES = {
    "f32": (gguf.LlamaFileType.ALL_F32, gguf.GGMLQuantizationType.F32),
    "f16": (gguf.LlamaFileType.MOSTLY_F16, gguf.GGMLQuantizationType.F16),
    "q8_0": (gguf.LlamaFileType.MOSTLY_Q8_0, gguf.GGMLQuantizationType.Q8_0),
}
SPECIAL = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def _pooling(hf: Path) -> int:
    cfg = json.loads((hf / "1_Pooling" / "config.json").read_text())
    if cfg.get("pooling_mode_mean_tokens"):
        return int(gguf.PoolingType.MEAN)
    if cfg.get("pooling_mode_cls_token"):
        return int(gguf.PoolingType.CLS)
    raise ValueError(f"{hf}: pooling {cfg} is neither mean nor CLS")


def _vocab(hf: Path, w: gguf.GGUFWriter) -> int:
    tokens = (hf / "vocab.txt").read_text(encoding="utf-8").split("\n")
    if tokens[-1] == "":
        tokens.pop()
    types = [gguf.TokenType.CONTROL if t in SPECIAL else gguf.TokenType.NORMAL for t in tokens]

    def phantom(tok: str, typ: gguf.TokenType) -> str:
        if typ == gguf.TokenType.CONTROL:
            return tok
        return tok[2:] if tok.startswith("##") else "\u2581" + tok

    w.add_token_type_count(int(json.loads((hf / "config.json").read_text())["type_vocab_size"]))
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre("bert-bge")  # the pre-tokenizer llama.cpp's hash names for this vocabulary
    w.add_token_list([phantom(t, y) for t, y in zip(tokens, types, strict=True)])
    w.add_token_types(types)
    gguf.SpecialVocab(hf, n_vocab=len(tokens)).add_to_gguf(w)
    return len(tokens)


def write(
    hf: Path, out: Path, ftype: str = "f32", tables: bool = False, pooling: int | None = None
) -> Path:
    """The GGUF of BERT directory ``hf`` at ``out`` (written to a temporary name, then moved);
    ``pooling`` (a gguf.PoolingType value) in place of the directory's own."""
    file_type, qtype = FTYPES[ftype]
    cfg: dict[str, Any] = json.loads((hf / "config.json").read_text())
    n_layer = int(cfg["num_hidden_layers"])
    with gguf_file(out, "bert", atomic=True) as w:
        w.add_type(gguf.GGUFType.MODEL)
        w.add_name(str(json.loads((hf / "config.json").read_text()).get("_name_or_path", hf.name)))
        w.add_file_type(file_type)
        w.add_block_count(n_layer)
        w.add_context_length(int(cfg["max_position_embeddings"]))
        w.add_embedding_length(int(cfg["hidden_size"]))
        w.add_feed_forward_length(int(cfg["intermediate_size"]))
        w.add_head_count(int(cfg["num_attention_heads"]))
        w.add_layer_norm_eps(float(cfg["layer_norm_eps"]))
        w.add_causal_attention(False)
        w.add_pooling_type(gguf.PoolingType(_pooling(hf) if pooling is None else pooling))
        _vocab(hf, w)
        nmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.BERT, n_layer)
        for name, data in load_file(str(hf / "model.safetensors")).items():
            name = name.removeprefix("bert.")
            if name in ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias"):
                continue
            new = nmap.get_name(name, try_suffixes=(".weight", ".bias"))
            if new is None:
                raise ValueError(f"{hf}: no GGUF name for tensor {name!r}")
            data = np.ascontiguousarray(data, dtype=np.float32)
            table = new in ("position_embd.weight", "token_types.weight")
            keep = data.ndim == 1 or (table and not tables)
            add_matrix(w, new, data, None if keep else qtype)
    return out


# a tiny random nomic-bert (nomic-embed-text's graph): 2 layers of width 128, 4 heads
NOMIC = {"n_layer": 2, "d": 128, "n_head": 4, "ff": 256, "n_ctx": 2048, "rope_base": 1000.0}


def write_nomic(hf: Path, out: Path, seed: int = 0, ftype: str = "f32") -> Path:
    """A tiny randomly initialised ``nomic-bert`` GGUF (the keys and tensors llama.cpp reads
    for nomic-embed-text: rotary positions, one Q/K/V matrix, a SwiGLU MLP, no biases) with
    the WordPiece vocabulary of BERT directory ``hf``; norms and weights non-trivial."""
    rng = np.random.default_rng(seed)
    c = NOMIC
    d, ff = c["d"], c["ff"]

    def mat(*shape: int) -> np.ndarray[Any, Any]:
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)

    def add(name: str, data: np.ndarray[Any, Any]) -> None:  # matrices in ftype
        add_matrix(w, name, data, qtype)

    def norm() -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        w = (1 + 0.2 * rng.standard_normal(d)).astype(np.float32)
        return w, (0.1 * rng.standard_normal(d)).astype(np.float32)

    with gguf_file(out, "nomic-bert", atomic=True) as w:
        w.add_type(gguf.GGUFType.MODEL)
        w.add_name("tiny-nomic-bert")
        file_type, qtype = FTYPES[ftype]
        w.add_file_type(file_type)
        w.add_block_count(int(c["n_layer"]))
        w.add_context_length(int(c["n_ctx"]))
        w.add_embedding_length(int(d))
        w.add_feed_forward_length(int(ff))
        w.add_head_count(int(c["n_head"]))
        w.add_layer_norm_eps(1e-12)
        w.add_causal_attention(False)
        w.add_pooling_type(gguf.PoolingType.MEAN)
        w.add_rope_freq_base(float(c["rope_base"]))
        n_vocab = _vocab(hf, w)
        add("token_embd.weight", (0.5 * rng.standard_normal((n_vocab, d))).astype(np.float32))
        w.add_tensor("token_types.weight", (0.5 * rng.standard_normal((2, d))).astype(np.float32))
        nw, nb = norm()
        w.add_tensor("token_embd_norm.weight", nw)
        w.add_tensor("token_embd_norm.bias", nb)
        for i in range(int(c["n_layer"])):
            add(f"blk.{i}.attn_qkv.weight", mat(3 * d, d))
            add(f"blk.{i}.attn_output.weight", mat(d, d))
            nw, nb = norm()
            w.add_tensor(f"blk.{i}.attn_output_norm.weight", nw)
            w.add_tensor(f"blk.{i}.attn_output_norm.bias", nb)
            add(f"blk.{i}.ffn_up.weight", mat(ff, d))
            add(f"blk.{i}.ffn_gate.weight", mat(ff, d))
            add(f"blk.{i}.ffn_down.weight", mat(d, ff))
            nw, nb = norm()
            w.add_tensor(f"blk.{i}.layer_output_norm.weight", nw)
            w.add_tensor(f"blk.{i}.layer_output_norm.bias", nb)
    return out


if __name__ == "__main__":
    from tests.assets import minilm_dir

    kind = sys.argv[2] if len(sys.argv) > 2 else "f32"
    if kind == "nomic":
        print(write_nomic(minilm_dir(), Path(sys.argv[1])))
    else:
        print(write(minilm_dir(), Path(sys.argv[1]), kind))
