"""The state and the line protocol of ``modelc chat`` (no engine, no terminal here).

* :func:`read_entry` turns input lines into one entry: a message, or a ``/command``.
  A line starting with ``\"\"\"`` opens a block that ends at a line ending with
  ``\"\"\"`` (ollama's convention); a line ending with a backslash continues on the
  next line.  Either way the lines are joined by newlines into one message.
* :class:`ChatState` holds the conversation (system prompt, the user and assistant
  messages so far) and the sampling settings the user chose; :func:`run_command`
  applies a ``/command`` to it.  Parameter names are ollama's (``repeat_penalty``,
  ``num_predict``), mapped onto the engine's sampling fields.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from modelc.errors import UsageError
from modelc.runtime.prompt import SAMPLING_FIELDS, SamplingDefaults
from modelc.runtime.sampling import SamplingParams

# ollama's `/set parameter` names -> SamplingParams fields
PARAMETERS: dict[str, str] = {
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "repeat_penalty": "repetition_penalty",
    "repeat_last_n": "repeat_last_n",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "seed": "seed",
    "num_predict": "max_tokens",
}
_INTEGER = {"top_k", "repeat_last_n", "seed", "max_tokens"}
FENCE = '"""'
PROMPT, MORE = ">>> ", "... "

HELP = f"""Available commands:
  /set parameter NAME VALUE   set a sampling parameter (see below)
  /set system TEXT            set the system message (the conversation is kept)
  /show parameters            the sampling settings in effect and where each comes from
  /show system                the system message
  /clear                      forget the conversation (the system message stays)
  /bye                        exit (or Ctrl + d)
  /?, /help                   this help

{textwrap.fill("Parameters: " + ", ".join(PARAMETERS) + " (-1: to the end of the turn).", 80)}
Begin a multi-line message with {FENCE} and end it with {FENCE}, or end a line with \\
to continue it on the next. Ctrl + c stops an answer."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One thing the user typed: a message to send, or a ``/command`` line."""

    text: str
    command: bool = False


def read_entry(read_line: Callable[[str], str]) -> Entry | None:
    """Read lines with ``read_line(prompt)`` until one entry is complete.

    None for an empty line; ``EOFError`` (from ``read_line``) at the first line only: an
    end of input inside a block or a continuation ends the message there.
    """
    first = read_line(PROMPT)
    if first.startswith(FENCE):
        rest = first[len(FENCE) :]
        if rest.endswith(FENCE):  # """one line"""
            return _message([rest[: -len(FENCE)]])
        lines = [rest] if rest else []
        while True:
            try:
                line = read_line(MORE)
            except EOFError:
                return _message(lines)
            if line.endswith(FENCE):
                if line[: -len(FENCE)]:
                    lines.append(line[: -len(FENCE)])
                return _message(lines)
            lines.append(line)
    if first.endswith("\\"):
        lines, line = [], first
        while line.endswith("\\"):
            lines.append(line[:-1])
            try:
                line = read_line(MORE)
            except EOFError:
                return _message(lines)
        return _message([*lines, line])
    if not first.strip():
        return None
    return Entry(first, command=first.startswith("/"))


def _message(lines: list[str]) -> Entry | None:
    text = "\n".join(lines)
    return Entry(text) if text.strip() else None


