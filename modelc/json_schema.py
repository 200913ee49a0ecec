"""JSON schemas as llama.cpp's grammar converter reads them (``common/json-schema.cpp``):
an object schema that lists ``properties`` and says nothing of ``additionalProperties``
admits no other key (JSON Schema itself would admit any), so a constrained answer or a
forced tool call holds the named keys only, as llama-server's and Ollama's do; a bare
``{"type": "object"}`` still admits any object."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")
_SUBSCHEMAS = ("items", "not", "additionalProperties", "contains")


def closed(schema: Any, *, close: bool = True) -> Any:
    """``schema`` with every object that lists ``properties`` and not
    ``additionalProperties`` closed (``"additionalProperties": false``), in every place a
    subschema stands; the members of an ``allOf`` keep theirs open (closing each would
    reject the keys the others add), their own subschemas closed."""
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, Mapping):
        return schema
    out = dict(schema)
    if close and "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    for key in _SUBSCHEMA_MAPS:
        sub = out.get(key)
        if isinstance(sub, Mapping):
            out[key] = {k: closed(v) for k, v in sub.items()}
    for key in _SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = closed(out[key])
    for key in _SUBSCHEMAS:
        if isinstance(out.get(key), (Mapping, list)):
            out[key] = closed(out[key])
    if isinstance(out.get("allOf"), list):
        out["allOf"] = [closed(s, close=False) for s in out["allOf"]]
    return out
