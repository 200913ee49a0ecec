"""Typed errors, and the one place that maps them to exit codes and HTTP statuses.

Every error a user or a file can cause is a :class:`ModelcError` subclass whose
message says what is wrong and what to do.  The CLI prints ``str(err)`` on one
line and exits with :attr:`ModelcError.exit_code`; the server answers with
:attr:`ModelcError.http_status` and an OpenAI-style error object.
"""

from __future__ import annotations

from pathlib import Path


class ModelcError(Exception):
    """Base of every error modelc raises on purpose."""

    exit_code: int = 2
    http_status: int = 500
    error_type: str = "server_error"

    def __init__(self, message: str, *, path: str | Path | None = None) -> None:
        self.path = str(path) if path is not None else None
        super().__init__(f"{self.path}: {message}" if self.path else message)


class UsageError(ModelcError):
    """A wrong flag, argument or request value (``param``: the request field, if one)."""

    http_status = 400
    error_type = "invalid_request_error"

    def __init__(
        self, message: str, *, path: str | Path | None = None, param: str | None = None
    ) -> None:
        super().__init__(message, path=path)
        self.param = param


class ConfigError(ModelcError):
    """A bad config.toml or environment setting."""


class FormatError(ModelcError):
    """A model file is truncated, corrupt, or not what its name claims."""

    http_status = 400
    error_type = "invalid_request_error"


class UnsafePickleError(FormatError):
    """A PyTorch pickle tried to do something other than rebuild tensors."""


class UnsupportedError(UsageError):
    """A valid file uses a feature modelc does not implement (a dtype, an op, an
    architecture), or a request asks a model for something it cannot do."""


class ArchitectureError(UnsupportedError):
    """The tensor layout matches no known architecture."""


class IntegrityError(FormatError):
    """A .modelc artifact fails its header or checksum verification."""


class TokenizerError(ModelcError):
    """A tokenizer cannot be built from the model's metadata, or a token id is out of range."""

    http_status = 400
    error_type = "invalid_request_error"


class StoreError(ModelcError):
    """A local store operation cannot be done (name clash, versions present, ...)."""

    http_status = 409
    error_type = "invalid_request_error"


class ModelNotFoundError(StoreError):
    """No model by that name in the store and no such file."""

    http_status = 404
    error_type = "not_found_error"


class DownloadError(ModelcError):
    """A pull failed: network, HTTP status, or checksum mismatch."""


class CapacityError(ModelcError):
    """The engine cannot take more work now (queue full)."""

    exit_code = 3
    http_status = 503
    error_type = "server_overloaded"


class WindowError(UsageError):
    """A KV cache's windowed layer no longer holds the rows an operation needs (a rollback
    or context shift reaching further back than the window plus its slack)."""
