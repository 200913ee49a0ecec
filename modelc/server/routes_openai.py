"""OpenAI-compatible endpoints: chat/completions, completions, embeddings, models."""

from __future__ import annotations

import base64
import time
from collections.abc import AsyncIterator

import numpy as np
from quart import Blueprint, Response

from modelc.engine.api import FinishEvent, TokenEvent
from modelc.server import sse
from modelc.server import tools as tooling
from modelc.server.context import body, ctx, json_response, nursery, record, stream_response
from modelc.server.errors import ParamError
from modelc.server.generation import (
    FINISH,
    EventStream,
    Outcome,
    chat_prompt,
    check_budget,
    check_ids,
    collect_all,
    embed_inputs,
    make_requests,
    new_id,
    raise_failed,
    response_constraint,
    sampling_params,
    submit_all,
)
from modelc.server.schemas import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatDelta,
    ChatMessageOut,
    ChoiceLogprobs,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    EmbeddingData,
    EmbeddingRequest,
    EmbeddingResponse,
    EmbeddingUsage,
    ModelCard,
    ModelList,
    PromptTokensDetails,
    TokenLogprob,
    ToolCallDelta,
    TopLogprob,
    Usage,
)
from modelc.server.state import ModelInfo

bp = Blueprint("openai", __name__)


def _usage(outs: list[Outcome], prompt_tokens: int) -> Usage:
    completion = sum(o.finish.completion_tokens if o.finish else 0 for o in outs)
    cached = max((o.finish.cached_tokens if o.finish else 0) for o in outs) if outs else 0
    return Usage(prompt_tokens, completion, prompt_tokens + completion, PromptTokensDetails(cached))


def _piece(info: ModelInfo, tok_id: int) -> tuple[str, list[int]]:
    raw = info.tok().token_to_piece(tok_id)
    return raw.decode("utf-8", "replace"), list(raw)


def _chat_logprobs(info: ModelInfo, events: list[TokenEvent]) -> ChoiceLogprobs:
    content = []
    for ev in events:
        s, b = _piece(info, ev.token_id)
        tops = []
        for t, lp in ev.top_logprobs:
            ts, tb = _piece(info, t)
            tops.append(TopLogprob(ts, lp, tb))
        content.append(TokenLogprob(s, ev.logprob if ev.logprob is not None else 0.0, b, tops))
    return ChoiceLogprobs(content)


# --- chat --------------------------------------------------------------------------------
@bp.post("/v1/chat/completions")
async def chat_completions() -> Response:
    c = ctx()
    req = await body(ChatCompletionRequest)
    info, engine = c.state.serve(req.model, "text")
    if req.top_logprobs is not None and not req.logprobs:
        raise ParamError("top_logprobs needs logprobs: true", param="top_logprobs")
    choice = req.tool_choice
    if choice is not None and choice != "none" and choice != "auto" and not req.tools:
        raise ParamError("tool_choice requires tools", param="tool_choice")
    tools = req.tools if req.tools and choice != "none" else None
    _, ids = chat_prompt(info, req.messages, tools)
    constraint = tooling.choice_constraint(tools, choice) if tools else None
    if constraint is None:
        constraint = response_constraint(req.response_format)
    max_tokens = check_budget(info, len(ids), req.token_limit)
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    sampling = sampling_params(req, info, max_tokens, logprobs)
    cid = new_id("chatcmpl")
    handles = submit_all(
        engine, make_requests(cid, ids, sampling, req.n, constraint, req.ignore_eos)
    )
    created = int(time.time())
    model = info.model_id
    rec = record()
    if req.stream:
        streams = [EventStream(h, nursery(), c.metrics) for h in handles]
        return stream_response(
            _chat_stream(
                info,
                streams,
                cid,
                created,
                model,
                len(ids),
                tools is not None,
                req.logprobs,
                req.include_usage,
                c.state.ping_interval,
            ),
            sse.HEADERS,
        )
    outs = await collect_all(handles, c.metrics)
    choices = []
    for i, o in enumerate(outs):
        assert o.finish is not None
        rec.add(o.finish, prompt=False)
        content: str | None = o.text
        calls = None
        reason = o.reason
        if tools:
            content, found = tooling.parse_tool_calls(o.text)
            if found:
                calls, reason = found, "tool_calls"
        lp = _chat_logprobs(info, o.tokens) if req.logprobs else None
        choices.append(ChatChoice(i, ChatMessageOut("assistant", content, calls), reason, lp))
    rec.prompt_tokens = len(ids)
    usage = _usage(outs, len(ids))
    return json_response(ChatCompletion(cid, created, model, choices, usage))


