"""Images on the chat routes of a real ``modelc run --mmproj`` (the tiny Gemma 3 VLM of
``tests/gen_gemma3vl.py``, ``exact`` mode, f32 KV cache), against llama.cpp's server
(``xllamacpp`` with the same model and mmproj GGUFs) and the official clients:

* the ``openai`` client's ``image_url`` data URL: prompt token count equal to llama.cpp's
  (``<start_of_image>``, one position per embedding, ``<end_of_image>`` at the marker, as
  ``mtmd_tokenize``); for an image of the tower's own size the greedy answer equal up to
  a near tie in llama.cpp's own log-probabilities (an image that is resized is not
  compared: llama.cpp's bilinear resize is its own, transformers' and ours Pillow's);
* the ``ollama`` client's ``images`` on ``/api/chat`` and ``/api/generate``: the same
  answer as the OpenAI route;
* a model started without ``--mmproj`` refuses images in one line (broken and hostile
  images: ``tests/test_vision_hostile.py``).
"""

from __future__ import annotations

import base64
import io
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ollama
import openai
import pytest

from modelc.bench.llamacpp import LlamaCppServer
from modelc.net import ssl_context
from tests import net
from tests.gen_gemma3vl import ensure_model
from tests.peers import HTTP_TIMEOUT, openai_client
from tests.server_fixtures import Server, start

IMAGES = Path(__file__).parent / "fixtures" / "vision"
QUESTION = "What is in the picture?"
N = 10


def data_url(data: bytes, kind: str = "png") -> str:
    return f"data:image/{kind};base64," + base64.b64encode(data).decode()


def messages(url: str) -> list[Any]:
    parts = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": QUESTION}]
    return [{"role": "user", "content": parts}]


@pytest.fixture(scope="module")
def vlm() -> Iterator[Server]:
    _, gg, mm = ensure_model()
    srv = start(
        str(gg), "--mmproj", str(mm), "--kv-cache", "f32", "--allow-image-urls",
        env={"MODELC_MATMUL": "exact", "MODELC_IMAGE_FETCH_TIMEOUT": "2"},
    )  # fmt: skip
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def oa(vlm: Server) -> openai.OpenAI:
    return openai_client(vlm)


def ask(oa: openai.OpenAI, url: str, *, ignore_eos: bool = True) -> Any:
    return oa.chat.completions.create(
        model="gemma3vl",
        messages=messages(url),
        temperature=0,
        max_tokens=N,
        extra_body={"return_token_ids": True, "ignore_eos": ignore_eos},
    )


@pytest.mark.parametrize("name", ["square.png", "wide.png", "tall.jpg", "gray.png"])
def test_openai_image_url_answers_as_llamacpp(vlm: Server, oa: openai.OpenAI, name: str) -> None:
    _, gg, mm = ensure_model()
    url = data_url((IMAGES / name).read_bytes(), "jpeg" if name.endswith("jpg") else "png")
    ours = ask(oa, url)
    body = {
        "messages": messages(url),
        "temperature": 0,
        "max_tokens": N,
        "ignore_eos": True,
        "logprobs": True,
        "top_logprobs": 2,
    }
    with LlamaCppServer(gg, threads=1, n_parallel=1, n_ctx=512, mmproj=mm) as peer:
        r = net.post(f"{peer.url}/v1/chat/completions", json=body, timeout=HTTP_TIMEOUT)
        r.raise_for_status()
        theirs = r.json()
        modalities = net.get(f"{peer.url}/props", timeout=HTTP_TIMEOUT).json()["modalities"]
    ours_props = net.get(f"{vlm.url}/props", timeout=HTTP_TIMEOUT).json()["modalities"]
    assert ours_props["vision"] == modalities["vision"]  # llama.cpp's also says video: true
    assert ours.usage.prompt_tokens == theirs["usage"]["prompt_tokens"]
    steps = theirs["choices"][0]["logprobs"]["content"]
    want = [s["id"] for s in steps]
    # compared up to llama.cpp's first near tie (its top two within 0.05 nats)
    cut = next(
        (i for i, s in enumerate(steps) if s["logprob"] - s["top_logprobs"][1]["logprob"] < 0.05),
        len(steps),
    )
    got = ours.choices[0].model_extra["token_ids"]
    if name != "square.png":  # resized: llama.cpp's bilinear filter is not Pillow's
        return
    assert cut >= 3, steps  # the comparison says something
    assert got[:cut] == want[:cut]


def test_ollama_images_answer_as_openai(vlm: Server, oa: openai.OpenAI) -> None:
    path = IMAGES / "wide.png"
    want = ask(oa, data_url(path.read_bytes())).choices[0].message.content
    oc = ollama.Client(verify=ssl_context(), host=vlm.url, timeout=HTTP_TIMEOUT)
    opts = {"temperature": 0, "num_predict": N}
    chat = oc.chat(
        model="gemma3vl",
        messages=[{"role": "user", "content": QUESTION, "images": [path]}],
        options=opts,
    )
    assert chat.message.content == want
    gen = oc.generate(model="gemma3vl", prompt=QUESTION, images=[path], options=opts)
    assert gen.response == want
    assert gen.prompt_eval_count == chat.prompt_eval_count
    assert "vision" in (oc.show("gemma3vl").capabilities or [])  # as Ollama shows a VLM


