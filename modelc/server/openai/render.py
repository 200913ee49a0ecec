"""The OpenAI dialect: chat.completion(.chunk) and text_completion bodies from engine results.

:class:`ChatRenderer` and :class:`CompletionRenderer` implement
:class:`~modelc.server.generation.Renderer`; the routes in :mod:`~modelc.server.openai.routes` only
parse, submit and hand the handles over.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from modelc.chat import Delta, StreamParser
from modelc.engine.api import (
    Constraint,
    ConstraintKind,
    FinishEvent,
    ProgressEvent,
    PromptEvent,
    TokenEvent,
)
from modelc.server import sse
from modelc.server import tools as tooling
from modelc.server.errors import ParamError
from modelc.server.generation import FINISH, Outcome, RendererBase
from modelc.server.openai.schemas import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatDelta,
    ChatMessageOut,
    ChatProgressChunk,
    ChoiceLogprobs,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    PromptProgress,
    PromptTokensDetails,
    ResponseFormat,
    TokenLogprob,
    ToolCallDelta,
    TopLogprob,
    Usage,
)
from modelc.server.state import ModelInfo
from modelc.server.tools import HERMES


def response_constraint(fmt: ResponseFormat | None) -> Constraint | None:
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return Constraint(ConstraintKind.JSON_OBJECT)
    if fmt.json_schema is None or fmt.json_schema.schema is None:
        raise ParamError(
            "response_format json_schema needs json_schema.schema (a JSON Schema object)",
            param="response_format.json_schema",
        )
    return Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(fmt.json_schema.schema))


def usage(outs: list[FinishEvent], prompt_tokens: int) -> Usage:
    completion = sum(f.completion_tokens for f in outs)
    cached = max((f.cached_tokens for f in outs), default=0)
    return Usage(prompt_tokens, completion, prompt_tokens + completion, PromptTokensDetails(cached))


def _piece(info: ModelInfo, tok_id: int) -> tuple[str, list[int]]:
    raw = info.tok().token_to_piece(tok_id)
    return raw.decode("utf-8", "replace"), list(raw)


@dataclass(slots=True)
class _Base(RendererBase):
    info: ModelInfo
    cid: str
    created: int
    prompt_ids: list[int]
    include_usage: bool = False
    return_token_ids: bool = False
    headers: dict[str, str] = field(default_factory=lambda: sse.HEADERS)
    ping: bytes | None = sse.PING
    finished: list[FinishEvent] = field(default_factory=list)

    @property
    def model(self) -> str:
        return self.info.model_id

    @property
    def n_prompt(self) -> int:
        return len(self.prompt_ids)


def chat_deltas(d: Delta) -> list[ChatDelta]:
    """One parser delta as OpenAI stream deltas (trace, answer, call pieces)."""
    out = []
    if d.reasoning:
        out.append(ChatDelta(reasoning_content=d.reasoning))
    if d.content:
        out.append(ChatDelta(content=d.content))
    for c in d.calls:
        if c.name is not None:
            fn = {"name": c.name, "arguments": c.arguments}
            out.append(ChatDelta(tool_calls=[ToolCallDelta(c.index, c.id, "function", fn)]))
        else:
            fn = {"arguments": c.arguments}
            out.append(ChatDelta(tool_calls=[ToolCallDelta(c.index, function=fn)]))
    return out


@dataclass(slots=True)
class ChatRenderer(_Base):
    """``/v1/chat/completions``: the output read by ``reader`` (the model's format) into
    ``reasoning_content``, ``content`` and ``tool_calls``, streamed as deltas."""

    reader: tooling.OutputReader = field(default_factory=lambda: tooling.OutputReader(HERMES))
    logprobs: bool = False
    progress_chunks: bool = False  # llama.cpp's return_progress
    _parser: StreamParser | None = None

    def _logprobs(self, events: list[TokenEvent]) -> ChoiceLogprobs:
        content = []
        for ev in events:
            s, b = _piece(self.info, ev.token_id)
            tops = [TopLogprob(*_piece_lp(self.info, t, lp)) for t, lp in ev.top_logprobs]
            content.append(TokenLogprob(s, ev.logprob if ev.logprob is not None else 0.0, b, tops))
        return ChoiceLogprobs(content)

    def body(self, outs: list[Outcome]) -> ChatCompletion:
        choices = []
        for i, o in enumerate(outs):
            got = self.reader.parser().full(o.text)
            calls = tooling.calls_out(got.calls) or None
            reason = "tool_calls" if calls else o.reason
            content = got.content if got.content or not calls else None
            lp = self._logprobs(o.tokens) if self.logprobs else None
            ids = [t.token_id for t in o.tokens] if self.return_token_ids else None
            msg = ChatMessageOut("assistant", content, calls, got.reasoning or None)
            choices.append(ChatChoice(i, msg, reason, lp, ids))
        return ChatCompletion(
            self.cid,
            self.created,
            self.model,
            choices,
            usage([o.finish for o in outs], self.n_prompt),
            prompt_token_ids=self.prompt_ids if self.return_token_ids else None,
        )

    def _chunk(
        self, i: int, delta: ChatDelta, finish: str | None = None, lp: ChoiceLogprobs | None = None
    ) -> bytes:
        choice = ChatChunkChoice(i, delta, finish, lp)
        return sse.event(ChatCompletionChunk(self.cid, self.created, self.model, [choice]))

    def progress(self, i: int, ev: ProgressEvent) -> list[bytes]:
        if not self.progress_chunks:
            return []
        p = PromptProgress(ev.total, ev.cached, ev.processed, round(ev.seconds * 1000, 3))
        return [sse.event(ChatProgressChunk(self.cid, self.created, self.model, [], p))]

    def start(self, i: int) -> list[bytes]:
        self._parser = self.reader.parser()
        return [self._chunk(i, ChatDelta(role="assistant", content=""))]

    def token(self, i: int, ev: TokenEvent) -> list[bytes]:
        assert self._parser is not None
        lp = self._logprobs([ev]) if self.logprobs else None
        deltas = chat_deltas(self._parser.feed(ev.text))
        if lp and not deltas:
            deltas = [ChatDelta(content="")]
        return [self._chunk(i, d, None, lp if k == 0 else None) for k, d in enumerate(deltas)]

    def finish(self, i: int, ev: FinishEvent) -> list[bytes]:
        assert self._parser is not None
        self.finished.append(ev)
        self._parser.feed(ev.text)
        last, whole = self._parser.finish()
        reason = "tool_calls" if whole.calls else FINISH.get(ev.reason, "stop")
        out = [self._chunk(i, d) for d in chat_deltas(last)]
        out.append(self._chunk(i, ChatDelta(), reason))
        return out

    def end(self) -> list[bytes]:
        out = []
        if self.include_usage:
            u = usage(self.finished, self.n_prompt)
            out.append(
                sse.event(ChatCompletionChunk(self.cid, self.created, self.model, [], usage=u))
            )
        return [*out, sse.DONE]


def _piece_lp(info: ModelInfo, tok_id: int, lp: float) -> tuple[str, float, list[int]]:
    s, b = _piece(info, tok_id)
    return s, lp, b


@dataclass(slots=True)
class CompletionRenderer(_Base):
    """``/v1/completions``: ``per_prompt`` engine requests for each of ``prompts``
    (text, ids); ``n`` choices each (the best ``n`` by log-probability when
    ``per_prompt`` > ``n``, i.e. ``best_of``).  ``echo`` puts the prompt before the
    text, with its tokens' log-probabilities first when ``logprobs`` is asked for (the
    first one null), as the legacy API does."""

    prompts: list[tuple[str, list[int]]] = field(default_factory=list)
    per_prompt: int = 1
    n: int = 1
    echo: bool = False
    logprobs: bool = False
    _offset: int = 0

    def _logprobs(self, events: list[TokenEvent], offset: int) -> CompletionLogprobs:
        out = CompletionLogprobs([], [], [], [])
        for ev in events:
            self._add(out, ev.token_id, ev.logprob, ev.top_logprobs, offset)
            offset += len(ev.text)
        return out

    def _add(
        self,
        lp: CompletionLogprobs,
        token: int,
        logprob: float | None,
        top: tuple[tuple[int, float], ...] | None,
        offset: int,
    ) -> None:
        lp.tokens.append(_piece(self.info, token)[0])
        lp.token_logprobs.append(logprob)
        lp.top_logprobs.append({_piece(self.info, t)[0]: v for t, v in top} if top else None)
        lp.text_offset.append(offset)

    def _prompt_logprobs(self, j: int, ev: PromptEvent | None) -> CompletionLogprobs:
        """The prompt's tokens with their log-probabilities (null for the first)."""
        out = CompletionLogprobs([], [], [], [])
        ids = self.prompts[j][1]
        offset = 0
        for k, tok in enumerate(ids):
            lp = ev.logprobs[k] if ev is not None else None
            top = ev.top[k] if ev is not None and k else None
            self._add(out, tok, lp, top, offset)
            offset += len(_piece(self.info, tok)[0])
        return out

    def body(self, outs: list[Outcome]) -> Completion:
        choices: list[CompletionChoice] = []
        for j, (text, ids) in enumerate(self.prompts):
            group = outs[j * self.per_prompt : (j + 1) * self.per_prompt]
            if self.per_prompt > self.n:
                group = sorted(group, key=lambda o: o.cum_logprob, reverse=True)[: self.n]
            prefix = text if self.echo else ""
            for o in group:
                lp = None
                if self.logprobs:
                    lp = self._logprobs(o.tokens, len(prefix))
                    if self.echo:
                        head = self._prompt_logprobs(j, o.prompt)
                        lp = CompletionLogprobs(
                            head.tokens + lp.tokens,
                            head.token_logprobs + lp.token_logprobs,
                            head.top_logprobs + lp.top_logprobs,
                            head.text_offset + lp.text_offset,
                        )
                choices.append(
                    CompletionChoice(
                        len(choices),
                        prefix + o.text,
                        o.reason,
                        lp,
                        ids if self.return_token_ids else None,
                        [t.token_id for t in o.tokens] if self.return_token_ids else None,
                    )
                )
        u = usage([o.finish for o in outs], self.n_prompt)
        return Completion(self.cid, self.created, self.model, choices, u)

    @property
    def n_prompt(self) -> int:
        return sum(len(ids) for _, ids in self.prompts)

    def _chunk(
        self, i: int, text: str, finish: str | None = None, lp: CompletionLogprobs | None = None
    ) -> bytes:
        choice = CompletionChoice(i, text, finish, lp)
        return sse.event(Completion(self.cid, self.created, self.model, [choice]))

    def start(self, i: int) -> list[bytes]:
        text = self.prompts[i // self.per_prompt][0]
        self._offset = len(text) if self.echo else 0
        if not self.echo or self.logprobs:  # with logprobs, the echo waits for them
            return []
        return [self._chunk(i, text)]

    def prompt(self, i: int, ev: PromptEvent) -> list[bytes]:
        j = i // self.per_prompt
        return [self._chunk(i, self.prompts[j][0], None, self._prompt_logprobs(j, ev))]

    def token(self, i: int, ev: TokenEvent) -> list[bytes]:
        lp = self._logprobs([ev], self._offset) if self.logprobs else None
        self._offset += len(ev.text)
        return [self._chunk(i, ev.text, None, lp)]

    def finish(self, i: int, ev: FinishEvent) -> list[bytes]:
        self.finished.append(ev)
        out = [self._chunk(i, ev.text)] if ev.text else []
        return [*out, self._chunk(i, "", FINISH.get(ev.reason, "stop"))]

    def end(self) -> list[bytes]:
        out = []
        if self.include_usage:
            u = usage(self.finished, self.n_prompt)
            out.append(sse.event(Completion(self.cid, self.created, self.model, [], u)))
        return [*out, sse.DONE]
