"""The CLI's one options table (``modelc.cli.options``): every command's parser is made
from it, and every command that builds an engine turns the same flags into the same
engine options."""

from __future__ import annotations

import argparse

import pytest

from modelc.cli import build_parser
from modelc.cli.args import engine_given, engine_options, sampling_given
from modelc.cli.options import DEVICE_SAMPLING, DEVICES, KV_MODES, MATMUL_MODES, OPTIONS, options_of


def _commands(p: argparse.ArgumentParser, prefix: str = "") -> dict[str, argparse.ArgumentParser]:
    """Every (sub)command's parser by its table name (``deploy k8s`` -> ``deploy-k8s``);
    aliases (``ls``, ``show``) left out."""
    out: dict[str, argparse.ArgumentParser] = {}
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            names = {c.dest for c in a._choices_actions}
            for name, sp in a.choices.items():
                if name in names:
                    out[prefix + name] = sp
                    out.update(_commands(sp, f"{prefix}{name}-"))
    return out


def _option_strings(p: argparse.ArgumentParser) -> set[str]:
    return {
        s
        for a in p._actions
        if not isinstance(a, argparse._HelpAction | argparse._SubParsersAction)
        for s in a.option_strings
    }


COMMANDS = _commands(build_parser())


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_parser_is_made_from_the_table(command: str) -> None:
    table = {f for o in options_of(command) for f in o.option_strings}
    assert _option_strings(COMMANDS[command]) == table


def test_the_table_names_only_real_commands_and_no_flag_twice() -> None:
    tagged = {c for o in OPTIONS for c in o.commands}
    assert tagged <= set(COMMANDS), tagged - set(COMMANDS)
    for command in COMMANDS:
        flags = [f for o in options_of(command) for f in o.option_strings]
        assert len(flags) == len(set(flags)), command


def test_choices_are_the_enums() -> None:
    from modelc.engine.options import DEVICE_SAMPLING as ENGINE_SAMPLING
    from modelc.engine.options import DEVICES as ENGINE_DEVICES
    from modelc.runtime.backends.cpu import MATMUL_TOLS
    from modelc.runtime.kv_store import KVMode

    assert list(KV_MODES) == [m.value for m in KVMode] == ["f32", "f16", "int8", "mixed"]
    assert tuple(DEVICES) == ENGINE_DEVICES
    assert tuple(DEVICE_SAMPLING) == ENGINE_SAMPLING
    assert list(MATMUL_MODES) == list(MATMUL_TOLS)
    assert "int8" in KV_MODES and "q4" not in KV_MODES
    for name, p in COMMANDS.items():  # every --kv-cache takes the same values
        for a in p._actions:
            if "--kv-cache" in a.option_strings:
                assert a.choices is not None and list(a.choices) == list(KV_MODES), name


ENGINE_FLAGS = [
    *("--kv-cache", "int8", "--device", "cpu", "--max-context", "512", "--threads", "2"),
    *("--anchor-tokens", "8", "--prefill-chunk", "64", "--context-shift", "--swa-full"),
    *("--speculate", "fixed", "--spec-max", "4", "--spec-min-prompt", "32"),
    *("--device-sampling", "on", "--no-mmproj", "--cache-ram", "64"),
]
EXPECTED = {
    "kv_cache": "int8",
    "device": "cpu",
    "max_context": 512,
    "threads": 2,
    "anchor_tokens": 8,
    "prefill_chunk": 64,
    "context_shift": True,
    "swa_full": True,
    "speculative": True,
    "spec_adaptive": False,
    "spec_gamma": 4,
    "spec_min_prompt": 32,
    "device_sampling": "on",
    "no_mmproj": True,
    "prefix_cache_bytes": 64 << 20,
}


