"""OpenAI-compatible endpoints: chat/completions, completions, embeddings, models.

The handlers parse, build prompts with the engine's prompt format, submit, and answer
through :mod:`~modelc.server.openai.render`'s renderers.
"""

from __future__ import annotations

import base64
import time

import numpy as np
import trio
from quart import Blueprint, Response

from modelc.server import tools as tooling
from modelc.server.context import body, ctx, json_response, record, use_model
from modelc.server.conversation import answer, chat_prompt, reasoning_budget
from modelc.server.errors import ParamError
from modelc.server.generation import (
    embed_inputs,
    make_requests,
    new_id,
    respond,
    sampling,
    submit_all,
    text_ids,
)
from modelc.server.image_urls import fetch_image_urls
from modelc.server.images import place_images
from modelc.server.openai.render import ChatRenderer, CompletionRenderer, response_constraint
from modelc.server.openai.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingData,
    EmbeddingRequest,
    EmbeddingResponse,
    EmbeddingUsage,
    ModelCard,
    ModelList,
)
from modelc.server.state import ModelInfo, load_model_info

bp = Blueprint("openai", __name__)


# --- chat --------------------------------------------------------------------------------
@bp.post("/v1/chat/completions")
async def chat_completions() -> Response:
    req = await body(ChatCompletionRequest)
    info, engine = await use_model(req.model, "text")
    _no_zero_tokens(req.token_limit)
    if req.top_logprobs is not None and not req.logprobs:
        raise ParamError("top_logprobs needs logprobs: true", param="top_logprobs")
    kwargs = tooling.template_kwargs(req.chat_template_kwargs, req.reasoning_effort)
    msgs = await fetch_image_urls(req.messages, ctx().state.allow_image_urls)
    prompt = chat_prompt(info, msgs, req.tools, req.tool_choice, template_kwargs=kwargs)
    constraint, reader = answer(
        info,
        prompt,
        grammar=req.grammar,
        answer_format=response_constraint(req.response_format),
        reasoning=req.reasoning_format != "none",
        parallel=req.parallel_tool_calls is not False,
    )
    ids, images = await place_images(info, engine, prompt.ids, prompt.media, prompt.images)
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    params = sampling(info, req, max_tokens=req.token_limit, logprobs=logprobs)
    budget = req.reasoning_budget_tokens
    params.reasoning_budget = reasoning_budget(
        info,
        reader,
        ctx().state,
        req.thinking_budget_tokens if budget is None else budget,
        req.reasoning_budget_message,
    )
    cid = new_id("chatcmpl")
    progress = req.stream and req.return_progress
    reqs = make_requests(
        cid,
        ids,
        params,
        req.n,
        constraint,
        req.ignore_eos,
        progress=progress,
        speculative=req.speculative,
        images=images,
    )
    handles = submit_all(engine, reqs, prompt_param="messages")
    r = ChatRenderer(
        info,
        cid,
        int(time.time()),
        ids,
        include_usage=req.include_usage,
        return_token_ids=req.return_token_ids,
        reader=reader,
        logprobs=req.logprobs,
        progress_chunks=progress,
    )
    return await respond(handles, r, stream=req.stream, n_prompt=len(ids))


def _no_zero_tokens(limit: int | None) -> None:
    if limit == 0:
        raise ParamError(
            "max_tokens must be at least 1 (leave it out to stop at the end of the turn)",
            param="max_tokens",
        )


# --- completions -------------------------------------------------------------------------
def _prompts(req: CompletionRequest, info: ModelInfo) -> list[tuple[str, list[int]]]:
    """(text, ids) of each prompt: a string, strings, token ids or token-id lists."""
    p = req.prompt
    tok = info.tok()
    if isinstance(p, str):
        return [(p, text_ids(info, p))]
    if all(isinstance(x, str) for x in p):
        return [(str(x), text_ids(info, str(x))) for x in p]
    if all(isinstance(x, int) for x in p):
        ids = text_ids(info, [int(x) for x in p])  # type: ignore[arg-type]
        return [(tok.decode(ids), ids)]
    if all(isinstance(x, list) for x in p):
        out = []
        for j, x in enumerate(p):
            if not x:
                raise ParamError(f"prompt[{j}] is an empty token list", param=f"prompt[{j}]")
            ids = text_ids(info, list(x), f"prompt[{j}]")  # type: ignore[arg-type]
            out.append((tok.decode(ids), ids))
        return out
    raise ParamError(
        "prompt must be a string, a list of strings, a list of token ids or a list of token-id lists",
        param="prompt",
    )


