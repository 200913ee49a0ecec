"""llama.cpp's further samplers (DRY, top-n-sigma, typical-p, XTC, mirostat 1 and 2):
known answers worked by hand from ``src/llama-sampler.cpp``, then a real server."""

from __future__ import annotations

import math

import httpx
import numpy as np
import pytest

from modelc.bench.llamacpp import LlamaCppServer
from modelc.engine.speculative import verify
from modelc.errors import UsageError
from modelc.runtime import samplers
from modelc.runtime.sampling import Sampler, SamplingParams
from tests import net
from tests.server_fixtures import Server

# a distribution over 4 tokens whose surprises are 1, 2, 3 and 3 bits
HALVES = np.log(np.array([0.5, 0.25, 0.125, 0.125], np.float32))


def _sampler(logits_n: int = 4, history: tuple[int, ...] = (), **kw: float) -> Sampler:
    """A sampler with llama.cpp's truncations off except those in ``kw``."""
    base: dict[str, float] = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
    return Sampler(SamplingParams(**{**base, **kw}), logits_n, history)  # type: ignore[arg-type]


def test_top_n_sigma_keeps_logits_within_n_deviations_of_the_best() -> None:
    # mean 0.5, deviation sqrt((1.5² + 0.5² + 0.5² + 1.5²) / 4) = sqrt(1.25) = 1.118
    x = np.array([2.0, 1.0, 0.0, -1.0], np.float32)
    one = x.copy()
    samplers.top_n_sigma(one, 1.0)  # cut 2 - 1.118 = 0.882: two stay
    assert np.isfinite(one).tolist() == [True, True, False, False]
    two = x.copy()
    samplers.top_n_sigma(two, 2.0)  # cut 2 - 2.236 = -0.236: three stay
    assert np.isfinite(two).tolist() == [True, True, True, False]
    # through the chain: the tokens cut get no probability
    s = _sampler(top_n_sigma=1.0)
    probs = s.probs(s.process(x))
    e = math.exp(1.0)
    assert np.allclose(probs, [e / (e + 1), 1 / (e + 1), 0, 0])


def test_typical_p_keeps_the_tokens_nearest_the_entropy() -> None:
    # entropy 1.75 bits; |surprise - entropy| = 0.75, 0.25, 1.25, 1.25 bits: token 1 first,
    # then token 0 (mass 0.25, then 0.75 > 0.5: stop), renormalised: 0.5/0.75, 0.25/0.75
    s = _sampler(typical_p=0.5)
    assert np.allclose(s.probs(s.process(HALVES)), [2 / 3, 1 / 3, 0, 0])
    s = _sampler(typical_p=0.2)  # 0.25 > 0.2 at once: token 1 alone
    assert np.allclose(s.probs(s.process(HALVES)), [0, 1, 0, 0])


def test_xtc_removes_the_top_tokens_above_the_threshold_but_the_last() -> None:
    logits = np.log(np.array([0.4, 0.3, 0.2, 0.1], np.float32))
    s = _sampler(xtc_probability=1.0, xtc_threshold=0.25)  # 0.4 and 0.3 above: 0.4 goes
    assert np.allclose(s.probs(s.process(logits)), [0, 0.5, 2 / 6, 1 / 6])
    s = _sampler(xtc_probability=1.0, xtc_threshold=0.35)  # only 0.4 above: nothing goes
    assert np.allclose(s.probs(s.process(logits)), [0.4, 0.3, 0.2, 0.1])
    s = _sampler(xtc_probability=1.0, xtc_threshold=0.09)  # all above: all but 0.1 go
    assert np.allclose(s.probs(s.process(logits)), [0, 0, 0, 1])


def test_mirostat_v2_truncates_at_mu_and_updates_it() -> None:
    # tau 1.25: mu starts at 2.5 bits; surprises 1, 2, 3, 3: the first two stay (2/3, 1/3)
    s = _sampler(mirostat=2, mirostat_tau=1.25, mirostat_eta=0.1)
    assert s.mu == 2.5
    assert np.allclose(s.probs(s.process(HALVES)), [2 / 3, 1 / 3, 0, 0])
    s.accept(0)  # surprise log2(3/2) = 0.585: mu = 2.5 - 0.1 * (0.585 - 1.25) = 2.5665
    assert s.mu == pytest.approx(2.5 - 0.1 * (math.log2(1.5) - 1.25))
    wide = _sampler(mirostat=2, mirostat_tau=5.0)  # mu 10: every token stays
    assert np.allclose(wide.probs(wide.process(HALVES)), [0.5, 0.25, 0.125, 0.125])


