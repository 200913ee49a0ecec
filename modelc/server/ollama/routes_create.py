"""Ollama's model creation: ``HEAD``/``POST /api/blobs/:digest`` and ``POST /api/create``.

A client pushes each file of a model as a blob (its bytes, named by their SHA-256;
:mod:`modelc.blobs` keeps them in the store), then creates a model from them::

    {"model": "fred", "files": {"model.gguf": "sha256:..."}}
    {"model": "fred", "files": {"config.json": "sha256:...", "tokenizer.json": "sha256:...",
                                "model.safetensors": "sha256:..."}}

or ``from`` a model the server has (a store name, a served model, a file on the server's
disk), with ``template`` (Jinja, as GGUF and Hugging Face ship them; Ollama's Go templates
are refused), ``system``, ``parameters`` (the model's sampling defaults), ``messages``
(the turns every conversation starts with), ``license``, ``adapters`` (a PEFT LoRA,
merged into the weights) and ``quantize`` (``modelc pack --quantize``'s methods).  The
result is a new store version, packed once; streamed, the progress is Ollama's lines
(``parsing GGUF`` / ``converting model`` / ``reading model metadata``, ``using existing
layer sha256:...``, ``quantizing F16 model to Q4_K_M``, ``writing manifest``,
``success``).  What a request gets wrong (an unknown blob or base model, a bad
``quantize``) is one 400 line before anything is written.
"""

from __future__ import annotations

import contextlib
import shlex
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
from quart import Blueprint, Response, request

from modelc.artifact import PackOptions
from modelc.artifact.format import QUANT_METHODS
from modelc.blobs import BlobStore, parse_digest
from modelc.errors import ModelNotFoundError, UsageError
from modelc.formats import detect_format
from modelc.formats.ir import ModelIR
from modelc.server import sse
from modelc.server.context import body, ctx, json_response, stream_response
from modelc.server.errors import ParamError
from modelc.server.models import ModelRegistry
from modelc.server.ollama.routes_models import (
    FROM_OLLAMA,
    in_store,
    model_name,
    store_of,
    thread_lines,
)
from modelc.server.ollama.schemas import OllamaCreateRequest, OllamaPullProgress, OllamaStatus
from modelc.store import Store, parse_ref

bp = Blueprint("ollama_create", __name__)

_CHUNK = 4 << 20  # bytes of a pushed blob hashed and written at a time


@bp.route("/api/blobs/<digest>", methods=["HEAD"])
async def blob_exists(digest: str) -> Response:
    """200 if the blob was pushed, 404 if not (400: not a ``sha256:`` digest)."""
    blobs = store_of(ctx().state.models).blobs
    if not blobs.has(digest):
        raise ModelNotFoundError(f'blob "{digest}" not found')
    return Response(b"", status=200)


@bp.post("/api/blobs/<digest>")
async def blob_push(digest: str) -> Response:
    """Stream the body into the store under ``digest``: 201, or 400 (and nothing kept) when
    its bytes hash to something else; 200 when the blob is already there."""
    blobs = store_of(ctx().state.models).blobs
    if blobs.has(digest):
        async for _ in request.body:  # read to its end, so that the connection stays usable
            pass
        return Response(b"", status=200)
    stack = contextlib.ExitStack()
    w = stack.enter_context(blobs.writer(digest))
    try:
        pending = bytearray()
        async for chunk in request.body:
            pending += chunk
            if len(pending) >= _CHUNK:
                await trio.to_thread.run_sync(w.write, bytes(pending))
                pending.clear()
        await trio.to_thread.run_sync(w.write, bytes(pending))
    except BaseException:
        stack.__exit__(*sys.exc_info())  # the partial file goes
        raise
    await trio.to_thread.run_sync(stack.close)  # the hash check, fsync and rename
    return Response(b"", status=201)


# -- /api/create ---------------------------------------------------------------------------
@dataclass(slots=True)
class Recipe:
    """What ``/api/create`` makes a model from, and what it sets on it."""

    name: str
    source: str | None = None  # ``from``: a store name, a served model or a file
    files: dict[str, str] = field(default_factory=dict)  # file name -> blob digest
    adapters: dict[str, str] = field(default_factory=dict)
    template: str | None = None
    system: str | None = None
    generation: dict[str, Any] = field(default_factory=dict)  # sampling defaults
    messages: list[dict[str, Any]] = field(default_factory=list)
    license: str | None = None
    quantize: str | None = None  # Ollama's spelling, for the status line
    pack: PackOptions | None = None


