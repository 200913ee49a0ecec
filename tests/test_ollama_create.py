"""Ollama's model creation with the official ``ollama`` client against ``modelc run`` (issue 36):
``create_blob`` (``POST /api/blobs/:digest``), ``HEAD /api/blobs/:digest``, ``create`` from
pushed ``files`` (a GGUF; a Hugging Face directory's safetensors, config and tokenizer) with
``system``, ``parameters``, ``messages``, ``license``, ``quantize``; then ``list``, ``show``,
``chat``, ``copy`` and ``delete`` of the result.

References: the client's own typed models and Ollama's documented status lines (docs/api.md);
a blob's digest is ``hashlib``'s SHA-256 of the file; a created model answers as the same base
model given the same system message, turns and sampling in the request.
"""

from __future__ import annotations

import hashlib
import json
import socket
import time
from pathlib import Path
from typing import Any

import numpy as np
import ollama
import pytest

from modelc.net import ssl_context
from tests import net
from tests.assets import smollm2_gguf
from tests.gen_families import ensure_family
from tests.server_fixtures import Server
from tests.test_hub import split_gguf

Q = "What is the capital of France?"
N = 12
GREEDY: dict[str, Any] = {"temperature": 0, "num_predict": N}
FRENCH = "Answer in French."
OPENING = [
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Bonjour! Comment puis-je vous aider?"},
]
UNKNOWN = "sha256:" + "0" * 64

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def oc(smol_minilm_server: Server) -> ollama.Client:
    return ollama.Client(verify=ssl_context(), host=smol_minilm_server.url, timeout=300)


@pytest.fixture(scope="module")
def url(smol_minilm_server: Server) -> str:
    return smol_minilm_server.url


@pytest.fixture(scope="module")
def smol_blob(oc: ollama.Client) -> str:
    return oc.create_blob(smollm2_gguf())


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return f"sha256:{h.hexdigest()}"


def listed(oc: ollama.Client) -> list[str]:
    return [str(m.model) for m in oc.list().models]


def answer(oc: ollama.Client, model: str, messages: list[dict[str, str]], **opts: Any) -> str:
    return str(oc.chat(model=model, messages=messages, options=opts or None).message.content)


def statuses(url: str, body: dict[str, Any]) -> list[str]:
    with net.stream("POST", f"{url}/api/create", json=body, timeout=300) as r:
        assert r.status_code == 200
        return [json.loads(line)["status"] for line in r.iter_lines() if line]


def store_leftovers(server: Server) -> list[str]:
    """Anything but whole blobs in the server's blob directory (temp files, staging dirs)."""
    blobs = server.log_path.parent / "models" / ".blobs"
    return sorted(p.name for p in blobs.iterdir() if not p.name.startswith("sha256-"))


def test_blobs_head_push_and_refuse_a_wrong_hash(
    oc: ollama.Client, url: str, smol_blob: str, smol_minilm_server: Server
) -> None:
    assert smol_blob == sha256(smollm2_gguf())  # the client's digest is the file's SHA-256
    assert net.head(f"{url}/api/blobs/{smol_blob}").status_code == 200
    assert net.head(f"{url}/api/blobs/{UNKNOWN}").status_code == 404
    # bytes that hash to something else: 400, Ollama's message, nothing kept
    r = net.post(f"{url}/api/blobs/{UNKNOWN}", content=b"not those bytes")
    want = hashlib.sha256(b"not those bytes").hexdigest()
    assert r.status_code == 400
    assert r.json() == {"error": f'digest mismatch, expected "{UNKNOWN}", got "sha256:{want}"'}
    assert net.head(f"{url}/api/blobs/{UNKNOWN}").status_code == 404
    assert store_leftovers(smol_minilm_server) == []
    r = net.head(f"{url}/api/blobs/sha256:abc")  # not a digest
    assert r.status_code == 400
    # pushing a blob that is there already: 200, as Ollama answers; the body is read to its
    # end, so the client's kept-alive connection serves its next request
    assert net.post(f"{url}/api/blobs/{smol_blob}", content=b"").status_code == 200
    assert oc.create_blob(smollm2_gguf()) == smol_blob
    assert "smol" in listed(oc)