def test_mirostat_v1_estimates_zipf_and_takes_its_top_k() -> None:
    # p ∝ 1 / (i+1)²: b_i = 2 t_i so s_hat = 2, epsilon 1; with mu = 2 (tau 1),
    # k = (1 * 2² / (1 - 4^-1)) ** (1/2) = sqrt(16/3) = 2.31 -> 2 tokens: 1 and 1/4 -> 0.8, 0.2
    logits = np.array([-2 * math.log(i + 1) for i in range(4)], np.float32)
    s = _sampler(mirostat=1, mirostat_tau=1.0, mirostat_eta=0.5)
    assert np.allclose(s.probs(s.process(logits)), [0.8, 0.2, 0, 0], atol=1e-6)
    s.accept(1)  # surprise log2(5) = 2.32: mu = 2 - 0.5 * (2.32 - 1)
    assert s.mu == pytest.approx(2 - 0.5 * (math.log2(5) - 1.0), rel=1e-5)


def test_dry_penalises_the_token_that_would_extend_a_repeat() -> None:
    a, b, c, d, x = 1, 2, 3, 4, 5
    # "a b" ends the context and was followed by c before: c extends a 2-token repeat,
    # 2 - allowed 2 = exponent 0: penalty 0.8 * 1.75^0
    assert samplers.dry_penalties([a, b, c, x, a, b], 0.8, 1.75, 2, -1, ()) == {c: 0.8}
    # "a b c" repeats: d extends a 3-token repeat, 0.8 * 1.75^1 = 1.4
    got = samplers.dry_penalties([a, b, c, d, x, a, b, c], 0.8, 1.75, 2, -1, ())
    assert got == {d: pytest.approx(1.4)}
    # a breaker inside the suffix ends the repeat (b: at most 1 token), none penalised
    assert samplers.dry_penalties([a, b, c, x, a, b], 0.8, 1.75, 2, -1, {a}) == {}
    # a breaker is never penalised itself
    assert samplers.dry_penalties([a, b, c, x, a, b], 0.8, 1.75, 2, -1, {c}) == {}
    # the window: the earlier "a b" is outside the last 4 tokens
    assert samplers.dry_penalties([a, b, c, x, a, b], 0.8, 1.75, 2, 4, ()) == {}
    # in the chain: on the logits, over prompt and generated tokens
    s = _sampler(8, (a, b, c, x, a), dry_multiplier=0.8)
    s.accept(b)
    assert np.allclose(s.process(np.zeros(8, np.float32)), [0, 0, 0, -0.8, 0, 0, 0, 0])
    # greedy with DRY: the repeat's next token loses to the runner-up
    s = _sampler(8, (a, b, c, x, a, b), dry_multiplier=0.8, temperature=0.0)
    logits = np.zeros(8, np.float32)
    logits[c], logits[d] = 1.0, 0.5
    assert s.sample(logits).token == d


def test_out_of_range_settings_name_their_field() -> None:
    for field, value in [
        ("typical_p", 0.0),
        ("xtc_probability", 1.5),
        ("mirostat", 3),
        ("dry_base", 0.5),
        ("dry_penalty_last_n", -2),
    ]:
        with pytest.raises(Exception, match=field):
            _sampler(**{field: value})


def test_a_samplers_list_turns_off_the_stages_it_leaves_out() -> None:
    assert samplers.chain_settings("edskypmxt") == {}  # llama.cpp's default, by letters
    assert samplers.chain_settings(["top_k"]) == {  # llama.cpp's own greedy request
        "repetition_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "dry_multiplier": 0.0,
        "top_n_sigma": -1.0,
        "typical_p": 1.0,
        "top_p": 1.0,
        "min_p": 0.0,
        "xtc_probability": 0.0,
        "temperature": 1.0,
    }
    # aliases as llama.cpp reads them: kebab case, no dashes, nucleus, temp
    assert samplers.chain_settings(["Top-K", "nucleus", "minp", "temp"]) == (
        samplers.chain_settings(["top_k", "top_p", "min_p", "temperature"])
    )
    with pytest.raises(UsageError, match="samplers: modelc runs"):
        samplers.chain_settings(["temperature", "top_k"])  # another order
    with pytest.raises(UsageError, match="'infill' is not a sampler"):
        samplers.chain_settings(["top_k", "infill"])


@pytest.fixture(scope="module")
def c(smol_server: Server) -> httpx.Client:
    return net.client(base_url=smol_server.url, timeout=180)


