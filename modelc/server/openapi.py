"""``/openapi.json``, generated from the same msgspec Structs the handlers decode and encode."""

from __future__ import annotations

import re
from typing import Any

import msgspec

import modelc
from modelc.server import schemas as s
from modelc.server.anthropic import schemas as an
from modelc.server.errors import error_shape
from modelc.server.llamacpp import schemas as lc
from modelc.server.native import schemas as nt
from modelc.server.ollama import schemas as ol
from modelc.server.openai import schemas as oa
from modelc.server.responses import schemas as rs

# (method, path, request body, response body, summary); None response body = a stream only
ROUTES: list[tuple[str, str, type[Any] | None, type[Any] | None, str]] = [
    (
        "post",
        "/v1/chat/completions",
        oa.ChatCompletionRequest,
        oa.ChatCompletion,
        "OpenAI chat completion (SSE of ChatCompletionChunk when stream)",
    ),
    (
        "post",
        "/v1/completions",
        oa.CompletionRequest,
        oa.Completion,
        "OpenAI text completion (SSE when stream)",
    ),
    (
        "post",
        "/v1/embeddings",
        oa.EmbeddingRequest,
        oa.EmbeddingResponse,
        "OpenAI embeddings (float or base64)",
    ),
    ("get", "/v1/models", None, oa.ModelList, "The served model"),
    ("get", "/v1/models/{model}", None, oa.ModelCard, "One model by id"),
    ("post", "/complete", nt.NativeCompleteRequest, nt.NativeCompleteResponse, "Complete a prompt"),
    ("post", "/chat", nt.NativeChatRequest, nt.NativeChatResponse, "Chat reply"),
    (
        "post",
        "/chat/stream",
        nt.NativeChatRequest,
        nt.NativeStreamEvent,
        "Chat reply as SSE events",
    ),
    ("post", "/infer", nt.InferRequest, nt.InferResponse, "Batched tensor inference (MLP models)"),
    (
        "post",
        "/embeddings",
        nt.NativeEmbeddingRequest,
        nt.NativeEmbeddingResponse,
        "Embeddings (llama.cpp names accepted)",
    ),
    (
        "post",
        "/tokenize",
        lc.TokenizeRequest,
        lc.TokenizeResponse,
        "Text or messages to token ids (a llama.cpp request, with `content`, gets `tokens` only)",
    ),
    (
        "post",
        "/completion",
        lc.LlamaCompletionRequest,
        lc.LlamaCompletion,
        "llama.cpp's native completion (SSE of LlamaStreamChunk when stream)",
    ),
    ("post", "/infill", lc.LlamaInfillRequest, lc.LlamaCompletion, "Fill in the middle"),
    ("post", "/detokenize", lc.DetokenizeRequest, lc.DetokenizeResponse, "Token ids to text"),
    (
        "post",
        "/embedding",
        lc.LlamaEmbeddingRequest,
        lc.LlamaEmbedding,
        "llama.cpp's embeddings: an array of LlamaEmbedding, one per input",
    ),
    (
        "post",
        "/apply-template",
        lc.ApplyTemplateRequest,
        lc.ApplyTemplateResponse,
        "The prompt text a chat request renders (llama.cpp)",
    ),
    ("get", "/health", None, nt.HealthResponse, "Liveness: 200 ok, 503 while loading"),
    ("get", "/info", None, nt.InfoResponse, "Model information"),
    ("get", "/props", None, lc.PropsResponse, "Server properties (llama.cpp)"),
    ("get", "/api/version", None, nt.VersionResponse, "Server version"),
    ("get", "/v1/system", None, nt.SystemResponse, "Host information"),
    (
        "post",
        "/lora/load",
        nt.LoraLoadRequest,
        nt.LoraResponse,
        "Load a LoRA adapter from an allowed directory",
    ),
    ("post", "/lora/unload", nt.LoraUnloadRequest, nt.LoraResponse, "Unload LoRA adapters"),
    (
        "post",
        "/api/generate",
        ol.OllamaGenerateRequest,
        ol.OllamaGenerateChunk,
        "Ollama generate (NDJSON when stream)",
    ),
    (
        "post",
        "/api/chat",
        ol.OllamaChatRequest,
        ol.OllamaChatChunk,
        "Ollama chat (NDJSON when stream)",
    ),
    ("post", "/api/embed", ol.OllamaEmbedRequest, ol.OllamaEmbedResponse, "Ollama embeddings"),
    ("get", "/api/tags", None, ol.OllamaTags, "Ollama model list"),
    (
        "post",
        "/api/show",
        ol.OllamaShowRequest,
        ol.OllamaShowResponse,
        "Ollama model details, template and sampling defaults",
    ),
    ("get", "/api/ps", None, ol.OllamaRunningList, "Ollama: the models loaded now"),
    ("post", "/api/pull", ol.OllamaPullRequest, ol.OllamaStatus, "Ollama: pull into the store"),
    ("post", "/api/copy", ol.OllamaCopyRequest, None, "Ollama: copy a store model"),
    ("delete", "/api/delete", ol.OllamaDeleteRequest, None, "Ollama: remove a store model"),
    (
        "post",
        "/api/create",
        ol.OllamaCreateRequest,
        ol.OllamaStatus,
        "Ollama: a new store model from a model, a file or pushed blobs (files, adapters), "
        "with parameters, template, system, messages, license, quantize",
    ),
    ("head", "/api/blobs/{digest}", None, None, "Ollama: 200 if the blob was pushed, else 404"),
    ("post", "/api/blobs/{digest}", None, None, "Ollama: push a file (its sha256 digest)"),
    (
        "post",
        "/api/embeddings",
        ol.OllamaEmbeddingsRequest,
        ol.OllamaEmbeddingsResponse,
        "Ollama's older single-text embeddings",
    ),
    ("get", "/slots", None, None, "llama.cpp: the engine's sequence slots"),
    (
        "post",
        "/v1/messages",
        an.MessagesRequest,
        an.Message,
        "Anthropic Messages (SSE of Anthropic's named events when stream)",
    ),
    (
        "post",
        "/v1/messages/count_tokens",
        an.CountTokensRequest,
        an.CountTokensResponse,
        "Anthropic: the prompt tokens of a Messages request",
    ),
    (
        "post",
        "/v1/responses",
        rs.ResponsesRequest,
        rs.ResponseObject,
        "OpenAI Responses (SSE of named response.* events when stream)",
    ),
    ("get", "/v1/responses/{response_id}", None, rs.ResponseObject, "A stored response"),
    ("delete", "/v1/responses/{response_id}", None, rs.Deleted, "Forget a stored response"),
]


