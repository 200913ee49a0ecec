"""The modelc CLI, run as a real subprocess with MODELC_HOME / MODELC_CACHE in temp dirs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from modelc.formats.ir import DType
from tests import assets
from tests.cli_support import Cli, write_mlp

ASSET_CACHE = assets.assets_dir() / "cache"


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    return Cli(tmp_path / "home", tmp_path / "cache", tmp_path)


@pytest.fixture
def asset_cli(tmp_path: Path) -> Cli:
    """A CLI whose download cache is the shared test-asset cache (catalog pulls need no network)."""
    return Cli(tmp_path / "home", ASSET_CACHE, tmp_path)


@pytest.fixture(scope="module")
def smol() -> Path:
    return assets.smollm2_gguf()


_mlp = write_mlp


def _listing(cli: Cli) -> list[dict[str, object]]:
    out: list[dict[str, object]] = json.loads(cli("list", "--json").stdout)
    return out


def test_quantize_choices_agree() -> None:
    import typing

    from modelc.artifact.format import QUANT_METHODS
    from modelc.cli import QUANTIZE_CHOICES
    from modelc.config import PackConfig

    assert tuple(QUANT_METHODS) == QUANTIZE_CHOICES
    literal = typing.get_args(typing.get_type_hints(PackConfig)["quantize"])[0]
    assert typing.get_args(literal) == QUANTIZE_CHOICES


def test_version_and_help(cli: Cli) -> None:
    assert cli("--version").stdout.strip() == "modelc 0.1.0"
    assert "pack" in cli("--help").stdout
    # an option whose choices are read lazily lists them in its help
    assert "(one of: f32, f16, int8, mixed)" in " ".join(cli("run", "--help").stdout.split())


def test_the_command_line_imports_no_engine_to_parse() -> None:
    """Building the whole parser (every command's options) imports neither the engine nor
    numpy nor trio: `modelc --version` or `modelc list` do not pay for them (they had made
    every command ~1 s slower; a value given to `--device` or `--kv-cache` imports their
    module to check it, as the command needs it anyway)."""
    code = (
        "import sys\n"
        "from modelc.cli import build_parser\n"
        "build_parser().parse_args(['list', '--json'])\n"
        "print(' '.join(sorted(m for m in ('numpy', 'trio', 'modelc.engine') if m in sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == []


def test_inspect_catalog_name_pulls_smollm2(asset_cli: Cli) -> None:
    """`modelc inspect smollm2-135m --json` on an empty store pulls (from the download cache)."""
    info = json.loads(asset_cli("inspect", "smollm2-135m", "--json").stdout)
    assert info["architecture"] == "llama"
    assert 134.4e6 < info["n_params"] < 134.6e6 and info["params"] == "134.5M"
    q = info["quantization"]
    assert q["summary"].startswith("q4_1") and set(q["by_dtype"]) == {"q4_1", "q8_0", "f32"}
    assert info["has_chat_template"] and "<|im_start|>" in info["chat_template"]
    assert info["tokenizer"]["model"] == "gpt2" and info["tokenizer"]["n_tokens"] == 49152
    assert [e["name"] for e in _listing(asset_cli)] == ["smollm2-135m"]
    # second use: straight from the store
    assert json.loads(asset_cli("inspect", "smollm2-135m", "--json").stdout)["path"] == info["path"]


def test_pack_inspect_verify_export_smollm2(cli: Cli, smol: Path, tmp_path: Path) -> None:
    out = cli("pack", str(smol), "--name", "smol:q41").stdout
    assert "smol:q41" in out and "llama" in out
    [entry] = _listing(cli)
    assert entry["name"] == "smol" and entry["version"] == "q41" and entry["current"]
    assert entry["architecture"] == "llama" and entry["quantization"] == "q4_1 (+q8_0, f32)"
    table = cli("list").stdout
    assert "134.5M" in table and "smol" in table
    assert "ok smol" in cli("verify", "smol").stdout
    assert "ok smol:q41" in cli("verify", "--all").stdout
    card = cli("inspect", "smol", "--readme").stdout
    assert card.startswith("# smol") and "| Architecture | `llama` |" in card and "```jinja" in card
    sizes = cli("inspect", "smol", "--quant-sizes").stdout
    rows = {ln.split()[0]: ln.split() for ln in sizes.splitlines()[1:7]}
    assert list(rows) == ["f32", "f16", "q8_0", "int8", "q4_0", "q4_1"]
    assert rows["f32"][2:4] == ["538.1", "MB"]  # 134.5M weights * 4 bytes
    text = cli("inspect", "smol").stdout
    assert "llama" in text and "chat template  yes" in text


@pytest.mark.slow
def test_export_smollm2(cli: Cli, smol: Path, tmp_path: Path) -> None:
    exported = tmp_path / "smol.safetensors"
    cli("export", str(smol), "-o", str(exported))
    back = load_file(str(exported))
    assert len(back) == 272 and back["token_embd.weight"].shape == (49152, 576)
    assert back["token_embd.weight"].dtype == np.float32
    assert back["output_norm.weight"].dtype == np.float32
    # the export packs back into the same model: hparams, tokenizer, template, values
    cli("pack", str(exported), "-o", "back.modelc")
    from modelc.artifact import load_artifact
    from modelc.artifact.transform import to_f32
    from modelc.formats import load_model

    src, again = load_model(smol), load_artifact(tmp_path / "back.modelc")
    assert (again.architecture, again.hparams) == ("llama", src.hparams)
    assert again.tokenizer == src.tokenizer and again.chat_template == src.chat_template
    for name in ("token_embd.weight", "blk.29.ffn_down.weight", "output_norm.weight"):
        t, u = src.tensors[name], again.tensors[name]
        assert u.dtype is DType.F32
        np.testing.assert_array_equal(u.data(), to_f32(t.data(), t.dtype, t.shape))
    info = json.loads(cli("inspect", "back.modelc", "--json").stdout)
    assert info["tokenizer"]["n_tokens"] == 49152 and info["has_chat_template"]


def test_pack_to_file_compress_quantize_round_trip(cli: Cli, tmp_path: Path) -> None:
    w = _mlp(tmp_path / "m.safetensors")
    out = tmp_path / "m.modelc"
    cli(
        "pack",
        "m.safetensors",
        "-o",
        str(out),
        "--compress",
        "--quantize",
        "fp16",
        "--prune",
        "0.01",
    )
    info = json.loads(cli("inspect", str(out), "--json").stdout)
    assert info["compression"] == "zstd" and info["pack"]["quantize"] == "fp16"
    assert info["pack"]["prune_threshold"] == 0.01 and info["architecture"] == "mlp"
    assert _listing(cli) == []  # -o writes a file, not a store entry
    cli("verify", str(out))
    cli("export", str(out), "-o", "back.safetensors")
    back = load_file(str(tmp_path / "back.safetensors"))
    want = w["fc1.weight"].astype(np.float16)
    want[np.abs(w["fc1.weight"]) < 0.01] = 0
    np.testing.assert_array_equal(back["layers.0.weight"], want)
    np.testing.assert_array_equal(back["layers.0.bias"], w["fc1.bias"])


def test_store_commands(cli: Cli, tmp_path: Path) -> None:
    _mlp(tmp_path / "m.safetensors")
    assert "packed m:latest" in cli("pack", "m.safetensors").stdout  # name from the file name
    cli("pack", "m.safetensors", "--name", "m:v2")
    assert {(e["version"], e["current"]) for e in _listing(cli)} == {
        ("latest", False),
        ("v2", True),
    }
    cli.fails("rm", "m", match=r"'m' has 2 versions \(latest, v2\)")
    cli("switch", "m", "latest")
    assert [e["version"] for e in _listing(cli) if e["current"]] == ["latest"]
    cli.fails("switch", "m", "v3", match="no version 'v3'")
    cli("cp", "m:v2", "copy")
    cli.fails("cp", "m", "copy:v2", match="already exists")
    found = json.loads(cli("search", "copy", "--json").stdout)
    assert [(e["name"], e["version"]) for e in found] == [("copy", "v2")]
    assert len(json.loads(cli("search", "arch:mlp", "<1M", "--json").stdout)) == 3
    assert json.loads(cli("search", ">1M", "--json").stdout) == []
    assert "removed m:v2" in cli("rm", "m:v2").stdout
    assert "removed m:latest" in cli("rm", "m").stdout
    cli("pack", "m.safetensors", "--name", "m:a")
    cli("pack", "m.safetensors", "--name", "m:b")
    assert len(cli("rm", "m", "--all").stdout.splitlines()) == 2
    assert [e["name"] for e in _listing(cli)] == ["copy"]
    cli.fails("rm", "nothing", match="no model named 'nothing'")


def test_bad_inputs_exit_2_one_line_store_unchanged(cli: Cli, tmp_path: Path) -> None:
    _mlp(tmp_path / "m.safetensors")
    cli("pack", "m.safetensors", "--name", "good")
    before = _listing(cli)
    (tmp_path / "random.bin").write_bytes(np.random.default_rng(0).bytes(4096))
    (tmp_path / "corrupt.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 40)
    (tmp_path / "short.safetensors").write_bytes((tmp_path / "m.safetensors").read_bytes()[:300])
    (tmp_path / "tiny").write_bytes(b"abc")
    cli("pack", "m.safetensors", "-o", "ok.modelc")
    data = (tmp_path / "ok.modelc").read_bytes()
    (tmp_path / "trunc.modelc").write_bytes(data[: len(data) // 2])
    cli.fails("pack", "random.bin", "--name", "r", match="random.bin")
    cli.fails("pack", "corrupt.gguf", "--name", "c", match="corrupt.gguf")
    cli.fails("pack", "short.safetensors", "--name", "s", match="short.safetensors")
    cli.fails("pack", "tiny", match="too short")
    cli.fails("pack", "nope.gguf", match="no such file")
    cli.fails("inspect", "trunc.modelc", match="truncated")
    cli.fails("verify", "trunc.modelc", match="truncated")
    cli.fails("inspect", "no-such-model", match="not in the store")
    cli.fails("pack", "m.safetensors", "--name", "bad/name", match="invalid model name")
    cli.fails("pack", "m.safetensors", "--quantize", "q3", match="invalid choice")
    cli.fails("pack", "m.safetensors", "--level", "99", match="level")
    cli.fails("pack", "m.safetensors", "-o", "x.modelc", "--name", "x", match="not both")
    cli.fails("export", "good", "-o", "out.bin", match="safetensors")
    cli.fails("verify", match="MODEL or --all")
    cli.fails("frobnicate", match="invalid choice")
    cli.fails("pull", "not-a-model", match="neither a catalog model")
    cli.fails("pull", "http://127.0.0.1:9/x.gguf", match="cannot connect")
    cli.fails("search", ">big", match="bad size filter")
    cli.fails("completions", "tcsh", match="invalid choice")
    assert _listing(cli) == before
    home = Path(cli.env["MODELC_HOME"])
    assert not [p for p in home.rglob("*") if p.name.endswith(".tmp")]
    (home / "config.toml").write_text("[server]\nport = 'eighty'\n")
    cli.fails("list", match=r"config.toml: bad value for 'server.port'")


def test_corrupted_byte_fails_verify_naming_the_tensor(cli: Cli, tmp_path: Path) -> None:
    _mlp(tmp_path / "m.safetensors")
    cli("pack", "m.safetensors", "--name", "m")
    meta = json.loads(cli("inspect", "m", "--json", "--tensors").stdout)
    entry = next(t for t in meta["tensors"] if t["name"] == "layers.1.weight")
    path = Path(meta["path"])
    raw = bytearray(path.read_bytes())
    raw[64 + entry["offset"] + 3] ^= 0x10
    path.write_bytes(bytes(raw))
    cli.fails("verify", "m", match=r"checksum mismatch in tensor layers\.1\.weight")
    proc = cli("verify", "--all", ok=False)
    assert proc.returncode == 2 and "FAILED m:latest" in proc.stdout


def test_raw_file_model_argument_is_cached(cli: Cli, tmp_path: Path) -> None:
    _mlp(tmp_path / "m.safetensors")
    a = json.loads(cli("inspect", "m.safetensors", "--json").stdout)
    b = json.loads(cli("inspect", str(tmp_path / "m.safetensors"), "--json").stdout)
    assert a["path"] == b["path"] and Path(a["path"]).parent.name == "packed"
    assert _listing(cli) == []


def test_tokenize_smollm2_gguf(cli: Cli, smol: Path) -> None:
    # every TEXT verbatim, one JSON list a line
    texts = ["Hello world", "", "   ", "-h", "a\\nb", "a\nb", "--"]
    ids, empty, spaces, dash, escaped, newline, dashes = map(
        json.loads, cli("tokenize", str(smol), *texts).stdout.splitlines()
    )
    assert ids == [19556, 905]  # SmolLM2 adds no BOS (add_bos false)
    assert empty == [] and dashes == json.loads(cli("tokenize", str(smol), "--").stdout)
    assert spaces and all(isinstance(i, int) for i in spaces)
    assert dash == json.loads(cli("tokenize", str(smol), "--", "-h").stdout) and len(dash) >= 1
    assert escaped != newline  # no escape processing


def test_tokenize_vocab_only_gguf_matches_vectors(cli: Cli) -> None:
    vocab = assets.vocab_dir() / "ggml-vocab-gpt-2.gguf"
    inp = (vocab.parent / "ggml-vocab-gpt-2.gguf.inp").read_text(encoding="utf-8")
    out = (vocab.parent / "ggml-vocab-gpt-2.gguf.out").read_text(encoding="utf-8")
    texts = inp.split("\n__ggml_vocab_test__\n")[:6]
    expected = out.strip("\n").split("\n")[:6]
    got = cli("tokenize", str(vocab), *texts).stdout.splitlines()
    for text, line, want in zip(texts, got, expected, strict=True):
        assert json.loads(line) == [int(x) for x in want.split()], repr(text)


def test_tokenize_without_tokenizer(cli: Cli, tmp_path: Path) -> None:
    _mlp(tmp_path / "m.safetensors")
    cli.fails("tokenize", "m.safetensors", "hi", match="has no tokenizer")


def test_interrupted_pack_exits_130_and_leaves_nothing(cli: Cli, smol: Path) -> None:
    import signal
    import time

    store = Path(cli.env["MODELC_HOME"]) / "models"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "modelc.cli",
            "pack",
            str(smol),
            "--name",
            "s",
            "--compress",
            "--level",
            "6",
        ],
        env=cli.env,
        # a job started in the background by a non-interactive shell inherits SIGINT
        # ignored, and Python then installs no KeyboardInterrupt handler: restore the default
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        cwd=cli.cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not list(store.rglob("*.tmp")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(store.rglob("*.tmp")), "pack never started writing"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert not [p for p in store.rglob("*") if p.is_file()]
    assert _listing(cli) == []


def test_malicious_pickle_refused_nothing_runs(cli: Cli, tmp_path: Path) -> None:
    import zipfile

    marker = tmp_path / "pwned"
    # protocol-0 pickle: os.system("touch <marker>"), the classic __reduce__ payload
    payload = f"cos\nsystem\n(S'touch {marker}'\ntR.".encode()
    evil = tmp_path / "pytorch_model.bin"
    with zipfile.ZipFile(evil, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("archive/data.pkl", payload)
        zf.writestr("archive/version", "3\n")
    cli.fails("pack", str(evil), "--name", "evil", match=r"pytorch_model\.bin.*(refus|not allowed)")
    cli.fails("inspect", str(evil), match="pytorch_model.bin")
    assert not marker.exists()
    assert _listing(cli) == []


def test_pull_catalog_name(asset_cli: Cli) -> None:
    out = asset_cli("pull", "smollm2-135m", "--name", "smol:v1").stdout
    assert out.startswith("pulled smol:v1")
    [entry] = _listing(asset_cli)
    assert (entry["name"], entry["version"], entry["architecture"]) == ("smol", "v1", "llama")
    asset_cli.fails("pull", "smollm2-135m", "--sha256", "0" * 64, match="catalog models are pinned")


def test_config_pack_defaults_and_store_path(cli: Cli, tmp_path: Path) -> None:
    _mlp(tmp_path / "m.safetensors")
    home = Path(cli.env["MODELC_HOME"])
    home.mkdir(parents=True)
    elsewhere = tmp_path / "my-store"
    (home / "config.toml").write_text(
        f'[store]\npath = "{elsewhere}"\n[pack]\ncompress = true\nquantize = "fp16"\n'
    )
    cli("pack", "m.safetensors", "--name", "a")
    cli("pack", "m.safetensors", "--name", "b", "--no-compress", "--quantize", "int8")
    info = {e["name"]: e for e in _listing(cli)}
    assert info["a"]["compression"] == "zstd-3" and info["a"]["quantization"].startswith("f16")
    assert info["b"]["compression"] == "none" and info["b"]["quantization"].startswith("int8")
    assert Path(str(info["a"]["path"])).is_relative_to(elsewhere)


def test_pack_minilm_hf_dir_as_bert(cli: Cli) -> None:
    cli("pack", str(assets.minilm_dir()), "--name", "minilm")
    info = json.loads(cli("inspect", "minilm", "--json").stdout)
    assert info["architecture"] == "bert" and info["params"] == "22.7M"
    assert info["tokenizer"] is not None and info["quantization"]["summary"] == "f32"
    assert "ok minilm" in cli("verify", "minilm").stdout


@pytest.mark.parametrize("wait", [0.0, 0.3, 1.0])
def test_kill_9_during_pack_leaves_nothing_after_the_next_command(
    cli: Cli, smol: Path, wait: float
) -> None:
    """kill -9 (no cleanup possible) at a few points of a pack into the store: the store
    stays consistent, and the next command removes the dead writer's temp file."""
    import signal
    import time

    store = Path(cli.env["MODELC_HOME"]) / "models"
    cli("pack", str(smol), "--name", "keep")  # a model that must survive untouched
    before = {p: p.stat().st_size for p in store.rglob("*.modelc")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "modelc.cli", "pack", str(smol), "--name", "s", "--compress"],
        env=cli.env,
        cwd=cli.cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while not list(store.rglob("*.tmp")) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert list(store.rglob("*.tmp")), "pack never started writing"
    time.sleep(wait)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    left = list(store.rglob("*.tmp"))
    if proc.returncode == -signal.SIGKILL and left:  # killed mid-write: the temp file stays
        assert all(p.name.startswith(".") for p in left)
    names = [e["name"] for e in _listing(cli)]  # any store command sweeps the dead writer's
    assert not list(store.rglob("*.tmp"))
    assert "keep" in names
    assert {p: p.stat().st_size for p in store.rglob("*.modelc") if "keep" in str(p)} == before
    assert cli("verify", "--all").returncode == 0


def test_sweep_keeps_a_live_writers_temp_file(cli: Cli) -> None:
    store = Path(cli.env["MODELC_HOME"]) / "models" / "m"
    store.mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = store / f".latest.modelc.{dead.pid}.abc123.tmp"
    live = store / f".latest.modelc.{os.getpid()}.def456.tmp"
    stale.write_bytes(b"x")
    live.write_bytes(b"y")
    _listing(cli)
    assert not stale.exists() and live.exists()
