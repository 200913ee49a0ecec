"""Summaries of an open artifact for ``modelc inspect``: JSON, text, model card, size table."""

from __future__ import annotations

from typing import Any

import msgspec

from modelc.artifact.reader import Artifact
from modelc.artifact.transform import SIZE_TABLE_TYPES, bits_per_weight, estimated_size
from modelc.formats.ir import DType, HParams


def human_count(n: int) -> str:
    for unit, div in (("T", 10**12), ("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= div:
            return f"{n / div:.1f}{unit}"
    return str(n)


def human_bytes(n: float) -> str:
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{int(n)} B"


def _n(shape: list[int]) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


def by_dtype(art: Artifact) -> dict[str, dict[str, int]]:
    """dtype -> {tensors, params, bytes}, largest parameter share first."""
    out: dict[str, dict[str, int]] = {}
    for e in art.manifest.tensors:
        d = out.setdefault(e.dtype, {"tensors": 0, "params": 0, "bytes": 0})
        d["tensors"] += 1
        d["params"] += _n(e.shape)
        d["bytes"] += e.stored_nbytes
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["params"]))


def quant_label(art: Artifact) -> str:
    counts = by_dtype(art)
    if not counts:
        return "-"
    names = list(counts)
    return names[0] + (f" (+{', '.join(names[1:])})" if len(names) > 1 else "")


def _short_meta(meta: dict[str, Any]) -> dict[str, Any]:
    """Metadata values small enough to show (long arrays and texts are left out)."""
    out: dict[str, Any] = {}
    for k, v in meta.items():
        if isinstance(v, (list, dict)) and len(v) > 16:
            continue
        if isinstance(v, str) and len(v) > 500:
            continue
        if isinstance(v, bytes):
            continue
        out[k] = v
    return out


def attention_features(art: Artifact) -> list[str]:
    """What sets a transformer family apart, read from its hparams and tensor names:
    head size, RoPE layout and scaling, QKV biases, Q/K norms, a sliding window, a tied head,
    a mixture of experts, recurrent (Gated DeltaNet, short-convolution, Mamba-2) layers, an
    encoder's pooling."""
    h = art.manifest.hparams
    names = {e.name for e in art.manifest.tensors}
    out = [f"head_dim {h.head_dim or h.n_embd // h.n_head}"]
    if "position_embd.weight" in names:
        out.append("learned positions")
    else:
        rope = f"RoPE {h.rope_style} (theta {h.rope_theta:g}"
        if h.rope_scaling.type != "none":
            rope += f", {h.rope_scaling.type} x{h.rope_scaling.factor:g}"
        if h.rope_theta_local:
            rope += f"; windowed layers theta {h.rope_theta_local:g}"
        out.append(rope + ")")
        if h.nope_layers:
            out.append(f"NoPE layers {','.join(map(str, h.nope_layers))}")
        if h.rope_sections:  # qwen2vl, qwen3vl
            way = " interleaved" if h.rope_interleaved else ""
            out.append(f"M-RoPE sections t/h/w {'/'.join(map(str, h.rope_sections))}{way}")
        if h.n_deepstack:  # qwen3vl
            out.append(f"DeepStack image features into the first {h.n_deepstack} layers")
    if h.rope_dim:
        out.append(f"partial RoPE ({h.rope_dim} of each head's {h.head_dim} dimensions)")
    if any(n.endswith(".shortconv.conv.weight") for n in names):  # lfm2
        n_conv = len(h.recurrent_layers)
        out.append(f"short convolution (width {h.ssm_conv}) {n_conv} of {h.n_layer} layers")
    elif any(n.endswith(".ssm_in.weight") for n in names):  # granitehybrid
        n_ssm = len(h.recurrent_layers)
        mamba = f"Mamba-2 ({h.ssm_v_heads} heads, state {h.ssm_head_k})"
        out.append(f"{mamba} {n_ssm} of {h.n_layer} layers")
    elif h.recurrent_layers:  # qwen35: their attn_qkv is the linear attention's
        out.append(f"Gated DeltaNet {len(h.recurrent_layers)} of {h.n_layer} layers")
    elif any(n.startswith("blk.0.attn_qkv") for n in names):
        out.append("fused QKV")
    if "blk.0.attn_q.bias" in names and "blk.0.ffn_gate.weight" in names:
        out.append("QKV bias")
    if "blk.0.attn_q_norm.weight" in names:
        out.append("Q/K norm")
    if h.sliding_window:
        n_win = len(h.window_layers) or h.n_layer
        out.append(f"sliding window {h.sliding_window} ({n_win} of {h.n_layer} layers)")
    if h.attn_chunk:
        out.append(f"attention in chunks of {h.attn_chunk} (the RoPE layers)")
    if h.attn_scale:
        out.append(f"Q·K scale {h.attn_scale:.4g}")
    if "blk.0.attn_sinks.weight" in names:
        out.append("attention sinks")
    if h.attn_softcap or h.final_softcap:
        out.append(f"soft-cap attention {h.attn_softcap:g}, logits {h.final_softcap:g}")
    if h.mla:
        q = f", Q rank {h.mla.q_rank}" if h.mla.q_rank else ""
        out.append(f"latent attention (KV rank {h.mla.kv_rank}, RoPE {h.mla.rope_dim}{q})")
    if h.n_expert:
        out.append(f"{h.n_expert} experts, {h.n_expert_used} a token")
    if h.routing:
        r = h.routing
        groups = f", top {r.n_group_used} of {r.n_group} groups" if r.n_group > 1 else ""
        out.append(f"{r.gating} routing{groups}, {r.n_shared} shared, first {r.n_dense_lead} dense")
    out += _gemma4_features(h, names)
    if h.swiglu_limit:
        out.append(f"biased experts, SwiGLU clamped at {h.swiglu_limit:g}")
    if h.pooling:  # an encoder: its pooled embeddings, no output head
        out.append(f"pooling {h.pooling}" + (", L2-normalised" if h.normalize_embeddings else ""))
    elif h.tie_embeddings and "output.weight" not in names:
        out.append("tied embeddings")
    return out