def recipe_of(req: OllamaCreateRequest) -> Recipe:
    """The request's fields (over an older client's ``modelfile``), checked."""
    name = model_name(req.model, req.name)
    try:
        parse_ref(name)
    except UsageError as e:
        raise ParamError(str(e), param="model") from e
    spec: dict[str, Any] = parse_modelfile(req.modelfile) if req.modelfile else {"parameters": {}}
    spec["parameters"].update(req.parameters or {})
    template = req.template if req.template is not None else spec.get("template")
    if template:
        _check_template(template)
    licenses = [req.license] if isinstance(req.license, str) else req.license
    if licenses is None and "license" in spec:
        licenses = [spec["license"]]
    messages = [
        {"role": m.role, "content": m.content}
        | ({"tool_calls": m.tool_calls} if m.tool_calls else {})
        for m in req.messages or []
    ]
    return Recipe(
        name=name,
        source=req.from_ or spec.get("from"),
        files=dict(req.files or {}),
        adapters=dict(req.adapters or {}),
        template=template,
        system=req.system if req.system is not None else spec.get("system"),
        generation=_generation(spec["parameters"]),
        messages=messages or spec.get("messages", []),
        license="\n".join(licenses) if licenses is not None else None,
        quantize=req.quantize,
        pack=_pack_options(req.quantize),
    )


Say = Callable[[Any], None]


@dataclass(frozen=True, slots=True)
class Base:
    """Where the new model's weights come from, found before anything is written."""

    path: Path
    packed: bool  # a .modelc file (else a source format: GGUF, safetensors, a directory)


def find_base(recipe: Recipe, models: ModelRegistry, store: Store) -> Base | None:
    """``from`` as a file, a served model or a store model (400 when none); None when the
    model comes from ``files`` (``from`` wins when both are given, as in Ollama)."""
    source = recipe.source
    if not source:
        if not recipe.files:
            raise ParamError("neither 'from' or 'files' was specified", param="from")
        store.blobs.resolve(recipe.files, "files")
        return None
    path = Path(source).expanduser()
    slot = models.find(source)
    if path.exists():  # a file on the server (a .modelc one too: show's Modelfile names it)
        return Base(path, packed=detect_format(path) == "modelc")
    if slot is not None and slot.path is not None:  # a served model, by any name
        return Base(slot.path, packed=True)
    if in_store(store, source):
        return Base(store.resolve(source), packed=True)
    raise UsageError(
        f"model {source!r} not found: neither a store model nor a file on the server",
        param="from",
    )


def build(recipe: Recipe, base: Base | None, store: Store, say: Say) -> None:
    """Load the base, apply the recipe, pack it into the store (runs in a thread)."""
    from modelc.artifact import load_artifact
    from modelc.formats import load_model

    if base is None:
        with store.blobs.staged(recipe.files) as staged:
            path = _model_path(staged, recipe.files, say)
            finish(load_model(path), recipe, store, say)
        return
    say(OllamaStatus("reading model metadata"))
    ir = load_artifact(base.path) if base.packed else load_model(base.path)
    finish(ir, recipe, store, say)


def _model_path(staged: Path, files: dict[str, str], say: Say) -> Path:
    """The GGUF among ``files`` (the first part of a split one), or the directory of a
    safetensors model (Ollama's rules: a name's suffix, else a GGUF's magic)."""
    names = sorted(files)
    ggufs = [n for n in names if n.endswith(".gguf") or _is_gguf(staged / n)]
    if ggufs:
        say(OllamaStatus("parsing GGUF"))
    elif any(n.endswith(".safetensors") for n in names):
        say(OllamaStatus("converting model"))
    else:
        raise ParamError(
            "unknown type: files must hold a GGUF, or a safetensors model with its "
            "config.json and tokenizer files",
            param="files",
        )
    for n in names:
        say(OllamaStatus(f"using existing layer sha256:{parse_digest(files[n])}"))
    return staged / ggufs[0] if ggufs else staged


def _is_gguf(p: Path) -> bool:
    with p.open("rb") as f:
        return f.read(4) == b"GGUF"


def finish(ir: ModelIR, recipe: Recipe, store: Store, say: Say) -> None:
    """Set the recipe's template, system, messages, defaults and license; pack into the store."""
    if recipe.adapters:
        say(OllamaStatus("converting adapter"))
        _merge_adapters(ir, recipe.adapters, store.blobs)
    if recipe.template is not None:
        ir.chat_template = recipe.template or None
    if recipe.system is not None:
        ir.generation["system"] = recipe.system
    if recipe.messages:
        ir.generation["messages"] = recipe.messages
    if recipe.license is not None:
        ir.metadata["general.license"] = recipe.license
    ir.generation.update(recipe.generation)  # over the file's own recommendation
    progress = None
    if recipe.pack is not None:
        status = f"quantizing {_dominant_type(ir)} model to {str(recipe.quantize).upper()}"
        shown = -1

        def progress(done: int, total: int, _name: str) -> None:
            nonlocal shown
            if done * 100 // max(total, 1) > shown:  # a line a percent
                shown = done * 100 // max(total, 1)
                say(OllamaPullProgress(status, "0", total, done))

    store.add(ir, recipe.name, recipe.pack, progress=progress)
    say(OllamaStatus("writing manifest"))


