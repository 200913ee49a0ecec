"""The one place where exceptions become HTTP responses with an OpenAI error object.

``{"error": {"message", "type", "param", "code"}}`` (Ollama's ``/api/`` routes get
``{"error": "<message>"}``, the shape its clients read): a :class:`~modelc.errors.ModelcError`
answers with its ``http_status`` and ``error_type``; a body that does not decode
(broken JSON) or does not validate (wrong type, out of range, missing field) is a
400 naming the field in ``param``; an HTTP error from routing (404, 405, 413) keeps
its status; anything else is a 500 without internals.
"""

from __future__ import annotations

import re
from typing import Literal

import msgspec
from werkzeug.exceptions import HTTPException

from modelc.errors import CapacityError, ModelcError, ModelNotFoundError, UsageError
from modelc.server.schemas import ENCODER, ErrorDetail, ErrorResponse


class AuthError(ModelcError):
    """Missing or wrong API key."""

    http_status = 401
    error_type = "authentication_error"


class RateLimitError(ModelcError):
    """Too many requests from one client address."""

    http_status = 429
    error_type = "rate_limit_error"

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class NotImplementedFeature(ModelcError):
    """The server knows the endpoint but this build or model cannot do it."""

    http_status = 501
    error_type = "not_implemented_error"


class ForbiddenError(ModelcError):
    """The request is understood but not allowed (e.g. an adapter outside the allowed dirs)."""

    http_status = 403
    error_type = "permission_error"


class LoadingError(ModelcError):
    """The model is still loading."""

    http_status = 503
    error_type = "server_overloaded"


class MemoryBudgetError(ModelcError):
    """A model does not fit in the server's memory budget (``--max-memory``), whatever is
    unloaded: 503, the line says what would fit."""

    http_status = 503
    error_type = "server_error"


_PATH_RE = re.compile(r" - at (?:`key` in )?`\$\.?([^`]*)`$")  # a value's or a key's path
_HTTP_TYPES = {
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
}
_CODES = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}


def error_body(
    message: str, type_: str, param: str | None = None, code: str | None = None
) -> bytes:
    return ENCODER.encode(ErrorResponse(error=ErrorDetail(message, type_, param, code)))


Shape = Literal["openai", "ollama", "anthropic"]

# Anthropic's error types by status (its API's ``error.type``)
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def is_ollama(path: str) -> bool:
    """Ollama's routes (``/api/...``) answer errors in Ollama's shape."""
    return path.startswith("/api/") and path != "/api/version"


def error_shape(path: str) -> Shape:
    """The error shape a route's clients read: Ollama's on ``/api/``, Anthropic's on
    ``/v1/messages``, OpenAI's elsewhere."""
    if is_ollama(path):
        return "ollama"
    if path == "/v1/messages" or path.startswith("/v1/messages/"):
        return "anthropic"
    return "openai"


def ollama_body(payload: bytes) -> bytes:
    """An OpenAI error body in Ollama's shape: ``{"error": "<message>"}``."""
    message = msgspec.json.decode(payload, type=ErrorResponse).error.message
    return msgspec.json.encode({"error": message})


def anthropic_body(payload: bytes, status: int) -> bytes:
    """An OpenAI error body in Anthropic's shape:
    ``{"type": "error", "error": {"type": ..., "message": ...}}``."""
    message = msgspec.json.decode(payload, type=ErrorResponse).error.message
    kind = _ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return msgspec.json.encode({"type": "error", "error": {"type": kind, "message": message}})


def to_error(exc: BaseException, *, shape: Shape = "openai") -> tuple[int, bytes, dict[str, str]]:
    """(status, JSON body, extra headers) for any exception raised by a handler, the
    body in the ``shape`` the route's clients read (see :func:`error_shape`)."""
    status, payload, headers = _to_error(exc)
    if shape == "ollama":
        payload = ollama_body(payload)
    elif shape == "anthropic":
        payload = anthropic_body(payload, status)
    return status, payload, headers


def _to_error(exc: BaseException) -> tuple[int, bytes, dict[str, str]]:
    headers: dict[str, str] = {}
    if isinstance(exc, msgspec.ValidationError):
        msg = str(exc)
        m = _PATH_RE.search(msg)
        param = m.group(1) if m else None
        detail = _PATH_RE.sub("", msg)
        text = (
            f"invalid value for '{param}': {detail}" if param else f"invalid request body: {detail}"
        )
        return 400, error_body(text, "invalid_request_error", param, "invalid_value"), headers
    if isinstance(exc, msgspec.DecodeError):
        return (
            400,
            error_body(
                f"the request body is not valid JSON ({exc}); send a JSON object with "
                "Content-Type: application/json",
                "invalid_request_error",
                None,
                "invalid_json",
            ),
            headers,
        )
    if isinstance(exc, ModelcError):
        if isinstance(exc, CapacityError | LoadingError):
            headers["Retry-After"] = "1"
        if isinstance(exc, RateLimitError):
            headers["Retry-After"] = str(exc.retry_after)
        code = "model_not_found" if isinstance(exc, ModelNotFoundError) else None
        param = exc.param if isinstance(exc, UsageError) else None
        return exc.http_status, error_body(str(exc), exc.error_type, param, code), headers
    if isinstance(exc, HTTPException):
        status = exc.code or 500
        if status == 413:  # the unread body is still on the wire: do not reuse the connection
            headers["Connection"] = "close"
        allowed = getattr(exc, "valid_methods", None)
        if status == 405 and allowed:  # RFC 9110: a 405 says what is allowed
            headers["Allow"] = ", ".join(sorted(allowed))
        return (
            status,
            error_body(
                exc.description or exc.name,
                _HTTP_TYPES.get(
                    status, "invalid_request_error" if status < 500 else "server_error"
                ),
                None,
                _CODES.get(status),
            ),
            headers,
        )
    return 500, error_body("internal server error; see the server log", "server_error"), headers


class ParamError(UsageError):
    """A request value that is well-typed but not acceptable; names its field."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message, param=param)
