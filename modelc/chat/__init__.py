"""Chat-output formats: which format a model's template speaks, the split of its output
into thinking trace, answer and tool calls, whole or as it streams.  Below the server:
imports nothing of trio, quart or msgspec."""

from modelc.chat.formats import ChatFormat, detect, new_call_id, parse, trace_grammar
from modelc.chat.grammar import Special, call_grammar
from modelc.chat.scan import Parsed, ToolCall, param_types
from modelc.chat.stream import CallDelta, Delta, StreamParser

__all__ = [
    "CallDelta",
    "ChatFormat",
    "Delta",
    "Parsed",
    "Special",
    "StreamParser",
    "ToolCall",
    "call_grammar",
    "detect",
    "new_call_id",
    "param_types",
    "parse",
    "trace_grammar",
]
