"""Client helpers shared by the differential tests (ours against llama.cpp's server or
transformers' goldens).

The reference servers themselves are session fixtures in ``tests/conftest.py``
(``llamacpp``, ``smol_exact_server``); :func:`serve_exact` starts another model in the
``exact`` mode for a module of its own.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import openai

from modelc.bench.llamacpp import LlamaCppServer
from modelc.net import ssl_context
from modelc.runtime.model import LanguageModel, SeqChunk
from modelc.runtime.tokenizer import Tokenizer
from tests import net
from tests.server_fixtures import Server, start


def serve_exact(path: Path, mmproj: Path | None = None) -> Iterator[Server]:
    """``modelc run`` of ``path`` (with the projector ``mmproj`` where given) in ``exact``
    mode with an f32 KV cache, the mode the transformers goldens are compared in; stopped
    when the fixture using it ends."""
    vision = ("--mmproj", str(mmproj)) if mmproj is not None else ()
    srv = start(str(path), *vision, "--kv-cache", "f32", env={"MODELC_MATMUL": "exact"})
    yield srv
    srv.stop()


HTTP_TIMEOUT = 300.0


def openai_client(srv: Server) -> openai.OpenAI:
    return openai.OpenAI(
        http_client=net.openai_http(),
        base_url=f"{srv.url}/v1",
        api_key="x",
        max_retries=0,
        timeout=HTTP_TIMEOUT,
    )


def image_question(data: bytes, question: str, kind: str = "png") -> list[dict[str, Any]]:
    """An OpenAI user message's content: the image ``data`` as a data URL, then ``question``."""
    url = f"data:image/{kind};base64," + base64.b64encode(data).decode()
    return [
        {"type": "image_url", "image_url": {"url": url}},
        {"type": "text", "text": question},
    ]


def openai_image_greedy(
    srv: Server, model: str, data: bytes, question: str, n: int, kind: str = "png"
) -> tuple[int, list[int]]:
    """The ``openai`` client's greedy answer of ``n`` tokens (past any end of turn) to
    ``question`` about the image ``data``: the prompt's token count and the answer's ids."""
    messages: Any = [{"role": "user", "content": image_question(data, question, kind)}]
    r = openai_client(srv).chat.completions.create(
        model=model,
        messages=messages,
        temperature=0,
        max_tokens=n,
        extra_body={"return_token_ids": True, "ignore_eos": True},
    )
    assert r.usage is not None and r.choices[0].model_extra is not None
    return r.usage.prompt_tokens, r.choices[0].model_extra["token_ids"]


def ollama_and_openai_answers(
    srv: Server, model: str, image: Path, question: str, n: int, kind: str = "png"
) -> tuple[str | None, str | None, int | None]:
    """The answers of the ``ollama`` client (``images``) and the ``openai`` client (a data
    URL) to ``question`` about ``image``, greedy, ``n`` tokens each, and ``ollama``'s prompt
    token count."""
    import ollama

    oc = ollama.Client(verify=ssl_context(), host=srv.url, timeout=HTTP_TIMEOUT)
    msg = {"role": "user", "content": question, "images": [image]}
    chat = oc.chat(model=model, messages=[msg], options={"temperature": 0, "num_predict": n})
    parts = image_question(image.read_bytes(), question, kind)
    messages: Any = [{"role": "user", "content": parts}]
    want = openai_client(srv).chat.completions.create(
        model=model, messages=messages, temperature=0, max_tokens=n
    )
    return chat.message.content, want.choices[0].message.content, chat.prompt_eval_count


def post(url: str, body: dict[str, Any]) -> Any:
    r = net.post(url, json=body, timeout=HTTP_TIMEOUT)
    r.raise_for_status()
    return r.json()