def _parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def test_engine_flags_mean_the_same_on_every_command() -> None:
    run = _parse("run", "m", *ENGINE_FLAGS)
    generate = _parse("generate", "m", "hi", *ENGINE_FLAGS)
    chat = _parse("chat", "m", *ENGINE_FLAGS)
    assert engine_given(run) == engine_given(generate) == engine_given(chat) == EXPECTED
    assert engine_options(run) == engine_options(generate) == engine_options(chat)
    # left out: the engine's defaults, the same for each command
    assert engine_given(_parse("run")) == engine_given(_parse("generate", "m", "p"))
    assert engine_options(_parse("chat", "m")).speculative is True


def test_run_only_flags_do_not_reach_other_commands_engines() -> None:
    """``--max-tokens`` is the server's cap in ``run``, one answer's length in ``generate``."""
    assert engine_given(_parse("run", "--max-tokens", "7"))["max_tokens"] == 7
    assert "max_tokens" not in engine_given(_parse("generate", "m", "p", "--max-tokens", "7"))
    with pytest.raises(SystemExit):
        _parse("generate", "m", "p", "--max-concurrent", "2")


def test_cache_ram_sets_the_prefix_cache_in_mib() -> None:
    """``--cache-ram MIB`` as llama-server's (0 turns the prefix cache off); left out, the
    engine's default; anything but a count of MiB is refused by the parser."""
    from modelc.engine.options import EngineOptions

    assert engine_options(_parse("run", "--cache-ram", "0")).prefix_cache_bytes == 0
    assert engine_options(_parse("run")).prefix_cache_bytes == EngineOptions().prefix_cache_bytes
    for bad in ("-1", "1.5", "1G"):
        with pytest.raises(SystemExit):
            _parse("run", "--cache-ram", bad)


def test_sampling_flags_mean_the_same_in_generate_and_chat() -> None:
    flags = ["--temperature", "0", "--top-k", "5", "--repeat-penalty", "1.1"]
    want = {"temperature": 0.0, "top_k": 5, "repetition_penalty": 1.1}
    assert sampling_given(_parse("generate", "m", "p", *flags)) == want
    assert sampling_given(_parse("chat", "m", *flags)) == want
    assert sampling_given(_parse("chat", "m")) == {}


@pytest.mark.parametrize("module", ["modelc", "modelc.cli"])
def test_python_dash_m_runs_the_command(module: str) -> None:
    import subprocess
    import sys

    import modelc

    out = subprocess.run(
        [sys.executable, "-m", module, "--version"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert out.stdout.strip() == f"modelc {modelc.__version__}"


def test_gpu_layers_flag() -> None:
    """``-ngl`` / ``--n-gpu-layers`` as llama.cpp's: a count, ``all`` or ``auto``, on every
    command that builds an engine and on ``bench``; asked of ``--device cpu``, one line
    before any load."""
    from modelc.engine.options import EngineOptions
    from modelc.errors import UsageError

    for argv, want in ((["-ngl", "12"], 12), (["--n-gpu-layers", "ALL"], "all"), ([], None)):
        for cmd in (["run"], ["generate", "m", "p"], ["chat", "m"], ["bench", "m"]):
            assert engine_given(_parse(*cmd, *argv)).get("n_gpu_layers") == want
    assert engine_options(_parse("run")).n_gpu_layers == "auto"
    with pytest.raises(SystemExit):
        _parse("run", "-ngl", "half")
    with pytest.raises(UsageError, match="--n-gpu-layers 8 needs --device cuda"):
        EngineOptions(device="cpu", n_gpu_layers=8).validate()
    EngineOptions(device="cpu", n_gpu_layers="auto").validate()
    EngineOptions(device="cpu", n_gpu_layers=0).validate()
    with pytest.raises(UsageError, match="must be a number of layers"):
        EngineOptions(n_gpu_layers=-1).validate()
    # --n-cpu-moe N: a number of layers, for the commands that build an engine
    for cmd in (["run"], ["generate", "m", "p"], ["chat", "m"], ["bench", "m"]):
        assert engine_given(_parse(*cmd, "--n-cpu-moe", "12")).get("n_cpu_moe") == 12
        assert engine_given(_parse(*cmd)).get("n_cpu_moe") is None
    with pytest.raises(SystemExit):
        _parse("run", "--n-cpu-moe", "half")