@bp.post("/v1/completions")
async def completions() -> Response:
    req = await body(CompletionRequest)
    info, engine = await use_model(req.model, "text")
    best_of = req.best_of or req.n
    if best_of < req.n:
        raise ParamError(f"best_of ({best_of}) must be >= n ({req.n})", param="best_of")
    if req.stream and best_of > req.n:
        raise ParamError("best_of cannot be used with stream", param="best_of")
    _no_zero_tokens(req.token_limit)
    prompts = _prompts(req, info)
    if req.suffix is not None:  # the text after the insertion point: fill in the middle
        prompts = [(text, info.fmt().infill(text, req.suffix)) for text, _ in prompts]
    if len(prompts) * best_of > 64:
        raise ParamError("at most 64 generations per request (prompts x best_of)", param="prompt")
    logprobs = req.logprobs if req.logprobs is not None else (0 if best_of > req.n else None)
    constraint = response_constraint(req.response_format)
    params = sampling(info, req, max_tokens=req.token_limit, logprobs=logprobs)
    cid = new_id("cmpl")
    echo_lp = req.logprobs if req.echo and req.logprobs is not None else None
    reqs = [
        r
        for j, (_, ids) in enumerate(prompts)
        for r in make_requests(
            f"{cid}-{j}",
            ids,
            params,
            best_of,
            constraint,
            req.ignore_eos,
            echo_lp,
            speculative=req.speculative,
        )
    ]
    handles = submit_all(engine, reqs)
    r = CompletionRenderer(
        info,
        cid,
        int(time.time()),
        [],
        include_usage=req.include_usage,
        return_token_ids=req.return_token_ids,
        prompts=prompts,
        per_prompt=best_of,
        n=req.n,
        echo=req.echo,
        logprobs=req.logprobs is not None,
    )
    return await respond(handles, r, stream=req.stream, n_prompt=r.n_prompt)


# --- embeddings --------------------------------------------------------------------------
@bp.post("/v1/embeddings")
async def embeddings() -> Response:
    req = await body(EmbeddingRequest)
    info, engine = await use_model(req.model, "embed")
    batch = embed_inputs(req.input, info)
    vecs = np.asarray(await engine.embed(batch), np.float32)  # (len(batch), d)
    if req.dimensions is not None:
        if req.dimensions > vecs.shape[1]:
            raise ParamError(
                f"dimensions {req.dimensions} exceeds the model's {vecs.shape[1]}",
                param="dimensions",
            )
        vecs = vecs[:, : req.dimensions]
        norms = np.linalg.norm(vecs, axis=1, keepdims=True)
        vecs = (vecs / np.where(norms > 0, norms, 1.0)).astype(np.float32)
    data = []
    for i, v in enumerate(vecs):
        emb: list[float] | str = (
            base64.b64encode(v.astype("<f4").tobytes()).decode()
            if req.encoding_format == "base64"
            else v.tolist()
        )
        data.append(EmbeddingData(i, emb))
    n = sum(len(b) for b in batch)
    record().prompt_tokens = n
    return json_response(EmbeddingResponse(data, info.model_id, EmbeddingUsage(n, n)))


# --- models ------------------------------------------------------------------------------
def model_card(name: str, info: ModelInfo) -> ModelCard:
    return ModelCard(name, info.created, "modelc", str(info.path), max_model_len=info.n_ctx)


@bp.get("/v1/models")
async def list_models() -> Response:
    listed = await trio.to_thread.run_sync(ctx().state.models.listing)
    return json_response(ModelList([model_card(name, info) for name, info in listed]))


@bp.get("/v1/models/<path:model_id>")
async def get_model(model_id: str) -> Response:
    models = ctx().state.models
    slot = models.lookup(model_id)
    info = slot.info
    if info is None:  # not loaded: the manifest's facts (no weights read)
        info = await trio.to_thread.run_sync(load_model_info, await models.path(slot), slot.name)
    return json_response(model_card(slot.name, info))
