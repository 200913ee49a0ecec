"""llama.cpp server routes that are not completions: tokenize, detokenize, apply-template, props.

Field names and defaults follow llama.cpp's server (``content``, ``add_special``,
``parse_special``, ``with_pieces``); vLLM's names (``prompt``, ``add_special_tokens``,
``messages``) are accepted too.  Every prompt is made by the engine's prompt format, so
``/tokenize`` with ``messages`` gives the ids a chat request would be fed.
"""

from __future__ import annotations

from quart import Blueprint, Response

import modelc
from modelc.runtime.prompt import SamplingDefaults
from modelc.server.context import body, ctx, json_response
from modelc.server.errors import ParamError
from modelc.server.generation import chat_ids, plain
from modelc.server.schemas import (
    ApplyTemplateRequest,
    ApplyTemplateResponse,
    DetokenizeRequest,
    DetokenizeResponse,
    GenerationSettings,
    PropsResponse,
    SamplingSettings,
    TokenizeRequest,
    TokenizeResponse,
    TokenPiece,
)
from modelc.server.state import ModelInfo

bp = Blueprint("llama", __name__)


@bp.post("/tokenize")
async def tokenize() -> Response:
    req = await body(TokenizeRequest)
    info = ctx().state.check_model(req.model)
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
        [TokenPiece(i, tok.token_to_piece(i).decode("utf-8", "replace")) for i in ids]
        if req.with_pieces
        else list(ids)
    )
    return json_response(TokenizeResponse(tokens, len(ids), info.n_ctx))


@bp.post("/detokenize")
async def detokenize() -> Response:
    req = await body(DetokenizeRequest)
    info = ctx().state.check_model(req.model)
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
    info = ctx().state.check_model(req.model)
    text = info.fmt().render(
        plain(req.messages),
        tools=plain(req.tools) if req.tools else None,
        add_generation_prompt=req.add_generation_prompt,
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
    info = s.model()
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
        )
    )
