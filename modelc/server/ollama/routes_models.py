"""Ollama's model management: ``/api/tags``, ``show``, ``ps``, ``pull``, ``copy``, ``delete``,
over the server's model store (``/api/create`` and ``/api/blobs``:
:mod:`~modelc.server.ollama.routes_create`).

Names are store references (``name`` or ``name:version``; Ollama's ``:latest`` is the
store's default version).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import threading
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import trio
from quart import Blueprint, Response

from modelc.errors import ModelcError
from modelc.server import sse
from modelc.server.context import body, ctx, json_response, stream_response, use_model
from modelc.server.errors import ParamError
from modelc.server.logging import logger
from modelc.server.models import ModelRegistry
from modelc.server.ollama.schemas import (
    OllamaCopyRequest,
    OllamaDeleteRequest,
    OllamaMessage,
    OllamaModel,
    OllamaModelDetails,
    OllamaPullProgress,
    OllamaPullRequest,
    OllamaRunning,
    OllamaRunningList,
    OllamaShowRequest,
    OllamaShowResponse,
    OllamaStatus,
    OllamaTags,
)
from modelc.server.state import ModelInfo
from modelc.store import Store

bp = Blueprint("ollama_models", __name__)


def _time(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def _size(info: ModelInfo) -> str:
    return f"{info.n_params / 1e6:.0f}M" if info.n_params < 1e9 else f"{info.n_params / 1e9:.1f}B"


def _digest(info: ModelInfo) -> str:
    """An identifier of the file (its path, size and time; not a hash of its bytes)."""
    key = f"{info.path}:{info.file_size}:{info.created}".encode()
    return hashlib.sha256(key).hexdigest()


def _details(info: ModelInfo) -> OllamaModelDetails:
    return OllamaModelDetails(
        "", "modelc", info.architecture, [info.architecture], _size(info), info.quantization
    )


def in_store(store: Store, ref: str) -> bool:
    try:
        return store.exists(ref)
    except ModelcError:  # not a store name
        return False


def store_of(models: ModelRegistry) -> Store:
    if models.store is None:
        raise ModelcError("this server has no model store")
    return models.store


def model_name(*given: str | None) -> str:
    for g in given:
        if g:
            return g
    raise ParamError("give the model's name in 'model'", param="model")


@bp.get("/api/tags")
async def tags() -> Response:
    listed = await trio.to_thread.run_sync(ctx().state.models.listing)
    return json_response(
        OllamaTags(
            [
                OllamaModel(
                    name,
                    name,
                    _time(info.created),
                    info.file_size,
                    _digest(info),
                    _details(info),
                )
                for name, info in listed
            ]
        )
    )


@bp.get("/api/ps")
async def ps() -> Response:
    out = []
    now = trio.current_time()
    for s in ctx().state.models.loaded():
        info = s.info
        assert info is not None
        left = s.expires - now
        # never: now + the longest Go duration (2**63 ns), as Ollama shows "Forever"
        expires = _time(datetime.now(UTC).timestamp() + min(left, 2**63 / 1e9))
        out.append(
            OllamaRunning(
                s.name,
                s.name,
                # its share of the memory budgets once measured; size_vram the GPU's part
                (s.cost or info.file_size) + s.gpu_cost,
                _digest(info),
                _details(info),
                expires,
                s.gpu_cost,
                info.n_ctx,
            )
        )
    return json_response(OllamaRunningList(out))


# Modelfile PARAMETER names of the sampling defaults (Ollama's spelling) and back
_PARAMETERS = {
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "repetition_penalty": "repeat_penalty",
    "repeat_last_n": "repeat_last_n",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
}
FROM_OLLAMA = {v: k for k, v in _PARAMETERS.items()}


@bp.post("/api/show")
async def show() -> Response:
    """The model's details, template and the sampling defaults in effect (``parameters``)."""
    req = await body(OllamaShowRequest)
    info, engine = await use_model(model_name(req.model, req.name))
    fmt = info.prompt
    lines = []
    if fmt is not None:
        d = fmt.defaults
        lines = [f"{_PARAMETERS[k]:<30} {v}" for k, v in d.values.items()]
        lines.append(f"{'num_predict':<30} {d.max_tokens}")
        eog = [fmt.tokenizer.tokens[i] for i in sorted(fmt.eog_ids)]
        stops = list(dict.fromkeys(eog + list(d.stop)))  # each once
        lines += [f"{'stop':<30} {json.dumps(t)}" for t in stops]
    template = info.chat_template or ""
    system = fmt.system if fmt is not None and fmt.system else ""
    messages = [
        OllamaMessage(str(m.get("role", "")), str(m.get("content", "")))
        for m in (fmt.messages if fmt is not None else ())
    ]
    modelfile = "\n".join(
        [f"# Modelfile of {info.model_id} (modelc)", f"FROM {info.path}"]
        + ([f'TEMPLATE """{template}"""'] if template else [])
        + ([f'SYSTEM """{system}"""'] if system else [])
        + [f"PARAMETER {line}" for line in lines]
        + [f'MESSAGE {m.role} """{m.content}"""' for m in messages]
        + ([f'LICENSE """{info.license}"""'] if info.license else [])
    )
    model_info: dict[str, Any] = {
        "general.architecture": info.architecture,
        "general.parameter_count": info.n_params,
        f"{info.architecture}.context_length": info.n_ctx,
        f"{info.architecture}.vocab_size": info.n_vocab,
    }
    return json_response(
        OllamaShowResponse(
            modelfile,
            "\n".join(lines),
            template,
            _details(info),
            model_info,
            info.capabilities() + (["vision"] if engine.vision is not None else []),  # Ollama's
            _time(info.created),
            system,
            info.license,
            messages,
        )
    )


