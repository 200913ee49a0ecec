"""The official ``ollama`` Python client against ``modelc run`` (issue 12, must-shows 1 and 4).

Every answer is held to a reference: the same server's OpenAI routes (openai client),
``/props``, ``modelc generate`` without a server, or a count known in advance.

* ``smol_minilm_server``: ``modelc run SmolLM2 MiniLM --alias smol --alias minilm`` with a
  private MODELC_HOME; the client's chat, generate, embed(dings), show, ps, list, pull
  (a ``file://`` URL), copy, delete and create, keep_alive and num_ctx/num_predict.
* ``two_text_server``: ``modelc run SmolLM2 llama-st --alias smol --alias tiny``: two text
  models in one process, each answering as it does alone (``modelc generate``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import ollama
import openai
import pytest

from modelc.net import ssl_context
from tests import net
from tests.assets import smollm2_gguf
from tests.peers import HTTP_TIMEOUT, openai_client
from tests.server_fixtures import FORMATS, ROOT, Server

N = 16  # tokens per greedy answer: enough to tell answers apart, cheap on 2 shared cores
Q = "What is the capital of France?"
GREEDY: dict[str, Any] = {"temperature": 0, "num_predict": N}
NEVER = "never"  # an expiry beyond the year 2200: Ollama's "Forever" (now + 2**63 ns)
PULLED = "smolpull"  # the store name `pull` derives from .../smolpull.gguf
Messages = list[dict[str, str]]


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def system(text: str) -> dict[str, str]:
    return {"role": "system", "content": text}


# --- clients and small helpers ---------------------------------------------------------------
@pytest.fixture(scope="module")
def oc(smol_minilm_server: Server) -> ollama.Client:
    return ollama.Client(verify=ssl_context(), host=smol_minilm_server.url, timeout=HTTP_TIMEOUT)


@pytest.fixture(scope="module")
def oa(smol_minilm_server: Server) -> openai.OpenAI:
    return openai_client(smol_minilm_server)


@pytest.fixture(scope="module")
def props(smol_minilm_server: Server) -> dict[str, Any]:
    r = net.get(f"{smol_minilm_server.url}/props", timeout=30)
    r.raise_for_status()
    return dict(r.json())


def listed(oc: ollama.Client) -> list[str]:
    return [str(m.model) for m in oc.list().models]


def running(oc: ollama.Client) -> dict[str, datetime | str]:
    """``ps``: each loaded model's name and expiry as the client parses it (NEVER for
    Ollama's "forever", a date ~292 years ahead)."""
    out: dict[str, datetime | str] = {}
    for m in oc.ps().models:
        assert m.model is not None and m.expires_at is not None
        out[m.model] = NEVER if m.expires_at.year > 2200 else m.expires_at
    return out