@pytest.mark.slow
def test_samplers_change_the_seeded_output_and_bad_values_are_400(c: httpx.Client) -> None:
    def complete(**kw: object) -> list[int]:
        body = {"prompt": "Once upon a time", "n_predict": 12, "seed": 7, "temperature": 1.5}
        r = c.post("/completion", json={**body, "top_k": 0, "top_p": 1.0, "min_p": 0.0, **kw})
        assert r.status_code == 200, r.text
        toks: list[int] = r.json()["tokens"]
        return toks

    def run(**kw: object) -> list[int]:
        return complete(return_tokens=True, **kw)

    plain = run()
    assert run() == plain  # the seed holds
    for kw in [
        {"typical_p": 0.3},
        {"top_n_sigma": 0.5},
        {"xtc_probability": 1.0, "xtc_threshold": 0.05},
        {"mirostat": 2, "mirostat_tau": 1.0},
        {"mirostat": 1, "mirostat_tau": 1.0},
    ]:
        assert run(**kw) != plain, kw
    for field, value in [
        ("typical_p", 1.5),
        ("mirostat", 3),
        ("xtc_threshold", -0.1),
        ("dry_base", 0.5),
    ]:
        r = c.post("/completion", json={"prompt": "Hi", "n_predict": 1, field: value})
        assert r.status_code == 400 and field in r.text, (field, r.text)
    # llama.cpp's greedy request: top-k 1 alone
    greedy = run(samplers=["top_k"], top_k=1)
    assert greedy == run(temperature=0) and run(samplers="edskypmxt") == plain
    for field, value in [
        ("dynatemp_range", 0.5),
        ("adaptive_target", 0.5),
        ("samplers", ["temperature", "top_k"]),
        ("samplers", "kq"),
    ]:
        r = c.post("/completion", json={"prompt": "Hi", "n_predict": 1, field: value})
        assert r.status_code == 400 and field in r.text, (field, r.text)
    r = c.post(
        "/api/generate",
        json={"model": "smol", "prompt": "Hi", "stream": False, "options": {"mirostat": 5}},
    )
    assert r.status_code == 400 and "mirostat" in r.text
    r = c.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1, "xtc_probability": 2})
    assert r.status_code == 400 and "xtc_probability" in r.text


@pytest.mark.slow
def test_ollama_options_carry_typical_p_and_mirostat(c: httpx.Client) -> None:
    model = c.get("/v1/models").json()["data"][0]["id"]

    def generate(**kw: object) -> str:
        options = {"seed": 7, "temperature": 1.5, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
        body = {"model": model, "prompt": "Once upon a time", "stream": False, "raw": True}
        r = c.post("/api/generate", json={**body, "options": {**options, "num_predict": 12, **kw}})
        assert r.status_code == 200, r.text
        text: str = r.json()["response"]
        return text

    plain = generate()
    assert generate() == plain
    assert generate(typical_p=0.3) != plain
    assert generate(mirostat=2, mirostat_tau=1.0) != plain


@pytest.mark.slow
def test_dry_breaks_a_greedy_loop(c: httpx.Client) -> None:
    prompt = "one two three, one two three, one two three, one two three,"
    body = {"prompt": prompt, "n_predict": 8, "temperature": 0, "return_tokens": True}
    loop = c.post("/completion", json=body).json()["tokens"]
    dry = c.post("/completion", json={**body, "dry_multiplier": 2.0}).json()["tokens"]
    assert dry != loop


@pytest.mark.slow
def test_dry_greedy_as_llama_server(llamacpp: LlamaCppServer, smol_server: Server) -> None:
    """Greedy with DRY on a repeating prompt: llama-server's tokens, penalty and all."""
    prompt = "red green blue red green blue red green blue red green blue red"
    body = {
        "prompt": prompt,
        "n_predict": 10,
        "temperature": 0,
        "ignore_eos": True,
        "return_tokens": True,
        "cache_prompt": False,
    }
    tokens = {}
    for name, url in (("llama", llamacpp.url), ("modelc", smol_server.url)):
        for dry in (0.0, 1.5):
            r = net.post(f"{url}/completion", json={**body, "dry_multiplier": dry}, timeout=180)
            assert r.status_code == 200, r.text
            tokens[name, dry] = r.json()["tokens"]
    assert tokens["modelc", 0.0] == tokens["llama", 0.0]  # the same greedy loop
    assert tokens["modelc", 1.5] != tokens["modelc", 0.0]  # DRY breaks it
    assert tokens["modelc", 1.5] == tokens["llama", 1.5]  # as llama.cpp's DRY does


def test_mirostat_mu_follows_each_token_speculative_decoding_emits() -> None:
    # verify() draws from probs() and accepts drafts itself: mu must move once per token
    # emitted, by that token's surprise under the truncated distribution of its own row
    rng = np.random.default_rng(0)
    rows = rng.normal(0, 2, (4, 16)).astype(np.float32)
    s = _sampler(16, mirostat=2, mirostat_tau=2.0, mirostat_eta=0.3, seed=3)
    out = verify(s, rows, [int(np.argmax(r)) for r in rows[:3]])
    mu = 4.0
    for row, smp in zip(rows, out, strict=False):
        p = samplers.mirostat_v2(row.astype(np.float64) - row.max(), mu)
        mu -= 0.3 * (-math.log2(p[smp.token]) - 2.0)
    assert len(out) == 3 and s.mu == pytest.approx(mu)  # two drafts kept, the third not
