"""Differential tests: modelc's chat prompts and answers against references.

The references are llama.cpp's own server on the same GGUF (``tests.peers.llamacpp``) and
transformers' f32 goldens of ``tests/golden/smollm2_chat.json`` (``scripts/make_goldens.py
chat``) on the cases of ``tests/fixtures/chat_cases.json``:

* the ids a chat request feeds the model, over every route that takes messages, equal
  llama.cpp's and transformers' ids for the same conversation;
* in ``exact`` matmul mode with an f32 KV cache, greedy answers equal transformers' token
  for token (a difference is allowed only at a near-tie of the golden's logits);
* no answer shows control text or runs past the end of its turn;
* in the default ``fast`` mode, greedy answers mostly agree with llama.cpp's texts;
* control text inside a client's message stays text (llama.cpp parses it: pinned);
* ``modelc generate --chat`` answers what the server answers.

Each server's answers are gathered once per module and checked by several tests.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import ollama
import openai
import pytest

from modelc.bench.llamacpp import LlamaCppServer
from modelc.net import ssl_context
from tests import net
from tests.assets import smollm2_gguf
from tests.peers import HTTP_TIMEOUT, openai_client, post
from tests.server_fixtures import ROOT, Server

CASES: dict[str, Any] = json.loads((ROOT / "tests/fixtures/chat_cases.json").read_text())
GOLDEN: dict[str, Any] = json.loads((ROOT / "tests/golden/smollm2_chat.json").read_text())
MAX_NEW: int = CASES["max_new_tokens"]
EOS: int = GOLDEN["eos_id"]
CHATS: dict[str, list[dict[str, str]]] = {c["id"]: c["messages"] for c in CASES["chats"]}
CHAT_IDS = list(CHATS)
GOLD_CHATS: dict[str, dict[str, Any]] = {c["id"]: c for c in GOLDEN["chats"]}
GOLD_RAW: list[dict[str, Any]] = GOLDEN["raw"]
CONTROL_TEXTS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")
NEAR_TIE = 0.05  # a golden top-1/top-2 logit margin below this is a near-tie
DEFAULT_SEEDS = (11, 12, 13)  # the fast server at its sampling defaults
DEFAULT_CHATS = ("capital", "haiku", "multi-turn", "tool-result")
DEFAULT_MAX_TOKENS = 96

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class Answer:
    """One generation: the text shown, the generated ids (without the end-of-turn token)."""

    label: str
    text: str
    token_ids: list[int]
    finish: str
    prompt_ids: list[int]
    max_tokens: int


# --- clients -------------------------------------------------------------------------------
def gather(fn: Callable[[T], R], items: Iterable[T], workers: int = 4) -> list[R]:
    """``fn`` over ``items``, a few requests in flight (the server batches them)."""
    with cf.ThreadPoolExecutor(workers) as ex:
        return list(ex.map(fn, items))


def model_id(srv: Server) -> str:
    r = net.get(f"{srv.url}/v1/models", timeout=HTTP_TIMEOUT)
    r.raise_for_status()
    return str(r.json()["data"][0]["id"])


def modelc_chat(
    client: openai.OpenAI, model: str, label: str, messages: list[dict[str, str]], **kw: Any
) -> Answer:
    r = client.chat.completions.create(
        model=model,
        messages=messages,  # type: ignore[arg-type]
        extra_body={"return_token_ids": True},
        **kw,
    ).model_dump()
    c = r["choices"][0]
    return Answer(
        label,
        c["message"]["content"],
        c["token_ids"],
        c["finish_reason"],
        r["prompt_token_ids"],
        kw.get("max_tokens", 0),
    )


def modelc_raw(client: openai.OpenAI, model: str, label: str, prompt: str) -> Answer:
    r = client.completions.create(
        model=model,
        prompt=prompt,
        temperature=0,
        max_tokens=MAX_NEW,
        extra_body={"return_token_ids": True},
    ).model_dump()
    c = r["choices"][0]
    return Answer(
        label, c["text"], c["token_ids"], c["finish_reason"], c["prompt_token_ids"], MAX_NEW
    )


def llama_prompt_ids(url: str, messages: list[dict[str, str]]) -> list[int]:
    """llama.cpp's ids for a chat: its template, then its tokenizer (control texts parsed)."""
    text = post(f"{url}/apply-template", {"messages": messages})["prompt"]
    body = {"content": text, "add_special": True, "parse_special": True}
    return [int(i) for i in post(f"{url}/tokenize", body)["tokens"]]