async def _chat_stream(
    info: ModelInfo,
    streams: list[EventStream],
    cid: str,
    created: int,
    model: str,
    n_prompt: int,
    tools: bool,
    want_logprobs: bool,
    include_usage: bool,
    ping: float,
) -> AsyncIterator[bytes]:
    rec = record()
    rec.prompt_tokens = n_prompt

    def chunk(
        i: int, delta: ChatDelta, finish: str | None = None, lp: ChoiceLogprobs | None = None
    ) -> bytes:
        return sse.event(
            ChatCompletionChunk(cid, created, model, [ChatChunkChoice(i, delta, finish, lp)])
        )

    completion = cached = 0
    try:
        for i, st in enumerate(streams):
            yield chunk(i, ChatDelta(role="assistant", content=""))
            held = ""  # text that may still be a tool call
            holding = tools
            while True:
                ev = await st.next(ping)
                if ev is None:
                    yield sse.PING
                    continue
                if isinstance(ev, TokenEvent):
                    lp = _chat_logprobs(info, [ev]) if want_logprobs else None
                    if holding:
                        held += ev.text
                        if tooling.may_be_call(held):
                            continue
                        holding = False
                        text, held = held, ""
                    else:
                        text = ev.text
                    if text or lp:
                        yield chunk(i, ChatDelta(content=text), None, lp)
                    continue
                assert isinstance(ev, FinishEvent)
                held += ev.text
                reason = FINISH.get(ev.reason, "stop")
                if ev.reason.value == "error":
                    raise_failed(ev)
                if holding and held:
                    content, calls = tooling.parse_tool_calls(held)
                    if calls:
                        if content:
                            yield chunk(i, ChatDelta(content=content))
                        for k, call in enumerate(calls):
                            yield chunk(
                                i,
                                ChatDelta(
                                    tool_calls=[
                                        ToolCallDelta(
                                            k,
                                            call.id,
                                            "function",
                                            {"name": call.function.name, "arguments": ""},
                                        )
                                    ]
                                ),
                            )
                            yield chunk(
                                i,
                                ChatDelta(
                                    tool_calls=[
                                        ToolCallDelta(
                                            k, function={"arguments": call.function.arguments}
                                        )
                                    ]
                                ),
                            )
                        reason = "tool_calls"
                    else:
                        yield chunk(i, ChatDelta(content=held))
                elif held:
                    yield chunk(i, ChatDelta(content=held))
                yield chunk(i, ChatDelta(), reason)
                completion += ev.completion_tokens
                cached = max(cached, ev.cached_tokens)
                rec.add(ev, prompt=False)
                break
            st.close()
        if include_usage:
            usage = Usage(n_prompt, completion, n_prompt + completion, PromptTokensDetails(cached))
            yield sse.event(ChatCompletionChunk(cid, created, model, [], usage=usage))
        yield sse.DONE
    finally:
        for st in streams:
            st.close()


# --- completions -------------------------------------------------------------------------
def _prompts(req: CompletionRequest, info: ModelInfo) -> list[tuple[str, list[int]]]:
    p = req.prompt
    tok = info.tok()
    if isinstance(p, str):
        return [(p, tok.encode(p, add_special=True))]
    if all(isinstance(x, str) for x in p):
        return [(str(x), tok.encode(str(x), add_special=True)) for x in p]
    if all(isinstance(x, int) for x in p):
        ids = [int(x) for x in p]  # type: ignore[arg-type]
        check_ids(ids, info, "prompt")
        return [(tok.decode(ids), ids)]
    if all(isinstance(x, list) for x in p):
        out = []
        for j, x in enumerate(p):
            ids = list(x)  # type: ignore[arg-type]
            if not ids:
                raise ParamError(f"prompt[{j}] is an empty token list", param=f"prompt[{j}]")
            check_ids(ids, info, f"prompt[{j}]")
            out.append((tok.decode(ids), ids))
        return out
    raise ParamError(
        "prompt must be a string, a list of strings, a list of token ids or a list of token-id lists",
        param="prompt",
    )


def _completion_logprobs(
    info: ModelInfo, events: list[TokenEvent], offset: int
) -> CompletionLogprobs:
    tokens, lps, tops, offs = [], [], [], []
    pos = offset
    for ev in events:
        s = _piece(info, ev.token_id)[0]
        tokens.append(s)
        lps.append(ev.logprob)
        tops.append({_piece(info, t)[0]: lp for t, lp in ev.top_logprobs} or None)
        offs.append(pos)
        pos += len(ev.text)
    return CompletionLogprobs(tokens, lps, tops, offs)


