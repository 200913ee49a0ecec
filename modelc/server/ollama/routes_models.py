"""Ollama's model management: ``/api/tags``, ``show``, ``ps``, ``pull``, ``copy``, ``delete``,
``create``, over the server's model store.

Names are store references (``name`` or ``name:version``; Ollama's ``:latest`` is the
store's default version).  ``/api/create`` makes a new store version from a store model
or a local file (``from``, or a Modelfile's ``FROM``), with its ``PARAMETER`` values as
the model's sampling defaults, ``TEMPLATE`` (a Jinja chat template, as GGUF and Hugging
Face ship them; Ollama's Go templates are refused) and ``SYSTEM`` (the system message of
a conversation that has none).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import shlex
import threading
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import trio
from quart import Blueprint, Response

from modelc.artifact import PackOptions
from modelc.artifact.format import QUANT_METHODS
from modelc.errors import ModelcError, UsageError
from modelc.server import sse
from modelc.server.context import body, ctx, json_response, stream_response, use_model
from modelc.server.errors import ParamError
from modelc.server.models import ModelRegistry
from modelc.server.ollama.schemas import (
    OllamaCopyRequest,
    OllamaCreateRequest,
    OllamaDeleteRequest,
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


def _in_store(store: Store, ref: str) -> bool:
    try:
        return store.exists(ref)
    except ModelcError:  # not a store name
        return False


def _store(models: ModelRegistry) -> Store:
    if models.store is None:
        raise ModelcError("this server has no model store")
    return models.store


def _name(*given: str | None) -> str:
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
                s.cost or info.file_size,  # its share of the memory budget once measured
                _digest(info),
                _details(info),
                expires,
                0,
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
_FROM_OLLAMA = {v: k for k, v in _PARAMETERS.items()}


@bp.post("/api/show")
async def show() -> Response:
    """The model's details, template and the sampling defaults in effect (``parameters``)."""
    req = await body(OllamaShowRequest)
    info, engine = await use_model(_name(req.model, req.name))
    fmt = info.prompt
    lines = []
    if fmt is not None:
        d = fmt.defaults
        lines = [f"{_PARAMETERS[k]:<30} {v}" for k, v in d.values.items()]
        lines.append(f"{'num_predict':<30} {d.max_tokens}")
        stops = [fmt.tokenizer.tokens[i] for i in sorted(fmt.eog_ids)] + list(d.stop)
        lines += [f"{'stop':<30} {json.dumps(t)}" for t in stops]
    template = info.chat_template or ""
    system = fmt.system if fmt is not None and fmt.system else ""
    modelfile = "\n".join(
        [f"# Modelfile of {info.model_id} (modelc)", f"FROM {info.path}"]
        + ([f'TEMPLATE """{template}"""'] if template else [])
        + ([f'SYSTEM """{system}"""'] if system else [])
        + [f"PARAMETER {line}" for line in lines]
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
        )
    )


@bp.post("/api/copy")
async def copy() -> Response:
    req = await body(OllamaCopyRequest)
    store = _store(ctx().state.models)
    await trio.to_thread.run_sync(store.cp, req.source, req.destination)
    return Response(b"", status=200)


@bp.delete("/api/delete")
async def delete() -> Response:
    req = await body(OllamaDeleteRequest)
    models = ctx().state.models
    name = _name(req.model, req.name)
    slot = models.find(name)
    if slot is not None and slot.pinned:
        raise ParamError(
            f"{name!r} is served from the command line; stop the server to remove it",
            param="model",
        )
    store = _store(models)
    await trio.to_thread.run_sync(lambda: store.rm(name, all_versions=":" not in name))
    if slot is not None:
        models.forget(slot)
    return Response(b"", status=200)


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
    name = _name(req.model, req.name)
    store = _store(ctx().state.models)
    if not (req.stream and is_hub_ref(name)):

        def plain() -> str:
            do_pull(name, store, quiet=True)
            return "success"

        return await _run(plain, req.stream, "pulling manifest")
    send, recv = trio.open_memory_channel[bytes](math.inf)
    token = trio.lowlevel.current_trio_token()

    def put(line: bytes) -> None:
        with contextlib.suppress(
            trio.RunFinishedError, trio.BrokenResourceError, trio.ClosedResourceError
        ):
            trio.from_thread.run_sync(send.send_nowait, line, trio_token=token)

    def progress(path: str, digest: str | None, done: int, total: int | None) -> None:
        status = f"pulling {digest[:12]}" if digest else f"pulling {path}"
        put(
            sse.ndjson(
                OllamaPullProgress(status, f"sha256:{digest}" if digest else "", total or 0, done)
            )
        )

    def work() -> None:
        try:
            do_pull(name, store, quiet=True, file_progress=progress)
            for status in ("verifying sha256 digest", "writing manifest", "success"):
                put(sse.ndjson(OllamaStatus(status)))
        except ModelcError as e:
            put(sse.ndjson({"error": str(e)}))
        finally:
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(send.close, trio_token=token)

    async def lines() -> AsyncIterator[bytes]:
        yield sse.ndjson(OllamaStatus("pulling manifest"))
        # a plain thread: the stream yields while it runs, which a nursery would not allow
        threading.Thread(target=work, name="modelc-pull", daemon=True).start()
        async with recv:
            async for line in recv:
                yield line

    return stream_response(lines(), sse.NDJSON_HEADERS)


