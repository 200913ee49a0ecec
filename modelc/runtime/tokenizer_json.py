"""Reading a Hugging Face ``tokenizer.json``: its added tokens, the piece rule its
model follows, and the :class:`TokenizerSpec` (special ids, BOS/EOS adding) it implies."""

from __future__ import annotations

import json
from typing import Any

from modelc.errors import TokenizerError
from modelc.formats.ir import TokenizerSpec

__all__ = ["MAX_VOCAB", "check_added", "hf_kind", "spec_from_tokenizer_json"]

MAX_VOCAB = 1 << 24  # the largest real vocabularies hold ~262k tokens


def check_added(added: Any) -> None:
    """TokenizerError unless ``added`` is tokenizer.json's list of added tokens."""
    if not isinstance(added, list):
        raise TokenizerError("tokenizer.json's added_tokens is not a list")
    for a in added:
        ok = isinstance(a, dict) and isinstance(a.get("content"), str)
        tid = a.get("id") if ok else None
        if not (isinstance(tid, int) and not isinstance(tid, bool) and 0 <= tid < MAX_VOCAB):
            raise TokenizerError(
                f"tokenizer.json has a malformed added token ({str(a)[:80]}): each needs a "
                f"'content' text and an 'id' in 0..{MAX_VOCAB - 1}"
            )


def spec_from_tokenizer_json(
    data: dict[str, Any], text: str, config: dict[str, Any]
) -> TokenizerSpec:
    """A ``hf`` TokenizerSpec: special ids from tokenizer_config, BOS/EOS adding from the post-processor."""
    ids: dict[str, int] = (
        dict((data.get("model") or {}).get("vocab") or {})
        if isinstance((data.get("model") or {}).get("vocab"), dict)
        else {}
    )
    for a in data.get("added_tokens") or []:
        ids[a["content"]] = int(a["id"])

    def tid(key: str) -> int | None:
        v = config.get(key)
        if isinstance(v, dict):
            v = v.get("content")
        return ids.get(v) if isinstance(v, str) else None

    prefix, suffix = _template_specials(data.get("post_processor"), ids)
    bos = prefix if prefix is not None else tid("bos_token")
    eos = tid("eos_token")
    return TokenizerSpec(
        model="hf",
        hf_json=text,
        bos_id=bos,
        eos_id=eos if eos is not None or suffix is None else suffix,
        pad_id=tid("pad_token"),
        unk_id=tid("unk_token"),
        sep_id=tid("sep_token"),
        cls_id=tid("cls_token"),
        mask_id=tid("mask_token"),
        add_bos=prefix is not None,
        add_eos=suffix is not None and (eos is None or suffix == eos),
    )


def _template_specials(pp: Any, ids: dict[str, int]) -> tuple[int | None, int | None]:
    """(first, last) special id the post-processor adds around a single sequence."""
    if not isinstance(pp, dict):
        return None, None
    if pp.get("type") == "Sequence":
        for sub in pp.get("processors") or []:
            got = _template_specials(sub, ids)
            if got != (None, None):
                return got
        return None, None
    if pp.get("type") in ("BertProcessing", "RobertaProcessing"):
        return int(pp["cls"][1]), int(pp["sep"][1])
    if pp.get("type") == "TemplateProcessing":
        single = pp.get("single") or []
        first = single[0].get("SpecialToken", {}).get("id") if single else None
        last = single[-1].get("SpecialToken", {}).get("id") if len(single) > 1 else None
        return (ids.get(first) if first else None), (ids.get(last) if last else None)
    return None, None


def hf_kind(data: dict[str, Any]) -> str:
    """Which piece rule a tokenizer.json follows: gpt2 (byte-level), spm, wordpiece, or plain."""
    model = data.get("model") or {}
    if model.get("type") == "WordPiece":
        return "wordpiece"
    text = json.dumps({k: data.get(k) for k in ("pre_tokenizer", "decoder")})
    if '"ByteLevel"' in text:
        return "gpt2"
    if model.get("byte_fallback") or "\u2581" in text or '"Metaspace"' in text:
        return "spm"
    return "plain"