def llama_detokenize(url: str, ids: list[int]) -> str:
    return str(post(f"{url}/detokenize", {"tokens": ids})["content"])


def first_divergence(answer: Answer, gold: dict[str, Any]) -> int | None:
    """The first step where ``answer`` leaves the golden's ids (its EOS included), or None."""
    got = answer.token_ids + ([EOS] if answer.finish == "stop" else [])
    want: list[int] = gold["answer_ids"]
    for k, (a, b) in enumerate(zip(got, want, strict=False)):
        if a != b:
            return k
    return None if len(got) == len(want) else min(len(got), len(want))


def check_against_golden(answers: list[Answer], golds: list[dict[str, Any]]) -> list[str]:
    """Hold greedy answers to the goldens; returns the labels that differ (near-ties)."""
    differ: list[str] = []
    for a, g in zip(answers, golds, strict=True):
        k = first_divergence(a, g)
        if k is None:
            want_ids = g["answer_ids"][:-1] if g["finish"] == "stop" else g["answer_ids"]
            assert a.token_ids == want_ids, a.label
            assert a.finish == g["finish"], (a.label, a.finish, g["finish"])
            if "\ufffd" not in g["answer_text"]:  # a character cut at 48 tokens: ids only
                assert a.text == g["answer_text"], a.label
            continue
        differ.append(a.label)
        assert k < len(g["margins"]), (a.label, k, a.token_ids, g["answer_ids"])
        assert g["margins"][k] < NEAR_TIE, (
            f"{a.label}: modelc leaves the golden at step {k} where the golden's margin is "
            f"{g['margins'][k]:.4f} (not a near-tie)\nmodelc {a.token_ids} {a.finish}\n"
            f"golden {g['answer_ids']} {g['finish']}"
        )
    return differ


def test_golden_check_allows_only_near_ties() -> None:
    gold: dict[str, Any] = {
        "answer_ids": [5, 6, EOS],
        "answer_text": "ab",
        "finish": "stop",
        "margins": [1.0, 0.01, 1.0],
    }

    def ans(ids: list[int], finish: str, text: str = "") -> Answer:
        return Answer("t", text, ids, finish, [], 3)

    assert first_divergence(ans([5, 6], "stop"), gold) is None
    assert first_divergence(ans([5, 7, 8], "length"), gold) == 1
    assert first_divergence(ans([5], "stop"), gold) == 1
    assert first_divergence(ans([5, 6, 9], "length"), gold) == 2
    assert check_against_golden([ans([5, 6], "stop", "ab")], [gold]) == []
    assert check_against_golden([ans([5, 7, 8], "length")], [gold]) == ["t"]  # near-tie
    with pytest.raises(AssertionError, match="not a near-tie"):
        check_against_golden([ans([4, 6], "stop")], [gold])
    with pytest.raises(AssertionError, match="not a near-tie"):
        check_against_golden([ans([5, 6, 9], "length")], [gold])
    with pytest.raises(AssertionError):
        check_against_golden([ans([5, 6], "stop", "ac")], [gold])  # same ids, other text


# --- module fixtures: each server's answers, gathered once ---------------------------------
@pytest.fixture(scope="module")
def fast(smol_server: Server) -> tuple[openai.OpenAI, str]:
    return openai_client(smol_server), model_id(smol_server)


@pytest.fixture(scope="module")
def exact(smol_exact_server: Server) -> tuple[openai.OpenAI, str]:
    return openai_client(smol_exact_server), model_id(smol_exact_server)


def greedy_chats(server: tuple[openai.OpenAI, str]) -> list[Answer]:
    """The 12 chats' greedy answers (max_new_tokens each) from one server."""
    client, model = server
    return gather(
        lambda cid: modelc_chat(client, model, cid, CHATS[cid], temperature=0, max_tokens=MAX_NEW),
        CHAT_IDS,
    )


@pytest.fixture(scope="module")
def exact_chats(exact: tuple[openai.OpenAI, str]) -> list[Answer]:
    return greedy_chats(exact)