def test_an_upload_cut_short_leaves_nothing(url: str, smol_minilm_server: Server) -> None:
    """A client that goes away mid-push: no blob, no partial file."""
    data = bytes(range(256)) * 4096  # 1 MiB
    digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
    head = f"POST /api/blobs/{digest} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(data)}\r\n\r\n"
    with socket.create_connection(("127.0.0.1", smol_minilm_server.port)) as sock:
        sock.sendall(head.encode() + data[: len(data) // 3])
        time.sleep(0.5)  # the server has started writing
    deadline = time.monotonic() + 10
    while store_leftovers(smol_minilm_server) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert store_leftovers(smol_minilm_server) == []
    assert net.head(f"{url}/api/blobs/{digest}").status_code == 404
    # the whole file then goes in, and is there
    assert net.post(f"{url}/api/blobs/{digest}", content=data).status_code == 201
    assert net.head(f"{url}/api/blobs/{digest}").status_code == 200


def test_create_again_replaces_a_loaded_model(oc: ollama.Client, url: str, smol_blob: str) -> None:
    """Creating a name that is loaded: the next request gets the new model; one in flight
    finishes on the old; a new version under the name moves the name alone too."""
    hi = [{"role": "user", "content": Q}]
    systems = ("Answer in French.", "Answer in German.", "Answer in Spanish.")
    want = [answer(oc, "smol", [{"role": "system", "content": s}, *hi], **GREEDY) for s in systems]
    assert len(set(want)) == 3

    oc.create("smolre", files={"smol.gguf": smol_blob}, system=systems[0])
    assert answer(oc, "smolre", hi, **GREEDY) == want[0]  # loaded now
    long = {"model": "smolre", "messages": hi, "options": {"temperature": 0, "num_predict": 48}}
    with net.stream("POST", f"{url}/api/chat", json=long, timeout=300) as r:
        lines = r.iter_lines()
        first = json.loads(next(lines))
        oc.create("smolre", files={"smol.gguf": smol_blob}, system=systems[1])
        rest = [json.loads(line) for line in lines if line]
    text = first["message"]["content"] + "".join(c["message"]["content"] for c in rest)
    assert rest[-1]["done"] and rest[-1]["eval_count"] == 48  # the old model, to its end
    assert text.startswith(want[0])
    assert answer(oc, "smolre", hi, **GREEDY) == want[1]

    oc.create("smolre:v2", files={"smol.gguf": smol_blob}, system=systems[2])
    assert answer(oc, "smolre", hi, **GREEDY) == want[2]  # the current version is v2


def test_create_from_a_pushed_gguf(oc: ollama.Client, url: str, smol_blob: str) -> None:
    """``files`` holding a GGUF, with system, parameters, messages and license: listed, shown,
    answering as the base model given the same conversation; copied and deleted."""
    got = statuses(
        url,
        {
            "model": "smolblob",
            "files": {"smol.gguf": smol_blob},
            "system": FRENCH,
            "parameters": {"temperature": 0, "num_predict": N},
            "messages": OPENING,
            "license": ["MIT", "Apache-2.0"],
        },
    )
    # Ollama's lines for a GGUF (docs/api.md, "Create a model from GGUF")
    assert got == [
        "parsing GGUF",
        f"using existing layer {smol_blob}",
        "writing manifest",
        "success",
    ]
    assert "smolblob" in listed(oc)
    shown = oc.show("smolblob")
    assert shown.license == "MIT\nApache-2.0"
    raw = net.post(f"{url}/api/show", json={"model": "smolblob"}).json()
    assert raw["system"] == FRENCH and raw["messages"] == OPENING
    params = dict(line.split(None, 1) for line in str(shown.parameters).splitlines())
    assert params["temperature"] == "0.0" and params["num_predict"] == str(N)

    mine = oc.chat(model="smolblob", messages=[{"role": "user", "content": Q}])
    ref = oc.chat(
        model="smol",
        messages=[{"role": "system", "content": FRENCH}, *OPENING, {"role": "user", "content": Q}],
        options=GREEDY,
    )
    assert mine.message.content == ref.message.content
    assert mine.prompt_eval_count == ref.prompt_eval_count

    # show's Modelfile makes the same model again (an older client's ``modelfile``)
    modelfile = str(shown.modelfile)
    assert 'MESSAGE assistant """Bonjour! Comment puis-je vous aider?"""' in modelfile
    body = {"model": "smolmf", "modelfile": modelfile, "stream": False}
    r = net.post(f"{url}/api/create", json=body, timeout=300)
    assert r.status_code == 200, r.text
    again = net.post(f"{url}/api/show", json={"model": "smolmf"}).json()
    for key in ("system", "messages", "license", "parameters", "template"):
        assert again[key] == raw[key], key

    assert oc.copy("smolblob", "smolblob2").status == "success"
    assert answer(oc, "smolblob2", [{"role": "user", "content": Q}]) == ref.message.content
    assert oc.delete("smolblob").status == "success"
    assert "smolblob" not in listed(oc) and "smolblob2" in listed(oc)
    with pytest.raises(ollama.ResponseError) as err:
        oc.chat(model="smolblob", messages=[{"role": "user", "content": Q}])
    assert err.value.status_code == 404


def test_create_from_a_served_model_with_the_client(oc: ollama.Client) -> None:
    """``from_`` a served model, streamed through the client: Ollama's lines, then the
    system message, opening turns and sampling defaults at work."""
    lines = oc.create(
        "smolfrom",
        from_="smol",
        system=FRENCH,
        messages=OPENING,
        parameters={"temperature": 0, "num_predict": N},
        stream=True,
    )
    assert [p.status for p in lines] == ["reading model metadata", "writing manifest", "success"]
    hi = [{"role": "user", "content": Q}]
    ref = [{"role": "system", "content": FRENCH}, *OPENING, *hi]
    assert answer(oc, "smolfrom", hi) == answer(oc, "smol", ref, **GREEDY)
    # a request's own system message comes first, then the model's turns
    own = [{"role": "system", "content": "Be terse."}, *hi]
    ref = [own[0], *OPENING, *hi]
    assert answer(oc, "smolfrom", own) == answer(oc, "smol", ref, **GREEDY)


def test_create_from_pushed_safetensors_files(oc: ollama.Client, url: str, tmp_path: Path) -> None:
    """A Hugging Face directory's files by digest (config, tokenizer, safetensors): converted,
    and answering as the same weights' GGUF (written by gguf-py) pushed as a blob, whole or
    split in two parts (gguf-py's split writer)."""
    hf, gguf = ensure_family("qwen2")
    files = {p.name: oc.create_blob(p) for p in sorted(hf.iterdir())}
    got = statuses(url, {"model": "tq-st", "files": files})
    assert got[0] == "converting model" and got[-2:] == ["writing manifest", "success"]
    assert sorted(got[1:-2]) == sorted(f"using existing layer {d}" for d in files.values())
    assert oc.create("tq-gguf", files={"qwen2.gguf": oc.create_blob(gguf)}).status == "success"
    hi = [{"role": "user", "content": "hello"}]
    ref = answer(oc, "tq-gguf", hi, **GREEDY)
    assert ref and answer(oc, "tq-st", hi, **GREEDY) == ref
    parts = split_gguf(gguf, tmp_path / "tq.gguf", 20)
    assert len(parts) == 2
    split = {p.name: oc.create_blob(p) for p in parts}
    assert oc.create("tq-split", files=split).status == "success"
    assert answer(oc, "tq-split", hi, **GREEDY) == ref
    details = oc.show("tq-st").details
    assert details is not None and details.family == "qwen2"


def test_create_quantized_from_files_streams_progress(oc: ollama.Client) -> None:
    hf, _ = ensure_family("qwen2")
    files = {p.name: oc.create_blob(p) for p in sorted(hf.iterdir())}
    lines = list(oc.create("tq-q8", files=files, quantize="q8_0", stream=True))
    quant = [p for p in lines if p.status == "quantizing F32 model to Q8_0"]
    assert quant and quant[-1].completed == quant[-1].total and quant[-1].digest == "0"
    assert [p.status for p in lines[-2:]] == ["writing manifest", "success"]
    details = oc.show("tq-q8").details
    assert details is not None and details.quantization_level == "Q8_0"


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"files": {"a.gguf": UNKNOWN}}, f'blob "{UNKNOWN}" not found'),
        ({"files": {"a.gguf": "sha256:xyz"}}, "files"),
        ({"from": "no-such-model"}, "'no-such-model' not found"),
        ({"from": "smol", "quantize": "q3_K_XL"}, "quantize 'q3_K_XL' is not supported"),
        ({}, "neither 'from' or 'files' was specified"),
        ({"files": {"../up.gguf": UNKNOWN}}, "file path must be relative"),
        ({"from": "smol", "adapters": {"adapter_model.safetensors": UNKNOWN}}, "not found"),
        ({"from": "smol", "template": "{{ .Prompt }}"}, "Jinja"),
    ],
)
def test_bad_create_is_one_400_line(
    oc: ollama.Client, url: str, body: dict[str, Any], says: str
) -> None:
    for stream in (False, True):
        r = net.post(f"{url}/api/create", json={"model": "bad", **body, "stream": stream})
        assert r.status_code == 400, r.text
        assert says in r.json()["error"] and "\n" not in r.text.strip()
    assert "bad" not in listed(oc)
    assert answer(oc, "smol", [{"role": "user", "content": "hi"}], num_predict=2)


