"""``modelc containerize``: the build context passes hadolint, names only files it holds,
and its entrypoint serves the baked artifact with ``modelc run`` (same greedy answer as a
``modelc run`` of the same model) and drains on SIGTERM.

The image itself is built without an engine by ``scripts/rootfs_smoke.py`` (a Debian
rootfs, the Dockerfile's steps, the entrypoint as PID 1 in private namespaces); it needs
PyPI and about three minutes, so its output is in bench/RESULTS.md, not here.  This test
passes ``--wheel`` a placeholder file so that it stays offline and fast: what it checks is
the context around the wheel; the real ``pip wheel`` and its install are the script's.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import psutil
import pytest
from dockerfile_parse import DockerfileParser

from modelc.resolve import packed_cache_path
from modelc.ship import file_sha256
from tests import net
from tests.assets import smollm2_gguf
from tests.server_fixtures import Server, free_port

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
WHEEL = "modelc-0.1.0-cp311-cp311-linux_x86_64.whl"
CHAT = {
    "messages": [{"role": "user", "content": "What is the capital of France? Answer briefly."}],
    "temperature": 0,
    "max_tokens": 24,
}


def modelc(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, MODELC_HOME=str(home))
    return subprocess.run(
        [sys.executable, "-m", "modelc.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def placeholder_wheel(d: Path, name: str = WHEEL) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(d / name, "w") as z:
        z.writestr("PLACEHOLDER", "not installed by this test\n")
    return d / name


@pytest.fixture(scope="module")
def ctx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("containerize")
    wheel = placeholder_wheel(tmp / "dist")
    out = tmp / "ctx"
    r = modelc(
        "containerize", str(smollm2_gguf()), "-o", str(out), "--name", "smol",
        "--wheel", str(wheel), "--port", "8123", "--grace", "20", home=tmp / "home",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert (out / "wheels" / WHEEL).read_bytes() == wheel.read_bytes()
    return out


def test_context_files_and_hadolint(ctx: Path) -> None:
    files = sorted(str(p.relative_to(ctx)) for p in ctx.rglob("*") if p.is_file())
    assert files == sorted(
        [".dockerignore", "Dockerfile", "constraints.txt", "entrypoint.sh", "healthcheck.py",
         "model/smol.modelc", f"wheels/{WHEEL}"]
    )  # fmt: skip
    lint = subprocess.run(
        [str(BIN / "hadolint"), "--failure-threshold", "info", "--format", "json", "Dockerfile"],
        cwd=ctx,
        capture_output=True,
        text=True,
        check=False,
    )
    assert lint.returncode == 0 and json.loads(lint.stdout) == [], lint.stdout + lint.stderr
    # the baked artifact is the one `modelc run` serves for this model
    assert file_sha256(ctx / "model" / "smol.modelc") == file_sha256(
        packed_cache_path(smollm2_gguf())
    )
    pins = (ctx / "constraints.txt").read_text().split()
    for dep in ("numpy", "hypercorn", "quart-trio", "tokenizers"):
        assert any(re.fullmatch(rf"{dep}==[\w.]+", p) for p in pins), (dep, pins)


def test_dockerfile_names_only_what_the_context_holds(ctx: Path) -> None:
    df = DockerfileParser(path=str(ctx / "Dockerfile"))
    ins = [(i["instruction"], i["value"]) for i in df.structure if i["instruction"] != "COMMENT"]
    allowed = {
        ln[1:].rstrip("/")
        for ln in (ctx / ".dockerignore").read_text().splitlines()
        if ln.startswith("!")
    }
    copied = [src for op, v in ins if op == "COPY" for src in v.split()[:-1]]
    assert copied, ins
    for src in copied:
        assert (ctx / src).exists(), src
        assert src.split("/")[0] in allowed, (src, allowed)  # not left out by .dockerignore
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm", df.baseimage)  # exact tag
    assert df.labels["io.modelc.model.sha256"] == file_sha256(ctx / "model" / "smol.modelc")
    user = dict(ins)["USER"]
    assert re.fullmatch(r"(\d+):(\d+)", user) and not user.startswith("0:")
    assert dict(ins)["EXPOSE"] == "8123"
    assert "/opt/modelc/healthcheck.py" in dict(ins)["HEALTHCHECK"]
    assert json.loads(dict(ins)["ENTRYPOINT"]) == ["/opt/modelc/entrypoint.sh"]
    run = " ".join(v for op, v in ins if op == "RUN")
    assert f"/opt/modelc/wheels/{WHEEL}" in run and "--constraint" in run


def test_entrypoint_serves_the_artifact_and_drains(
    ctx: Path, smol_server: Server, tmp_path: Path
) -> None:
    port = free_port()
    env = {
        **os.environ,
        "PATH": f"{BIN}:{os.environ['PATH']}",
        "MODELC_HOST": "127.0.0.1",
        "MODELC_PORT": str(port),
        "MODELC_HOME": str(tmp_path),
        "MODELC_THREADS": "1",
    }
    log = (tmp_path / "log").open("wb")
    proc = subprocess.Popen([str(ctx / "entrypoint.sh"), "--threads", "1"], env=env, stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    health = [sys.executable, str(ctx / "healthcheck.py")]
    try:
        deadline = time.monotonic() + 120
        while subprocess.run(health, env=env, check=False).returncode != 0:
            assert proc.poll() is None and time.monotonic() < deadline, (
                tmp_path / "log"
            ).read_text()[-3000:]
            time.sleep(0.2)
        # `exec`: the entrypoint's process is modelc run itself, with the baked artifact
        cmd = psutil.Process(proc.pid).cmdline()
        assert "run" in cmd and str(ctx / "model" / "smol.modelc") in cmd, cmd
        assert [m["id"] for m in net.get(f"{url}/v1/models").json()["data"]] == ["smol"]
        ours = net.post(f"{url}/v1/chat/completions", json={**CHAT, "model": "smol"}, timeout=60)
        ref = net.post(f"{smol_server.url}/v1/chat/completions", json=CHAT, timeout=60)
        assert ours.status_code == ref.status_code == 200
        text = ours.json()["choices"][0]["message"]["content"]
        assert text == ref.json()["choices"][0]["message"]["content"] and text
        body = {**CHAT, "model": "smol", "stream": True, "ignore_eos": True, "max_tokens": 32}
        chunks, finish = 0, None
        with net.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as s:
            for line in s.iter_lines():
                if not line.startswith("data:") or line.endswith("[DONE]"):
                    continue
                choice = json.loads(line[5:])["choices"]
                if choice and choice[0]["delta"].get("content"):
                    chunks += 1
                    if chunks == 1:
                        proc.send_signal(signal.SIGTERM)
                if choice and choice[0].get("finish_reason"):
                    finish = choice[0]["finish_reason"]
        assert finish == "length" and chunks >= 30  # the running stream finished
        assert proc.wait(30) == 0
        assert subprocess.run(health, env=env, check=False).returncode == 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()


def test_errors_are_one_line(ctx: Path, tmp_path: Path) -> None:
    model = str(smollm2_gguf())
    wheel = placeholder_wheel(tmp_path / "w312", "modelc-0.1.0-cp312-cp312-linux_x86_64.whl")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    cases = [
        (["-o", str(tmp_path / "full"), "--wheel", str(wheel)], "is not empty"),
        (["-o", str(tmp_path / "x"), "--wheel", str(tmp_path / "no.whl")], "no such file"),
    ]
    try:
        engine = subprocess.run(["docker", "info"], capture_output=True, check=False).returncode
    except FileNotFoundError:
        engine = 1
    if engine != 0:  # no container engine here: --build says so in one line
        cases.append(
            (["-o", str(tmp_path / "b"), "--wheel", str(wheel), "--build"], "docker build -t")
        )
    for args, msg in cases:
        r = modelc("containerize", model, *args, home=tmp_path)
        assert r.returncode == 2, r.stderr
        lines = [ln for ln in r.stderr.splitlines() if ln.startswith("modelc:")]
        assert len(lines) == 1 and msg in lines[0], r.stderr
    assert (tmp_path / "full" / "keep.txt").read_text() == "mine"
    # a cp312 wheel gets a Python 3.12 base
    assert "FROM python:3.12." in (tmp_path / "b" / "Dockerfile").read_text() or engine == 0