@dataclass(slots=True)
class ChatState:
    """The conversation so far and the user's settings (None or absent: the model's)."""

    system: str | None = None
    history: list[dict[str, str]] = field(default_factory=list)  # user/assistant turns
    sampling: dict[str, float | int] = field(default_factory=dict)  # SAMPLING_FIELDS keys
    seed: int | None = None
    max_tokens: int | None = None  # None: until the end of the turn

    def messages(self, user: str) -> list[dict[str, str]]:
        """The messages of the next turn: system, the history, then ``user``."""
        head = [{"role": "system", "content": self.system}] if self.system else []
        return [*head, *self.history, {"role": "user", "content": user}]

    def add_turn(self, user: str, assistant: str) -> None:
        self.history += [
            {"role": "user", "content": user},
            {"role": "assistant", "content": assistant},
        ]

    def params(self, defaults: SamplingDefaults) -> SamplingParams:
        """The request's sampling settings: the user's over the model's defaults."""
        return defaults.params(self.sampling, max_tokens=self.max_tokens, seed=self.seed)

    def set_parameter(
        self, name: str, value: str, defaults: SamplingDefaults, n_vocab: int
    ) -> None:
        """Set ollama's parameter ``name``; UsageError for an unknown name or a bad value."""
        key = PARAMETERS.get(name)
        if key is None:
            raise UsageError(f"unknown parameter {name!r}; one of {', '.join(PARAMETERS)}")
        try:
            num: float | int = int(value) if key in _INTEGER else float(value)
        except ValueError:
            kind = "a whole number" if key in _INTEGER else "a number"
            raise UsageError(f"{name} must be {kind}, got {value!r}") from None
        if num != num or num in (float("inf"), float("-inf")):
            raise UsageError(f"{name} must be a finite number, got {value!r}")
        trial = replace(self, sampling=dict(self.sampling), history=[])
        if key == "seed":
            trial.seed = int(num)
        elif key == "max_tokens":
            trial.max_tokens = None if num < 0 else int(num)  # ollama: -1 = no limit
        else:
            trial.sampling[key] = num
        trial.params(defaults).validate(n_vocab)  # UsageError names the bad setting
        self.sampling, self.seed, self.max_tokens = trial.sampling, trial.seed, trial.max_tokens

    def show_parameters(self, defaults: SamplingDefaults) -> str:
        """The settings in effect, one a line: ollama's name, the value, where it comes from."""
        by_field = {f: n for n, f in PARAMETERS.items()}
        rows = [
            (by_field[f], _num(self.sampling.get(f, defaults.values[f])), self._origin(f, defaults))
            for f in SAMPLING_FIELDS
        ]
        rows.append(
            ("seed", "random" if self.seed is None else str(self.seed), self._set(self.seed))
        )
        limit = (
            f"end of turn (at most {defaults.max_tokens})"
            if self.max_tokens is None
            else str(self.max_tokens)
        )
        rows.append(("num_predict", limit, self._set(self.max_tokens)))
        width = max(len(r[0]) for r in rows) + 2
        vwidth = max(len(r[1]) for r in rows) + 2
        lines = [f"  {n:<{width}}{v:<{vwidth}}({o})" for n, v, o in rows]
        return "Parameters in effect (and their source):\n" + "\n".join(lines)

    def _origin(self, f: str, defaults: SamplingDefaults) -> str:
        return "set" if f in self.sampling else defaults.origin.get(f, "default")

    @staticmethod
    def _set(value: object) -> str:
        return "default" if value is None else "set"


def _num(v: float | int) -> str:
    return str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)


@dataclass(frozen=True, slots=True)
class Reply:
    """What a command answers: text to print, and whether the session ends."""

    text: str = ""
    exit: bool = False


def run_command(line: str, state: ChatState, defaults: SamplingDefaults, n_vocab: int) -> Reply:
    """Apply one ``/command`` line to ``state``."""
    words = line.split()
    cmd = words[0]
    if cmd == "/bye":
        return Reply(exit=True)
    if cmd in ("/?", "/help"):
        return Reply(HELP)
    if cmd == "/clear":
        state.history.clear()
        return Reply("Cleared session context")
    if cmd == "/set":
        what = words[1] if len(words) > 1 else ""
        if what == "parameter" and len(words) == 4:
            try:
                state.set_parameter(words[2], words[3], defaults, n_vocab)
            except UsageError as e:
                return Reply(f"Couldn't set parameter: {e}")
            return Reply(f"Set parameter '{words[2]}' to '{words[3]}'")
        if what == "system" and len(words) > 2:
            state.system = line.split(None, 2)[2].strip()
            return Reply("Set system message.")
        return Reply("Usage: /set parameter NAME VALUE, or /set system TEXT")
    if cmd == "/show":
        what = words[1] if len(words) > 1 else ""
        if what == "parameters":
            return Reply(state.show_parameters(defaults))
        if what == "system":
            return Reply(state.system or "No system message was specified.")
        return Reply("Usage: /show parameters, or /show system")
    return Reply(f"Unknown command '{cmd}'. Type /? for help")
