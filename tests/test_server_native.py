"""Native, llama.cpp/vLLM-style and Ollama endpoints, /openapi.json and /metrics."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from modelc.artifact import load_artifact
from modelc.runtime.tokenizer import Tokenizer
from tests import net
from tests.server_fixtures import Server


@pytest.fixture(scope="module")
def c(smol_server: Server) -> httpx.Client:
    return net.client(base_url=smol_server.url, timeout=120)


def test_tokenize_detokenize_both_field_names(c: httpx.Client) -> None:
    text = "Hello world, how are you?"
    a = c.post("/tokenize", json={"content": text}).json()  # llama.cpp: its shape
    b = c.post("/tokenize", json={"prompt": text}).json()  # vLLM: its shape
    assert list(a) == ["tokens"] and a["tokens"] == b["tokens"]
    assert b["count"] == len(b["tokens"]) > 3 and b["max_model_len"] == 8192
    d = c.post("/detokenize", json={"tokens": a["tokens"]}).json()
    assert d["content"] == d["prompt"] == text
    pieces = c.post("/tokenize", json={"content": text, "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == a["tokens"]
    assert "".join(p["piece"] for p in pieces) == text  # every piece is whole UTF-8 here
    chat = c.post("/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}).json()
    assert chat["count"] > 3
    back = c.post("/detokenize", json={"tokens": chat["tokens"]}).json()["content"]
    assert "<|im_start|>user" in back and back.rstrip().endswith("<|im_start|>assistant")


def test_tokenize_matches_runtime_tokenizer(c: httpx.Client, smol_server: Server) -> None:
    path = c.get("/info").json()["path"]
    ir = load_artifact(path)
    assert ir.tokenizer is not None
    tok = Tokenizer(ir.tokenizer)
    text = "Straße 123 — naïve café"
    assert c.post("/tokenize", json={"content": text}).json()["tokens"] == tok.encode(text)


def test_probes_and_info(c: httpx.Client) -> None:
    assert c.get("/health").json() == {"status": "ok"}
    info = c.get("/info").json()
    assert info["architecture"] == "llama" and info["n_vocab"] == 49152
    assert "chat" in info["capabilities"] and info["parameters"] > 100_000_000
    props = c.get("/props").json()
    assert props["chat_template"] and props["default_generation_settings"]["n_ctx"] == 8192
    assert props["total_slots"] == 4
    v = c.get("/api/version").json()
    assert v["version"] and v["git_sha"]
    sysinfo = c.get("/v1/system").json()
    assert sysinfo["cpu_count"] >= 1 and sysinfo["memory_total"] > sysinfo["memory_available"] > 0


def test_native_complete_chat_stream(c: httpx.Client) -> None:
    r = c.post(
        "/complete", json={"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}
    )
    j = r.json()
    assert r.status_code == 200 and j["text"] and j["usage"]["completion_tokens"] <= 4
    msgs = [{"role": "user", "content": "Say hi"}]
    chat = c.post("/chat", json={"messages": msgs, "max_tokens": 6, "temperature": 0}).json()
    assert chat["message"]["role"] == "assistant" and chat["message"]["content"]
    text, final = "", None
    with c.stream(
        "POST", "/chat/stream", json={"messages": msgs, "max_tokens": 6, "temperature": 0}
    ) as s:
        assert s.headers["content-type"].startswith("text/event-stream")
        for line in s.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                ev = json.loads(line[6:])
                text += ev.get("delta", "")
                final = ev if "finish_reason" in ev else final
    assert text == chat["message"]["content"]
    assert (
        final is not None
        and final["usage"]["completion_tokens"] == chat["usage"]["completion_tokens"]
    )


def test_infer_and_lora_refusals(c: httpx.Client) -> None:
    r = c.post("/infer", json={"inputs": [[1.0, 2.0]]})
    assert r.status_code == 400 and "MLP" in r.json()["error"]["message"]
    r = c.post("/lora/load", json={"path": "/tmp"})
    assert r.status_code == 403 and "--lora-dir" in r.json()["error"]["message"]


def test_ollama_generate_chat_tags(c: httpx.Client) -> None:
    tags = c.get("/api/tags").json()["models"]
    name = tags[0]["name"]
    assert tags[0]["details"]["family"] == "llama" and tags[0]["size"] > 0
    body = {
        "model": name,
        "prompt": "Why is the sky blue?",
        "stream": False,
        "options": {"temperature": 0, "num_predict": 5},
    }
    one = c.post("/api/generate", json=body).json()
    assert one["done"] is True and one["response"] and one["eval_count"] <= 5
    lines = []
    with c.stream("POST", "/api/generate", json={**body, "stream": True}) as s:
        assert s.headers["content-type"] == "application/x-ndjson"
        lines = [json.loads(x) for x in s.iter_lines() if x]
    assert lines[-1]["done"] is True and all(not x["done"] for x in lines[:-1])
    assert "".join(x["response"] for x in lines) == one["response"]
    chat = c.post(
        "/api/chat",
        json={
            "model": name,
            "messages": [{"role": "user", "content": "hi"}],
            "stream": False,
            "options": {"temperature": 0, "num_predict": 4},
        },
    ).json()
    assert chat["message"]["role"] == "assistant" and chat["done"] is True
    r = c.post("/api/chat", json={"model": "llama3", "messages": []})
    assert r.status_code == 404


def test_openapi_describes_every_endpoint(c: httpx.Client) -> None:
    doc = c.get("/openapi.json").json()
    assert doc["openapi"].startswith("3.")
    for path in [
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/models",
        "/tokenize",
        "/detokenize",
        "/health",
        "/api/generate",
        "/api/tags",
        "/lora/load",
    ]:
        assert path in doc["paths"], path
    schemas = doc["components"]["schemas"]
    req = schemas["ChatCompletionRequest"]
    temp = req["properties"]["temperature"]  # a number up to 2, or null (the model's default)
    assert {"type": "null"} in temp["anyOf"]
    assert [t["maximum"] for t in temp["anyOf"] if t.get("type") == "number"] == [2.0]
    assert "messages" in req["required"]
    refs = json.dumps(doc["paths"])
    for name in schemas:
        if name not in ("ErrorDetail",):
            assert name in refs or name in json.dumps(schemas), name


def test_metrics(c: httpx.Client, smol_server: Server) -> None:
    c.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
    text = c.get("/metrics").text
    assert 'modelc_requests_total{endpoint="/v1/completions",status="200"}' in text
    for name in [
        "modelc_inference_duration_seconds_bucket",
        "modelc_time_to_first_token_seconds_count",
        "modelc_tokens_generated_total",
        "modelc_prompt_tokens_total",
        "modelc_engine_running",
        "modelc_engine_queued",
        "modelc_batch_size",
        "modelc_kv_cache_usage_ratio",
        "modelc_prefix_cache_hits_total",
        "modelc_spec_accepted_tokens_total",
        "modelc_requests_active",
    ]:
        assert name in text, name
    assert smol_server.metric("modelc_tokens_generated_total") >= 2


def test_chat_page_served(c: httpx.Client) -> None:
    r = c.get("/")
    assert r.status_code == 200 and "text/html" in r.headers["content-type"]
    assert "/v1/chat/completions" in r.text


# --- MiniLM: native and Ollama embeddings ------------------------------------------------
def test_native_and_ollama_embeddings(minilm_server: Server) -> None:
    url = minilm_server.url
    texts = ["a red apple", "a green apple"]
    oa = net.post(f"{url}/v1/embeddings", json={"input": texts}).json()
    ref = np.array([d["embedding"] for d in oa["data"]])
    native = net.post(f"{url}/embeddings", json={"content": texts}).json()
    assert np.allclose(native["embeddings"], ref, atol=1e-6)
    name = net.get(f"{url}/api/tags").json()["models"][0]["name"]
    ol = net.post(f"{url}/api/embed", json={"model": name, "input": texts}).json()
    assert np.allclose(ol["embeddings"], ref, atol=1e-6) and ol["prompt_eval_count"] > 0
    # llama.cpp's add_special (default false): [CLS] ... [SEP] as an embedding request adds
    ids = net.post(f"{url}/tokenize", json={"content": texts[0], "add_special": True}).json()[
        "tokens"
    ]
    by_ids = net.post(f"{url}/v1/embeddings", json={"input": [ids]}).json()["data"][0]["embedding"]
    assert np.allclose(by_ids, ref[0], atol=1e-6)
    dims = net.post(f"{url}/v1/embeddings", json={"input": texts[0], "dimensions": 64}).json()
    v = np.array(dims["data"][0]["embedding"])
    assert v.shape == (64,) and abs(np.linalg.norm(v) - 1) < 1e-4


# --- MLP: /infer -------------------------------------------------------------------------
def test_infer_mlp_batch() -> None:
    from pathlib import Path

    from tests.server_fixtures import start

    fixtures = Path(__file__).parent / "fixtures" / "formats"
    golden = np.load(fixtures / "mlp_golden.npz")
    srv = start(str(fixtures / "mlp.safetensors"))
    try:
        r = net.post(f"{srv.url}/infer", json={"inputs": golden["x"].tolist()}, timeout=60)
        assert r.status_code == 200, r.text
        assert np.allclose(r.json()["outputs"], golden["y"], atol=1e-5)
        assert net.get(f"{srv.url}/info").json()["capabilities"] == ["infer"]
        bad = net.post(f"{srv.url}/infer", json={"inputs": [[1.0, 2.0]]})
        assert bad.status_code == 400 and "8 features" in bad.json()["error"]["message"]
        ragged = net.post(f"{srv.url}/infer", json={"inputs": [[1.0] * 8, [1.0]]})
        assert ragged.status_code == 400 and ragged.json()["error"]["param"] == "inputs"
        chat = net.post(
            f"{srv.url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]}
        )
        assert chat.status_code == 400
    finally:
        assert srv.stop() == 0


def test_ollama_chat_tools_and_format(c: httpx.Client) -> None:
    name = c.get("/api/tags").json()["models"][0]["name"]
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
    call_schema = {
        "type": "object",
        "properties": {
            "name": {"const": "get_weather"},
            "arguments": tool["function"]["parameters"],
        },
        "required": ["name", "arguments"],
    }
    r = c.post(
        "/api/chat",
        json={
            "model": name,
            "stream": False,
            "tools": [tool],
            "format": call_schema,
            "messages": [{"role": "user", "content": "Weather in Oslo?"}],
            "options": {"temperature": 0, "num_predict": 40},
        },
    )
    msg = r.json()["message"]
    assert msg["tool_calls"][0]["function"]["name"] == "get_weather"
    assert isinstance(msg["tool_calls"][0]["function"]["arguments"]["city"], str)
    # format "json" alone: any JSON object
    r = c.post(
        "/api/generate",
        json={
            "model": name,
            "prompt": "A person as JSON",
            "format": "json",
            "stream": False,
            "options": {"temperature": 0, "num_predict": 30},
        },
    )
    assert r.status_code == 200 and r.json()["response"].lstrip().startswith("{")


def test_chat_stream_n2(c: httpx.Client) -> None:
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 3,
        "n": 2,
        "temperature": 0,
        "stream": True,
    }
    finished: dict[int, str] = {}
    text: dict[int, str] = {0: "", 1: ""}
    with c.stream("POST", "/v1/chat/completions", json=body) as s:
        for line in s.iter_lines():
            if line.startswith("data: {"):
                for ch in json.loads(line[6:])["choices"]:
                    text[ch["index"]] += ch["delta"].get("content") or ""
                    if ch["finish_reason"]:
                        finished[ch["index"]] = ch["finish_reason"]
    assert finished == {0: "length", 1: "length"}
    assert text[0] == text[1] and text[0]  # greedy: both choices agree
