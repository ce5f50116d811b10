"""The router's Prometheus metrics (prometheus-client, one CollectorRegistry per app).

Where vLLM's server has a counterpart, the series carries vLLM's name and `model_name` label,
so dashboards built for vLLM work unchanged: request latencies (TTFT, inter-token, end to end,
streamed or not), token counters, prefix-cache hits, requests by finish reason, and (from the
worker registry, router/metrics/worker_metrics.py) running / waiting requests and KV-cache usage. The
rest is ours, under `mlx_fleet_`: HTTP requests by endpoint, routing, fail-over, and per-worker
series labelled `worker`.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterable
from typing import TYPE_CHECKING

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

from router.metrics.key_usage import KeyUsage
from router.metrics.worker_metrics import WorkerCollector

if TYPE_CHECKING:
    from router.metrics.worker_metrics import ScrapedWorker

disable_created_metrics()  # no `_created` series: vLLM's exposition has none either
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
HTTP_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160)
ITL_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 2.5, 5, 10)
E2E_BUCKETS_S = (0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 20, 30, 60, 120, 300, 600, 1200)


class Metrics:
    """The app's registry: request series per served model (`model(name)`), fleet series."""

    def __init__(self, *model_names: str):
        self.registry = CollectorRegistry(auto_describe=True)
        self.model_names = model_names or ("model",)
        self._workers: list[ScrapedWorker] = []  # the registry as of the current scrape
        self._pending = 0
        self._routed: Tally[str] = Tally()
        self._routed_hit_tokens: Tally[str] = Tally()
        self._routed_pull_tokens: Tally[str] = Tally()
        self._request_families()
        self._fleet_series()
        self._models = {name: ModelMetrics(self, name) for name in self.model_names}
        self.keys = KeyUsage(self.registry)  # usage per API key fingerprint
        self.registry.register(
            WorkerCollector(self.model_names, lambda: self._workers, self._routing)
        )

    def model(self, name: str) -> ModelMetrics:
        """The request series of one served model (labelled `model_name`)."""
        return self._models[name]

    def _request_families(self) -> None:
        def histogram(name, doc, buckets):
            return Histogram(name, doc, ["model_name"], buckets=buckets, registry=self.registry)

        def counter(name, doc, labels=("model_name",)):
            return Counter(name, doc, list(labels), registry=self.registry)

        self.ttft_family = histogram(
            "vllm:time_to_first_token_seconds", "time to first token", TTFT_BUCKETS_S
        )
        self.itl_family = histogram(
            "vllm:inter_token_latency_seconds", "time between output tokens", ITL_BUCKETS_S
        )
        self.tpot_family = histogram(
            "vllm:time_per_output_token_seconds",
            "time per output token (vLLM's older name)",
            ITL_BUCKETS_S,
        )
        self.e2e_family = histogram(
            "vllm:e2e_request_latency_seconds", "request latency, end to end", E2E_BUCKETS_S
        )
        self.prompt_tokens_family = counter("vllm:prompt_tokens", "prompt tokens processed")
        self.generation_tokens_family = counter("vllm:generation_tokens", "tokens generated")
        self.cache_queries_family = counter(
            "vllm:prefix_cache_queries", "prompt tokens looked up in the prefix caches"
        )
        self.cache_hits_family = counter(
            "vllm:prefix_cache_hits", "prompt tokens found in the prefix caches"
        )
        self.decisions_family = counter(
            "mlx_fleet_routing_decisions",
            "routing decisions by how the prompt's cached prefix is served: local_hit, pull (from a peer), recompute",
            ("model_name", "kind"),
        )
        self.pulled_tokens_family = counter(
            "mlx_fleet_prefix_pulled_tokens",
            "prompt tokens routed to be pulled from a peer's cache (apart from vllm:prefix_cache_hits, the local hits)",
        )
        self.volatile_family = counter(
            "mlx_fleet_volatile_prompt_removals",
            "per-request metadata taken out of prompts before templating ([router] volatile_prompt_patterns, e.g. Claude Code's billing line)",
        )
        self.success_family = counter(
            "vllm:request_success", "finished requests", ("model_name", "finished_reason")
        )
        # The streaming handler observes this one: time until the first chunk is written.
        self.first_chunk_family = histogram(
            "mlx_fleet_time_to_first_chunk_seconds",
            "streamed requests: time to the first chunk",
            TTFT_BUCKETS_S,
        )

    def _fleet_series(self) -> None:
        r = self.registry
        self._http = Counter(
            "mlx_fleet_http_requests", "HTTP requests", ["endpoint", "status"], registry=r
        )
        self._http_seconds = Histogram(
            "mlx_fleet_http_request_duration_seconds",
            "HTTP request duration",
            ["endpoint"],
            buckets=HTTP_BUCKETS_S,
            registry=r,
        )
        self._resubmitted = Counter(
            "mlx_fleet_resubmitted_requests", "requests moved to another worker", registry=r
        )
        self._workers_lost = Counter("mlx_fleet_workers_lost", "workers declared lost", registry=r)
        self._registrations = Counter(
            "mlx_fleet_worker_registrations",
            "registrations (a restart registers again)",
            ["worker"],
            registry=r,
        )
        self._cached_tokens = Counter(
            "mlx_fleet_cached_prompt_tokens",
            "prompt tokens of finished requests served from a cache",
            registry=r,
        )
        Gauge("mlx_fleet_pending_requests", "requests the router holds", registry=r).set_function(
            lambda: self._pending
        )

    # ------------------------------------------------------------ recording

    def request_done(self, endpoint: str, status: int, seconds: float) -> None:
        """An HTTP request ended (any endpoint, any status)."""
        self._http.labels(endpoint, str(status)).inc()
        self._http_seconds.labels(endpoint).observe(seconds)

    def routed_to(self, worker_id: str, predicted_hit_tokens: int, pulled_tokens: int = 0) -> None:
        self._routed[worker_id] += 1
        self._routed_hit_tokens[worker_id] += predicted_hit_tokens
        self._routed_pull_tokens[worker_id] += pulled_tokens

    def cached_tokens(self, count: int) -> None:
        self._cached_tokens.inc(count)

    def worker_registered(self, worker_id: str) -> None:
        self._registrations.labels(worker_id).inc()

    def resubmitted(self) -> None:
        self._resubmitted.inc()

    def worker_lost(self) -> None:
        self._workers_lost.inc()

    def _routing(self, worker_id: str) -> tuple[int, int, int]:
        routed, pulled = self._routed[worker_id], self._routed_pull_tokens[worker_id]
        return routed, self._routed_hit_tokens[worker_id], pulled

    # ------------------------------------------------------------ exposition

    def render(self, workers: Iterable[ScrapedWorker], pending: int) -> str:
        """The text exposition, with the worker series read from `workers` now."""
        self._workers, self._pending = list(workers), pending
        try:
            return generate_latest(self.registry).decode()
        finally:
            self._workers = []


