"""``modelc completions bash|zsh|fish``: shell completion scripts made from the parser.

A script completes the commands, each command's options, the values of options that
have choices (``--quantize``, ``--kv-cache`` ...), and store model names where a
command takes a MODEL (asked of ``modelc list --names`` at completion time, so the
list is never stale); other arguments complete file names.
"""

from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass, field
from typing import Any

# metavars of a first positional argument that names a model in the store
MODEL_METAVARS = frozenset({"MODEL", "NAME", "NAME[:VERSION]", "SRC[:VERSION]"})


@dataclass
class CommandSpec:
    """What completion needs to know about one subcommand."""

    help: str = ""
    options: list[str] = field(default_factory=list)  # every option string
    takes_value: list[str] = field(default_factory=list)  # options followed by a value
    choices: dict[str, list[str]] = field(default_factory=dict)  # option -> its values
    model: bool = False  # the first positional is a MODEL
    actions: list[argparse.Action] = field(default_factory=list)  # the options, for fish


def command_specs(parser: argparse.ArgumentParser) -> dict[str, CommandSpec]:
    """Subcommand (aliases included) -> its :class:`CommandSpec`."""
    out: dict[str, CommandSpec] = {}
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        helps = {a.dest: a.help or "" for a in action._choices_actions}
        for name, sp in action.choices.items():
            spec = CommandSpec(help=helps.get(name, ""))
            positionals = [a for a in sp._actions if not a.option_strings]
            spec.model = bool(positionals) and positionals[0].metavar in MODEL_METAVARS
            for a in sp._actions:
                if not a.option_strings:
                    continue
                spec.actions.append(a)
                spec.options += a.option_strings
                if a.nargs != 0:
                    spec.takes_value += a.option_strings
                if a.choices is not None:
                    for o in a.option_strings:
                        spec.choices[o] = [str(c) for c in a.choices]
            out[name] = spec
    return out


def _bash(specs: dict[str, CommandSpec]) -> str:
    cases = "\n".join(
        f'        {c}) opts="{" ".join(s.options)}"; vals="{" ".join(s.takes_value)}"; '
        f"model={int(s.model)} ;;"
        for c, s in specs.items()
    )
    values = "\n".join(
        f'        "{c} {o}") COMPREPLY=($(compgen -W "{" ".join(v)}" -- "$cur")); return ;;'
        for c, s in specs.items()
        for o, v in s.choices.items()
    )
    return f"""_modelc() {{
    local cur prev cmd opts vals model w i n
    COMPREPLY=()
    cur="${{COMP_WORDS[COMP_CWORD]}}"
    prev="${{COMP_WORDS[COMP_CWORD-1]}}"
    if [ "$prev" = "=" ] && [ "$COMP_CWORD" -gt 2 ]; then
        prev="${{COMP_WORDS[COMP_CWORD-2]}}"  # --opt=VALUE
    fi
    if [ "$COMP_CWORD" -eq 1 ]; then
        COMPREPLY=($(compgen -W "{" ".join(specs)} --version --help" -- "$cur"))
        return
    fi
    cmd="${{COMP_WORDS[1]}}"
    case "$cmd" in
{cases}
        *) opts=""; vals=""; model=0 ;;
    esac
    case "$cmd $prev" in
{values}
    esac
    if [[ " $vals " == *" $prev "* ]]; then
        COMPREPLY=($(compgen -f -- "$cur"))
        return
    fi
    if [[ "$cur" == -* ]]; then
        COMPREPLY=($(compgen -W "$opts" -- "$cur"))
        return
    fi
    n=0
    i=2
    while [ "$i" -lt "$COMP_CWORD" ]; do
        w="${{COMP_WORDS[i]}}"
        if [[ "$w" == -* ]]; then
            if [[ " $vals " == *" $w "* ]]; then i=$((i + 1)); fi
        else
            n=$((n + 1))
        fi
        i=$((i + 1))
    done
    if [ "$model" = 1 ] && [ "$n" -eq 0 ]; then
        COMPREPLY=($(compgen -W "$("${{COMP_WORDS[0]}}" list --names 2>/dev/null)" -- "$cur")
                   $(compgen -f -- "$cur"))
    else
        COMPREPLY=($(compgen -f -- "$cur"))
    fi
}}
complete -F _modelc modelc"""


def _fish(specs: dict[str, CommandSpec]) -> str:
    q = shlex.quote
    lines = ["complete -c modelc -f"]
    for c, s in specs.items():
        lines.append(f"complete -c modelc -n __fish_use_subcommand -a {c} -d {q(s.help)}")
        when = f"-n {q('__fish_seen_subcommand_from ' + c)}"
        if s.model:
            lines.append(f"complete -c modelc {when} -F -a '(modelc list --names 2>/dev/null)'")
        for a in s.actions:
            flags = " ".join(
                f"-l {o[2:]}" if o.startswith("--") else f"-s {o[1:]}" for o in a.option_strings
            )
            if a.choices is not None:
                flags += f" -x -a {q(' '.join(str(v) for v in a.choices))}"
            elif a.nargs != 0:
                flags += " -r -F"
            lines.append(f"complete -c modelc {when} {flags}")
    return "\n".join(lines)


def completion_script(parser: argparse.ArgumentParser, shell: str) -> str:
    """A bash, zsh or fish script completing modelc's commands, options and model names."""
    specs = command_specs(parser)
    if shell == "fish":
        return _fish(specs)
    if shell == "zsh":
        return "autoload -U +X bashcompinit && bashcompinit\n" + _bash(specs)
    return _bash(specs)


def cmd_completions(args: argparse.Namespace) -> int:
    print(completion_script(args.root_parser, args.shell))  # build_parser's default
    return 0


def add_completions(sub: Any) -> None:
    p = sub.add_parser(
        "completions",
        help="print a shell completion script (e.g. `source <(modelc completions bash)`)",
    )
    p.add_argument("shell", choices=["bash", "zsh", "fish"])
    p.set_defaults(func=cmd_completions)
