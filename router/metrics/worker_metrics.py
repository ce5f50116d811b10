"""Per-worker and cluster-wide gauges, read from the worker registry at scrape time.

A worker's state (its last Heartbeat, its Register) is already in the registry, so these
series are built when Prometheus scrapes (a custom collector) instead of being kept up to date
on every message. Adding a per-worker series is one line in `WORKER_SERIES`; every field of
`WorkerPhases` (a worker's step-time stats) is exported on its own as
`mlx_fleet_worker_phase_<field>`.

A worker is read through `ScrapedWorker`, what a scrape needs of one (the cluster's
WorkerState is one): metrics sit below the cluster and import nothing of it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, NamedTuple, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from router.metrics.kv_blocks import KVBlocks
from shared.protocol import WorkerPhases

if TYPE_CHECKING:
    from shared.protocol import Heartbeat, LinkRate, Register


class ScrapedWorker(Protocol):
    """A registered worker as a scrape reads it."""

    info: Register  # what it said when it registered
    heartbeat: Heartbeat | None  # its last one (None: none yet)
    healthy: bool
    model: str  # the id of the model it serves
    inflight: Collection[str]  # wire ids of requests this router sent there
    requests_served: int
    cached_tokens: int  # prompt tokens of requests served there that hit the cache
    links: Mapping[str, LinkRate]  # measured KV transfer rates from its peers, by peer id

    @property
    def worker_id(self) -> str: ...

    @property
    def load(self) -> int:
        """Running + waiting requests, as the router sees them."""


class Series(NamedTuple):
    name: str  # without the mlx_fleet_worker_ prefix (and, for counters, without _total)
    kind: str  # "gauge" or "counter"
    doc: str
    value: Callable[[ScrapedWorker], float]


def _hb(field: str, default: float = 0) -> Callable[[ScrapedWorker], float]:
    return lambda w: getattr(w.heartbeat, field) if w.heartbeat else default


def _kv_total(w: ScrapedWorker) -> int:
    return w.heartbeat.total_blocks if w.heartbeat else w.info.kv_capacity_blocks


def _kv_used(w: ScrapedWorker) -> int:
    return w.heartbeat.total_blocks - w.heartbeat.free_blocks if w.heartbeat else 0


def _kv_held(w: ScrapedWorker) -> int:
    return KVBlocks.of(w.heartbeat).held if w.heartbeat else 0


WORKER_SERIES: tuple[Series, ...] = (
    Series("up", "gauge", "1 if the worker is registered and healthy", lambda w: int(w.healthy)),
    Series("load", "gauge", "running + waiting requests (router's view)", lambda w: w.load),
    Series("inflight", "gauge", "requests this router has sent there", lambda w: len(w.inflight)),
    Series("running", "gauge", "sequences in the running batch", _hb("running")),
    Series("waiting", "gauge", "requests queued, not yet prefilling", _hb("waiting")),
    Series("kv_total_blocks", "gauge", "KV blocks in the worker's pool", _kv_total),
    Series("kv_used_blocks", "gauge", "KV blocks held by sequences or the cache", _kv_used),
    Series("kv_free_blocks", "gauge", "KV blocks free", _hb("free_blocks")),
    Series("kv_held_blocks", "gauge", "KV blocks running requests hold beyond the cache", _kv_held),
    Series("kv_cached_blocks", "gauge", "full KV blocks in the prefix cache", _hb("cached_blocks")),
    Series(
        "kv_cached_partial_blocks",
        "gauge",
        "partial KV blocks the prefix cache keeps",
        _hb("cached_partial_blocks"),
    ),
    Series(
        "kv_pinned_blocks",
        "gauge",
        "KV blocks pinned by cache hints (cache_control, "
        "prompt_cache_retention) until their deadline",
        _hb("pinned_blocks"),
    ),
    Series("kv_pins", "gauge", "pinned prefixes", _hb("pins")),
    Series(
        "state_snapshots",
        "gauge",
        "recurrent-state snapshots kept (hybrid models)",
        _hb("state_snapshots"),
    ),
    Series(
        "state_snapshot_bytes", "gauge", "bytes of those snapshots", _hb("state_snapshot_bytes")
    ),
    Series("state_slots", "gauge", "recurrent-state slots (hybrid models)", _hb("state_slots")),
    Series(
        "state_kept",
        "gauge",
        "state slots holding running sequences' reply-end copies",
        _hb("state_kept"),
    ),
    Series(
        "cache_hit_tokens",
        "counter",
        "prompt tokens served from the prefix cache",
        _hb("hit_tokens"),
    ),
    Series(
        "cache_query_tokens",
        "counter",
        "prompt tokens looked up in the prefix cache",
        _hb("prompt_tokens"),
    ),
    Series(
        "cached_tokens",
        "counter",
        "cached prompt tokens of requests this router sent there",
        lambda w: w.cached_tokens,
    ),
    Series("requests_served", "counter", "requests finished there", lambda w: w.requests_served),
    Series("pulled_blocks", "counter", "KV blocks it pulled from peers", _hb("pulled_blocks")),
    Series("pull_failures", "counter", "pulls that fell back to recompute", _hb("pull_failures")),
    Series(
        "prefill_tokens_per_s",
        "gauge",
        "its measured prefill rate (0: not yet)",
        _hb("prefill_tokens_per_s"),
    ),
)

# WorkerPhases fields that only grow (the others are recent-window statistics).
PHASE_COUNTERS = frozenset(
    {
        "decode_spikes",
        "decode_spike_seconds",
        "decode_tokens",
        "prefill_tokens",
        "preemptions",
        "spec_drafted",
        "spec_accepted",
        "folded_tokens",
        "folded_forwards",
        "prefill_forwards",
        "prefill_padding_tokens",
    }
)


def _phase(field: str) -> Callable[[ScrapedWorker], float]:
    return lambda w: getattr(w.heartbeat.phases, field) if w.heartbeat and w.heartbeat.phases else 0


def phase_series() -> tuple[Series, ...]:
    """One series per WorkerPhases field: a new field is exported without touching this file."""
    return tuple(
        Series(
            f"phase_{f.name}",
            "counter" if f.name in PHASE_COUNTERS else "gauge",
            f"worker step phases: {f.name}",
            _phase(f.name),
        )
        for f in dataclasses.fields(WorkerPhases)
    )


class WorkerCollector(Collector):
    """Reads `workers()` at scrape time; the vLLM-named cluster gauges are summed per model
    (labelled `model_name`) over the workers that serve it."""

    def __init__(
        self,
        model_names: Iterable[str],
        workers: Callable[[], Iterable[ScrapedWorker]],
        routed: Callable[[str], tuple[int, int, int]],
    ):
        self._model_names = tuple(model_names)
        self._workers = workers
        # worker id -> (requests routed, predicted hit tokens, tokens to pull from peers)
        self._routed = routed

    def collect(self) -> Iterator[Metric]:
        workers = list(self._workers())
        yield from self._cluster_gauges(workers)
        for series in (*WORKER_SERIES, *self._routing_series(), *phase_series()):
            yield _family(series, workers)
        yield from _attention(workers)
        yield _links(workers)

    def _routing_series(self) -> tuple[Series, ...]:
        return (
            Series(
                "routed", "counter", "requests routed there", lambda w: self._routed(w.worker_id)[0]
            ),
            Series(
                "routed_hit_tokens",
                "counter",
                "prefix tokens predicted cached when routed",
                lambda w: self._routed(w.worker_id)[1],
            ),
            Series(
                "routed_pull_tokens",
                "counter",
                "prefix tokens routed to be pulled from a peer",
                lambda w: self._routed(w.worker_id)[2],
            ),
        )

    def _cluster_gauges(self, workers: list[ScrapedWorker]) -> Iterator[Metric]:
        """vLLM's names, summed per model (`model_name`) over its healthy workers, so
        dashboards built for vLLM work."""
        gauges = (
            ("vllm:num_requests_running", "requests in the workers' running batches", _running),
            ("vllm:num_requests_waiting", "requests queued on the workers", _waiting),
            ("vllm:kv_cache_usage_perc", "KV-cache usage, 0..1", _kv_usage),
            ("vllm:gpu_cache_usage_perc", "KV-cache usage, 0..1 (vLLM's older name)", _kv_usage),
        )
        by_model = {m: [w for w in workers if w.model == m] for m in self._model_names}
        for name, doc, value in gauges:
            family = GaugeMetricFamily(name, doc, labels=["model_name"])
            for model, group in by_model.items():
                family.add_metric([model], value([w for w in group if w.healthy and w.heartbeat]))
            yield family
        preemptions = CounterMetricFamily(
            "vllm:num_preemptions",
            "sequences preempted (summed over the workers' counts)",
            labels=["model_name"],
        )
        for model, group in by_model.items():
            preemptions.add_metric([model], sum(_phase("preemptions")(w) for w in group))
        yield preemptions


def _running(live: list[ScrapedWorker]) -> float:
    return sum(w.heartbeat.running for w in live)


def _waiting(live: list[ScrapedWorker]) -> float:
    return sum(w.heartbeat.waiting for w in live)


def _kv_usage(live: list[ScrapedWorker]) -> float:
    total = sum(_kv_total(w) for w in live)
    return sum(_kv_used(w) for w in live) / total if total else 0.0


def _family(series: Series, workers: list[ScrapedWorker]) -> Metric:
    name = f"mlx_fleet_worker_{series.name}"
    cls = CounterMetricFamily if series.kind == "counter" else GaugeMetricFamily
    family = cls(name, series.doc, labels=["worker"])
    for w in workers:
        family.add_metric([w.worker_id], series.value(w))
    return family


def _attention(workers: list[ScrapedWorker]) -> Iterator[Metric]:
    """Each worker's paged-attention backend, its self-test and timings (from Register)."""
    info = GaugeMetricFamily(
        "mlx_fleet_worker_attention_info",
        "the worker's paged-attention backend (value 1)",
        labels=["worker", "backend", "requested", "self_test"],
    )
    timings = GaugeMetricFamily(
        "mlx_fleet_worker_attention_selftest_ms",
        "attention self-test timings",
        labels=["worker", "which"],
    )
    for w in workers:
        a = w.info.attention
        if a is None:
            continue
        info.add_metric([w.worker_id, a.backend, a.requested, a.self_test], 1)
        for which, ms in (("candidate", a.candidate_ms), ("reference", a.reference_ms)):
            if ms is not None:
                timings.add_metric([w.worker_id, which], ms)
    yield info
    yield timings
    yield from _kv_layout(workers)


