"""The local store, config.toml, MODEL resolution and URL pulls (over a real local HTTP server)."""

from __future__ import annotations

import hashlib
import http.server
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

from modelc.artifact import PackOptions, open_artifact, write_artifact
from modelc.config import Config, load_config, parse_config
from modelc.errors import (
    ConfigError,
    DownloadError,
    FormatError,
    ModelNotFoundError,
    StoreError,
    UsageError,
)
from modelc.formats import load_model
from modelc.formats.ir import DType, HParams, ModelIR, SourceInfo, Tensor
from modelc.pull import derive_name, download, pull
from modelc.resolve import packed_cache_path, resolve_model
from modelc.store import Store


@pytest.fixture(autouse=True)
def _env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODELC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MODELC_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("MODELC_CONFIG", raising=False)


def _mlp(path: Path, seed: int = 0, width: int = 32) -> Path:
    rng = np.random.default_rng(seed)
    save_file(
        {
            "fc1.weight": rng.standard_normal((width, 16), dtype=np.float32),
            "fc2.weight": rng.standard_normal((4, width), dtype=np.float32),
        },
        str(path),
    )
    return path


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "home" / "models")


@pytest.fixture
def src(tmp_path: Path) -> Path:
    return _mlp(tmp_path / "mlp.safetensors")


def test_add_list_resolve_current(store: Store, src: Path) -> None:
    assert store.list_models() == []
    p = store.add(load_model(src), "mlp")
    assert p == store.root / "mlp" / "latest.modelc"
    assert store.resolve("mlp") == p == store.resolve("mlp:latest")
    p2 = store.add(load_model(src), "mlp:v2", PackOptions(quantize="fp16"))
    assert store.current("mlp") == "v2" and store.resolve("mlp") == p2
    entries = {e.ref: e for e in store.list_models()}
    assert set(entries) == {"mlp:latest", "mlp:v2"}
    e = entries["mlp:v2"]
    assert e.current and not entries["mlp:latest"].current
    assert e.architecture == "mlp" and e.n_params == 32 * 16 + 4 * 32
    assert e.quantization == "f16" and e.size == p2.stat().st_size
    assert entries["mlp:latest"].quantization == "f32" and e.compression == "none"
    store.switch("mlp", "latest")
    assert store.resolve("mlp") == p
    with pytest.raises(ModelNotFoundError, match="no version 'v9'"):
        store.switch("mlp", "v9")
    with pytest.raises(ModelNotFoundError, match="no model named 'nope'"):
        store.resolve("nope")
    with pytest.raises(UsageError, match="invalid model name"):
        store.resolve("../etc")


def test_add_copies_artifact_files(store: Store, src: Path, tmp_path: Path) -> None:
    a = tmp_path / "a.modelc"
    write_artifact(load_model(src), a, PackOptions(compress=True))
    p = store.add(a, "copied:1")
    assert p.read_bytes() == a.read_bytes()
    bad = tmp_path / "bad.modelc"
    bad.write_bytes(a.read_bytes()[:100])
    with pytest.raises(FormatError, match="truncated"):
        store.add(bad, "broken")
    assert store.names() == ["copied"]
    assert not (store.root / "broken").exists()


def test_failed_add_leaves_store_unchanged(store: Store, src: Path) -> None:
    store.add(load_model(src), "mlp")
    before = sorted(str(p.relative_to(store.root)) for p in store.root.rglob("*"))

    def boom() -> np.ndarray[Any, Any]:
        raise FormatError("unreadable tensor", path="x")

    for ref in ("mlp:v2", "other"):
        ir = load_model(src)
        ir.tensors["layers.1.weight"] = Tensor("layers.1.weight", DType.F32, (4, 32), boom)
        with pytest.raises(FormatError, match="unreadable"):
            store.add(ir, ref)
    after = sorted(str(p.relative_to(store.root)) for p in store.root.rglob("*"))
    assert after == before
    assert [e.ref for e in store.list_models()] == ["mlp:latest"]