@pytest.fixture(scope="module")
def exact_raw(exact: tuple[openai.OpenAI, str]) -> list[Answer]:
    client, model = exact
    return gather(lambda p: modelc_raw(client, model, repr(p), p), CASES["raw"])


@pytest.fixture(scope="module")
def fast_chats(fast: tuple[openai.OpenAI, str]) -> list[Answer]:
    return greedy_chats(fast)


@pytest.fixture(scope="module")
def fast_default_chats(fast: tuple[openai.OpenAI, str]) -> list[Answer]:
    """No sampling field: the server's defaults (a seed each, and a bound on the length)."""
    client, model = fast
    runs = [(cid, seed) for cid in DEFAULT_CHATS for seed in DEFAULT_SEEDS]
    return gather(
        lambda run: modelc_chat(
            client,
            model,
            f"{run[0]} seed {run[1]}",
            CHATS[run[0]],
            seed=run[1],
            max_tokens=DEFAULT_MAX_TOKENS,
        ),
        runs,
    )


@pytest.fixture(scope="module")
def llama_chats(llamacpp: LlamaCppServer) -> list[str]:
    def one(cid: str) -> str:
        body = {"messages": CHATS[cid], "temperature": 0, "max_tokens": MAX_NEW}
        return str(
            post(f"{llamacpp.url}/v1/chat/completions", body)["choices"][0]["message"]["content"]
        )

    return gather(one, CHAT_IDS, workers=2)


# --- the references themselves ---------------------------------------------------------------
def test_goldens_are_for_these_cases() -> None:
    assert [c["id"] for c in GOLDEN["chats"]] == CHAT_IDS
    assert [g["prompt"] for g in GOLD_RAW] == CASES["raw"]
    assert GOLDEN["max_new_tokens"] == MAX_NEW
    for g in [*GOLDEN["chats"], *GOLD_RAW]:
        assert len(g["margins"]) == len(g["answer_ids"])
        assert (g["finish"] == "stop") == (g["answer_ids"][-1] == EOS)
        assert g["finish"] == "stop" or len(g["answer_ids"]) == MAX_NEW


# --- a. the prompt ids every chat route feeds the model --------------------------------------
@pytest.mark.parametrize("cid", CHAT_IDS)
def test_prompt_ids_match_references(
    cid: str, smol_server: Server, fast: tuple[openai.OpenAI, str], llamacpp: LlamaCppServer
) -> None:
    messages = CHATS[cid]
    gold = GOLD_CHATS[cid]
    want: list[int] = gold["prompt_ids"]
    assert llama_prompt_ids(llamacpp.url, messages) == want  # llama.cpp == transformers
    client, model = fast
    served = modelc_chat(client, model, cid, messages, temperature=0, max_tokens=1)
    assert served.prompt_ids == want
    assert post(f"{smol_server.url}/tokenize", {"messages": messages})["tokens"] == want
    text = post(f"{smol_server.url}/apply-template", {"messages": messages})["prompt"]
    assert text == gold["prompt"]
    oll = ollama.Client(verify=ssl_context(), host=smol_server.url, timeout=HTTP_TIMEOUT).chat(
        model=model,
        messages=messages,
        options={"temperature": 0, "num_predict": 1},
        stream=False,
    )
    assert oll.prompt_eval_count == len(want)
    native = post(f"{smol_server.url}/chat", {"messages": messages, "max_tokens": 1})
    assert native["usage"]["prompt_tokens"] == len(want)


# --- b. exact mode == transformers, token for token ------------------------------------------
@pytest.mark.slow
def test_exact_chat_answers_match_transformers(exact_chats: list[Answer]) -> None:
    golds = [GOLD_CHATS[cid] for cid in CHAT_IDS]
    for a, g in zip(exact_chats, golds, strict=True):
        assert a.prompt_ids == g["prompt_ids"], a.label
    differ = check_against_golden(exact_chats, golds)
    print(f"\nexact mode, chats: {len(CHAT_IDS) - len(differ)}/{len(CHAT_IDS)} equal the golden")
    assert len(differ) <= 1, differ


@pytest.mark.slow
def test_exact_raw_answers_match_transformers(exact_raw: list[Answer]) -> None:
    for a, g in zip(exact_raw, GOLD_RAW, strict=True):
        assert a.prompt_ids == g["prompt_ids"], a.label
    differ = check_against_golden(exact_raw, GOLD_RAW)
    print(f"\nexact mode, raw: {len(GOLD_RAW) - len(differ)}/{len(GOLD_RAW)} equal the golden")
    assert len(differ) <= 1, differ


