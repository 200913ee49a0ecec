"""A Hugging Face Hub on loopback: real files, served the way huggingface_hub reads the Hub.

The endpoints ``huggingface_hub`` (2.x) calls for ``model_info`` and ``hf_hub_download``:

* ``GET /api/models/{repo}/revision/{rev}`` -> ``{"id", "sha", "siblings": [{"rfilename",
  "size", "blobId", "lfs": {"sha256", "size", "pointerSize"}}]}`` (``lfs`` only on LFS files);
* ``HEAD`` / ``GET /{repo}/resolve/{rev}/{path}`` with ``X-Repo-Commit``, ``ETag`` (an LFS
  file's sha256, else its git blob sha1), ``Content-Length``, and ``Range: bytes=N-``
  answered ``206`` with ``Content-Range``;
* unknown repositories and files -> ``404`` with ``X-Error-Code`` ``RepoNotFound`` /
  ``EntryNotFound``, as the Hub answers.

``rate`` (bytes a second, 0 = unlimited) slows file bodies so a test can kill a pull midway;
``ranges`` records the start of every ranged GET, ``auth`` the Authorization headers sent;
a path in ``corrupt`` is served with one byte changed (its sha256 no longer the Hub's).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

LFS_SUFFIXES = (".gguf", ".safetensors", ".bin")


class _File:
    def __init__(self, local: Path) -> None:
        data = local.read_bytes()
        self.local = local
        self.size = len(data)
        self.lfs = local.name.endswith(LFS_SUFFIXES)
        self.sha256 = hashlib.sha256(data).hexdigest()
        self.git_sha = hashlib.sha1(b"blob %d\0" % self.size + data).hexdigest()

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else self.git_sha


class FakeHub:
    """A threaded HTTP server on 127.0.0.1; ``repos`` maps ``user/repo`` -> {path: file}."""

    def __init__(self, repos: dict[str, dict[str, Path]]) -> None:
        self.repos = {r: {p: _File(f) for p, f in files.items()} for r, files in repos.items()}
        self.commits = {
            r: hashlib.sha1(
                "".join(f"{p}:{f.etag}" for p, f in sorted(files.items())).encode()
            ).hexdigest()
            for r, files in self.repos.items()
        }
        self.rate = 0
        self.ranges: list[tuple[str, int]] = []
        self.auth: set[str | None] = set()  # Authorization headers seen on file requests
        self.corrupt: set[str] = set()  # paths served with byte 1000 flipped
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _error(self, code: int, error_code: str, repo: str | None = None) -> None:
                body = json.dumps({"error": error_code}).encode()
                self.send_response(code)
                self.send_header("X-Error-Code", error_code)
                if repo is not None:
                    self.send_header("X-Repo-Commit", hub.commits[repo])
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _info(self, repo: str) -> None:
                siblings = []
                for path, f in sorted(hub.repos[repo].items()):
                    s: dict[str, object] = {"rfilename": path, "size": f.size, "blobId": f.git_sha}
                    if f.lfs:
                        s["lfs"] = {"sha256": f.sha256, "size": f.size, "pointerSize": 134}
                    siblings.append(s)
                body = json.dumps(
                    {"id": repo, "modelId": repo, "sha": hub.commits[repo], "siblings": siblings}
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _file(self, repo: str, path: str) -> None:
                hub.auth.add(self.headers.get("Authorization"))
                f = hub.repos[repo].get(path)
                if f is None:
                    self._error(404, "EntryNotFound", repo)
                    return
                start = 0
                rng = self.headers.get("Range")
                if rng and rng.startswith("bytes=") and self.command == "GET":
                    start = int(rng[len("bytes=") :].split("-", 1)[0])
                    hub.ranges.append((path, start))
                self.send_response(206 if start else 200)
                self.send_header("X-Repo-Commit", hub.commits[repo])
                self.send_header("ETag", f'"{f.etag}"')
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("Content-Length", str(f.size - start))
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{f.size - 1}/{f.size}")
                self.end_headers()
                if self.command == "HEAD":
                    return
                with f.local.open("rb") as src:
                    src.seek(start)
                    pos = start
                    while block := src.read(1 << 16):
                        if path in hub.corrupt and pos <= 1000 < pos + len(block):
                            block = bytearray(block)
                            block[1000 - pos] ^= 0xFF
                            block = bytes(block)
                        pos += len(block)
                        try:
                            self.wfile.write(block)
                        except (BrokenPipeError, ConnectionResetError):
                            return
                        if hub.rate:
                            time.sleep(len(block) / hub.rate)

            def _route(self) -> None:
                parts = unquote(urlparse(self.path).path).strip("/").split("/")
                if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] == "revision":
                    repo = "/".join(parts[2:4])
                    if repo not in hub.repos:
                        self._error(404, "RepoNotFound")
                    else:
                        self._info(repo)
                elif len(parts) >= 5 and parts[2] == "resolve":
                    repo = "/".join(parts[:2])
                    if repo not in hub.repos:
                        self._error(404, "RepoNotFound")
                    else:
                        self._file(repo, "/".join(parts[4:]))
                else:
                    self._error(404, "RepoNotFound")

            do_GET = _route
            do_HEAD = _route

        return Handler