def test_anthropic_and_responses_images_answer_as_openai(vlm: Server, oa: openai.OpenAI) -> None:
    """An Anthropic ``image`` block (base64) and a Responses ``input_image`` (data URL)
    before the question: the chat route's prompt, so its answer."""
    import anthropic

    data = (IMAGES / "tall.jpg").read_bytes()
    url = data_url(data, "jpeg")
    want = ask(oa, url, ignore_eos=False)
    ac = anthropic.Anthropic(
        http_client=net.anthropic_http(),
        base_url=vlm.url,
        api_key="x",
        max_retries=0,
        timeout=HTTP_TIMEOUT,
    )
    b64 = base64.b64encode(data).decode()
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": b64}}
    msg = ac.messages.create(
        model="gemma3vl",
        max_tokens=N,
        messages=[{"role": "user", "content": [image, {"type": "text", "text": QUESTION}]}],
        extra_body={"temperature": 0},
    )
    assert msg.content[0].text == want.choices[0].message.content
    assert msg.usage.input_tokens == want.usage.prompt_tokens
    count = ac.messages.count_tokens(
        model="gemma3vl",
        messages=[{"role": "user", "content": [image, {"type": "text", "text": QUESTION}]}],
    )
    assert count.input_tokens == want.usage.prompt_tokens
    resp = oa.responses.create(
        model="gemma3vl",
        max_output_tokens=N,
        temperature=0,
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_image", "image_url": url, "detail": "auto"},
                    {"type": "input_text", "text": QUESTION},
                ],
            }
        ],
    )
    assert resp.output_text == want.choices[0].message.content
    assert resp.usage is not None and resp.usage.input_tokens == want.usage.prompt_tokens


def test_routes_without_images_refuse_them(vlm: Server) -> None:
    """The native /chat and llama.cpp's /tokenize of messages take no images: a 400, not
    a silently dropped image."""
    png = (IMAGES / "wide.png").read_bytes()
    body = {"messages": messages(data_url(png))}
    for route in ("/chat", "/tokenize"):
        r = net.post(f"{vlm.url}{route}", json=body, timeout=HTTP_TIMEOUT)
        assert r.status_code == 400, (route, r.text)
        assert "takes no images" in r.text
    b64 = base64.b64encode(png).decode()
    raw = {"model": "gemma3vl", "prompt": "x", "raw": True, "images": [b64], "stream": False}
    r = net.post(f"{vlm.url}/api/generate", json=raw, timeout=HTTP_TIMEOUT)
    assert r.status_code == 400 and "leave raw off" in r.text
    parts = [{"type": "image_url", "image_url": {"url": data_url(png)}}] * 17
    many = {"model": "gemma3vl", "messages": [{"role": "user", "content": parts}]}
    r = net.post(f"{vlm.url}/v1/chat/completions", json=many, timeout=HTTP_TIMEOUT)
    assert r.status_code == 400 and "at most 16" in r.text


def test_an_animated_gif_is_read_by_its_first_frame(oa: openai.OpenAI) -> None:
    from PIL import Image

    frames = [Image.new("RGB", (20, 30), c) for c in ((250, 0, 0), (0, 0, 250))]
    out = io.BytesIO()
    frames[0].save(out, "GIF", save_all=True, append_images=frames[1:], duration=50, loop=0)
    still = io.BytesIO()
    frames[0].save(still, "PNG")
    gif = ask(oa, data_url(out.getvalue(), "gif")).choices[0].model_extra["token_ids"]
    assert gif == ask(oa, data_url(still.getvalue())).choices[0].model_extra["token_ids"]


def test_a_lossless_webp_answers_as_its_png(oa: openai.OpenAI) -> None:
    from PIL import Image

    png = (IMAGES / "square.png").read_bytes()
    webp = io.BytesIO()
    Image.open(io.BytesIO(png)).save(webp, "WEBP", lossless=True)
    got = ask(oa, data_url(webp.getvalue(), "webp")).choices[0].model_extra["token_ids"]
    assert got == ask(oa, data_url(png)).choices[0].model_extra["token_ids"]


def test_a_model_without_mmproj_refuses_images() -> None:
    """--mmproj is the first model's: a second model of the same server takes no images."""
    from tests.gen_families import ensure_family

    _, gg, mm = ensure_model()
    _, other = ensure_family("qwen3")
    srv = start(None, str(gg), str(other), "--mmproj", str(mm))
    try:
        oa = openai_client(srv)
        assert ask(oa, data_url((IMAGES / "wide.png").read_bytes())).choices[0].message.content
        with pytest.raises(openai.BadRequestError, match="takes no images; start it with --mmproj"):
            oa.chat.completions.create(
                model="qwen3",
                messages=messages(data_url((IMAGES / "wide.png").read_bytes())),
                max_tokens=2,
            )
        caps = ollama.Client(verify=ssl_context(), host=srv.url).show("qwen3").capabilities or []
        assert "completion" in caps and "vision" not in caps
    finally:
        srv.stop()


