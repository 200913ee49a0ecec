"""``modelc completions``: the bash script run for real (COMP_WORDS/COMP_CWORD set, the
completion function called), and ``modelc list --names`` behind its model names."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from modelc.cli.options import QUANTIZE_CHOICES
from tests.cli_support import Cli, write_mlp


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    return Cli(tmp_path / "home", tmp_path / "cache", tmp_path)


def _complete(cli: Cli, script: Path, *words: str) -> list[str]:
    """COMPREPLY of the bash completion function for the command line ``words``
    (the last word is the one being completed), run in an empty directory."""
    empty = Path(cli.cwd) / "empty"
    empty.mkdir(exist_ok=True)
    line = " ".join(shlex.quote(w) for w in words)
    cmd = (
        f"source {shlex.quote(str(script))}; COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; "
        '_modelc; printf "%s\\n" "${COMPREPLY[@]}"'
    )
    env = {**cli.env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(
        ["bash", "-c", cmd], env=env, cwd=empty, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0 and not proc.stderr, proc.stderr
    return [w for w in proc.stdout.split("\n") if w]


def test_bash_completion_of_commands_options_values_and_models(cli: Cli, tmp_path: Path) -> None:
    write_mlp(tmp_path / "m.safetensors")
    cli("pack", "m.safetensors", "--name", "tiny-mlp")
    script = tmp_path / "modelc.bash"
    script.write_text(cli("completions", "bash").stdout)
    quant = list(QUANTIZE_CHOICES)  # fp16 int8 int4 q8_0 q4_0, then the K mixes
    assert {"pack", "inspect", "run", "bench", "--version"} <= set(
        _complete(cli, script, "modelc", "")
    )
    assert _complete(cli, script, "modelc", "ins") == ["inspect"]
    # store model names where a command takes a MODEL
    for cmd in ("inspect", "verify", "export", "rm", "generate", "run", "tokenize"):
        assert _complete(cli, script, "modelc", cmd, "") == ["tiny-mlp"], cmd
    assert _complete(cli, script, "modelc", "inspect", "ti") == ["tiny-mlp"]
    assert _complete(cli, script, "modelc", "inspect", "--json", "") == ["tiny-mlp"]
    assert _complete(cli, script, "modelc", "tokenize", "tiny-mlp", "") == []  # TEXT, not a model
    assert _complete(cli, script, "modelc", "pack", "") == []  # SRC is a file: none here
    # option values
    assert _complete(cli, script, "modelc", "pack", "m.safetensors", "--quantize", "") == quant
    assert _complete(cli, script, "modelc", "pull", "--quantize", "q") == [
        q for q in QUANTIZE_CHOICES if q.startswith("q")
    ]
    assert _complete(cli, script, "modelc", "pack", "--quantize", "=", "") == quant
    kv = ["f32", "f16", "int8", "mixed"]
    assert _complete(cli, script, "modelc", "run", "tiny-mlp", "--kv-cache", "") == kv
    assert _complete(cli, script, "modelc", "generate", "--kv-cache", "i") == ["int8"]
    assert _complete(cli, script, "modelc", "completions", "") == []  # no `shell` option
    assert _complete(cli, script, "modelc", "pack", "--qu") == ["--quantize"]
    assert "--kv-cache" in _complete(cli, script, "modelc", "run", "--")
    # after an option that takes a value, a MODEL is still the first positional
    assert _complete(cli, script, "modelc", "run", "--port", "8080", "") == ["tiny-mlp"]


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_scripts(cli: Cli, shell: str) -> None:
    script = cli("completions", shell).stdout
    assert "list --names" in script
    quant = " ".join(QUANTIZE_CHOICES)
    for word in ("pack", "inspect", "tokenize", quant, "f32 f16 int8 mixed"):
        assert word in script, word
    if shell == "fish":
        assert f"-l quantize -x -a '{quant}'" in script
        assert "-l json" in script
    else:
        proc = subprocess.run(
            ["bash", "-n"], input=script, text=True, capture_output=True, check=False
        )
        assert proc.returncode == 0, proc.stderr


def test_list_names(cli: Cli, tmp_path: Path) -> None:
    assert cli("list", "--names").stdout == ""
    write_mlp(tmp_path / "m.safetensors")
    for ref in ("b", "a:v1", "a:v2"):
        cli("pack", "m.safetensors", "--name", ref)
    assert cli("list", "--names").stdout.splitlines() == ["a", "b"]
    cli.fails("list", "--names", "--json", match="not allowed with")