def test_create_with_a_lora_adapter_matches_peft(oc: ollama.Client, url: str) -> None:
    """``adapters``: a PEFT LoRA pushed as blobs, merged into the tiny LLaMA's weights; the
    created model's next-token log-probabilities are PEFT's merged model's (its goldens)."""
    fixtures = Path(__file__).parent / "fixtures"
    golden = np.load(fixtures / "lora" / "llama" / "golden.npz")
    base = {
        p.name: oc.create_blob(p) for p in sorted((fixtures / "formats" / "llama-st").iterdir())
    }
    adapter = {
        p.name: oc.create_blob(p)
        for p in sorted((fixtures / "lora" / "llama").iterdir())
        if p.suffix in (".json", ".safetensors")
    }
    got = statuses(url, {"model": "tiny-lora", "files": base, "adapters": adapter})
    assert "converting adapter" in got and got[-1] == "success", got
    assert oc.create("tiny-base", files=base).status == "success"
    tokens = [int(t) for t in golden["tokens_0"]]
    for model, want in (("tiny-base", golden["base_0"]), ("tiny-lora", golden["merged_0"])):
        np.testing.assert_allclose(
            top_logprobs(url, model, tokens), golden_top(want[-1]), atol=1e-3, err_msg=model
        )
    # an adapter for another architecture: refused in the stream's last line, nothing created
    smol = {"smol.gguf": oc.create_blob(smollm2_gguf())}
    with pytest.raises(ollama.ResponseError) as err:
        oc.create("smol-lora", files=smol, adapters=adapter)
    assert err.value.status_code == 400 and "LoRA" in err.value.error
    assert "smol-lora" not in listed(oc)


def top_logprobs(url: str, model: str, tokens: list[int]) -> list[float]:
    """Top-5 next-token log-probabilities after a token-id prompt, best first."""
    r = net.post(
        f"{url}/v1/completions",
        json={"model": model, "prompt": tokens, "max_tokens": 1, "temperature": 0, "logprobs": 5},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    return sorted(
        (float(v) for v in r.json()["choices"][0]["logprobs"]["top_logprobs"][0].values()),
        reverse=True,
    )


def golden_top(logits: np.ndarray[Any, Any], k: int = 5) -> list[float]:
    z = logits.astype(np.float64)
    lp = z - z.max() - np.log(np.exp(z - z.max()).sum())
    return sorted(lp.tolist(), reverse=True)[:k]
