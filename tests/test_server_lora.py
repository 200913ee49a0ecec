"""LoRA hot swap over HTTP on the tiny LLaMA fixture, held to PEFT's merged logits."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests import net
from tests.server_fixtures import Server, start

FIXTURES = Path(__file__).parent / "fixtures"
ADAPTER = FIXTURES / "lora" / "llama"


@pytest.fixture(scope="module")
def tiny() -> Iterator[Server]:
    srv = start(str(FIXTURES / "formats" / "llama-st"), "--lora-dir", str(FIXTURES / "lora"))
    yield srv
    srv.stop()


def _first_token_logprobs(url: str, tokens: list[int]) -> list[float]:
    """Top-5 next-token log-probabilities after ``tokens`` (a token-id prompt), best first."""
    r = net.post(
        f"{url}/v1/completions",
        json={"prompt": tokens, "max_tokens": 1, "temperature": 0, "logprobs": 5},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    lp = r.json()["choices"][0]["logprobs"]
    assert lp["tokens"], lp
    return sorted((float(v) for v in lp["top_logprobs"][0].values()), reverse=True)


def _golden_top(logits: np.ndarray, k: int = 5) -> list[float]:
    z = logits.astype(np.float64)
    lp = z - z.max() - np.log(np.exp(z - z.max()).sum())
    return sorted(lp.tolist(), reverse=True)[:k]


def test_lora_hot_swap_matches_peft_and_unloads_exactly(tiny: Server) -> None:
    golden = np.load(ADAPTER / "golden.npz")
    tokens = [int(t) for t in golden["tokens_0"]]
    base = _first_token_logprobs(tiny.url, tokens)
    np.testing.assert_allclose(base, _golden_top(golden["base_0"][-1]), atol=1e-3)

    r = net.post(f"{tiny.url}/lora/load", json={"path": str(ADAPTER)}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["adapters"] == [str(ADAPTER.resolve())]
    merged = _first_token_logprobs(tiny.url, tokens)
    np.testing.assert_allclose(merged, _golden_top(golden["merged_0"][-1]), atol=1e-3)
    assert max(abs(a - b) for a, b in zip(merged, base, strict=True)) > 1e-3  # it changed something

    r = net.post(f"{tiny.url}/lora/unload", json={"path": str(ADAPTER)}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["adapters"] == []
    again = _first_token_logprobs(tiny.url, tokens)
    assert again == base  # the base weights are back bit for bit