def test_rm_guards_and_versions(store: Store, src: Path) -> None:
    for v in ("a", "b", "c"):
        store.add(load_model(src), f"m:{v}")
    with pytest.raises(StoreError, match=r"'m' has 3 versions \(a, b, c\).*m:VERSION.*--all"):
        store.rm("m")
    assert store.versions("m") == ["a", "b", "c"]
    assert store.rm("m:c") == ["m:c"]  # the current one: current falls back to the newest left
    assert store.current("m") == "b"
    store.switch("m", "a")
    assert store.rm("m:b") == ["m:b"] and store.current("m") == "a"
    store.add(load_model(src), "m:d")
    assert sorted(store.rm("m", force=True)) == ["m:a", "m:d"]
    assert store.names() == []
    store.add(load_model(src), "n:1")
    store.add(load_model(src), "n:2")
    assert len(store.rm("n", all_versions=True)) == 2
    store.add(load_model(src), "single")
    assert store.rm("single") == ["single:latest"]
    assert not any(p.name.startswith(".trash") for p in store.root.iterdir())
    with pytest.raises(ModelNotFoundError):
        store.rm("single")


def test_cp_and_refuses_existing(store: Store, src: Path) -> None:
    store.add(load_model(src), "m:1")
    p = store.cp("m", "copy")
    assert p == store.root / "copy" / "1.modelc" and store.resolve("copy") == p
    assert p.read_bytes() == store.resolve("m").read_bytes()
    store.cp("m:1", "copy:2")
    with pytest.raises(StoreError, match="copy:1 already exists"):
        store.cp("m", "copy:1")
    with pytest.raises(ModelNotFoundError):
        store.cp("missing", "x")
    assert not (store.root / "x").exists()
    store.rm("m")
    open_artifact(store.resolve("copy:1")).close()  # a hard-linked copy survives the original


def test_search(store: Store, tmp_path: Path) -> None:
    store.add(load_model(_mlp(tmp_path / "s.safetensors", width=32)), "small-mlp")
    store.add(
        load_model(_mlp(tmp_path / "b.safetensors", width=4096)),
        "big-mlp",
        PackOptions(quantize="q8_0"),
    )

    def names(q: str) -> list[str]:
        return [e.name for e in store.search(q)]

    assert names("small") == ["small-mlp"]
    assert names("mlp") == ["big-mlp", "small-mlp"]
    assert names("arch:mlp >10K") == ["big-mlp"]
    assert names("<10K") == ["small-mlp"]
    assert names(">=640") == ["big-mlp", "small-mlp"]
    assert names("<100KB") == ["small-mlp"]
    assert names(">100KB") == ["big-mlp"]
    assert names("<1MB") == ["big-mlp", "small-mlp"]
    assert names("quant:q8_0") == ["big-mlp"]
    assert names("llama") == []
    with pytest.raises(UsageError, match="bad size filter"):
        store.search(">lots")
    with pytest.raises(UsageError, match="empty search"):
        store.search("  ")