# each error shape's body (see modelc.server.errors.error_shape)
_ERRORS: dict[str, type[Any]] = {
    "openai": s.ErrorResponse,
    "ollama": ol.OllamaError,
    "anthropic": an.AnthropicError,
}


def _ref(t: type[Any]) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{t.__name__}"}


# routes that stream when asked (``stream: true``): SSE, or Ollama's NDJSON (its default)
_SSE = {
    "/v1/chat/completions",
    "/v1/completions",
    "/completion",
    "/infill",
    "/chat/stream",
    "/v1/messages",
    "/v1/responses",
}
_NDJSON = {"/api/generate", "/api/chat", "/api/pull", "/api/create"}
# request bodies that need one of several fields (msgspec cannot say so in the Struct)
_ONE_OF = {
    "/tokenize": ["content", "prompt", "messages"],
    "/embedding": ["content", "input"],
    "/api/show": ["model", "name"],
    "/api/pull": ["model", "name"],
    "/api/delete": ["model", "name"],
    "/api/create": ["model", "name"],
}


# one server-sent event (Open API 3.1 without ``itemSchema``: ``schema`` describes each event);
# ``data`` is the JSON text of the route's chunk type, or ``[DONE]``
_SSE_EVENT = {
    "type": "object",
    "properties": {
        "data": {"type": "string"},
        "event": {"type": "string"},
        "id": {"type": "string"},
        "retry": {"type": "integer"},
    },
    "required": ["data"],
}
# routes whose answer has one of several shapes
# responses that are a JSON array of the route's response type
_ARRAYS = {"/embedding"}

_RESPONSES: dict[str, list[type[Any]]] = {
    "/tokenize": [lc.TokenizeResponse, lc.LlamaTokenizeResponse],  # llama.cpp's `content`: tokens
}


def _body(schema: dict[str, Any], path: str) -> dict[str, Any]:
    content: dict[str, Any] = {"application/json": {"schema": schema}}
    if path in _SSE:
        content["text/event-stream"] = {"schema": _SSE_EVENT}
    if path in _NDJSON:
        content["application/x-ndjson"] = {"schema": {"type": "string"}}
    return content


def openapi_document() -> bytes:
    types = {t for _, _, req, resp, _ in ROUTES for t in (req, resp) if t is not None}
    types |= {*_ERRORS.values(), *(t for ts in _RESPONSES.values() for t in ts)}
    ordered = sorted(types, key=lambda t: t.__name__)
    _, components = msgspec.json.schema_components(
        ordered, ref_template="#/components/schemas/{name}"
    )
    paths: dict[str, dict[str, Any]] = {}
    for method, path, req, resp, summary in ROUTES:
        shape = _ERRORS[error_shape(path)]
        error = {"description": "error", "content": {"application/json": {"schema": _ref(shape)}}}
        ok: dict[str, Any] = {"description": "OK"}
        if path in _RESPONSES:
            ok["content"] = _body({"anyOf": [_ref(t) for t in _RESPONSES[path]]}, path)
        elif resp is not None and path in _ARRAYS:
            ok["content"] = _body({"type": "array", "items": _ref(resp)}, path)
        elif resp is not None:
            ok["content"] = _body(_ref(resp), path)
        elif path in _SSE or path in _NDJSON:
            ok["content"] = _body({"type": "string"}, path)
        op: dict[str, Any] = {
            "summary": summary,
            "responses": {"200": ok, "4XX": error, "5XX": error},
        }
        if req is not None:
            schema: dict[str, Any] = _ref(req)
            if path in _ONE_OF:
                schema = {
                    "allOf": [schema],
                    "anyOf": [{"required": [f]} for f in _ONE_OF[path]],
                }
            op["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": schema}},
            }
        names = re.findall(r"\{(\w+)\}", path)
        if names:
            op["parameters"] = [
                {"name": n, "in": "path", "required": True, "schema": {"type": "string"}}
                for n in names
            ]
        paths.setdefault(path, {})[method] = op
    doc = {
        "openapi": "3.1.0",
        "info": {"title": "modelc", "version": modelc.__version__},
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
    return msgspec.json.encode(doc)
