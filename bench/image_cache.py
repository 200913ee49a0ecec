"""Time to first token for a repeated image against a new one, over HTTP (issue 37: "a
repeated image hits the prefix cache: time to first token falls as for text").

    .venv/bin/python -m bench.image_cache [--rounds 5] [--size 896x672]

Serves the tiny random Qwen2.5-VL of ``tests/gen_qwen25vl.py`` (``modelc run GGUF --mmproj
MMPROJ``, the f16 KV cache and prefix cache as shipped) and, each round, streams through
the official ``openai`` client:

* a new image (seeded noise of ``--size`` pixels) with a
  question, then the same image and question again;
* a new text prompt of about as many tokens, then the same prompt again;

timing each request from its send to the first content chunk.  Prints the medians and the
prompt tokens served from the cache (``usage.prompt_tokens_details.cached_tokens``).
"""

from __future__ import annotations

import argparse
import base64
import io
import statistics
import time
from typing import Any

import numpy as np
import openai

from tests.gen_qwen25vl import ensure_model
from tests.server_fixtures import start


def _png(seed: int, w: int, h: int) -> str:
    from PIL import Image

    rng = np.random.default_rng(seed)
    img = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
    out = io.BytesIO()
    img.save(out, "PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def _first_token(client: openai.OpenAI, content: Any) -> tuple[float, int, int]:
    """Seconds to the first content chunk, the prompt's tokens and those the cache served."""
    t0 = time.perf_counter()
    ttft, cached, n = 0.0, 0, 0
    stream = client.chat.completions.create(
        model="qwen25vl",
        messages=[{"role": "user", "content": content}],
        temperature=0,
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    for chunk in stream:
        if not ttft and chunk.choices and chunk.choices[0].delta.content is not None:
            ttft = time.perf_counter() - t0
        if chunk.usage is not None:
            n = chunk.usage.prompt_tokens
            details = chunk.usage.prompt_tokens_details
            cached = (details.cached_tokens or 0) if details is not None else 0
    return ttft, n, cached


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--size", default="448x336", help="the images' WxH")
    args = ap.parse_args()
    w, h = (int(v) for v in args.size.split("x"))
    _, gg, mm = ensure_model()
    srv = start(str(gg), "--mmproj", str(mm), "--max-concurrent", "1")
    client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0, timeout=600)
    rows: dict[str, list[float]] = {k: [] for k in ("image", "image again", "text", "text again")}
    cached: dict[str, list[int]] = {k: [] for k in rows}
    tokens: dict[str, list[int]] = {k: [] for k in rows}
    try:
        _first_token(client, "warm up")  # the first request's one-off costs
        for r in range(args.rounds):
            parts = [
                {"type": "image_url", "image_url": {"url": _png(r, w, h)}},
                {"type": "text", "text": f"Round {r}: what is in the picture?"},
            ]
            words = " ".join(f"w{(r * 7919 + i) % 1000}" for i in range(120))
            for name, content in (("image", parts), ("text", words)):
                for key in (name, f"{name} again"):
                    t, n, c = _first_token(client, content)
                    rows[key].append(t)
                    tokens[key].append(n)
                    cached[key].append(c)
    finally:
        srv.stop()
    print(
        f"| request ({args.rounds} rounds, medians) | prompt tokens | from the cache | first token |"
    )
    print("|---|---|---|---|")
    for key, ts in rows.items():
        ms = statistics.median(ts) * 1e3
        n_tok, n_hit = statistics.median(tokens[key]), statistics.median(cached[key])
        print(f"| {key} | {n_tok:.0f} | {n_hit:.0f} | {ms:.0f} ms |")


if __name__ == "__main__":
    main()