class ModelMetrics:
    """One model's request series; routing and fail-over counts go to the fleet's."""

    def __init__(self, fleet: Metrics, name: str):
        self.name = name
        self._fleet = fleet
        self._ttft = fleet.ttft_family.labels(name)
        self._itl = fleet.itl_family.labels(name)
        self._tpot = fleet.tpot_family.labels(name)
        self._e2e = fleet.e2e_family.labels(name)
        self._prompt_tokens = fleet.prompt_tokens_family.labels(name)
        self._generation_tokens = fleet.generation_tokens_family.labels(name)
        self._cache_queries = fleet.cache_queries_family.labels(name)
        self._cache_hits = fleet.cache_hits_family.labels(name)
        self.first_chunk = fleet.first_chunk_family.labels(name)
        self._volatile = fleet.volatile_family.labels(name)

    def usage(self, prompt: int, completion: int, cached: int) -> None:
        """A generation request's usage, once it finished."""
        self._prompt_tokens.inc(prompt)
        self._generation_tokens.inc(completion)
        self._cache_queries.inc(prompt)
        self._cache_hits.inc(cached)
        self._fleet.cached_tokens(cached)

    def volatile_removed(self, count: int) -> None:
        """A prompt lost `count` matches of the volatile patterns (router/text/volatile.py)."""
        self._volatile.inc(count)

    def first_token(self, seconds: float) -> None:
        """The first token of a request reached the router, `seconds` after it was sent."""
        self._ttft.observe(seconds)

    def output_tokens(self, gap_s: float, count: int) -> None:
        """`count` tokens arrived together `gap_s` after the previous ones: each is one
        inter-token interval of gap / count (a worker may send several per delta)."""
        for _ in range(count):
            self._itl.observe(gap_s / count)
            self._tpot.observe(gap_s / count)

    def request_finished(self, finish_reason: str, seconds: float) -> None:
        self._fleet.success_family.labels(self.name, finish_reason).inc()
        self._e2e.observe(seconds)

    def routed_to(
        self,
        worker_id: str,
        predicted_hit_tokens: int,
        kind: str = "recompute",
        pulled_tokens: int = 0,
    ) -> None:
        """A request went to `worker_id`, its prefix served as `kind` (local_hit, pull,
        recompute): predicted tokens cached there, and tokens it pulls from a peer."""
        self._fleet.routed_to(worker_id, predicted_hit_tokens, pulled_tokens)
        self._fleet.decisions_family.labels(self.name, kind).inc()
        self._fleet.pulled_tokens_family.labels(self.name).inc(pulled_tokens)

    def resubmitted(self) -> None:
        self._fleet.resubmitted()
