"""Prometheus text-format metrics, kept by hand (no client library needed for a few series)."""

from __future__ import annotations

import bisect
import dataclasses
from collections import Counter
from collections.abc import Iterable

from router.workers import WorkerState
from shared.protocol import WorkerPhases

LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class Histogram:
    def __init__(self, buckets: tuple[float, ...] = LATENCY_BUCKETS_S):
        self._buckets = buckets
        self._counts = [0] * (len(buckets) + 1)  # the last one is +Inf
        self._sum = 0.0

    def observe(self, value: float) -> None:
        self._counts[bisect.bisect_left(self._buckets, value)] += 1
        self._sum += value

    def render(self, name: str, labels: str) -> Iterable[str]:
        cumulative = 0
        sep = "," if labels else ""
        for bound, count in zip([*self._buckets, "+Inf"], self._counts, strict=True):
            cumulative += count
            yield f'{name}_bucket{{{labels}{sep}le="{bound}"}} {cumulative}'
        yield f"{name}_sum{{{labels}}} {self._sum}"
        yield f"{name}_count{{{labels}}} {cumulative}"


class Metrics:
    def __init__(self):
        self.requests: Counter[tuple[str, int]] = Counter()  # (endpoint, status)
        self.latency: dict[str, Histogram] = {}  # by endpoint
        self.ttft = Histogram()
        self.tokens: Counter[str] = Counter()  # prompt / completion / cached
        self.routed: Counter[str] = Counter()  # by worker
        self.routed_hit_tokens: Counter[str] = Counter()  # predicted prefix hits, by worker
        self.counts: Counter[str] = Counter()  # resubmitted, workers_lost

    def request_done(self, endpoint: str, status: int, seconds: float) -> None:
        self.requests[(endpoint, status)] += 1
        self.latency.setdefault(endpoint, Histogram()).observe(seconds)

    def usage(self, prompt: int, completion: int, cached: int) -> None:
        self.tokens.update(prompt=prompt, completion=completion, cached=cached)

    def routed_to(self, worker_id: str, predicted_hit_tokens: int) -> None:
        self.routed[worker_id] += 1
        self.routed_hit_tokens[worker_id] += predicted_hit_tokens

    def resubmitted(self) -> None:
        self.counts["resubmitted"] += 1

    def worker_lost(self) -> None:
        self.counts["workers_lost"] += 1

    def render(self, workers: Iterable[WorkerState], pending: int) -> str:
        lines = [
            "# TYPE router_requests_total counter",
            *(
                f'router_requests_total{{endpoint="{e}",status="{s}"}} {n}'
                for (e, s), n in sorted(self.requests.items())
            ),
            "# TYPE router_request_duration_seconds histogram",
        ]
        for endpoint, hist in sorted(self.latency.items()):
            lines += hist.render("router_request_duration_seconds", f'endpoint="{endpoint}"')
        lines += ["# TYPE router_time_to_first_token_seconds histogram"]
        lines += self.ttft.render("router_time_to_first_token_seconds", "")
        lines += ["# TYPE router_tokens_total counter"]
        lines += [
            f'router_tokens_total{{kind="{k}"}} {self.tokens[k]}'
            for k in ("prompt", "completion", "cached")
        ]
        lines += [
            "# TYPE router_pending_requests gauge",
            f"router_pending_requests {pending}",
            "# TYPE router_resubmitted_requests_total counter",
            f"router_resubmitted_requests_total {self.counts['resubmitted']}",
            "# TYPE router_workers_lost_total counter",
            f"router_workers_lost_total {self.counts['workers_lost']}",
        ]
        lines += self._render_workers(list(workers))
        return "\n".join(lines) + "\n"

    def _render_workers(self, workers: list[WorkerState]) -> list[str]:
        series = {
            "router_worker_healthy": ("gauge", lambda w: int(w.healthy)),
            "router_worker_load": ("gauge", lambda w: w.load),
            "router_worker_inflight": ("gauge", lambda w: len(w.inflight)),
            "router_worker_kv_total_blocks": ("gauge", _kv_total),
            "router_worker_kv_used_blocks": ("gauge", _kv_used),
            "router_worker_cache_hit_tokens_total": (
                "counter",
                lambda w: w.heartbeat.hit_tokens if w.heartbeat else 0,
            ),
            "router_worker_cached_tokens_total": ("counter", lambda w: w.cached_tokens),
            "router_worker_requests_served_total": ("counter", lambda w: w.requests_served),
            "router_worker_routed_total": ("counter", lambda w: self.routed[w.worker_id]),
            "router_worker_routed_hit_tokens_total": (
                "counter",
                lambda w: self.routed_hit_tokens[w.worker_id],
            ),
        }
        for field in dataclasses.fields(WorkerPhases):  # where each worker's step time goes
            series[f"router_worker_phase_{field.name}"] = (
                "counter" if field.name in PHASE_COUNTERS else "gauge",
                lambda w, f=field.name: (
                    getattr(w.heartbeat.phases, f) if w.heartbeat and w.heartbeat.phases else 0
                ),
            )
        lines = []
        for name, (kind, value) in series.items():
            lines.append(f"# TYPE {name} {kind}")
            lines += [f'{name}{{worker="{_label(w.worker_id)}"}} {value(w)}' for w in workers]
        return lines + _render_attention(workers)


PHASE_COUNTERS = {"decode_spikes", "decode_spike_seconds", "decode_tokens", "prefill_tokens",
                  "preemptions"}  # fmt: skip


def _render_attention(workers: list[WorkerState]) -> list[str]:
    """Each worker's paged-attention backend, its self-test and timings (from Register)."""
    lines = ["# TYPE router_worker_attention_info gauge"]
    timings = ["# TYPE router_worker_attention_selftest_ms gauge"]
    for w in workers:
        a = w.info.attention
        if a is None:
            continue
        worker = _label(w.worker_id)
        lines.append(
            f'router_worker_attention_info{{worker="{worker}",backend="{_label(a.backend)}",'
            f'requested="{_label(a.requested)}",self_test="{_label(a.self_test)}"}} 1'
        )
        for which, ms in (("candidate", a.candidate_ms), ("reference", a.reference_ms)):
            if ms is not None:
                timings.append(
                    f'router_worker_attention_selftest_ms{{worker="{worker}",which="{which}"}} {ms}'
                )
    return lines + timings


def _label(value: str) -> str:
    """A Prometheus label value: backslash, quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _kv_total(w: WorkerState) -> int:
    return w.heartbeat.total_blocks if w.heartbeat else w.info.kv_capacity_blocks


def _kv_used(w: WorkerState) -> int:
    return w.heartbeat.total_blocks - w.heartbeat.free_blocks if w.heartbeat else 0