# --- c. no control text, nothing past the end of the turn ------------------------------------
@pytest.mark.slow
def test_answers_end_at_their_turn(
    llamacpp: LlamaCppServer,
    exact_chats: list[Answer],
    exact_raw: list[Answer],
    fast_chats: list[Answer],
    fast_default_chats: list[Answer],
) -> None:
    control_ids = set()
    for t in CONTROL_TEXTS:
        ids = post(
            f"{llamacpp.url}/tokenize", {"content": t, "add_special": False, "parse_special": True}
        )["tokens"]
        assert len(ids) == 1, (t, ids)
        control_ids.add(int(ids[0]))
    assert EOS in control_ids
    answers = [*exact_chats, *exact_raw, *fast_chats, *fast_default_chats]
    for a in answers:
        assert not any(t in a.text for t in CONTROL_TEXTS), (a.label, a.text)
        # generation ended at its first end-of-turn token: none among the generated ids
        assert not control_ids & set(a.token_ids), (a.label, a.token_ids)
        assert a.finish in ("stop", "length"), a.label
        if a.finish == "length":
            assert len(a.token_ids) == a.max_tokens, a.label
        else:  # the end-of-turn token was the next one, within max_tokens
            assert len(a.token_ids) < a.max_tokens, a.label
        # the text is the generated ids and nothing else (llama.cpp's detokenizer)
        if "\ufffd" not in a.text:
            assert a.text == llama_detokenize(llamacpp.url, a.token_ids), a.label
    assert any(a.finish == "stop" for a in fast_default_chats)


# --- d. fast mode against llama.cpp -----------------------------------------------------------
# Both engines quantize activations (differently), so greedy answers part at near-ties.
# Measured (exact text, 12 chats, xllamacpp 2026.10, 1 thread each): 5/12 in each of 3 runs
# (capital, unicode-latin, tool-result, long-summary, whitespace); each engine's text equals
# the f32 golden's in 7/12.
FAST_VS_LLAMA_FLOOR = 3


@pytest.mark.slow
def test_fast_answers_agree_with_llamacpp(fast_chats: list[Answer], llama_chats: list[str]) -> None:
    same = [a.label for a, ref in zip(fast_chats, llama_chats, strict=True) if a.text == ref]
    print(f"\nfast mode vs llama.cpp: {len(same)}/{len(CHAT_IDS)} greedy answers agree: {same}")
    for a, ref in zip(fast_chats, llama_chats, strict=True):
        if a.text != ref:
            print(f"  {a.label}: modelc {a.text!r}\n  {' ' * len(a.label)}  llama  {ref!r}")
    golds = [GOLD_CHATS[cid]["answer_text"] for cid in CHAT_IDS]
    print(
        f"  equal to the f32 golden text: modelc fast "
        f"{sum(a.text == g for a, g in zip(fast_chats, golds, strict=True))}/{len(golds)}, "
        f"llama.cpp {sum(r == g for r, g in zip(llama_chats, golds, strict=True))}/{len(golds)}"
    )
    assert len(same) >= FAST_VS_LLAMA_FLOOR


# --- e. control text inside a message: modelc keeps it text, llama.cpp parses it ------------
def test_control_text_in_a_message_stays_text(
    smol_server: Server, fast: tuple[openai.OpenAI, str], llamacpp: LlamaCppServer
) -> None:
    text = "Repeat this exactly: <|im_end|> and nothing more."
    messages = [{"role": "user", "content": text}]
    client, model = fast
    served = modelc_chat(client, model, "control", messages, temperature=0, max_tokens=1)
    # the template's EOS ends the default system turn and the user turn: two, no more
    assert served.prompt_ids.count(EOS) == len(messages) + 1
    assert post(f"{smol_server.url}/tokenize", {"messages": messages})["tokens"] == (
        served.prompt_ids
    )
    # the same conversation with the control text removed differs by that text's ids only
    plain = [{"role": "user", "content": text.replace("<|im_end|>", "")}]
    assert (
        modelc_chat(client, model, "plain", plain, temperature=0, max_tokens=1).prompt_ids.count(
            EOS
        )
        == len(plain) + 1
    )
    # llama.cpp parses the client's "<|im_end|>" as the control token (documented difference)
    ref = llama_prompt_ids(llamacpp.url, messages)
    assert ref.count(EOS) == len(messages) + 2
    # and modelc's ids are llama.cpp's with the message text tokenized as text
    piece = post(
        f"{llamacpp.url}/tokenize", {"content": text, "add_special": False, "parse_special": False}
    )["tokens"]
    parsed = post(
        f"{llamacpp.url}/tokenize", {"content": text, "add_special": False, "parse_special": True}
    )["tokens"]
    k = next(i for i in range(len(ref)) if ref[i : i + len(parsed)] == parsed)
    assert served.prompt_ids == ref[:k] + piece + ref[k + len(parsed) :]


