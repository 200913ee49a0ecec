"""llama.cpp's own routes: completion, infill, tokenize, detokenize, apply-template, props,
slots, embedding.

Field names and defaults follow llama.cpp's server (``n_predict``, ``n_probs``,
``content``, ``add_special``, ``parse_special``, ``with_pieces``...); vLLM's names
(``prompt``, ``add_special_tokens``, ``messages``) are accepted by ``/tokenize`` too.
Every prompt is made by the engine's prompt format, so ``/tokenize`` with ``messages``
gives the ids a chat request would be fed.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from quart import Blueprint, Response, request

import modelc
from modelc.engine.api import Constraint, ConstraintKind
from modelc.errors import UnsupportedError
from modelc.runtime.prompt import SamplingDefaults
from modelc.server.context import body, ctx, json_response, record, use_model
from modelc.server.errors import NotImplementedFeature, ParamError
from modelc.server.generation import (
    chat_ids,
    check_ids,
    embed_inputs,
    llama_normalize,
    make_requests,
    new_id,
    plain,
    respond,
    sampling,
    submit_all,
    text_ids,
)
from modelc.server.llamacpp.render import LlamaRenderer
from modelc.server.llamacpp.schemas import (
    ApplyTemplateRequest,
    ApplyTemplateResponse,
    DetokenizeRequest,
    DetokenizeResponse,
    GenerationSettings,
    LlamaCompletionRequest,
    LlamaEmbedding,
    LlamaEmbeddingRequest,
    LlamaInfillRequest,
    LlamaSlot,
    LlamaTokenizeResponse,
    PropsResponse,
    SamplingSettings,
    TokenizeRequest,
    TokenizeResponse,
    TokenPiece,
)
from modelc.server.state import ModelInfo
from modelc.server.tools import template_kwargs

bp = Blueprint("llama", __name__)


@bp.post("/tokenize")
async def tokenize() -> Response:
    req = await body(TokenizeRequest)
    info = (await use_model(req.model))[0]
    tok = info.tok()
    if req.messages is not None:
        ids = chat_ids(info, req.messages, add_generation_prompt=req.add_generation_prompt)
    else:
        text = req.content if req.content is not None else req.prompt
        if text is None:
            raise ParamError(
                "give 'content' (llama.cpp), 'prompt' or 'messages' (vLLM)", param="content"
            )
        # llama.cpp's add_special defaults to false, vLLM's add_special_tokens to true
        add = req.add_special if req.add_special is not None else req.add_special_tokens
        if add is None:
            add = req.content is None
        ids = info.fmt().encode(text, add_special=add, parse_special=req.parse_special)
    tokens: list[int | TokenPiece] = (
        [TokenPiece(i, _piece(tok.token_to_piece(i))) for i in ids]
        if req.with_pieces
        else list(ids)
    )
    if req.content is not None:  # llama.cpp's request: llama.cpp's answer
        return json_response(LlamaTokenizeResponse(tokens))
    return json_response(TokenizeResponse(tokens, len(ids), info.n_ctx))


@bp.post("/detokenize")
async def detokenize() -> Response:
    req = await body(DetokenizeRequest)
    info = (await use_model(req.model))[0]
    tok = info.tok()
    bad = [i for i in req.tokens if i >= tok.vocab_size]
    if bad:
        raise ParamError(
            f"token id {bad[0]} is outside the vocabulary 0..{tok.vocab_size - 1}", param="tokens"
        )
    text = tok.decode(req.tokens)
    return json_response(DetokenizeResponse(text, text))


@bp.post("/apply-template")
async def apply_template() -> Response:
    """The prompt text a chat request renders (llama.cpp's ``/apply-template``)."""
    req = await body(ApplyTemplateRequest)
    info = (await use_model(req.model))[0]
    text = info.fmt().render(
        plain(req.messages),
        tools=plain(req.tools) if req.tools else None,
        add_generation_prompt=req.add_generation_prompt,
        continue_final=True,  # llama.cpp continues a final assistant message either way
        template_kwargs=template_kwargs(req.chat_template_kwargs, req.reasoning_effort),
    )
    return json_response(ApplyTemplateResponse(text))


def sampling_settings(info: ModelInfo) -> SamplingSettings:
    """The sampling defaults in effect for the served model."""
    d = info.prompt.defaults if info.prompt is not None else SamplingDefaults.resolve()
    v = d.values
    return SamplingSettings(
        temperature=float(v["temperature"]),
        top_k=int(v["top_k"]),
        top_p=float(v["top_p"]),
        min_p=float(v["min_p"]),
        repeat_penalty=float(v["repetition_penalty"]),
        repeat_last_n=int(v["repeat_last_n"]),
        presence_penalty=float(v["presence_penalty"]),
        frequency_penalty=float(v["frequency_penalty"]),
        max_tokens=d.max_tokens,
        n_predict=d.max_tokens,
        sources=dict(d.origin),
    )


@bp.get("/props")
async def props() -> Response:
    s = ctx().state
    info, engine = await use_model(request.args.get("model"))
    fmt = info.prompt
    return json_response(
        PropsResponse(
            str(info.path),
            info.model_id,
            info.model_id,
            info.architecture,
            s.max_concurrent,
            info.chat_template or "",
            fmt.bos_text if fmt is not None else "",
            fmt.eos_text if fmt is not None else "",
            GenerationSettings(info.n_ctx, sampling_settings(info)),
            f"modelc {modelc.__version__}",
            {"vision": engine.vision is not None, "audio": False, "video": False},
        )
    )


def _piece(raw: bytes) -> str | list[int]:
    """A token's text, or its bytes when they are not valid UTF-8 on their own (llama.cpp)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)


def _bias(b: Any) -> dict[str, float] | None:
    """llama.cpp's logit_bias: ``{"id": bias}`` or ``[[id or text, bias]]``; false bans."""
    if b is None:
        return None
    pairs = list(b.items()) if isinstance(b, dict) else [tuple(p) for p in b]
    out: dict[str, float] = {}
    for pair in pairs:
        if len(pair) != 2 or not isinstance(pair[0], int | str):
            raise ParamError("logit_bias pairs are [token id, bias]", param="logit_bias")
        key, v = pair
        value = -100.0 if v is False else float(v)
        out[str(key)] = value
    return out


def _prompts(info: ModelInfo, prompt: Any) -> tuple[list[tuple[str, list[int]]], bool]:
    """(text, ids) per prompt, and whether the request gave several.

    A string; a list of ids and strings (one prompt, the strings tokenized in place); or
    a list of strings / of such lists (several prompts).
    """
    if isinstance(prompt, str):
        return [(prompt, text_ids(info, prompt))], False
    several = any(isinstance(p, list) for p in prompt) or (
        len(prompt) > 1 and all(isinstance(p, str) for p in prompt)
    )
    if several:
        return [_mixed(info, p if isinstance(p, list) else [p]) for p in prompt], True
    return [_mixed(info, list(prompt))], False


def _mixed(info: ModelInfo, items: list[Any]) -> tuple[str, list[int]]:
    fmt = info.fmt()
    ids: list[int] = []
    for k, x in enumerate(items):
        if isinstance(x, str):
            ids += fmt.encode(x, add_special=k == 0)
        else:
            ids.append(int(x))
    check_ids(ids, info, "prompt")
    return fmt.decode(ids), ids


async def _complete(req: LlamaCompletionRequest) -> Response:
    info, engine = await use_model(req.model, "text")
    if isinstance(req, LlamaInfillRequest):
        try:
            ids = info.fmt().infill(req.input_prefix, req.input_suffix)
        except UnsupportedError as e:
            raise NotImplementedFeature(f"Infill is not supported by this model: {e}") from e
        if isinstance(req.prompt, str) and req.prompt:
            ids += info.fmt().encode(req.prompt, add_special=False)
        prompts, many = [(req.input_prefix, ids)], False
    else:
        prompts, many = _prompts(info, req.prompt)
    limit = None if req.n_predict is None or req.n_predict < 0 else req.n_predict
    params = sampling(
        info, req.sampling(_bias(req.logit_bias)), max_tokens=limit, logprobs=req.n_probs or None
    )
    constraint = None
    if req.json_schema is not None:
        constraint = Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(req.json_schema))
    elif req.grammar:
        constraint = Constraint(ConstraintKind.GRAMMAR, req.grammar)
    base = new_id("cmpl")
    reqs = [
        r
        for j, (_, ids) in enumerate(prompts)
        for r in make_requests(
            f"{base}-{j}", ids, params, 1, constraint, req.ignore_eos, speculative=req.speculative
        )
    ]
    r = LlamaRenderer(
        info,
        prompts,
        params,
        req.n_probs,
        req.return_tokens,
        req.ignore_eos,
        req.stream,
        many,
    )
    n_prompt = sum(len(ids) for _, ids in prompts)
    return await respond(submit_all(engine, reqs), r, stream=req.stream, n_prompt=n_prompt)