def test_cli_generate_with_an_image_answers_as_the_server(oa: openai.OpenAI) -> None:
    """``modelc generate --mmproj FILE --chat --image PATH``: the server's answer."""
    _, gg, mm = ensure_model()
    path = IMAGES / "tall.jpg"
    want = ask(oa, data_url(path.read_bytes(), "jpeg"), ignore_eos=False)
    cmd = [sys.executable, "-m", "modelc.cli", "generate", str(gg), "--mmproj", str(mm)]
    cmd += ["--chat", "--image", str(path), QUESTION, "--temperature", "0"]
    cmd += ["--max-tokens", str(N), "--kv-cache", "f32"]
    env = {**os.environ, "MODELC_MATMUL": "exact", "MODELC_THREADS": "1"}
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run(
        cmd, cwd=root, capture_output=True, env=env, timeout=HTTP_TIMEOUT, check=True
    )
    assert out.stdout.decode() == want.choices[0].message.content
    assert f"prompt {want.usage.prompt_tokens} tok" in out.stderr.decode()


def test_a_repeated_image_hits_the_prefix_cache(oa: openai.OpenAI) -> None:
    """The same image and question again: its prompt comes from the prefix cache (the
    image's positions keyed by its hash), with the same answer; another image with the
    same question shares nothing past the image."""
    question = " ".join([QUESTION] * 6)

    def once(name: str) -> Any:
        url = data_url((IMAGES / name).read_bytes())
        parts = [
            {"type": "image_url", "image_url": {"url": url}},
            {"type": "text", "text": question},
        ]
        return oa.chat.completions.create(
            model="gemma3vl",
            messages=[{"role": "user", "content": parts}],
            temperature=0,
            max_tokens=N,
            extra_body={"return_token_ids": True, "ignore_eos": True},
        )

    first, again, other = once("wide.png"), once("wide.png"), once("gray.png")
    assert first.usage.prompt_tokens >= 64
    assert first.choices[0].model_extra["token_ids"] == again.choices[0].model_extra["token_ids"]
    details = again.usage.prompt_tokens_details
    assert details is not None and (details.cached_tokens or 0) >= 32
    assert other.usage.prompt_tokens_details is not None
    assert not other.usage.prompt_tokens_details.cached_tokens


@pytest.fixture(scope="module")
def image_host() -> Iterator[str]:
    """A web server on loopback: ``/wide.png``, a redirect to it, a 404, a body over the
    size limit and one slower than the fetch timeout (2 s in the ``vlm`` server)."""
    import http.server
    import threading
    import time

    png = (IMAGES / "wide.png").read_bytes()

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            if self.path == "/wide.png":
                self.send_response(200)
                self.send_header("Content-Length", str(len(png)))
                self.end_headers()
                self.wfile.write(png)
            elif self.path == "/moved":
                self.send_response(302)
                self.send_header("Location", "/wide.png")
                self.end_headers()
            elif self.path == "/huge":  # no Content-Length: the limit is on the bytes read
                self.send_response(200)
                self.end_headers()
                for _ in range(21):
                    self.wfile.write(b"\0" * (1 << 20))
            elif self.path == "/slow":
                self.send_response(200)
                self.send_header("Content-Length", str(len(png)))
                self.end_headers()
                self.wfile.write(png[:100])
                self.wfile.flush()
                time.sleep(4)
                self.wfile.write(png[100:])
            else:
                self.send_error(404)

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_image_urls_are_fetched_where_the_server_allows(
    vlm: Server, oa: openai.OpenAI, image_host: str, smol_server: Server
) -> None:
    """``--allow-image-urls``: an ``http`` image URL (and one redirected) answers as the
    same image inline; a 404, a body over 20 MiB and one slower than the timeout are one
    400 each and the server keeps serving; a server without the flag refuses the URL."""
    want = ask(oa, data_url((IMAGES / "wide.png").read_bytes())).choices[0]
    for path in ("/wide.png", "/moved"):
        got = ask(oa, image_host + path).choices[0]
        assert got.model_extra["token_ids"] == want.model_extra["token_ids"], path
    for path, says in (("/missing", "HTTP 404"), ("/huge", "larger than 20 MiB"),
                       ("/slow", "did not arrive within 2 s")):  # fmt: skip
        body = {"model": "gemma3vl", "messages": messages(image_host + path), "max_tokens": 2}
        r = net.post(f"{vlm.url}/v1/chat/completions", json=body, timeout=HTTP_TIMEOUT)
        assert r.status_code == 400 and says in r.text, (path, r.text)
    assert ask(oa, image_host + "/wide.png").choices[0].message.content == want.message.content
    name = net.get(f"{smol_server.url}/v1/models", timeout=HTTP_TIMEOUT).json()["data"][0]["id"]
    body = {"model": name, "messages": messages(image_host + "/wide.png")}
    r = net.post(f"{smol_server.url}/v1/chat/completions", json=body, timeout=HTTP_TIMEOUT)
    assert r.status_code == 400 and "start the server with --allow-image-urls" in r.text
