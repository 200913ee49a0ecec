"""Prove a ``modelc containerize`` build context without a container engine.

    flock /tmp/modelc-bench.lock .venv/bin/python -m scripts.rootfs_smoke [--model M | --context DIR]

As root (Debian, with ``mmdebstrap``, ``unshare``, ``nsenter``, ``ip``):

1. writes a build context with ``modelc containerize`` (a real ``pip wheel --no-deps``
   of this checkout), unless ``--context`` names one;
2. builds the base: a minimal Debian bookworm root filesystem from ``mmdebstrap``
   (``minbase`` + python3, python3-venv, ca-certificates) stands in for the
   Dockerfile's ``FROM python:3.11.X-slim-bookworm`` (Debian's CPython 3.11 in /usr
   instead of the image's CPython 3.11.X in /usr/local; same glibc, same cp311 ABI);
   cached in ``~/.cache/modelc-rootfs``;
3. applies the Dockerfile's instructions to a copy of it (parsed with
   dockerfile-parse): ENV, RUN (``chroot`` in a private mount namespace, with the
   network, as ``docker build`` has), COPY, USER, WORKDIR, and records EXPOSE,
   STOPSIGNAL, HEALTHCHECK, ENTRYPOINT;
4. starts the ENTRYPOINT as the USER in private PID, mount, network, UTS and IPC
   namespaces (``unshare``; the server is PID 1 there, as in a container), and drives
   it over the namespace's loopback (``nsenter --net``): the HEALTHCHECK command, one
   greedy chat on ``/v1/chat/completions`` compared with a ``modelc run`` of the same
   artifact outside, then a stream during which SIGTERM arrives: the stream must
   finish, ``/health`` must turn 503, and PID 1 must exit 0.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path.home() / ".cache" / "modelc-rootfs"
BASE_PACKAGES = "python3,python3-venv,ca-certificates"
BASE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
}
PROMPT = [{"role": "user", "content": "What is the capital of France? Answer briefly."}]


def say(msg: str) -> None:
    print(f"[rootfs_smoke {time.strftime('%H:%M:%S')}] {msg}", flush=True)


@dataclass
class Image:
    env: dict[str, str] = field(default_factory=lambda: dict(BASE_ENV))
    user: str = "0:0"
    workdir: str = "/"
    expose: list[str] = field(default_factory=list)
    stopsignal: str = "SIGTERM"
    healthcheck: list[str] = field(default_factory=list)
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)


def base_rootfs() -> Path:
    """A cached mmdebstrap tarball of Debian bookworm with python3."""
    CACHE.mkdir(parents=True, exist_ok=True)
    tar = CACHE / "bookworm-minbase-python3.tar"
    if not tar.exists():
        say(f"mmdebstrap --variant=minbase --include={BASE_PACKAGES} bookworm")
        t0 = time.monotonic()
        tmp = tar.with_suffix(".tmp.tar")
        subprocess.run(
            ["mmdebstrap", "--variant=minbase", f"--include={BASE_PACKAGES}", "bookworm", str(tmp)],
            check=True,
        )
        tmp.rename(tar)
        say(f"base rootfs built in {time.monotonic() - t0:.0f} s")
    return tar


def expand(s: str, env: dict[str, str]) -> str:
    return re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: env.get(m.group(1), ""), s)


def env_argv(env: dict[str, str]) -> list[str]:
    return ["/usr/bin/env", "-i", *(f"{k}={v}" for k, v in env.items())]


HOST_CA = "/etc/ssl/certs/ca-certificates.crt"


def chroot_run(root: Path, script: str, env: dict[str, str]) -> None:
    """``RUN script``: /bin/sh -c in the rootfs, private mount namespace, host network.

    This machine reaches PyPI through a TLS-intercepting proxy, so the step sees the
    host's CA bundle (bind-mounted in its private mount namespace, and PIP_CERT), as a
    build secret would: nothing of it stays in the image.
    """
    wrapper = (
        'mount -t proc proc "$1/proc" && cp /etc/resolv.conf "$1/etc/resolv.conf"'
        f' && mount --bind {HOST_CA} "$1{HOST_CA}"'
        ' && r=$1 && shift && exec chroot "$r" "$@"'
    )
    argv = ["unshare", "--mount", "--fork", "--", "/bin/sh", "-c", wrapper, "sh", str(root)]
    step_env = {**env, "PIP_CERT": HOST_CA}
    subprocess.run([*argv, *env_argv(step_env), "/bin/sh", "-c", script], check=True)


def copy_in(context: Path, root: Path, args: list[str], workdir: str) -> None:
    *srcs, dst = args
    target = root / (dst if dst.startswith("/") else f"{workdir}/{dst}").lstrip("/")
    into_dir = dst.endswith("/") or len(srcs) > 1
    for src in srcs:
        s = context / src
        if s.is_dir():  # a directory's contents, as docker does
            shutil.copytree(s, target, dirs_exist_ok=True)
        else:
            d = target / s.name if into_dir else target
            d.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(s, d)


def apply_dockerfile(context: Path, root: Path) -> Image:
    from dockerfile_parse import DockerfileParser

    img = Image()
    for ins in DockerfileParser(path=str(context / "Dockerfile")).structure:
        op, val = ins["instruction"], ins["value"]
        if op in ("COMMENT", "LABEL"):
            continue
        say(f"{op} {val[:110]}")
        if op == "FROM":
            assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm(@sha256:[0-9a-f]{64})?", val), val
        elif op == "ENV":
            for kv in shlex.split(val):
                k, _, v = kv.partition("=")
                img.env[k] = expand(v, img.env)
        elif op == "RUN":
            chroot_run(root, val, img.env)
        elif op == "COPY":
            copy_in(context, root, shlex.split(val), img.workdir)
        elif op == "USER":
            img.user = val
        elif op == "WORKDIR":
            img.workdir = val
            (root / val.lstrip("/")).mkdir(parents=True, exist_ok=True)
        elif op == "EXPOSE":
            img.expose += val.split()
        elif op == "STOPSIGNAL":
            img.stopsignal = val
        elif op == "HEALTHCHECK":
            img.healthcheck = json.loads(val.split("CMD", 1)[1])
        elif op == "ENTRYPOINT":
            img.entrypoint = json.loads(val)
        elif op == "CMD":
            img.cmd = json.loads(val)
        else:
            raise SystemExit(f"rootfs_smoke: no emulation for {op}")
    return img


def start_container(root: Path, img: Image, log: Path) -> subprocess.Popen[bytes]:
    """ENTRYPOINT + CMD as USER in new PID/mount/net/UTS/IPC namespaces (PID 1 inside)."""
    uid, _, gid = img.user.partition(":")
    wrapper = 'ip link set lo up && r=$1 && shift && exec chroot --userspec="$0" "$r" "$@"'
    inner = ["/bin/sh", "-c", 'cd "$0" && exec "$@"', img.workdir, *img.entrypoint, *img.cmd]
    argv = ["unshare", "--pid", "--fork", "--mount", "--net", "--uts", "--ipc"]
    argv += [f"--mount-proc={root}/proc", "--", "/bin/sh", "-c", wrapper, f"{uid}:{gid or uid}"]
    with log.open("wb") as out:
        return subprocess.Popen(
            [*argv, str(root), *env_argv(img.env), *inner], stdout=out, stderr=subprocess.STDOUT
        )


def pid1(proc: subprocess.Popen[bytes]) -> int:
    """Host PID of the namespace's PID 1 (unshare --fork's child)."""
    import psutil

    for _ in range(200):
        kids = psutil.Process(proc.pid).children()
        if kids:
            return int(kids[0].pid)
        time.sleep(0.05)
    raise SystemExit("rootfs_smoke: the container's PID 1 did not start")


def reference_chat(artifact: Path, name: str) -> str:
    """The same greedy chat from ``modelc run`` of the same artifact, outside the rootfs."""
    import httpx

    from tests.server_fixtures import start

    srv = start(str(artifact), "--alias", name)
    try:
        body = {"model": name, "messages": PROMPT, "temperature": 0, "max_tokens": 32}
        r = httpx.post(f"{srv.url}/v1/chat/completions", json=body, timeout=120)
        r.raise_for_status()
        return str(r.json()["choices"][0]["message"]["content"])
    finally:
        srv.stop()


def drive(a: argparse.Namespace) -> None:
    """Runs inside the container's network namespace; prints one JSON line."""
    import httpx

    url, out = f"http://127.0.0.1:{a.port}", {}
    t0 = time.monotonic()
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() - t0 > 300:
            raise SystemExit("rootfs_smoke: the container was not healthy in 300 s")
        time.sleep(0.1)
    out["ready_s"] = round(time.monotonic() - t0, 2)
    hc = ["nsenter", "-t", str(a.pid), "-m", "-p", "-r", "-w", "-S", a.uid, "-G", a.gid, "--"]
    hc += env_argv(json.loads(a.env)) + json.loads(a.healthcheck)
    out["healthcheck_rc"] = subprocess.run(hc, check=False).returncode
    body: dict[str, Any] = {"model": a.name, "messages": PROMPT, "temperature": 0, "max_tokens": 32}
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
    out["chat_status"] = r.status_code
    out["chat"] = r.json()["choices"][0]["message"]["content"]
    stream = {**body, "max_tokens": 48, "ignore_eos": True, "stream": True}
    chunks, finish, sent = 0, None, None
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=stream, timeout=120) as s:
        for line in s.iter_lines():
            if not line.startswith("data:") or line.endswith("[DONE]"):
                continue
            ch = json.loads(line[5:])["choices"]
            if ch and ch[0].get("delta", {}).get("content"):
                chunks += 1
            if ch and ch[0].get("finish_reason"):
                finish = ch[0]["finish_reason"]
            if chunks == 1 and sent is None:
                os.kill(a.pid, signal.SIGTERM)  # PID 1 of the container, from outside
                sent = time.monotonic()
                while time.monotonic() - sent < 3:  # the signal reaches the loop
                    try:
                        out["health_after_sigterm"] = httpx.get(f"{url}/health").status_code
                    except httpx.HTTPError as e:
                        out["health_after_sigterm"] = type(e).__name__
                    if out["health_after_sigterm"] != 200:
                        break
                    time.sleep(0.05)
    out.update(stream_chunks=chunks, stream_finish=finish)
    print("DRIVE " + json.dumps(out), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="MODEL for modelc containerize (SmolLM2)")
    ap.add_argument("--context", default=None, help="an existing build context")
    ap.add_argument("--keep", action="store_true", help="keep the rootfs")
    ap.add_argument("--drive", action="store_true", help=argparse.SUPPRESS)
    for k in ("port", "pid", "name", "uid", "gid", "env", "healthcheck"):
        ap.add_argument(f"--{k}", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.drive:
        a.pid = int(a.pid)
        drive(a)
        return 0
    t_all = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="modelc-rootfs-"))
    try:
        if a.context:
            ctx = Path(a.context)
        else:
            from tests.assets import smollm2_gguf

            model = a.model or str(smollm2_gguf())
            ctx = work / "context"
            t0 = time.monotonic()
            say(f"modelc containerize {model} -o {ctx}")
            subprocess.run(
                [sys.executable, "-m", "modelc.cli", "containerize", model, "-o", str(ctx)],
                check=True,
            )
            say(f"build context (with pip wheel) in {time.monotonic() - t0:.0f} s")
        artifact = next((ctx / "model").glob("*.modelc"))
        name = artifact.stem
        tar = base_rootfs()
        root = work / "rootfs"
        root.mkdir()
        subprocess.run(["tar", "-xf", str(tar), "-C", str(root)], check=True)
        t0 = time.monotonic()
        img = apply_dockerfile(ctx, root)
        say(f"Dockerfile applied in {time.monotonic() - t0:.0f} s; rootfs {du(root)}")
        ref = reference_chat(artifact, name)
        say(f"reference chat (modelc run outside): {ref!r}")
        log = work / "container.log"
        t0 = time.monotonic()
        proc = start_container(root, img, log)
        p1 = pid1(proc)
        port = img.env.get("MODELC_PORT", img.expose[0] if img.expose else "8080")
        uid, _, gid = img.user.partition(":")
        drv = [
            sys.executable,
            "-m",
            "scripts.rootfs_smoke",
            "--drive",
            "--port",
            port,
            "--pid",
            str(p1),
        ]
        drv += ["--name", name, "--uid", uid, "--gid", gid or uid, "--env", json.dumps(img.env)]
        drv += ["--healthcheck", json.dumps(img.healthcheck)]
        d = subprocess.run(
            ["nsenter", "-t", str(p1), "-n", "--", *drv],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        rc = proc.wait(120)
        exit_s = time.monotonic() - t0
        print(d.stderr[-2000:], end="")
        lines = [x for x in d.stdout.splitlines() if x.startswith("DRIVE ")]
        if not lines:
            print(log.read_text(errors="replace")[-3000:])
            raise SystemExit("rootfs_smoke: the drive step failed")
        res = json.loads(lines[-1][6:])
        res.update(pid1_exit=rc, reference_chat=ref, total_s=round(time.monotonic() - t_all))
        say("container log:\n" + log.read_text(errors="replace")[-1500:])
        print(json.dumps(res, indent=2))
        ok = (
            res["healthcheck_rc"] == 0
            and res["chat_status"] == 200
            and res["chat"] == ref
            and res["stream_finish"] == "length"
            and res["stream_chunks"] >= 40
            and res["health_after_sigterm"] in (503, "ConnectError")
            and rc == 0
        )
        say(
            f"{'PASS' if ok else 'FAIL'} (container ran {exit_s:.0f} s, whole run {res['total_s']} s)"
        )
        return 0 if ok else 1
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)


def du(p: Path) -> str:
    out = subprocess.run(["du", "-sh", str(p)], capture_output=True, text=True, check=False)
    return out.stdout.split()[0] if out.stdout else "?"


if __name__ == "__main__":
    sys.exit(main())