def _gemma4_features(h: HParams, names: set[str]) -> list[str]:
    """Gemma 4's: global layers' own head shape, KV sharing, per-layer inputs, a mixture
    beside the FFN."""
    out = []
    if h.head_dim_global or h.n_head_kv_global:
        kv = h.n_head_kv_global or h.n_head_kv
        out.append(f"global layers head_dim {h.head_dim_global or h.head_dim} ({kv} kv)")
    if h.rope_dims_global:
        out.append(f"proportional RoPE ({h.rope_dims_global} dims)")
    if h.n_kv_shared:
        out.append(f"last {h.n_kv_shared} layers share K/V")
    if h.n_embd_per_layer:
        out.append(f"per-layer inputs {h.n_embd_per_layer}")
    if "blk.0.ffn_gate_up_exps.weight" in names and "blk.0.ffn_gate.weight" in names:
        n = sum(1 for n in names if n.endswith("ffn_gate_inp.weight"))
        out.append(f"experts beside the FFN ({h.n_expert_used} a token, {n} layers)")
    return out


def summary(
    art: Artifact,
    name: str,
    *,
    tensors: bool = False,
    sampling: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Everything ``inspect --json`` prints (``sampling``: the defaults in effect, with
    their sources, as the CLI resolves them)."""
    m = art.manifest
    tok = m.tokenizer
    out: dict[str, Any] = {
        "name": name,
        "path": str(art.path),
        "architecture": m.architecture,
        "n_params": art.n_params,
        "params": human_count(art.n_params),
        "size": art.size,
        "quantization": {
            "summary": quant_label(art),
            "by_dtype": by_dtype(art),
            "quantized": any(DType(e.dtype).is_quantized for e in m.tensors),
        },
        "compression": m.pack.compression,
        "pack": msgspec.to_builtins(m.pack),
        "hparams": msgspec.to_builtins(m.hparams),
        "attention": attention_features(art) if m.hparams.n_layer and m.hparams.n_head else [],
        "tokenizer": None
        if tok is None
        else {
            "model": tok.model,
            "pre": tok.pre,
            "n_tokens": len(tok.tokens),
            "bos_id": tok.bos_id,
            "eos_id": tok.eos_id,
            "add_bos": tok.add_bos,
            "add_eos": tok.add_eos,
        },
        "has_chat_template": bool(m.chat_template),
        "chat_template": m.chat_template,
        "generation": m.generation,
        "sampling_defaults": sampling,
        "source": msgspec.to_builtins(m.source),
        "created": m.created,
        "format_version": m.format_version,
        "modelc_version": m.modelc_version,
        "n_tensors": len(m.tensors),
        "has_graph": m.graph is not None,
        "metadata": _short_meta(m.metadata),
    }
    if tensors:
        out["tensors"] = [msgspec.to_builtins(e) for e in m.tensors]
    return out


def summary_text(
    art: Artifact, name: str, *, tensors: bool = False, sampling: dict[str, Any] | None = None
) -> str:
    m = art.manifest
    h = m.hparams
    lines = [
        f"{name}",
        f"  path           {art.path}",
        f"  architecture   {m.architecture}",
        f"  parameters     {human_count(art.n_params)} ({art.n_params:,})",
        f"  size           {human_bytes(art.size)}",
        f"  quantization   {quant_label(art)}",
        f"  compression    {m.pack.compression}"
        + (f" (level {m.pack.compression_level})" if m.pack.compression != "none" else ""),
    ]
    if m.pack.quantize:
        lines.append(
            f"  packed with    --quantize {m.pack.quantize} ({m.pack.quantized_tensors} tensors)"
        )
    if m.pack.prune_threshold is not None:
        lines.append(
            f"  pruned         |w| < {m.pack.prune_threshold} ({m.pack.pruned_weights:,} weights)"
        )
    if m.pack.requantized_tensors:
        lines.append(
            f"  requantized    {m.pack.requantized_tensors} tensors from "
            f"{', '.join(m.pack.requantized_from)} (dequantized to f32, quantized again)"
        )
    if h.n_layer:
        lines.append(
            f"  shape          {h.n_layer} layers, n_embd {h.n_embd}, {h.n_head} heads"
            + (f" ({h.n_head_kv} kv)" if h.n_head_kv else "")
            + f", ctx {h.n_ctx}, vocab {h.n_vocab}"
        )
    if h.n_layer and h.n_head:
        lines.append(f"  attention      {', '.join(attention_features(art))}")
    if m.tokenizer:
        t = m.tokenizer
        lines.append(
            f"  tokenizer      {t.model}{'/' + t.pre if t.pre else ''}, {len(t.tokens)} tokens"
        )
    lines.append(f"  chat template  {'yes' if m.chat_template else 'no'}")
    if sampling:
        src = sampling.get("sources", {})
        shown = [
            f"{k} {v}" + (f" ({src[k]})" if src.get(k) and src[k] != "llama-server" else "")
            for k, v in sampling.items()
            if k != "sources"
        ]
        lines.append(f"  sampling       {', '.join(shown)}")
    lines.append(f"  source         {m.source.format} {m.source.path}")
    lines.append(f"  created        {m.created} (modelc {m.modelc_version})")
    if tensors:
        lines.append("")
        for e in m.tensors:
            lines.append(
                f"  {e.name:40s} {e.dtype:6s} {e.shape!s:20s} {human_bytes(e.stored_nbytes)}"
            )
    return "\n".join(lines)


def quant_sizes(art: Artifact) -> list[tuple[str, float, int]]:
    """(dtype, bits per weight, total bytes) for each type in the size table."""
    ts = [(e.name, DType(e.dtype), tuple(e.shape)) for e in art.manifest.tensors]
    return [(d.value, bits_per_weight(d), estimated_size(ts, d)) for d in SIZE_TABLE_TYPES]


def quant_sizes_table(art: Artifact) -> str:
    current = sum(e.nbytes for e in art.manifest.tensors)
    rows = [["TYPE", "BITS/WEIGHT", "SIZE", "VS NOW"]]
    for name, bits, size in quant_sizes(art):
        rows.append(
            [name, f"{bits:.2f}", human_bytes(size), f"{size / current:.2f}x" if current else "-"]
        )
    rows.append(["(now)", "", human_bytes(current), "1.00x"])
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    text = "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )
    return text + "\n(weight matrices in the type; norms, biases and 1-D tensors as f32)"


def model_card(art: Artifact, name: str) -> str:
    """A markdown model card."""
    m = art.manifest
    h = msgspec.to_builtins(m.hparams)
    out = [
        f"# {name}",
        "",
        f"A `{m.architecture}` model with {human_count(art.n_params)} parameters, packed by modelc "
        f"{m.modelc_version} on {m.created}.",
        "",
        "| | |",
        "|---|---|",
        f"| Architecture | `{m.architecture}` |",
        f"| Parameters | {human_count(art.n_params)} ({art.n_params:,}) |",
        f"| File size | {human_bytes(art.size)} |",
        f"| Quantization | {quant_label(art)} |",
        f"| Compression | {m.pack.compression} |",
        f"| Chat template | {'yes' if m.chat_template else 'no'} |",
        f"| Source | {m.source.format}: `{m.source.path}` |",
        "",
        "## Hyper-parameters",
        "",
        "| name | value |",
        "|---|---|",
        *[f"| {k} | {v} |" for k, v in h.items()],
        "",
        "## Tensors by type",
        "",
        "| type | tensors | parameters | bytes |",
        "|---|---|---|---|",
        *[
            f"| {k} | {v['tensors']} | {v['params']:,} | {human_bytes(v['bytes'])} |"
            for k, v in by_dtype(art).items()
        ],
    ]
    if m.tokenizer:
        t = m.tokenizer
        out += [
            "",
            "## Tokenizer",
            "",
            f"{t.model}{' (' + t.pre + ')' if t.pre else ''}, {len(t.tokens)} tokens; "
            f"BOS {t.bos_id}, EOS {t.eos_id}; add BOS: {t.add_bos}, add EOS: {t.add_eos}.",
        ]
    if m.chat_template:
        out += ["", "## Chat template", "", "```jinja", m.chat_template.strip(), "```"]
    out += [
        "",
        "## Usage",
        "",
        "```sh",
        f"modelc inspect {name}",
        f"modelc tokenize {name} 'Hello world'",
        "```",
    ]
    return "\n".join(out)