def _kv_layout(workers: list[ScrapedWorker]) -> Iterator[Metric]:
    """Each worker's K/V layout ("float16", "q8g64": --kv-bits 8 in groups of 64) and the
    bytes one token's K and V take in its pool, all layers (from Register)."""
    layout = GaugeMetricFamily(
        "mlx_fleet_worker_kv_layout_info",
        "the worker's KV-cache layout (value 1)",
        labels=["worker", "kv_layout"],
    )
    per_token = GaugeMetricFamily(
        "mlx_fleet_worker_kv_bytes_per_token",
        "bytes one token's K and V take in the worker's pool, all layers",
        labels=["worker"],
    )
    groups = GaugeMetricFamily(
        "mlx_fleet_worker_kv_group_bytes_per_token",
        "bytes one token's K and V take in one layer group of the worker's pool (a group: "
        "the layers that keep one kind of cache, e.g. full attention or one sliding window)",
        labels=["worker", "group", "layers", "paged_layers"],
    )
    for w in workers:
        a = w.info.attention
        if a is None or not a.kv_layout:
            continue
        layout.add_metric([w.worker_id, a.kv_layout], 1)
        per_token.add_metric([w.worker_id], a.kv_bytes_per_token)
        for g in a.kv_groups:
            labels = [w.worker_id, g.kind, str(g.layers), str(g.paged_layers)]
            groups.add_metric(labels, g.bytes_per_token)
    yield layout
    yield per_token
    yield groups


def _links(workers: list[ScrapedWorker]) -> Metric:
    """The link rates each worker measured fetching KV blocks from its peers."""
    family = GaugeMetricFamily(
        "mlx_fleet_worker_link_bytes_per_second",
        "measured KV transfer rate from a peer (probe, then real transfers)",
        labels=["worker", "peer"],
    )
    for w in workers:
        for peer, rate in w.links.items():
            family.add_metric([w.worker_id, peer], rate.bytes_per_s)
    return family