def wait_until(cond: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def seconds_left(expires: datetime) -> float:
    return (expires - datetime.now(UTC)).total_seconds()


def chat_text(oc: ollama.Client, model: str, messages: Messages, **options: Any) -> str:
    r = oc.chat(model=model, messages=messages, options={**GREEDY, **options})
    return str(r.message.content)


def openai_chat(oa: openai.OpenAI, model: str, messages: Messages, n: int = N) -> Any:
    return oa.chat.completions.create(
        model=model,
        messages=messages,  # type: ignore[arg-type]
        temperature=0,
        max_tokens=n,
    )


def parameters(text: str) -> dict[str, list[str]]:
    """``show``'s ``parameters`` (Modelfile PARAMETER lines) as name -> values."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        name, _, value = line.strip().partition(" ")
        out.setdefault(name, []).append(value.strip())
    return out


def show_json(server: Server, model: str) -> dict[str, Any]:
    """The raw ``/api/show`` body (the client's ShowResponse drops ``system``)."""
    r = net.post(f"{server.url}/api/show", json={"model": model}, timeout=60)
    r.raise_for_status()
    return dict(r.json())


@pytest.fixture(scope="module")
def pulled(oc: ollama.Client, tmp_path_factory: pytest.TempPathFactory) -> str:
    """SmolLM2 pulled into the server's store from a ``file://`` URL (streamed statuses)."""
    src = tmp_path_factory.mktemp("pull") / f"{PULLED}.gguf"
    src.symlink_to(smollm2_gguf())
    assert PULLED not in listed(oc)
    statuses = [p.status for p in oc.pull(src.as_uri(), stream=True)]
    assert statuses[-1] == "success", statuses
    return PULLED


# --- must-show 1: every client call against one two-model server ----------------------------
@pytest.mark.slow
def test_chat_and_generate_equal_openai_routes(oc: ollama.Client, oa: openai.OpenAI) -> None:
    msgs = [system("You are terse."), user(Q)]
    ref = openai_chat(oa, "smol", msgs)
    r = oc.chat(model="smol", messages=msgs, options=GREEDY)
    assert r.message.role == "assistant" and r.done and r.model == "smol"
    assert r.message.content == ref.choices[0].message.content
    assert (r.prompt_eval_count, r.eval_count) == (
        ref.usage.prompt_tokens,
        ref.usage.completion_tokens,
    )
    assert r.done_reason == ref.choices[0].finish_reason
    # streamed (the client's NDJSON reader): the same text, one final chunk with the counts
    parts = list(oc.chat(model="smol", messages=msgs, options=GREEDY, stream=True))
    assert "".join(str(p.message.content) for p in parts) == r.message.content
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    assert parts[-1].eval_count == r.eval_count

    # generate = a one-turn chat (its system and prompt as the messages)
    g = oc.generate(model="smol", prompt=Q, system="You are terse.", options=GREEDY)
    assert g.response == ref.choices[0].message.content
    assert g.prompt_eval_count == ref.usage.prompt_tokens and g.eval_count == r.eval_count

    # raw generate = /v1/completions on the same text
    prompt = "The capital of France is"
    raw = oc.generate(model="smol", prompt=prompt, raw=True, options=GREEDY)
    comp = oa.completions.create(model="smol", prompt=prompt, temperature=0, max_tokens=N)
    assert raw.response == comp.choices[0].text and raw.done_reason == "length"
    assert comp.usage is not None and raw.prompt_eval_count == comp.usage.prompt_tokens
    assert raw.context is not None and len(raw.context) == raw.prompt_eval_count + N  # ids


@pytest.mark.slow
def test_embed_equals_openai_embeddings(oc: ollama.Client, oa: openai.OpenAI) -> None:
    texts = ["The cat sits on the mat.", "Stock markets fell sharply today."]
    e = oc.embed(model="minilm", input=texts)
    ref = oa.embeddings.create(model="minilm", input=texts, encoding_format="float")
    ours = np.asarray(e.embeddings, np.float32)
    theirs = np.asarray([d.embedding for d in ref.data], np.float32)
    assert ours.shape == (2, 384)
    np.testing.assert_array_equal(ours, theirs)
    assert e.prompt_eval_count == ref.usage.prompt_tokens
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    # the older single-text /api/embeddings: the same vector as embed of that text alone
    old = np.asarray(oc.embeddings(model="minilm", prompt=texts[0]).embedding, np.float32)
    one = np.asarray(oc.embed(model="minilm", input=texts[0]).embeddings[0], np.float32)
    np.testing.assert_array_equal(old, one)
    np.testing.assert_allclose(old, ours[0], atol=1e-5)
    # a chat model cannot embed: a readable Ollama-shaped error
    with pytest.raises(ollama.ResponseError) as err:
        oc.embed(model="smol", input="hi")
    assert err.value.status_code == 400 and "embedding" in err.value.error


@pytest.mark.slow
def test_show_reports_the_defaults_in_effect(
    oc: ollama.Client, props: dict[str, Any], smol_minilm_server: Server
) -> None:
    s = oc.show("smol")
    assert s.parameters is not None and s.modelfile is not None
    got = parameters(s.parameters)
    want = props["default_generation_settings"]["params"]
    for key in (
        "temperature",
        "top_k",
        "top_p",
        "min_p",
        "repeat_penalty",
        "repeat_last_n",
        "presence_penalty",
        "frequency_penalty",
    ):
        assert float(got[key][0]) == float(want[key]), key
    # llama-server's defaults (the GGUF recommends none), as the README says
    assert [got[k][0] for k in ("temperature", "top_k", "top_p", "min_p")] == [
        "0.8",
        "40",
        "0.95",
        "0.05",
    ]
    assert int(got["num_predict"][0]) == want["max_tokens"] == 4096
    stops = {json.loads(v) for v in got["stop"]}
    assert props["eos_token"] == "<|im_end|>" and {"<|im_end|>", "<|endoftext|>"} <= stops
    assert s.template == props["chat_template"]
    assert f'TEMPLATE """{props["chat_template"]}"""' in s.modelfile
    assert all(f"PARAMETER {line}" in s.modelfile for line in s.parameters.splitlines())
    assert s.details is not None and s.details.family == "llama"
    assert s.details.quantization_level == "Q4_1" and s.details.parameter_size == "135M"
    assert s.modelinfo is not None and s.modelinfo["llama.context_length"] == 8192
    assert s.capabilities is not None and "chat" in s.capabilities
    assert show_json(smol_minilm_server, "smol")["system"] == ""
    m = oc.show("minilm")
    assert m.details is not None and m.details.family == "bert"
    assert m.capabilities is not None and "chat" not in m.capabilities


@pytest.mark.slow
def test_ps_and_list_name_the_served_models(oc: ollama.Client, smol_minilm_server: Server) -> None:
    ps = oc.ps().models
    by_name = {m.model: m for m in ps}
    assert {"smol", "minilm"} <= set(by_name)
    assert by_name["smol"].context_length == 8192 and by_name["minilm"].context_length == 512
    assert by_name["smol"].details is not None and by_name["smol"].details.family == "llama"
    assert by_name["minilm"].details is not None and by_name["minilm"].details.family == "bert"
    # command-line models never expire: as Ollama, now + the longest Go duration (2**63 ns,
    # ~292 years), which `ollama ps` shows as "Forever"
    raw = net.get(f"{smol_minilm_server.url}/api/ps", timeout=30).json()["models"]
    sent = {m["name"]: datetime.fromisoformat(m["expires_at"]) for m in raw}
    ahead = sent["smol"] - datetime.now(UTC)
    assert 292 * 365 < ahead.days < 293 * 366 and sent["minilm"].year == sent["smol"].year
    assert running(oc)["smol"] == running(oc)["minilm"] == NEVER
    assert listed(oc)[:2] == ["smol", "minilm"]
    tags = {m.model: m for m in oc.list().models}
    size = tags["smol"].size
    # list: the file; ps: the memory it holds, as Ollama's (weights + KV budget + prefix cache)
    assert size is not None and size > 50_000_000
    held = by_name["smol"].size
    assert held is not None and held > size + 8 * 8192 * 30 * 3 * 64 * 2 * 2  # 8 full f16 KVs
    assert tags["smol"].digest == by_name["smol"].digest


@pytest.mark.slow
def test_pull_copy_delete(oc: ollama.Client, pulled: str) -> None:
    tags = {m.model: m for m in oc.list().models}
    assert pulled in tags
    details = tags[pulled].details
    assert details is not None and details.family == "llama"
    assert details.quantization_level == "Q4_1"
    assert pulled not in running(oc)  # listed, not loaded
    msgs = [user(Q)]
    want = chat_text(oc, "smol", msgs)
    assert chat_text(oc, pulled, msgs) == want  # loaded on first use
    ps = running(oc)
    assert pulled in ps and 280 < seconds_left(ps[pulled]) <= 300  # Ollama's 5 minutes

    assert oc.copy(pulled, "smolcopy").status == "success"
    assert {pulled, "smolcopy"} <= set(listed(oc))
    assert chat_text(oc, "smolcopy", msgs) == want

    assert oc.delete("smolcopy").status == "success"
    assert "smolcopy" not in listed(oc) and "smolcopy" not in running(oc)
    assert pulled in listed(oc)
    with pytest.raises(ollama.ResponseError) as err:
        oc.chat(model="smolcopy", messages=msgs)
    assert err.value.status_code == 404 and "'smolcopy'" in err.value.error
    with pytest.raises(ollama.ResponseError) as err:
        oc.delete("smolcopy")
    assert err.value.status_code == 404 and "smolcopy" in err.value.error
    with pytest.raises(ollama.ResponseError) as err:  # a command-line model stays
        oc.delete("smol")
    assert err.value.status_code == 400 and "command line" in err.value.error
    assert chat_text(oc, pulled, msgs) == want


FRENCH = "Answer in French."
BRIEFLY = " (briefly)"


def briefly_template(template: str) -> str:
    """SmolLM2's template, slightly changed: a user turn ends with " (briefly)"."""
    old = "message['content'] + '<|im_end|>'"
    assert old in template
    new = f"message['content'] + ('{BRIEFLY}' if message['role'] == 'user' else '') + '<|im_end|>'"
    return template.replace(old, new)


@pytest.mark.slow
def test_create_with_parameters_system_and_template(
    oc: ollama.Client, pulled: str, props: dict[str, Any], smol_minilm_server: Server
) -> None:
    template = briefly_template(props["chat_template"])
    r = oc.create(
        "smolfr",
        from_=pulled,
        parameters={"temperature": 0, "top_k": 7, "repeat_last_n": 32, "stop": ["###"]},
        system=FRENCH,
        template=template,
    )
    assert r.status == "success" and "smolfr" in listed(oc)
    s = oc.show("smolfr")
    assert s.parameters is not None and s.modelfile is not None
    got = parameters(s.parameters)
    assert got["temperature"] == ["0.0"] and got["top_k"] == ["7"]
    assert got["repeat_last_n"] == ["32"] and got["top_p"] == ["0.95"]  # the rest as before
    assert "###" in {json.loads(v) for v in got["stop"]}
    assert s.template == template
    assert f'SYSTEM """{FRENCH}"""' in s.modelfile
    assert show_json(smol_minilm_server, "smolfr")["system"] == FRENCH

    # greedy by its own defaults (no temperature in the request); the system message and
    # the template's " (briefly)" are exactly what the base model needs spelled out
    mine = oc.chat(model="smolfr", messages=[user(Q)], options={"num_predict": N})
    ref = oc.chat(model=pulled, messages=[system(FRENCH), user(Q + BRIEFLY)], options=GREEDY)
    assert mine.message.content == ref.message.content
    assert mine.prompt_eval_count == ref.prompt_eval_count
    g = oc.generate(model="smolfr", prompt=Q, options={"num_predict": N})
    assert g.response == ref.message.content
    # a conversation with its own system message keeps it
    own = [system("Be terse."), user(Q)]
    mine2 = chat_text(oc, "smolfr", own)
    assert mine2 == chat_text(oc, pulled, [system("Be terse."), user(Q + BRIEFLY)])


@pytest.mark.slow
def test_create_from_an_older_clients_modelfile(
    oc: ollama.Client, pulled: str, smol_minilm_server: Server
) -> None:
    """``modelfile`` (FROM/PARAMETER/SYSTEM), as clients before ``from``/``parameters`` send."""
    modelfile = (
        f'FROM {pulled}\nPARAMETER temperature 0\nPARAMETER top_k 5\nSYSTEM """{FRENCH}"""\n'
    )
    with net.stream(
        "POST",
        f"{smol_minilm_server.url}/api/create",
        json={"model": "smolmf", "modelfile": modelfile},
        timeout=120,
    ) as r:
        statuses = [json.loads(line)["status"] for line in r.iter_lines() if line]
    assert statuses[-1] == "success", statuses
    got = parameters(str(oc.show("smolmf").parameters))
    assert got["temperature"] == ["0.0"] and got["top_k"] == ["5"]
    assert show_json(smol_minilm_server, "smolmf")["system"] == FRENCH
    mine = oc.chat(model="smolmf", messages=[user(Q)], options={"num_predict": N})
    assert mine.message.content == chat_text(oc, pulled, [system(FRENCH), user(Q)])
    with pytest.raises(ollama.ResponseError) as err:  # Go templates are refused, readably
        oc.create("gotpl", from_=pulled, template="{{ .Prompt }}")
    assert err.value.status_code == 400 and "Jinja" in err.value.error


@pytest.mark.slow
def test_create_from_a_local_file(oc: ollama.Client) -> None:
    """``from`` a model file on the server's disk (not a store name)."""
    assert oc.create("smolfile", from_=str(smollm2_gguf())).status == "success"
    assert "smolfile" in listed(oc)
    assert chat_text(oc, "smolfile", [user(Q)]) == chat_text(oc, "smol", [user(Q)])


@pytest.mark.slow
def test_create_with_quantize(oc: ollama.Client) -> None:
    """``quantize`` (Ollama's names, as ``ollama create -q q4_K_M``) packs with the K-quant mix;
    the quantized model answers."""
    assert oc.create("smolq4km", from_=str(smollm2_gguf()), quantize="q4_K_M").status == "success"
    shown = oc.show("smolq4km")
    assert shown.details is not None and shown.details.quantization_level == "Q4_K_M"
    assert chat_text(oc, "smolq4km", [user(Q)])
    with pytest.raises(ollama.ResponseError) as err:
        oc.create("smolbad", from_=str(smollm2_gguf()), quantize="q2_K_S")
    assert err.value.status_code == 400 and "quantize" in err.value.error


@pytest.mark.slow
def test_create_num_predict_parameter(oc: ollama.Client, pulled: str) -> None:
    """Ollama's ``num_predict`` parameter is the model's default answer length."""
    oc.create("smol5", from_=pulled, parameters={"temperature": 0, "num_predict": 5})
    got = parameters(str(oc.show("smol5").parameters))
    assert got["num_predict"] == ["5"], got["num_predict"]
    hi = [user("hi")]  # greedy: "Hello! How can I assist you today?" (10 tokens), then stop
    r = oc.chat(model="smol5", messages=hi)
    ref = oc.chat(model=pulled, messages=hi, options={"temperature": 0, "num_predict": 5})
    assert (r.eval_count, r.done_reason) == (5, "length")
    assert r.message.content == ref.message.content


# --- keep_alive --------------------------------------------------------------------------------
@pytest.mark.slow
def test_keep_alive_loads_unloads_and_sets_expiry(oc: ollama.Client, pulled: str) -> None:
    r = oc.generate(model=pulled, prompt="", keep_alive="10m")  # no prompt: load only
    assert (r.done, r.done_reason, r.response) == (True, "load", "")
    assert 590 < seconds_left(running(oc)[pulled]) <= 600

    r = oc.generate(model=pulled, prompt="", keep_alive=0)
    assert (r.done, r.done_reason) == (True, "unload")
    assert wait_until(lambda: pulled not in running(oc), 2.0)

    # a request with keep_alive 0: loaded for it, answers, unloaded right after
    c = oc.chat(model=pulled, messages=[user(Q)], options=GREEDY, keep_alive=0)
    assert c.message.content == chat_text(oc, "smol", [user(Q)])
    assert wait_until(lambda: pulled not in running(oc), 2.0)

    # chat with no messages: load only; a negative keep_alive: never expires
    c = oc.chat(model=pulled, messages=[], keep_alive=-1)
    assert (c.done_reason, c.message.content) == ("load", "")
    assert running(oc)[pulled] == NEVER
    c = oc.chat(model=pulled, messages=[], keep_alive="0s")
    assert c.done_reason == "unload"
    assert wait_until(lambda: pulled not in running(oc), 2.0)
    assert running(oc)["smol"] == running(oc)["minilm"] == NEVER  # untouched


@pytest.mark.slow
def test_keep_alive_zero_does_not_stick_to_an_on_demand_model(
    oc: ollama.Client, pulled: str
) -> None:
    """Ollama: keep_alive 0 unloads; the next request that gives none loads the model with
    the default again (5 minutes)."""
    oc.generate(model=pulled, prompt="", keep_alive=0)
    assert wait_until(lambda: pulled not in running(oc), 2.0)
    oc.chat(model=pulled, messages=[user("hi")], options={"num_predict": 1})
    time.sleep(0.3)
    ps = running(oc)
    assert pulled in ps and 280 < seconds_left(ps[pulled]) <= 300, ps.get(pulled)


@pytest.mark.slow
def test_keep_alive_zero_does_not_stick_to_a_command_line_model(oc: ollama.Client) -> None:
    """A command-line model unloaded with keep_alive 0 is loaded again by the next request,
    and (no keep_alive given) stays loaded, as the command line asked."""
    try:
        oc.generate(model="smol", prompt="", keep_alive=0)
        assert wait_until(lambda: "smol" not in running(oc), 2.0)
        oc.chat(model="smol", messages=[user("hi")], options={"num_predict": 1})
        time.sleep(0.3)
        assert running(oc).get("smol") == NEVER
    finally:
        oc.generate(model="smol", prompt="", keep_alive=-1)  # back as the command line left it


# --- num_ctx and num_predict -------------------------------------------------------------------
CHAT = [
    system("You are a helpful assistant."),
    user("My name is Ada and I live in a small town by the sea, where I keep bees."),
    {"role": "assistant", "content": "Nice to meet you, Ada! Beekeeping by the sea sounds lovely."},
    user("What should I plant for my bees?"),
    {"role": "assistant", "content": "Lavender, borage and clover are all good for bees."},
    user("Which of those flowers first?"),
]


def prompt_count(oc: ollama.Client, messages: Sequence[dict[str, str]], **options: Any) -> int:
    r = oc.chat(model="smol", messages=list(messages), options={"num_predict": 1, **options})
    assert r.prompt_eval_count is not None
    return r.prompt_eval_count


@pytest.mark.slow
def test_num_ctx_drops_the_oldest_messages(oc: ollama.Client) -> None:
    full = prompt_count(oc, CHAT)
    without_pair = [CHAT[0], *CHAT[3:]]  # the system message stays
    m = prompt_count(oc, without_pair)
    k = prompt_count(oc, [CHAT[0], *CHAT[2:]])  # only the first user message gone
    assert m < k < full and k - m > N
    # num_ctx = k: dropping the first user message is not enough, the first pair goes
    r = oc.chat(model="smol", messages=CHAT, options={**GREEDY, "num_ctx": k})
    ref = oc.chat(model="smol", messages=without_pair, options=GREEDY)
    assert r.prompt_eval_count == m <= k
    assert (r.message.content, r.eval_count) == (ref.message.content, N)
    assert r.done_reason == "length"
    # one more token of room: only the first user message goes
    r2 = oc.chat(model="smol", messages=CHAT, options={**GREEDY, "num_ctx": k + 1})
    assert r2.prompt_eval_count == k


@pytest.mark.slow
def test_num_ctx_keeps_a_raw_prompts_end(oc: ollama.Client, oa: openai.OpenAI) -> None:
    prompt = "The quick brown fox jumps over the lazy dog. " * 4 + "The capital of France is"
    whole = oc.generate(model="smol", prompt=prompt, raw=True, options={"num_predict": 1})
    assert whole.context is not None and whole.prompt_eval_count == 45
    ids = whole.context[:45]
    r = oc.generate(
        model="smol", prompt=prompt, raw=True, options={"temperature": 0, "num_ctx": 12}
    )
    # the prompt's last 11 tokens, and room for one more in 12
    assert (r.prompt_eval_count, r.eval_count, r.done_reason) == (11, 1, "length")
    assert r.context is not None and r.context[:11] == ids[-11:]
    ref = oa.completions.create(model="smol", prompt=ids[-11:], temperature=0, max_tokens=1)
    assert r.response == ref.choices[0].text


@pytest.mark.slow
def test_num_predict(oc: ollama.Client, oa: openai.OpenAI) -> None:
    r = oc.chat(model="smol", messages=[user(Q)], options={"temperature": 0, "num_predict": 3})
    assert (r.eval_count, r.done_reason) == (3, "length")
    ref = openai_chat(oa, "smol", [user(Q)], n=3)
    assert r.message.content == ref.choices[0].message.content
    g = oc.generate(model="smol", prompt=Q, options={"temperature": 0, "num_predict": 3})
    assert (g.eval_count, g.done_reason, g.response) == (3, "length", r.message.content)
    # -1: to the end of the turn (greedy "hi" ends after 10 tokens), as with no limit
    hi = [user("hi")]
    to_end = oc.chat(model="smol", messages=hi, options={"temperature": 0, "num_predict": -1})
    ref = oa.chat.completions.create(model="smol", messages=hi, temperature=0)  # type: ignore[arg-type]
    assert to_end.done_reason == ref.choices[0].finish_reason == "stop"
    assert to_end.message.content == ref.choices[0].message.content
    assert ref.usage is not None and to_end.eval_count == ref.usage.completion_tokens


# --- must-show 4: two text models in one process -----------------------------------------------
TINY = FORMATS / "llama-st"  # tiny random llama: noise, but a tokenizer and a chat template


def modelc_generate(model: Path, prompt: str, n: int, *flags: str, home: Path) -> str:
    """What ``modelc generate`` (no server) prints: greedy, ``n`` tokens."""
    env = {**os.environ, "MODELC_HOME": str(home), "MODELC_THREADS": "1"}
    env.pop("MODELC_CONFIG", None)
    greedy = ["--temperature", "0", "--max-tokens", str(n)]
    proc = subprocess.run(
        [sys.executable, "-m", "modelc.cli", "generate", str(model), prompt, *flags, *greedy],
        capture_output=True,
        env=env,
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    return proc.stdout.decode()  # bytes as printed: no newline translation ("\r" stays)


@pytest.fixture(scope="module")
def alone(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Each model's greedy answers from ``modelc generate``, one model per process."""
    home = tmp_path_factory.mktemp("generate-home")
    gguf = smollm2_gguf()
    return {
        "smol chat": modelc_generate(gguf, Q, N, "--chat", home=home),
        "tiny chat": modelc_generate(TINY, Q, N, "--chat", home=home),
        "tiny raw": modelc_generate(TINY, "Once upon a time", N, home=home),
    }


@pytest.fixture(scope="module")
def two(two_text_server: Server) -> tuple[ollama.Client, openai.OpenAI]:
    client = ollama.Client(verify=ssl_context(), host=two_text_server.url, timeout=HTTP_TIMEOUT)
    return client, openai_client(two_text_server)


@pytest.mark.slow
def test_two_text_models_answer_as_alone(
    two: tuple[ollama.Client, openai.OpenAI], alone: dict[str, str]
) -> None:
    oc2, oa2 = two
    assert [m.id for m in oa2.models.list().data] == ["smol", "tiny"]
    assert listed(oc2) == ["smol", "tiny"]
    assert set(running(oc2)) == {"smol", "tiny"}
    assert alone["tiny chat"] != alone["smol chat"]

    for name in ("smol", "tiny"):
        want = alone[f"{name} chat"]
        assert chat_text(oc2, name, [user(Q)]) == want, name
        r = openai_chat(oa2, name, [user(Q)])
        assert r.model == name and r.choices[0].message.content == want
    raw = oc2.generate(model="tiny", prompt="Once upon a time", raw=True, options=GREEDY)
    assert raw.response == alone["tiny raw"] and raw.eval_count == N

    # both at once, each on its own engine: the same answers
    with ThreadPoolExecutor(4) as pool:
        jobs = {
            name: [pool.submit(chat_text, oc2, name, [user(Q)]) for _ in range(2)]
            for name in ("smol", "tiny")
        }
        for name, futures in jobs.items():
            assert [f.result() for f in futures] == [alone[f"{name} chat"]] * 2, name


@pytest.mark.slow
def test_unknown_model_is_404(two: tuple[ollama.Client, openai.OpenAI]) -> None:
    oc2, oa2 = two
    with pytest.raises(openai.NotFoundError) as e:
        openai_chat(oa2, "llama3", [user(Q)])
    assert e.value.status_code == 404 and e.value.code == "model_not_found"
    assert "'llama3'" in e.value.message
    for call in (
        lambda: oc2.chat(model="llama3", messages=[user(Q)]),
        lambda: oc2.generate(model="llama3", prompt=Q),
        lambda: oc2.show("llama3"),
    ):
        with pytest.raises(ollama.ResponseError) as err:
            call()
        assert err.value.status_code == 404 and "'llama3'" in err.value.error
        assert "smol" in err.value.error and "tiny" in err.value.error  # what is served


@pytest.mark.slow
def test_every_name_of_a_model_routes_to_it(
    two: tuple[ollama.Client, openai.OpenAI], alone: dict[str, str], two_text_server: Server
) -> None:
    """The alias, the store-style ``:latest`` form, the argument as given, the file name
    with and without its extension (a directory's name); no model: the first one."""
    oc2, _ = two
    gguf = smollm2_gguf()
    names = {
        "smol": ["smol", "smol:latest", str(gguf), gguf.name, gguf.stem],
        "tiny": ["tiny", "tiny:latest", str(TINY), TINY.name],
    }
    wrong = {}
    for model, aliases in names.items():
        for name in aliases:
            try:
                got = chat_text(oc2, name, [user(Q)])
            except ollama.ResponseError as e:
                got = f"{e.status_code}: {e.error}"
            if got != alone[f"{model} chat"]:
                wrong[name] = got
    assert not wrong, "\n".join(f"{k!r} -> {v[:90]!r}" for k, v in wrong.items())
    nameless = net.post(
        f"{two_text_server.url}/v1/chat/completions",
        json={"messages": [user(Q)], "temperature": 0, "max_tokens": N},
        timeout=120,
    ).json()
    assert nameless["model"] == "smol"
    assert nameless["choices"][0]["message"]["content"] == alone["smol chat"]