def greedy_to_near_tie(
    model: LanguageModel,
    ids: list[int],
    n: int,
    banned: Sequence[int] = (),
    margin: float = 0.01,
) -> tuple[list[int], int]:
    """Our greedy continuation (``banned`` ids never picked, as llama.cpp's ``ignore_eos``
    bans end-of-generation ids), and how many of its tokens were picked by a clear margin
    (top-2 logits ``margin`` apart or more): llama.cpp's f16 KV cache may flip a near tie,
    and its int8 activations against quantized weights one a little wider."""
    cache = model.new_cache("f32")
    logits = model.forward([SeqChunk(cache, list(ids))])[0]
    toks: list[int] = []
    cut = n
    for i in range(n):
        logits[list(banned)] = -np.inf
        top2 = np.sort(logits)[-2:]
        if top2[1] - top2[0] < margin:
            cut = min(cut, i)
        toks.append(int(np.argmax(logits)))
        logits = model.forward([SeqChunk(cache, [toks[-1]])])[0]
    return toks, cut


def llamacpp_greedy(url: str, ids: list[int], n: int) -> list[int]:
    """llama.cpp's server: ``n`` greedy ids after ``ids`` (end-of-generation ids banned)."""
    body = {
        "prompt": ids,
        "n_predict": n,
        "temperature": 0,
        "samplers": ["top_k"],
        "top_k": 1,
        "ignore_eos": True,
        "cache_prompt": False,
        "return_tokens": True,
    }
    return [int(t) for t in post(f"{url}/completion", body)["tokens"]]


def llamacpp_image_answer(
    gguf: Path, mmproj: Path, text: str, image: bytes, n: int, log: Path
) -> tuple[int, list[int]]:
    """llama.cpp's server with ``--mmproj``: the token count of the prompt ``text`` whose
    ``<__media__>`` marker stands for ``image`` (its bytes), and ``n`` greedy ids after it."""
    from modelc.bench.llamacpp import LlamaCppServer

    body = {
        "prompt": {"prompt_string": text, "multimodal_data": [base64.b64encode(image).decode()]},
        "n_predict": n,
        "temperature": 0,
        "samplers": ["top_k"],
        "top_k": 1,
        "ignore_eos": True,
        "cache_prompt": False,
        "return_tokens": True,
    }
    marker = {"LLAMA_MEDIA_MARKER": "<__media__>"}  # the server's own is random
    with LlamaCppServer(
        gguf, threads=1, n_parallel=1, n_ctx=512, log=log, mmproj=mmproj, env=marker
    ) as s:
        r = net.post(f"{s.url}/completion", json=body, timeout=120).json()
    return int(r["tokens_evaluated"]), [int(t) for t in r["tokens"]]


def greedy_as_llamacpp(
    model: LanguageModel, tok: Tokenizer, gguf: Path, g: Mapping[str, Any], log: Path
) -> int:
    """llama.cpp's server on ``gguf`` against ``model`` (ours, on the same file) and the
    golden record set ``g``: the same ids for ``g["text"]``, and for each record whose
    greedy continuation passes no end-of-generation id (llama.cpp's ``ignore_eos`` bans
    them) the same greedy tokens up to a near tie, ours the golden's; how many records
    were compared."""
    with LlamaCppServer(gguf, threads=1, n_parallel=1, n_ctx=256, log=log) as s:
        theirs = net.post(f"{s.url}/tokenize", json={"content": g["text"]}, timeout=30)
        assert theirs.json()["tokens"] == tok.encode(g["text"], add_special=True)
        compared = 0
        for rec in g["records"]:
            if set(rec["greedy"]) & set(tok.eot_ids):
                continue
            ours, cut = greedy_to_near_tie(model, rec["prompt_ids"], len(rec["greedy"]))
            assert ours[:cut] == rec["greedy"][:cut]
            got = llamacpp_greedy(s.url, rec["prompt_ids"], len(rec["greedy"]))
            assert got[:cut] == ours[:cut], (rec["prompt_ids"], cut)
            compared += 1
    return compared