# ------------------------------------------------------------------------------------- config
def test_config_defaults_and_file(tmp_path: Path) -> None:
    cfg = load_config()
    assert cfg == Config()
    assert cfg.store_dir == tmp_path / "home" / "models"
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "config.toml").write_text(
        'default_model = "mine"\n[server]\nport = 9000\n[store]\npath = "'
        + str(tmp_path / "elsewhere")
        + '"\n[pack]\ncompress = true\nquantize = "int4"\n'
    )
    cfg = load_config()
    assert cfg.server.port == 9000 and cfg.default_model == "mine"
    assert cfg.store_dir == tmp_path / "elsewhere" and cfg.pack.quantize == "int4"


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('[server]\nport = "http"', "'server.port'"),
        ("[server]\nport = 70000", "'server.port'.*65535"),
        ('[pack]\nquantize = "q3"', "'pack.quantize'"),
        ("[pack]\ncompression_level = 0", "'pack.compression_level'"),
        ("[pack]\nlevel = 3", "unknown key 'pack.level'"),
        ("colour = 1", "unknown key 'colour'"),
        ("[server\nport=1", "invalid TOML"),
    ],
)
def test_config_errors_name_the_key(text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_config(text)


def test_example_config_parses() -> None:
    example = Path(__file__).parent.parent / "configs" / "modelc.example.toml"
    assert parse_config(example.read_text()) == Config(path="config.toml")


# ------------------------------------------------------------------------------------ resolve
def test_resolve_raw_file_is_packed_once(src: Path, store: Store) -> None:
    p = resolve_model(str(src), store=store)
    assert p == packed_cache_path(src) and p.exists()
    mtime = p.stat().st_mtime_ns
    assert resolve_model(str(src), store=store) == p
    assert p.stat().st_mtime_ns == mtime  # cached, not re-packed
    _mlp(src, seed=1)  # the source changes: a new cache key
    os.utime(src, ns=(mtime + 10**9, mtime + 10**9))
    p2 = resolve_model(str(src), store=store)
    assert p2 != p
    # a .modelc path is used as is; a store name resolves through the store
    assert resolve_model(str(p2), store=store) == p2
    store.add(load_model(src), "named")
    assert resolve_model("named", store=store) == store.resolve("named")
    with pytest.raises(ModelNotFoundError, match="not in the store"):
        resolve_model("unknown-model", store=store)
    with pytest.raises(ModelNotFoundError, match="no such file"):
        resolve_model("./missing.gguf", store=store)
    with pytest.raises(ModelNotFoundError, match="no version"):
        resolve_model("named:v7", store=store)


def test_resolve_hf_dir_cache_key_covers_files(tmp_path: Path, store: Store) -> None:
    d = tmp_path / "hf"
    d.mkdir()
    _mlp(d / "model.safetensors")
    k1 = packed_cache_path(d)
    (d / "extra.txt").write_text("x")
    assert packed_cache_path(d) != k1
    assert derive_name(d / "model.safetensors") == "hf"
    assert derive_name("SmolLM2-135M-Instruct.Q4_1.gguf") == "smollm2-135m-instruct.q4_1"


# --------------------------------------------------------------------------------------- pull
class _RangeHandler(http.server.BaseHTTPRequestHandler):
    """Serves one payload; honours Range; can be told to cut the first response short."""

    payload = b""
    cut_first_at: int | None = None
    gone = False  # answer 404 to everything
    requests: list[str | None] = []  # noqa: RUF012

    def do_GET(self) -> None:
        rng = self.headers.get("Range")
        type(self).requests.append(rng)
        data = self.payload
        if self.path != "/model.safetensors" or self.gone:
            self.send_error(404)
            return
        if rng:
            start = int(rng.split("=")[1].rstrip("-"))
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.send_header("Content-Length", str(len(data) - start))
            self.end_headers()
            self.wfile.write(data[start:])
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        cut = type(self).cut_first_at
        if cut is not None:
            type(self).cut_first_at = None
            self.wfile.write(data[:cut])
            self.wfile.flush()
            self.connection.shutdown(2)
            return
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server(src: Path) -> Iterator[str]:
    _RangeHandler.payload = src.read_bytes()
    _RangeHandler.requests = []
    _RangeHandler.gone = False
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RangeHandler)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_pull_url_resumes_and_checks_sha256(server: str, src: Path, store: Store) -> None:
    url = f"{server}/model.safetensors"
    payload = src.read_bytes()
    digest = hashlib.sha256(payload).hexdigest()
    _RangeHandler.cut_first_at = 1000
    with pytest.raises(DownloadError, match="run pull again to resume"):
        download(url, sha256=digest)
    ref, path = pull(url, store, sha256=digest)
    assert _RangeHandler.requests == [None, "bytes=1000-"]
    assert ref == "model:latest" and path == store.resolve("model")
    assert open_artifact(path).manifest.architecture == "mlp"
    # cached: a second pull does not download again
    pull(url, store, name="again:v1")
    assert len(_RangeHandler.requests) == 2
    assert store.resolve("again") != path


def test_pull_errors(server: str, store: Store) -> None:
    with pytest.raises(DownloadError, match=r"sha256 is .* expected 0{64}"):
        pull(f"{server}/model.safetensors", store, name="x", sha256="0" * 64)
    with pytest.raises(DownloadError, match="HTTP 404"):
        pull(f"{server}/nothing.gguf", store)
    with pytest.raises(UsageError, match="64 hex digits"):
        pull(f"{server}/model.safetensors", store, sha256="abc")
    with pytest.raises(UsageError, match="neither a catalog model"):
        pull("not-a-model", store)
    with pytest.raises(DownloadError, match="cannot connect"):
        download("http://127.0.0.1:9/x.gguf")
    with pytest.raises(UsageError, match=r"ftp://h/x\.gguf: modelc cannot pull ftp:// URLs"):
        pull("ftp://h/x.gguf", store)
    assert store.names() == []
    cache = Path(os.environ["MODELC_CACHE"])
    assert not (cache / "downloads").exists() or list((cache / "downloads").iterdir()) == []