# --- f. modelc generate --chat == the server ---------------------------------------------------
CLI_RUNS: list[tuple[str, dict[str, Any]]] = [
    ("What is the capital of France? Answer briefly.", {"temperature": 0}),
    ("Write a haiku about the sea.", {"temperature": 0}),
    ("Tell me a fun fact about cats.", {"temperature": 0.8, "seed": 7}),
]
CLI_MAX_TOKENS = 40


@pytest.mark.slow
def test_generate_cli_matches_server(fast: tuple[openai.OpenAI, str], tmp_path: Path) -> None:
    client, model = fast
    env = {**os.environ, "MODELC_THREADS": "1", "MODELC_HOME": str(tmp_path / "home")}
    env.pop("MODELC_CONFIG", None)
    for prompt, settings in CLI_RUNS:
        flags = [f"--{k}={v}" for k, v in settings.items()]
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "modelc.cli",
                "generate",
                str(smollm2_gguf()),
                prompt,
                "--chat",
                "--max-tokens",
                str(CLI_MAX_TOKENS),
                *flags,
            ],
            capture_output=True,
            env=env,
            cwd=ROOT,
            timeout=300,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr.decode(errors="replace")
        served = modelc_chat(
            client,
            model,
            prompt,
            [{"role": "user", "content": prompt}],
            max_tokens=CLI_MAX_TOKENS,
            **settings,
        )
        assert proc.stdout.decode() == served.text, (prompt, settings)
        assert f"finish: {served.finish}" in proc.stderr.decode(), proc.stderr


# --- the README's question at each server's defaults ------------------------------------------
ASKS = 32
QUESTION = [{"role": "user", "content": "What is the capital of France? Answer briefly."}]


@pytest.mark.slow
def test_defaults_end_the_turn_as_often_as_llamacpp(
    fast: tuple[openai.OpenAI, str], llamacpp: LlamaCppServer
) -> None:
    """No sampling field: each server samples at its own defaults (seeded, one request at
    a time, so the run repeats on one machine); answers end their turn within 200 tokens
    as often as llama.cpp's, give or take two of 32 asks: each is a sample at temperature
    0.8 from a 135M model, and int8 rounding that differs by machine or batch (a different
    SIMD path, other requests in the step) changes which token a seed draws, so one ask in
    16 moved between runs of the same code (15/16 against 16/16)."""
    client, model = fast

    def ours_all() -> list[Answer]:
        return gather(
            lambda seed: modelc_chat(
                client, model, f"seed {seed}", QUESTION, seed=seed, max_tokens=200
            ),
            range(ASKS),
            workers=1,
        )

    def theirs(seed: int) -> str:
        body = {"messages": QUESTION, "seed": seed, "max_tokens": 200}
        return str(post(f"{llamacpp.url}/v1/chat/completions", body)["choices"][0]["finish_reason"])

    # the two servers at once (each still one request at a time: one thread each, two cores)
    with cf.ThreadPoolExecutor(2) as ex:
        ours_f, ref_f = ex.submit(ours_all), ex.submit(gather, theirs, range(ASKS), 1)
        ours, ref = ours_f.result(), ref_f.result()
    stopped = sum(a.finish == "stop" for a in ours)
    print(
        f"\nstopped within 200 tokens: modelc {stopped}/{ASKS}, llama.cpp {ref.count('stop')}/{ASKS}"
    )
    assert stopped >= ref.count("stop") - 2
    assert stopped >= 0.8 * ASKS
    assert all(not any(t in a.text for t in CONTROL_TEXTS) for a in ours)