@bp.post("/api/copy")
async def copy() -> Response:
    req = await body(OllamaCopyRequest)
    store = store_of(ctx().state.models)
    await trio.to_thread.run_sync(store.cp, req.source, req.destination)
    return Response(b"", status=200)


@bp.delete("/api/delete")
async def delete() -> Response:
    req = await body(OllamaDeleteRequest)
    models = ctx().state.models
    name = model_name(req.model, req.name)
    slot = models.find(name)
    if slot is not None and slot.pinned:
        raise ParamError(
            f"{name!r} is served from the command line; stop the server to remove it",
            param="model",
        )
    store = store_of(models)
    await trio.to_thread.run_sync(lambda: store.rm(name, all_versions=":" not in name))
    if slot is not None:
        models.forget(slot)
    return Response(b"", status=200)


def thread_lines(work: Callable[[Callable[[Any], None]], None], what: str) -> AsyncIterator[bytes]:
    """Run ``work(say)`` in a plain thread (the stream yields while it runs, which a nursery
    would not allow): each object it says is one NDJSON line; an error it raises is raised
    here, so that the stream reports it in its last line."""
    send, recv = trio.open_memory_channel[bytes | ModelcError](math.inf)
    token = trio.lowlevel.current_trio_token()

    def put(item: bytes | ModelcError) -> None:
        with contextlib.suppress(
            trio.RunFinishedError, trio.BrokenResourceError, trio.ClosedResourceError
        ):
            trio.from_thread.run_sync(send.send_nowait, item, trio_token=token)

    def run() -> None:
        try:
            work(lambda obj: put(sse.ndjson(obj)))
        except ModelcError as e:
            put(e)
        except Exception as e:  # reported as the 500 it is, not lost with the thread
            logger().error("thread_error", what=what, error=repr(e), exc_info=True)
            put(ModelcError(f"{what} failed: {type(e).__name__}"))
        finally:
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(send.close, trio_token=token)

    async def lines() -> AsyncIterator[bytes]:
        threading.Thread(target=run, name=f"modelc-{what}", daemon=True).start()
        async with recv:
            async for item in recv:
                if isinstance(item, ModelcError):
                    raise item
                yield item

    return lines()


async def _run(work: Callable[[], str], stream: bool, first: str) -> Response:
    """Run ``work`` in a thread; its result is the final status.  Streaming (Ollama's
    default), a ``first`` status line goes out at once and the final one at the end."""
    if not stream:
        return json_response(OllamaStatus(await trio.to_thread.run_sync(work)))

    async def lines() -> AsyncIterator[bytes]:
        yield sse.ndjson(OllamaStatus(first))
        yield sse.ndjson(OllamaStatus(await trio.to_thread.run_sync(work)))

    return stream_response(lines(), sse.NDJSON_HEADERS)


@bp.post("/api/pull")
async def pull() -> Response:
    """Pull a catalog model, a Hub model or a URL into the store (``modelc pull``).

    Streamed, a Hub pull sends Ollama's lines: ``pulling manifest``, then per file
    ``pulling <digest>`` with ``digest`` / ``total`` / ``completed``, then ``verifying
    sha256 digest``, ``writing manifest``, ``success`` (or one ``error`` line)."""
    from modelc.hub import is_hub_ref
    from modelc.pull import pull as do_pull

    req = await body(OllamaPullRequest)
    name = model_name(req.model, req.name)
    store = store_of(ctx().state.models)
    if not (req.stream and is_hub_ref(name)):

        def plain() -> str:
            do_pull(name, store, quiet=True)
            return "success"

        return await _run(plain, req.stream, "pulling manifest")

    def work(say: Callable[[Any], None]) -> None:
        def progress(path: str, digest: str | None, done: int, total: int | None) -> None:
            status = f"pulling {digest[:12]}" if digest else f"pulling {path}"
            sha = f"sha256:{digest}" if digest else ""
            say(OllamaPullProgress(status, sha, total or 0, done))

        do_pull(name, store, quiet=True, file_progress=progress)
        for status in ("verifying sha256 digest", "writing manifest", "success"):
            say(OllamaStatus(status))

    async def lines() -> AsyncIterator[bytes]:
        yield sse.ndjson(OllamaStatus("pulling manifest"))
        async for line in thread_lines(work, "pull"):
            yield line

    return stream_response(lines(), sse.NDJSON_HEADERS)
