"""How often the default (int8) mode's greedy text stays with the f32 one: modelc vs llama.cpp.

    .venv/bin/python -m bench.greedy_fidelity [--model gemma3|smollm2|FILE.gguf]
                                              [--prompts 150] [--tokens 24] [--threads 2]

Both engines quantize activations to int8 on the CPU, differently, so neither can be held
token for token to the other; what can be compared is how often each one's greedy
continuation equals the f32 one. The f32 reference is modelc in ``exact`` mode with an f32
KV cache (f32 activations on the dequantized weights), which ``tests/test_gemma3_real.py``
and ``tests/test_chat_fidelity.py`` hold to transformers' f32 greedy output. The prompts
are the first 12 words of the docstrings of ~180 standard-library modules (plain English
of many kinds; which ones depends on the Python version, printed with the result). The
end-of-generation ids are banned on every side, as ``ignore_eos`` does. Against each
prompt's reference continuation of ``--tokens`` ids it counts:

* identical continuations (the must-show of issue 13: "at least as often as llama.cpp's");
* tokens agreeing before the first difference, summed over the prompts.
"""

from __future__ import annotations

import argparse
import importlib
import platform
import re
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bench.llamacpp_peer import LlamaCppServer
from modelc.engine import EngineOptions, build_engine
from modelc.formats import load_model
from modelc.runtime.arch import build
from modelc.runtime.backends.cpu import CpuBackend
from modelc.runtime.model import LanguageModel, SeqChunk
from tests.peers import llamacpp_greedy

MODULES = [
    "os",
    "re",
    "json",
    "csv",
    "heapq",
    "bisect",
    "textwrap",
    "string",
    "random",
    "statistics",
    "fractions",
    "decimal",
    "pathlib",
    "shutil",
    "tempfile",
    "glob",
    "fnmatch",
    "pickle",
    "copy",
    "pprint",
    "enum",
    "functools",
    "itertools",
    "operator",
    "collections",
    "dataclasses",
    "typing",
    "abc",
    "contextlib",
    "threading",
    "queue",
    "sched",
    "socket",
    "ssl",
    "select",
    "selectors",
    "signal",
    "subprocess",
    "asyncio",
    "email",
    "html",
    "xml",
    "urllib",
    "http",
    "ftplib",
    "smtplib",
    "uuid",
    "base64",
    "binascii",
    "hashlib",
    "hmac",
    "secrets",
    "zlib",
    "gzip",
    "bz2",
    "lzma",
    "zipfile",
    "tarfile",
    "sqlite3",
    "logging",
    "argparse",
    "getopt",
    "getpass",
    "curses",
    "platform",
    "errno",
    "ctypes",
    "time",
    "datetime",
    "calendar",
    "locale",
    "gettext",
    "unicodedata",
    "codecs",
    "io",
    "struct",
    "array",
    "weakref",
    "types",
    "inspect",
    "dis",
    "ast",
    "tokenize",
    "traceback",
    "gc",
    "warnings",
    "unittest",
    "doctest",
    "pdb",
    "timeit",
    "trace",
    "math",
    "cmath",
    "numbers",
    "colorsys",
    "wave",
    "difflib",
    "shelve",
    "dbm",
    "configparser",
    "netrc",
    "mimetypes",
    "mailbox",
    "quopri",
    "webbrowser",
    "wsgiref",
    "xmlrpc",
    "ipaddress",
    "graphlib",
    "zoneinfo",
    "tomllib",
    "venv",
    "zipimport",
    "pkgutil",
    "importlib",
    "runpy",
    "site",
    "code",
    "codeop",
    "optparse",
    "linecache",
    "filecmp",
    "stat",
    "fileinput",
    "reprlib",
    "keyword",
    "token",
    "symtable",
    "pyclbr",
    "py_compile",
    "compileall",
    "sysconfig",
    "builtins",
    "copyreg",
    "marshal",
    "mmap",
    "readline",
    "rlcompleter",
    "pty",
    "tty",
    "termios",
    "resource",
    "grp",
    "pwd",
    "fcntl",
    "turtle",
    "cmd",
    "shlex",
    "tkinter",
    "ensurepip",
    "zipapp",
    "faulthandler",
    "tracemalloc",
    "cProfile",
    "profile",
    "pstats",
    "atexit",
    "contextvars",
    "concurrent",
    "multiprocessing",
    "plistlib",
    "poplib",
    "imaplib",
    "socketserver",
    "http.server",
    "http.client",
    "urllib.request",
    "urllib.parse",
    "json.decoder",
    "email.message",
    "xml.dom",
    "xml.etree.ElementTree",
    "html.parser",
    "logging.handlers",
    "asyncio.queues",
    "collections.abc",
    "concurrent.futures",
    "importlib.metadata",
    "unittest.mock",
    "sqlite3.dbapi2",
    "ctypes.util",
]


