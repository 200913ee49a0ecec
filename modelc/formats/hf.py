"""Hugging Face model directories: ``config.json`` + weights + tokenizer files.

Weights, first found wins: ``model.safetensors``, ``model.safetensors.index.json`` (shards),
``pytorch_model.bin``, ``pytorch_model.bin.index.json`` (shards).  The tokenizer is kept as the
whole ``tokenizer.json`` text (``TokenizerSpec(model="hf")``) with the special-token ids and
add-bos/eos flags that ``tokenizer_config.json`` / ``config.json`` state.  The chat template
comes from ``tokenizer_config.json`` or ``chat_template.jinja``; sampling defaults from
``generation_config.json``; sentence-transformers pooling from ``modules.json`` + ``1_Pooling``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from modelc.errors import FormatError
from modelc.formats.arch import build_model_ir
from modelc.formats.ir import ModelIR, SourceInfo, Tensor, TokenizerSpec
from modelc.formats.pytorch import read_pytorch
from modelc.formats.safetensors import read_safetensors

_GENERATION_KEYS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "do_sample",
    "max_new_tokens",
)
_SPECIALS = ("bos", "eos", "pad", "unk", "sep", "cls", "mask")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FormatError(f"cannot read JSON: {e}", path=path) from e


def _json_dict(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = _read_json(path)
    if not isinstance(data, dict):
        raise FormatError("expected a JSON object", path=path)
    return data


def _load_shards(d: Path, index_name: str, read: Any) -> dict[str, Tensor]:
    index_path = d / index_name
    weight_map = _json_dict(index_path).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise FormatError("index has no weight_map", path=index_path)
    out: dict[str, Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        shard_path = d / str(shard)
        if Path(str(shard)).is_absolute() or ".." in Path(str(shard)).parts:
            raise FormatError(
                f"shard name {shard!r} points outside the model directory", path=index_path
            )
        if not shard_path.is_file():
            raise FormatError(
                f"shard {shard!r} listed in {index_name} is missing; download the complete model",
                path=shard_path,
            )
        tensors = read(shard_path)
        if isinstance(tensors, tuple):
            tensors = tensors[0]
        wanted = {k for k, v in weight_map.items() if v == shard}
        for name in sorted(wanted):
            if name not in tensors:
                raise FormatError(
                    f"tensor {name!r} is listed in {index_name} but not in the shard",
                    path=shard_path,
                )
            out[name] = tensors[name]
    return out


def read_hf_weights(d: Path) -> tuple[dict[str, Tensor], str]:
    """All weight tensors of a HF directory (source names) and a short description of where they came from."""
    if (d / "model.safetensors").is_file():
        return read_safetensors(d / "model.safetensors")[0], "model.safetensors"
    if (d / "model.safetensors.index.json").is_file():
        return _load_shards(
            d, "model.safetensors.index.json", read_safetensors
        ), "model.safetensors.index.json"
    if (d / "pytorch_model.bin").is_file():
        return read_pytorch(d / "pytorch_model.bin"), "pytorch_model.bin"
    if (d / "pytorch_model.bin.index.json").is_file():
        return _load_shards(
            d, "pytorch_model.bin.index.json", read_pytorch
        ), "pytorch_model.bin.index.json"
    raise FormatError(
        "no weights found: expected model.safetensors, model.safetensors.index.json, pytorch_model.bin "
        "or pytorch_model.bin.index.json",
        path=d,
    )


def _token_str(v: Any) -> str | None:
    if isinstance(v, str):
        return v
    if isinstance(v, dict) and isinstance(v.get("content"), str):
        return str(v["content"])  # AddedToken serialised as a dict
    return None


def _first_id(v: Any) -> int | None:
    if isinstance(v, list):
        v = v[0] if v else None
    return v if isinstance(v, int) else None


def read_tokenizer(d: Path, config: dict[str, Any]) -> tuple[TokenizerSpec | None, str | None]:
    """The tokenizer spec and chat template of a HF directory (None where absent)."""
    tcfg = _json_dict(d / "tokenizer_config.json")
    template = tcfg.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    if not isinstance(template, str) and (d / "chat_template.jinja").is_file():
        template = (d / "chat_template.jinja").read_text(encoding="utf-8")
    template = template if isinstance(template, str) else None
    tok_path = d / "tokenizer.json"
    try:
        text = (
            tok_path.read_text(encoding="utf-8")
            if tok_path.is_file()
            else _tokenizer_json_from_vocab(d, tcfg)
        )
    except UnicodeDecodeError as e:
        raise FormatError(f"tokenizer.json is not UTF-8 text ({e})", path=tok_path) from e
    if text is None:
        return None, template
    try:
        tok = json.loads(text)
    except json.JSONDecodeError as e:
        raise FormatError(f"tokenizer.json is not valid JSON ({e})", path=tok_path) from e
    if not isinstance(tok, dict):
        raise FormatError("tokenizer.json is not a JSON object", path=tok_path)
    ids: dict[str, int] = {}
    vocab = (tok.get("model") or {}).get("vocab")
    if isinstance(vocab, dict):
        ids.update({k: v for k, v in vocab.items() if isinstance(v, int)})
    for added in tok.get("added_tokens") or []:
        if (
            isinstance(added, dict)
            and isinstance(added.get("content"), str)
            and isinstance(added.get("id"), int)
        ):
            ids[added["content"]] = added["id"]
    spec: dict[str, Any] = {}
    for role in _SPECIALS:
        tstr = _token_str(tcfg.get(f"{role}_token"))
        if tstr is not None and tstr in ids:
            spec[f"{role}_id"] = ids[tstr]
        elif (
            role in ("bos", "eos", "pad") and _first_id(config.get(f"{role}_token_id")) is not None
        ):
            spec[f"{role}_id"] = _first_id(config.get(f"{role}_token_id"))
    if isinstance(tcfg.get("add_bos_token"), bool):
        spec["add_bos"] = tcfg["add_bos_token"]
    else:
        spec["add_bos"] = _post_processor_adds(tok, ids, spec.get("bos_id"))
    if isinstance(tcfg.get("add_eos_token"), bool):
        spec["add_eos"] = tcfg["add_eos_token"]
    return TokenizerSpec(model="hf", hf_json=text, **spec), template


def _tokenizer_json_from_vocab(d: Path, tcfg: dict[str, Any]) -> str | None:
    """Build tokenizer.json text from a slow tokenizer's files: BERT vocab.txt or GPT-2 vocab.json + merges.txt."""
    from tokenizers.implementations import (  # type: ignore[attr-defined]
        BertWordPieceTokenizer,
        ByteLevelBPETokenizer,
    )

    try:
        if (d / "vocab.txt").is_file():
            bert = BertWordPieceTokenizer(
                str(d / "vocab.txt"), lowercase=bool(tcfg.get("do_lower_case", True))
            )
            return str(bert._tokenizer.to_str())
        if (d / "vocab.json").is_file() and (d / "merges.txt").is_file():
            bpe = ByteLevelBPETokenizer(str(d / "vocab.json"), str(d / "merges.txt"))
            return str(bpe._tokenizer.to_str())
    except Exception as e:  # the tokenizers library raises plain Exception subclasses
        raise FormatError(f"cannot build a tokenizer from the vocabulary files: {e}", path=d) from e
    return None


