"""modelc settings: ``config.toml``, typed, with defaults for everything.

The file is looked up at ``$MODELC_CONFIG`` if set, else ``$MODELC_HOME/config.toml``
if ``MODELC_HOME`` is set, else ``config.toml`` in the platform config directory
(``platformdirs.user_config_dir("modelc")``).  A missing file means all defaults.
See ``configs/modelc.example.toml`` for every key.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Annotated, Literal

import msgspec
import platformdirs

from modelc.errors import ConfigError


class ServerConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    host: str = "127.0.0.1"
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 8080


class StoreConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    # where models are kept; default: $MODELC_HOME/models or <platform data dir>/models
    path: str | None = None


# = modelc.artifact.format.QUANT_METHODS (tests/test_cli.py holds the two equal)
QuantizeMethod = Literal[
    "fp16", "int8", "int4", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k_s", "q3_k_m",
    "q3_k_l", "q4_k_s", "q4_k_m", "q5_k_s", "q5_k_m", "q6_k", "iq4_nl", "iq4_xs",
]  # fmt: skip


class PackConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    compress: bool = False
    compression_level: Annotated[int, msgspec.Meta(ge=1, le=22)] = 3
    quantize: QuantizeMethod | None = None


class SamplingConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The server's sampling defaults: used where a request and the model say nothing
    (unset keys fall back to llama-server's defaults)."""

    temperature: Annotated[float, msgspec.Meta(ge=0, le=2)] | None = None
    top_k: Annotated[int, msgspec.Meta(ge=0)] | None = None
    top_p: Annotated[float, msgspec.Meta(gt=0, le=1)] | None = None
    min_p: Annotated[float, msgspec.Meta(ge=0, le=1)] | None = None
    repetition_penalty: Annotated[float, msgspec.Meta(gt=0, le=10)] | None = None
    repeat_last_n: Annotated[int, msgspec.Meta(ge=0)] | None = None
    presence_penalty: Annotated[float, msgspec.Meta(ge=-2, le=2)] | None = None
    frequency_penalty: Annotated[float, msgspec.Meta(ge=-2, le=2)] | None = None
    # a request without max_tokens stops at the end of its turn or after this many tokens
    max_tokens: Annotated[int, msgspec.Meta(ge=1)] | None = None

    def given(self) -> dict[str, float | int]:
        """The keys set in the file (max_tokens excluded)."""
        d = msgspec.structs.asdict(self)
        return {k: v for k, v in d.items() if v is not None and k != "max_tokens"}


class Config(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    default_model: str = "smollm2-135m"
    # what `modelc run` with no MODEL serves (default: [default_model])
    models: list[str] = msgspec.field(default_factory=list)
    server: ServerConfig = msgspec.field(default_factory=ServerConfig)
    store: StoreConfig = msgspec.field(default_factory=StoreConfig)
    pack: PackConfig = msgspec.field(default_factory=PackConfig)
    sampling: SamplingConfig = msgspec.field(default_factory=SamplingConfig)
    path: str | None = None  # the file this was read from (not a key in the file)

    @property
    def home(self) -> Path:
        return modelc_home()

    @property
    def store_dir(self) -> Path:
        """Directory of the model store."""
        if self.store.path:
            return Path(os.path.expandvars(self.store.path)).expanduser()
        return modelc_home() / "models"


def modelc_home() -> Path:
    """``$MODELC_HOME``, or the platform data directory."""
    env = os.environ.get("MODELC_HOME")
    return Path(env).expanduser() if env else Path(platformdirs.user_data_dir("modelc"))


def config_path() -> Path:
    if env := os.environ.get("MODELC_CONFIG"):
        return Path(env).expanduser()
    if env := os.environ.get("MODELC_HOME"):
        return Path(env).expanduser() / "config.toml"
    return Path(platformdirs.user_config_dir("modelc")) / "config.toml"


_KEY_RE = re.compile(r"at `\$\.?([^`]*)`")


def parse_config(text: str, *, path: str = "config.toml") -> Config:
    """Parse config TOML text; a bad value raises ConfigError naming the key."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"invalid TOML: {e}", path=path) from e
    if "path" in raw:
        raise ConfigError("unknown key 'path' (did you mean [store] path?)", path=path)
    try:
        cfg = msgspec.convert(raw, Config)
    except msgspec.ValidationError as e:
        msg = str(e)
        m = _KEY_RE.search(msg)
        key = m.group(1) if m else ""
        detail = _KEY_RE.sub("", msg).strip(" -")
        if detail.startswith("Object contains unknown field"):
            field = detail.split("`")[1] if "`" in detail else "?"
            full = f"{key}.{field}" if key else field
            raise ConfigError(
                f"unknown key {full!r}; see configs/modelc.example.toml", path=path
            ) from e
        raise ConfigError(f"bad value for {key or 'config'!r}: {detail}", path=path) from e
    cfg.path = path
    return cfg


def load_config(path: str | Path | None = None) -> Config:
    """Read the config file (``path`` or :func:`config_path`); missing file -> defaults."""
    p = Path(path) if path is not None else config_path()
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        if path is not None:
            raise ConfigError("config file not found", path=p) from None
        return Config()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read config file: {e}", path=p) from e
    return parse_config(text, path=str(p))
