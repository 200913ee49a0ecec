"""Prometheus metrics (``/metrics``), one registry per app.

Counted by the server: requests by endpoint and status, inference duration, time to
first token, prompt and generated tokens, requests in flight.  Read from the engine
at scrape time (:meth:`Engine.stats`): running and queued requests, batch size of the
last step, KV-cache bytes used and budget, prefix-cache hits, speculative drafts and
acceptances.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from modelc.engine.api import EngineStats, FinishEvent

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _EngineCollector(Collector):
    """Each loaded model's engine numbers, labelled ``model``."""

    def __init__(self, stats: Callable[[], list[tuple[str, EngineStats]]]) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        engines = self.stats()
        if not engines:
            return
        gauges: dict[str, tuple[str, Callable[[EngineStats], float]]] = {
            "modelc_engine_running": ("requests in the running batch", lambda s: s.running),
            "modelc_engine_queued": ("requests waiting for a slot", lambda s: s.waiting),
            "modelc_batch_size": ("sequences in the last engine step", lambda s: s.last_batch_size),
            "modelc_kv_cache_used_bytes": ("KV-cache bytes in use", lambda s: s.kv_bytes_used),
            "modelc_kv_cache_budget_bytes": ("KV-cache byte budget", lambda s: s.kv_bytes_budget),
            "modelc_kv_cache_usage_ratio": (
                "KV-cache bytes used / budget",
                lambda s: s.kv_bytes_used / s.kv_bytes_budget if s.kv_bytes_budget else 0.0,
            ),
            "modelc_spec_acceptance_ratio": (
                "accepted / drafted speculative tokens",
                lambda s: s.spec_accepted / s.spec_drafted if s.spec_drafted else 0.0,
            ),
        }
        for name, (doc, fn) in gauges.items():
            g = GaugeMetricFamily(name, doc, labels=["model"])
            for model, s in engines:
                g.add_metric([model], float(fn(s)))
            yield g
        counters: dict[str, tuple[str, Callable[[EngineStats], float]]] = {
            "modelc_engine_steps": ("engine steps run", lambda s: s.steps),
            "modelc_prefix_cache_hits": (
                "requests that reused cached prefix blocks",
                lambda s: s.prefix_cache_hits,
            ),
            "modelc_prefix_cache_tokens": (
                "prompt tokens served from the prefix cache",
                lambda s: s.prefix_cache_tokens,
            ),
            "modelc_spec_drafted_tokens": ("speculative tokens drafted", lambda s: s.spec_drafted),
            "modelc_spec_accepted_tokens": (
                "speculative tokens accepted",
                lambda s: s.spec_accepted,
            ),
        }
        for name, (doc, fn) in counters.items():
            c = CounterMetricFamily(name, doc, labels=["model"])
            for model, s in engines:
                c.add_metric([model], float(fn(s)))
            yield c
        extra: dict[str, GaugeMetricFamily] = {}
        for model, s in engines:  # engine-specific numbers, as gauges
            for key, v in sorted(s.extra.items()):
                if isinstance(v, int | float) and not isinstance(v, bool) and key.isidentifier():
                    if key not in extra:
                        extra[key] = GaugeMetricFamily(
                            f"modelc_engine_{key}", f"engine stat {key}", labels=["model"]
                        )
                    extra[key].add_metric([model], float(v))
        yield from extra.values()


class Metrics:
    def __init__(self, stats: Callable[[], list[tuple[str, EngineStats]]]) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "modelc_requests",
            "HTTP requests by endpoint and status",
            ["endpoint", "status"],
            registry=r,
        )
        self.active = Gauge("modelc_requests_active", "generation requests in flight", registry=r)
        self.duration = Histogram(
            "modelc_inference_duration_seconds",
            "engine time per generation request",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300),
            registry=r,
        )
        self.ttft = Histogram(
            "modelc_time_to_first_token_seconds",
            "time from submit to the first token",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
            registry=r,
        )
        self.generated = Counter("modelc_tokens_generated", "tokens generated", registry=r)
        self.stream_writes = Counter(
            "modelc_stream_writes",
            "writes of streamed answers (several tokens share one when a client falls behind)",
            registry=r,
        )
        self.prompt = Counter("modelc_prompt_tokens", "prompt tokens processed", registry=r)
        self.cached = Counter(
            "modelc_prompt_tokens_cached", "prompt tokens from the prefix cache", registry=r
        )
        self.spec_drafted = Counter(
            "modelc_request_spec_drafted", "speculative tokens drafted (per request)", registry=r
        )
        self.spec_accepted = Counter(
            "modelc_request_spec_accepted", "speculative tokens accepted (per request)", registry=r
        )
        r.register(_EngineCollector(stats))

    def finished(self, f: FinishEvent) -> None:
        self.duration.observe(f.total_time)
        if f.time_to_first_token is not None:
            self.ttft.observe(f.time_to_first_token)
        self.generated.inc(f.completion_tokens)
        self.prompt.inc(f.prompt_tokens)
        self.cached.inc(f.cached_tokens)
        self.spec_drafted.inc(f.spec_drafted)
        self.spec_accepted.inc(f.spec_accepted)

    def render(self) -> bytes:
        return generate_latest(self.registry)