def parse_modelfile(text: str) -> dict[str, Any]:
    """A Modelfile's FROM, PARAMETER, TEMPLATE and SYSTEM (as /api/create's fields)."""
    out: dict[str, Any] = {"parameters": {}}
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        i += 1
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        rest = rest.strip()
        if rest.startswith('"""'):  # a block, maybe over several lines
            body_ = rest[3:]
            while not body_.endswith('"""') and i < len(lines):
                body_ += "\n" + lines[i]
                i += 1
            if not body_.endswith('"""'):
                raise ParamError('a """ block in the Modelfile is not closed', param="modelfile")
            rest = body_[:-3]
        key = word.upper()
        if key == "FROM":
            out["from"] = rest
        elif key in ("TEMPLATE", "SYSTEM"):
            out[key.lower()] = rest
        elif key == "PARAMETER":
            name, _, value = rest.partition(" ")
            vals = out["parameters"].setdefault(name, [])
            vals.append(value.strip())
        else:
            raise ParamError(
                f"Modelfile instruction {word!r} is not supported (FROM, PARAMETER, TEMPLATE, "
                "SYSTEM)",
                param="modelfile",
            )
    return out


def _generation(parameters: dict[str, Any]) -> dict[str, Any]:
    """Modelfile/``parameters`` values as the model's generation defaults."""
    gen: dict[str, Any] = {}
    for name, value in parameters.items():
        values = value if isinstance(value, list) else [value]
        if name == "stop":
            gen["stop"] = [_unquote(v) for v in values]
            continue
        if name == "num_predict":  # a request without a limit stops here
            n = int(float(values[-1]))
            if n > 0:
                gen["num_predict"] = n
            continue
        key = _FROM_OLLAMA.get(name)
        if key is None:
            raise ParamError(
                f"parameter {name!r} is not supported; use "
                f"{', '.join(sorted([*_FROM_OLLAMA, 'stop']))}",
                param="parameters",
            )
        try:
            gen[key] = float(values[-1])
        except (TypeError, ValueError) as e:
            raise ParamError(f"parameter {name} needs a number, got {values[-1]!r}") from e
    return gen


def _unquote(v: Any) -> str:
    s = str(v)
    if len(s) >= 2 and s[0] == s[-1] == '"':
        return str(shlex.split(s)[0])
    return s


def _check_template(template: str) -> None:
    if "{{ ." in template or "{{- ." in template or "{{.Prompt" in template:
        raise ParamError(
            "TEMPLATE looks like an Ollama Go template; modelc renders Jinja chat templates "
            "(as GGUF files and Hugging Face tokenizer_config.json carry them)",
            param="template",
        )


@bp.post("/api/create")
async def create() -> Response:
    req = await body(OllamaCreateRequest)
    name = _name(req.model, req.name)
    spec: dict[str, Any] = parse_modelfile(req.modelfile) if req.modelfile else {"parameters": {}}
    if req.from_:
        spec["from"] = req.from_
    if req.template is not None:
        spec["template"] = req.template
    if req.system is not None:
        spec["system"] = req.system
    spec["parameters"].update(req.parameters or {})
    source = spec.get("from")
    if not source:
        raise ParamError("give the base model in 'from' (or a Modelfile's FROM)", param="from")
    if spec.get("template"):
        _check_template(spec["template"])
    gen = _generation(spec["parameters"])
    opts = _pack_options(req.quantize)
    models = ctx().state.models
    store = _store(models)

    def work() -> str:
        from modelc.artifact import load_artifact
        from modelc.formats import load_model

        path = Path(source).expanduser()
        slot = models.find(source)
        if path.exists():
            ir = load_model(path)
        elif slot is not None and slot.path is not None:  # a served model, by any name
            ir = load_artifact(slot.path)
        elif _in_store(store, source):
            ir = load_artifact(store.resolve(source))
        else:
            raise UsageError(
                f"{source!r} is neither a store model nor a file on the server", param="from"
            )
        if "template" in spec:
            ir.chat_template = spec["template"] or None
        if "system" in spec:
            ir.generation["system"] = spec["system"]
        ir.generation.update(gen)  # over the file's own recommendation
        store.add(ir, name, opts)
        return "success"

    what = (
        f"quantizing {source} to {req.quantize}"
        if req.quantize
        else f"creating {name} from {source}"
    )
    return await _run(work, req.stream, what)


def _pack_options(quantize: str | None) -> PackOptions | None:
    """``quantize`` (Ollama's ``q4_K_M``, ``q8_0``, ...) as pack options: the same methods
    as ``modelc pack --quantize``, case-insensitive."""
    if quantize is None:
        return None
    method = quantize.lower()
    if method not in QUANT_METHODS:
        raise ParamError(
            f"quantize {quantize!r} is not supported; use one of {', '.join(QUANT_METHODS)}",
            param="quantize",
        )
    return PackOptions(quantize=method)