def prompts(limit: int) -> list[str]:
    out = []
    for name in MODULES:
        try:
            doc = importlib.import_module(name).__doc__ or ""
        except Exception:  # a module this Python lacks (tkinter, curses, ...)
            continue
        words = re.sub(r"\s+", " ", doc).strip().split(" ")
        if len(words) >= 12:
            out.append(" ".join(words[:12]))
    return out[:limit]


def greedy(model: LanguageModel, kv: str, ids: list[int], n: int, banned: list[int]) -> list[int]:
    cache = model.new_cache(kv)
    logits = model.forward([SeqChunk(cache, ids)])[0]
    out: list[int] = []
    while len(out) < n:
        logits = logits.copy()
        logits[banned] = -np.inf
        out.append(int(np.argmax(logits)))
        logits = model.forward([SeqChunk(cache, [out[-1]])])[0]
    return out


def agreed(got: Sequence[int], want: Sequence[int]) -> int:
    return next((i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b), len(want))


def model_path(name: str) -> Path:
    from tests import assets

    known = {"gemma3": assets.gemma3_gguf, "smollm2": assets.smollm2_gguf}
    return known[name]() if name in known else Path(name)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gemma3")
    ap.add_argument("--prompts", type=int, default=150)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    path = model_path(a.model)
    texts = prompts(a.prompts)
    eng = build_engine(path, EngineOptions(threads=a.threads))
    assert eng.prompt is not None
    ids = [eng.prompt.encode(t) for t in texts]
    banned = sorted(eng.prompt.eog_ids)
    ir = load_model(path)
    runs: dict[str, list[list[int]]] = {}
    for label, mode, kv in (("f32", "exact", "f32"), ("modelc", "fast", "f16")):
        model = build(ir, CpuBackend(matmul=mode, threads=a.threads))
        assert isinstance(model, LanguageModel)
        runs[label] = [greedy(model, kv, p, a.tokens, banned) for p in ids]
    log = Path(tempfile.mkdtemp(prefix="greedy-fidelity-")) / "llamacpp.log"
    with LlamaCppServer(path, threads=a.threads, n_parallel=1, n_ctx=1024, log=log) as peer:
        runs["llama.cpp"] = [llamacpp_greedy(peer.url, p, a.tokens) for p in ids]
    print(
        f"{path.name}: {len(ids)} prompts (Python {platform.python_version()} docstrings),"
        f" {a.tokens} greedy tokens, end-of-generation ids {banned} banned\n"
    )
    print("| engine (default mode) | continuations identical to f32 | tokens agreeing |")
    print("|---|---|---|")
    for label in ("modelc", "llama.cpp"):
        ks = [agreed(got, ref) for got, ref in zip(runs[label], runs["f32"], strict=True)]
        same = sum(k == a.tokens for k in ks)
        print(f"| {label} | {same}/{len(ids)} | {sum(ks)}/{len(ids) * a.tokens} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