def _dominant_type(ir: ModelIR) -> str:
    counts: dict[str, int] = {}
    for t in ir.tensors.values():
        counts[t.dtype.value] = counts.get(t.dtype.value, 0) + t.n_elements
    return max(counts, key=lambda k: counts[k]).upper() if counts else "F32"


def _merge_adapters(ir: ModelIR, adapters: dict[str, str], blobs: BlobStore) -> None:
    """A PEFT LoRA (``adapter_config.json`` and ``adapter_model.safetensors``) merged into
    the weights for good."""
    from modelc.runtime.lora import CONFIG_NAME, WEIGHTS_NAME, load_adapter, merge_into_ir

    if any(n.endswith(".gguf") for n in adapters):
        raise ParamError(
            "GGUF LoRA adapters are not supported; push the PEFT adapter's "
            f"{CONFIG_NAME} and {WEIGHTS_NAME} (safetensors) as 'adapters'",
            param="adapters",
        )
    weights = [n for n in adapters if n.endswith(".safetensors")]
    with blobs.staged(adapters, "adapters") as staged:  # the config must be adapter_config.json
        merge_into_ir(ir, load_adapter(staged / weights[0] if len(weights) == 1 else staged))


@bp.post("/api/create")
async def create() -> Response:
    req = await body(OllamaCreateRequest)
    recipe = recipe_of(req)
    models = ctx().state.models
    store = store_of(models)
    slot = models.find(recipe.name)
    if slot is not None and slot.pinned:
        raise ParamError(
            f"{recipe.name!r} is served from the command line; create under another name",
            param="model",
        )
    store.blobs.resolve(recipe.adapters, "adapters")
    base = find_base(recipe, models, store)

    def done() -> None:
        """A loaded model of that name (or the name alone: its current version moved) is the
        old one: it goes now, or once its requests in flight end; the next request loads
        the new one."""
        for ref in {recipe.name, parse_ref(recipe.name)[0]}:
            old = models.find(ref)
            if old is None or old.pinned:
                continue
            if old.active:
                old.keep_alive, old.path = 0.0, None  # unload when done; look the file up again
            else:
                models.forget(old)

    if not req.stream:
        await trio.to_thread.run_sync(build, recipe, base, store, lambda _: None)
        done()
        return json_response(OllamaStatus("success"))

    async def lines() -> AsyncIterator[bytes]:
        async for line in thread_lines(lambda say: build(recipe, base, store, say), "create"):
            yield line
        done()
        yield sse.ndjson(OllamaStatus("success"))

    return stream_response(lines(), sse.NDJSON_HEADERS)


# -- Modelfiles and parameters -------------------------------------------------------------
def parse_modelfile(text: str) -> dict[str, Any]:
    """A Modelfile's FROM, PARAMETER, TEMPLATE, SYSTEM, MESSAGE and LICENSE (as
    /api/create's fields)."""
    out: dict[str, Any] = {"parameters": {}}
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        i += 1
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        key = word.upper()
        role = ""
        if key == "MESSAGE":  # MESSAGE <role> <text or a block>
            role, _, rest = rest.strip().partition(" ")
        rest = rest.strip()
        if rest.startswith('"""'):  # a block, maybe over several lines
            body_ = rest[3:]
            while not body_.endswith('"""') and i < len(lines):
                body_ += "\n" + lines[i]
                i += 1
            if not body_.endswith('"""'):
                raise ParamError('a """ block in the Modelfile is not closed', param="modelfile")
            rest = body_[:-3]
        if key == "FROM":
            out["from"] = rest
        elif key in ("TEMPLATE", "SYSTEM", "LICENSE"):
            out[key.lower()] = rest
        elif key == "MESSAGE":
            out.setdefault("messages", []).append({"role": role, "content": rest})
        elif key == "PARAMETER":
            name, _, value = rest.partition(" ")
            vals = out["parameters"].setdefault(name, [])
            vals.append(value.strip())
        else:
            raise ParamError(
                f"Modelfile instruction {word!r} is not supported (FROM, PARAMETER, TEMPLATE, "
                "SYSTEM, MESSAGE, LICENSE)",
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
        key = FROM_OLLAMA.get(name)
        if key is None:
            raise ParamError(
                f"parameter {name!r} is not supported; use "
                f"{', '.join(sorted([*FROM_OLLAMA, 'stop']))}",
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