def test_failed_download_keeps_a_cut_transfer_only(server: str, src: Path) -> None:
    """A transfer cut short keeps its .part to resume; a 404 on the resume removes it."""
    url = f"{server}/model.safetensors"
    _RangeHandler.cut_first_at = 1000
    with pytest.raises(DownloadError, match="run pull again to resume"):
        download(url)
    downloads = Path(os.environ["MODELC_CACHE"]) / "downloads"
    [part] = downloads.rglob("*.part")
    assert part.stat().st_size == 1000
    _RangeHandler.gone = True
    with pytest.raises(DownloadError, match=rf"{url}: HTTP 404"):
        download(url)
    assert _RangeHandler.requests == [None, "bytes=1000-"]
    assert list(downloads.iterdir()) == []


def test_pull_file_url(src: Path, store: Store) -> None:
    ref, path = pull(src.as_uri(), store)
    assert ref == "mlp:latest" and open_artifact(path).manifest.architecture == "mlp"
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    assert pull(src.as_uri(), store, name="checked", sha256=digest)[0] == "checked:latest"
    with pytest.raises(DownloadError, match="sha256 is"):
        pull(src.as_uri(), store, name="bad", sha256="0" * 64)
    with pytest.raises(DownloadError, match="no such file"):
        pull(src.with_name("nope.gguf").as_uri(), store)
    assert store.names() == ["checked", "mlp"]
    assert not Path(os.environ["MODELC_CACHE"]).exists()  # read in place, nothing cached


def test_store_ir_round_trip_keeps_hparams(store: Store) -> None:
    ir = ModelIR(
        "mlp",
        HParams(layer_sizes=[2, 2]),
        {
            "layers.0.weight": Tensor(
                "layers.0.weight", DType.F32, (2, 2), lambda: np.eye(2, dtype=np.float32)
            )
        },
        SourceInfo(path="mem", format="safetensors"),
        metadata={"note": "hi"},
    )
    p = store.add(ir, "eye")
    m = open_artifact(p).manifest
    assert m.hparams.layer_sizes == [2, 2] and m.metadata == {"note": "hi"}


def test_unreadable_entry_is_listed_and_fails_verify(store: Store, src: Path) -> None:
    store.add(load_model(src), "ok")
    p = store.add(load_model(src), "broken")
    p.write_bytes(p.read_bytes()[:200])
    entries = {e.name: e for e in store.list_models()}
    assert entries["ok"].error is None
    assert entries["broken"].architecture == "unreadable"
    assert entries["broken"].error and "truncated" in entries["broken"].error
    results = dict(store.verify_all())
    assert results["ok:latest"] is None
    assert results["broken:latest"] is not None and "truncated" in str(results["broken:latest"])
    assert store.rm("broken") == ["broken:latest"]


def test_planted_symlinks_are_never_followed(store: Store, src: Path, tmp_path: Path) -> None:
    """A link planted in the store (to a folder or a file elsewhere) is not a model: the
    store neither lists it nor writes, reads or removes through it."""
    store.add(load_model(src), "real")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "latest.modelc").write_bytes(store.resolve("real").read_bytes())
    (store.root / "evil").symlink_to(outside, target_is_directory=True)
    (store.root / "real" / "planted.modelc").symlink_to(outside / "latest.modelc")
    assert store.names() == ["real"]
    assert store.versions("real") == ["latest"]
    for act in (
        lambda: store.resolve("evil"),
        lambda: store.add(load_model(src), "evil"),
        lambda: store.rm("evil", all_versions=True),
    ):
        with pytest.raises(StoreError, match="symbolic link"):
            act()
    assert (outside / "latest.modelc").exists() and list(outside.iterdir()) == [
        outside / "latest.modelc"
    ]


def test_an_extracted_catalog_model_is_used_without_its_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A catalog model extracted before (from its checked package, renamed into place
    whole) is the answer: the package is neither hashed again nor fetched."""
    from modelc import catalog

    monkeypatch.setenv("MODELC_CACHE", str(tmp_path))
    entry = catalog.CATALOG["smollm2-135m"]
    final = tmp_path / "sources" / entry.name / Path(entry.member).name
    final.parent.mkdir(parents=True)
    final.write_bytes(b"GGUF")
    assert catalog.resolve_catalog("smollm2-135m", quiet=True) == final
    assert not (tmp_path / "packages").exists()  # no package looked for, none fetched