def _post_processor_adds(tok: dict[str, Any], ids: dict[str, int], bos_id: int | None) -> bool:
    """Whether tokenizer.json's TemplateProcessing puts the bos token first."""
    post = tok.get("post_processor") or {}
    single = post.get("single") if isinstance(post, dict) else None
    if bos_id is None or not isinstance(single, list) or not single:
        return False
    first = single[0].get("SpecialToken") if isinstance(single[0], dict) else None
    return isinstance(first, dict) and ids.get(str(first.get("id"))) == bos_id


def _sentence_transformers(d: Path) -> tuple[str | None, bool]:
    modules = _read_json(d / "modules.json") if (d / "modules.json").is_file() else []
    if not isinstance(modules, list):
        return None, False
    types = [str(m.get("type", "")) for m in modules if isinstance(m, dict)]
    normalize = any(t.endswith("models.Normalize") for t in types)
    pooling = None
    for m in modules:
        if isinstance(m, dict) and str(m.get("type", "")).endswith("models.Pooling"):
            pcfg = _json_dict(d / str(m.get("path", "")) / "config.json")
            if pcfg.get("pooling_mode_mean_tokens"):
                pooling = "mean"
            elif pcfg.get("pooling_mode_cls_token"):
                pooling = "cls"
    return pooling, normalize


def load_hf_dir(path: str | Path) -> ModelIR:
    """Read a Hugging Face model directory into the canonical IR."""
    d = Path(path)
    if not (d / "config.json").is_file():
        raise FormatError("not a Hugging Face model directory: config.json is missing", path=d)
    config = _json_dict(d / "config.json")
    raw, weights_from = read_hf_weights(d)
    size = sum(p.stat().st_size for p in d.iterdir() if p.is_file())
    ir = build_model_ir(
        raw,
        config,
        SourceInfo(path=str(d), format="hf-dir", size=size),
        metadata={"weights": weights_from},
    )
    ir.tokenizer, ir.chat_template = read_tokenizer(d, config)
    gen = _json_dict(d / "generation_config.json")
    ir.generation = {k: gen[k] for k in _GENERATION_KEYS if k in gen}
    if (
        ir.tokenizer is not None
        and ir.tokenizer.eos_id is None
        and _first_id(gen.get("eos_token_id")) is not None
    ):
        ir.tokenizer.eos_id = _first_id(gen.get("eos_token_id"))
    eos_ids = gen.get("eos_token_id")
    if isinstance(eos_ids, list) and len(eos_ids) > 1:
        ir.generation["stop_token_ids"] = [i for i in eos_ids if isinstance(i, int)]
    if ir.architecture == "bert":
        pooling, normalize = _sentence_transformers(d)
        if pooling:
            ir.hparams.pooling = pooling
        ir.hparams.normalize_embeddings = normalize
        max_len = _json_dict(d / "sentence_bert_config.json").get("max_seq_length")
        if isinstance(max_len, int):
            ir.metadata["max_seq_length"] = max_len
    return ir
