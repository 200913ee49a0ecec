"""From the options table to a parser, and from parsed arguments to the engine's options.

:func:`add_options` gives a command's parser its options from
:data:`modelc.cli.options.OPTIONS`; :func:`engine_options` and :func:`sampling_given`
read the values back, the one way every command that builds an engine (``run``,
``generate``, ``chat``) turns its flags into
:class:`~modelc.engine.options.EngineOptions` and sampling settings.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from modelc.cli.options import UNSET, Opt, Values, options_of

if TYPE_CHECKING:
    from modelc.engine.options import EngineOptions

COMMAND_KEY = "table_command"  # the parsed arguments' attribute naming their command


def _add(target: Any, o: Opt) -> None:
    kw: dict[str, Any] = {"help": o.help}
    if o.env and o.help:
        kw["help"] = f"{o.help} (env {o.env})"
    for name in ("type", "metavar", "choices", "action", "dest"):
        value = getattr(o, name)
        if value is not None:
            kw[name] = value
    if isinstance(o.choices, Values) and o.metavar is None:
        # argparse checks a metavar as it adds the option, which lists the choices and so
        # would import the engine for every command (`modelc --version` took ~1 s): a named
        # metavar, and the choices in the help (expanded only when help is printed)
        kw["metavar"] = o.flags[-1].lstrip("-").replace("-", "_").upper()
        kw["help"] = f"{kw['help']} (one of: %(choices)s)" if kw.get("help") else None
    if o.default is not UNSET:
        kw["default"] = o.default
    if o.required:
        kw["required"] = True
    target.add_argument(*o.flags, **kw)


def add_options(p: argparse.ArgumentParser, command: str) -> None:
    """Add every option of the table that ``command`` takes to its parser ``p``.

    Options of one ``group`` exclude each other; those of one ``section`` are listed
    under that title in ``--help``.  ``p`` remembers its command (:func:`command_of`).
    """
    opts = options_of(command)
    shared = [o.group for o in opts if o.group is not None]
    groups: dict[str, Any] = {}
    sections: dict[str, argparse._ArgumentGroup] = {}
    for o in opts:
        target: Any = p
        if o.section is not None:
            if o.section not in sections:
                sections[o.section] = p.add_argument_group(o.section)
            target = sections[o.section]
        if o.group is not None and shared.count(o.group) > 1:
            if o.group not in groups:
                groups[o.group] = target.add_mutually_exclusive_group()
            target = groups[o.group]
        _add(target, o)
    p.set_defaults(**{COMMAND_KEY: command})


def command_of(args: argparse.Namespace) -> str:
    """The command whose parser (made by :func:`add_options`) parsed ``args``."""
    command: str = getattr(args, COMMAND_KEY)
    return command


def engine_given(args: argparse.Namespace) -> dict[str, Any]:
    """The EngineOptions fields the command's flags set (flags left out: none)."""
    given: dict[str, Any] = {}
    for o in options_of(command_of(args)):
        value = getattr(args, o.key)
        if o.engine is None or value is None:
            continue
        given.update(o.engine(value) if callable(o.engine) else {o.engine: value})
    return given


def sampling_given(args: argparse.Namespace) -> dict[str, Any]:
    """The sampling settings (SamplingParams fields) the command's flags set."""
    return {
        o.sampling: getattr(args, o.key)
        for o in options_of(command_of(args))
        if o.sampling is not None and getattr(args, o.key) is not None
    }


def engine_options(args: argparse.Namespace, **fixed: Any) -> EngineOptions:
    """The engine's options for a command: the config's sampling defaults and
    ``max_tokens``, then ``fixed`` (the command's own, e.g. one request at a time), then
    the engine flags given; checked, and a device asked for checked to be there (one
    line now, not a failed load later)."""
    from modelc.cli.common import _config
    from modelc.engine.options import EngineOptions
    from modelc.errors import UsageError

    cfg = _config()
    given: dict[str, Any] = {}
    if cfg.sampling.max_tokens is not None:
        given["max_tokens"] = cfg.sampling.max_tokens
    given.update(fixed)
    given.update(engine_given(args))
    if given.get("max_context") == "auto":
        raise UsageError(
            "--max-context auto fits the context to modelc run's memory budget; give this "
            "command a number of tokens (or leave it out for the model's own context)"
        )
    opts = EngineOptions(sampling=cfg.sampling.given(), **given)
    opts.validate()
    check_device(opts.device)
    return opts


def check_device(device: str) -> None:
    """A UsageError at once if ``device`` (cuda, webgpu, metal) is not usable here."""
    if device == "cuda":
        from modelc.runtime.backends.cuda import require_cuda

        require_cuda()
    if device in ("webgpu", "metal"):
        from modelc.runtime.backends.webgpu_device import find_adapter

        find_adapter("Metal" if device == "metal" else None)
