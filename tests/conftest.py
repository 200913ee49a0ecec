"""The shared fixtures of the test suite, each defined once here and used by name.

Session-scoped (one process for the whole run, stopped at its end):

* ``smol_server``: ``modelc run`` on the SmolLM2 GGUF (4 slots, a ': ping' every 50 ms, so
  every stream carries comments clients must skip).
* ``minilm_server``: ``modelc run`` on the MiniLM embedding model.
* ``smol_exact_server``: ``modelc run`` on the SmolLM2 GGUF with ``MODELC_MATMUL=exact``
  (activations stay f32) and an f32 KV cache: the mode compared with transformers' goldens.
* ``templates_server``: ``modelc run`` on the SmolLM2 GGUF as ``smol`` in a private store,
  with ``qwen3``, ``qwen35`` and ``gptoss``: SmolLM2 under Qwen3's, Qwen3.5's and gpt-oss's
  chat templates (``/api/create``); a module may create more models from ``smol``
  (:func:`tests.server_fixtures.create_from`) under names no other module uses.
* ``llamacpp``: llama.cpp's own server (the ``xllamacpp`` wheel, :mod:`modelc.bench.llamacpp`)
  on the same GGUF; the fixture's value has ``url``.  Every llama.cpp peer of a worker
  without an environment of its own starts in one host process
  (``LlamaCppServer.shared``, set below; ``tests/test_llamacpp_host.py``).

Module-scoped, because their store (what /api/pull, /api/copy, /api/create and /api/delete
change) must be private to the module using them: ``smol_minilm_server``,
``two_text_server``; ``browser`` (headless Chromium, skipped without it) and ``page`` (a fresh
profile per test) for the chat page.

The end of a run reports how many servers it started (``modelc run`` by arguments,
llama.cpp), summed over the workers of ``pytest -n``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from modelc.bench.llamacpp import LlamaCppServer
from tests.assets import minilm_dir, smollm2_gguf
from tests.chat_page_support import ARGS, CHROMIUM, DESKTOP, sync_playwright
from tests.peers import serve_exact
from tests.server_fixtures import FORMATS, STARTED, TEMPLATES, Server, create_from, start

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

# llama.cpp's servers (~100 a run) start in one host process a worker, not a process each
LlamaCppServer.shared = True


@pytest.fixture(scope="session")
def smol_server() -> Iterator[Server]:
    srv = start(str(smollm2_gguf()), "--max-concurrent", "4", "--ping-interval", "0.05")
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def minilm_server() -> Iterator[Server]:
    srv = start(str(minilm_dir()))
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def smol_exact_server() -> Iterator[Server]:
    yield from serve_exact(smollm2_gguf())


@pytest.fixture(scope="session")
def templates_server() -> Iterator[Server]:
    srv = start(None, str(smollm2_gguf()), "--alias", "smol")
    for name, tpl in (
        ("qwen3", "Qwen-Qwen3-0.6B"),
        ("qwen35", "Qwen3.5-4B"),
        ("gptoss", "openai-gpt-oss-120b"),
    ):
        create_from(srv, name, (TEMPLATES / f"{tpl}.jinja").read_text())
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def llamacpp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaCppServer]:
    log = tmp_path_factory.mktemp("llamacpp") / "llamacpp.log"  # kept for a post-mortem
    with LlamaCppServer(smollm2_gguf(), threads=1, n_parallel=2, n_ctx=8192, log=log) as peer:
        yield peer


@pytest.fixture(scope="module")
def smol_minilm_server() -> Iterator[Server]:
    """``modelc run SmolLM2 MiniLM --alias smol --alias minilm``: one process, two engines,
    a private store."""
    srv = start(
        None, str(smollm2_gguf()), str(minilm_dir()), "--alias", "smol", "--alias", "minilm"
    )
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def two_text_server() -> Iterator[Server]:
    """``modelc run SmolLM2 llama-st --alias smol --alias tiny``: two text models in one
    process (llama-st is the tiny random llama with a chat template), a private store."""
    srv = start(
        None, str(smollm2_gguf()), str(FORMATS / "llama-st"), "--alias", "smol", "--alias", "tiny"
    )
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if sync_playwright is None or CHROMIUM is None:
        pytest.skip("needs playwright (pip) and Debian's chromium (apt-get install chromium)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """A fresh profile (empty localStorage) at desktop size; page errors fail the test."""
    context = browser.new_context(viewport=DESKTOP)
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    yield pg
    context.close()
    assert not errors, errors


# the longest modules, longest first (from --durations of a full run, summed per module):
# collected first, so that ``pytest -n 2 --dist loadfile`` hands them out early and the short
# modules fill the end, instead of one worker running a long module alone while the other
# idles. The soak leads: its 150 s are wall-clock time, mostly idle, beside the other
# worker's busiest modules.
LONG_FIRST = (
    "test_soak.py",
    "test_gemma3_real.py",
    "test_chat_formats_peer.py",
    "test_compile.py",
    "test_store_kill.py",
    "test_cli_pack.py",
    "test_cli.py",
    "test_chat_fidelity.py",
    "test_server_chat_page.py",
    "test_hub.py",
    "test_runtime_llama.py",
    "test_chat_formats_dialects.py",
    "test_cli_completions.py",
    "test_ollama_client.py",
    "test_split.py",
    "test_llama_parity.py",
    "test_batch_sampler.py",
    "test_ollama_create.py",
    "test_chat_formats_server.py",
    "test_cli_chat.py",
    "test_chat_template_file.py",
    "test_server_lifecycle.py",
    "test_reasoning_budget.py",
    "test_vision_server.py",
    "test_engine.py",
    "test_bench.py",
    "test_chat_forced_call.py",
    "test_schemathesis.py",
)


def pytest_configure(config: pytest.Config) -> None:
    """pytest-xdist (3.6 and later) hands out ``--dist loadfile``'s modules by their test
    count, most first, unless told not to: the collection order below would be lost, and
    the one-test soak (150 s) came last, run alone at the end of the run."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        name = item.path.name
        return LONG_FIRST.index(name) if name in LONG_FIRST else len(LONG_FIRST)

    items.sort(key=rank)  # stable: every module keeps its own order


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A ``pytest -n`` worker hands its counts to the controller (``workeroutput``)."""
    out = getattr(session.config, "workeroutput", None)
    if out is not None:
        out["servers"] = json.dumps([dict(STARTED), LlamaCppServer.started])


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """The controller of ``pytest -n``: a worker's counts added to this process's."""
    started, peers = json.loads(getattr(node, "workeroutput", {}).get("servers", "[{}, 0]"))
    STARTED.update(started)
    LlamaCppServer.started += peers


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """One line: the servers this run started (each shared one once per worker)."""
    if not STARTED and not LlamaCppServer.started:
        return
    models = "; ".join(f"{n} x {name}" for name, n in sorted(STARTED.items()))
    terminalreporter.write_line(
        f"servers started: {LlamaCppServer.started} llama.cpp, "
        f"{sum(STARTED.values())} modelc run ({models})"
    )