@bp.post("/completion")
@bp.post("/completions")
async def completion() -> Response:
    """llama.cpp's native completion (``n_predict``, ``n_probs``, streaming...)."""
    return await _complete(await body(LlamaCompletionRequest))


@bp.post("/infill")
async def infill() -> Response:
    """Fill in the middle between ``input_prefix`` and ``input_suffix`` (code models)."""
    return await _complete(await body(LlamaInfillRequest))


@bp.get("/slots")
async def slots() -> Response:
    """One entry per sequence the engine runs at once; the first ``running`` are busy."""
    s = ctx().state
    info, engine = await use_model(request.args.get("model"))
    running = engine.stats().running
    return json_response(
        [LlamaSlot(i, info.n_ctx, False, i < running) for i in range(s.max_concurrent)]
    )


@bp.post("/embedding")
async def embedding() -> Response:
    """llama.cpp's ``/embedding``: ``[{"index", "embedding": [[...]]}]``, one per input, the
    pooled vector scaled as ``embd_normalize`` says (default: unit euclidean length).
    (``/embeddings`` is modelc's native route; llama.cpp answers both alike.)"""
    req = await body(LlamaEmbeddingRequest)
    info, engine = await use_model(req.model, "embed")
    inp = req.content if req.content is not None else req.input
    if inp is None:
        raise ParamError("give 'content' (or 'input')", param="content")
    batch = embed_inputs(inp, info, param="content")
    raw = np.asarray(await engine.embed(batch, normalize=False), np.float32)
    record().prompt_tokens = sum(len(b) for b in batch)
    vecs = llama_normalize(raw, req.embd_normalize)
    return json_response([LlamaEmbedding(i, [v.tolist()]) for i, v in enumerate(vecs)])


@bp.post("/rerank")
@bp.post("/v1/rerank")
@bp.post("/v1/reranking")
async def rerank() -> Response:
    info, _ = await use_model(None)
    raise NotImplementedFeature(
        f"model {info.model_id!r} is not a reranker; modelc has no reranking models yet "
        "(llama.cpp needs a model with a rank head, started with --reranking)"
    )