@bp.post("/v1/completions")
async def completions() -> Response:
    c = ctx()
    req = await body(CompletionRequest)
    info, engine = c.state.serve(req.model, "text")
    best_of = req.best_of or req.n
    if best_of < req.n:
        raise ParamError(f"best_of ({best_of}) must be >= n ({req.n})", param="best_of")
    if req.stream and best_of > req.n:
        raise ParamError("best_of cannot be used with stream", param="best_of")
    prompts = _prompts(req, info)
    if len(prompts) * best_of > 64:
        raise ParamError("at most 64 generations per request (prompts x best_of)", param="prompt")
    logprobs = req.logprobs if req.logprobs is not None else (0 if best_of > req.n else None)
    constraint = response_constraint(req.response_format)
    cid = new_id("cmpl")
    created = int(time.time())
    handles = []
    try:
        for j, (_, ids) in enumerate(prompts):
            max_tokens = check_budget(info, len(ids), req.token_limit, param="prompt")
            sampling = sampling_params(req, info, max_tokens, logprobs)
            handles.append(
                submit_all(
                    engine,
                    make_requests(f"{cid}-{j}", ids, sampling, best_of, constraint, req.ignore_eos),
                )
            )
    except BaseException:
        for hs in handles:
            for h in hs:
                h.cancel()
        raise
    n_prompt = sum(len(ids) for _, ids in prompts)
    rec = record()
    rec.prompt_tokens = n_prompt
    if req.stream:
        streams = [[EventStream(h, nursery(), c.metrics) for h in hs] for hs in handles]
        return stream_response(
            _completion_stream(
                info,
                req,
                prompts,
                streams,
                cid,
                created,
                n_prompt,
                req.include_usage,
                c.state.ping_interval,
            ),
            sse.HEADERS,
        )
    flat = await collect_all([h for hs in handles for h in hs], c.metrics)
    choices: list[CompletionChoice] = []
    for j, (ptext, _) in enumerate(prompts):
        outs = flat[j * best_of : (j + 1) * best_of]
        if best_of > req.n:
            outs = sorted(outs, key=lambda o: o.cum_logprob, reverse=True)[: req.n]
        for o in outs:
            assert o.finish is not None
            rec.add(o.finish, prompt=False)
            prefix = ptext if req.echo else ""
            text = prefix + o.text + (req.suffix or "")
            lp = (
                _completion_logprobs(info, o.tokens, len(prefix))
                if req.logprobs is not None
                else None
            )
            choices.append(CompletionChoice(len(choices), text, o.reason, lp))
    return json_response(Completion(cid, created, info.model_id, choices, _usage(flat, n_prompt)))


async def _completion_stream(
    info: ModelInfo,
    req: CompletionRequest,
    prompts: list[tuple[str, list[int]]],
    streams: list[list[EventStream]],
    cid: str,
    created: int,
    n_prompt: int,
    include_usage: bool,
    ping: float,
) -> AsyncIterator[bytes]:
    rec = record()
    model = info.model_id

    def chunk(
        i: int, text: str, finish: str | None = None, lp: CompletionLogprobs | None = None
    ) -> bytes:
        return sse.event(Completion(cid, created, model, [CompletionChoice(i, text, finish, lp)]))

    completion = 0
    idx = 0
    try:
        for j, group in enumerate(streams):
            for st in group:
                if req.echo:
                    yield chunk(idx, prompts[j][0])
                offset = len(prompts[j][0]) if req.echo else 0
                while True:
                    ev = await st.next(ping)
                    if ev is None:
                        yield sse.PING
                        continue
                    if isinstance(ev, TokenEvent):
                        lp = (
                            _completion_logprobs(info, [ev], offset)
                            if req.logprobs is not None
                            else None
                        )
                        offset += len(ev.text)
                        yield chunk(idx, ev.text, None, lp)
                        continue
                    if ev.reason.value == "error":
                        raise_failed(ev)
                    tail = ev.text + (req.suffix or "")
                    if tail:
                        yield chunk(idx, tail)
                    yield chunk(idx, "", FINISH.get(ev.reason, "stop"))
                    completion += ev.completion_tokens
                    rec.add(ev, prompt=False)
                    break
                st.close()
                idx += 1
        if include_usage:
            yield sse.event(
                Completion(
                    cid, created, model, [], Usage(n_prompt, completion, n_prompt + completion)
                )
            )
        yield sse.DONE
    finally:
        for group in streams:
            for st in group:
                st.close()


# --- embeddings --------------------------------------------------------------------------
@bp.post("/v1/embeddings")
async def embeddings() -> Response:
    c = ctx()
    req = await body(EmbeddingRequest)
    info, engine = c.state.serve(req.model, "embed")
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
def model_card(info: ModelInfo) -> ModelCard:
    return ModelCard(
        info.model_id, info.created, "modelc", str(info.path), max_model_len=info.n_ctx
    )


@bp.get("/v1/models")
async def list_models() -> Response:
    info = ctx().state.model()
    return json_response(ModelList([model_card(info)]))


@bp.get("/v1/models/<path:model_id>")
async def get_model(model_id: str) -> Response:
    info = ctx().state.check_model(model_id)
    return json_response(model_card(info))
