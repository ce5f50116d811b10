"""A discrete-event run of the real router's Dispatcher over simulated workers.

The router side is the production code: `router.routing.dispatcher.Dispatcher` routes each request
(hashing, prefix index lookup, affinity, policy), the `PrefixIndex` follows the workers' KV
events, and `WorkerState.on_heartbeat` takes their stats. Only the workers and the clock are
simulated. Events are processed in time order: arrivals, finishes, heartbeats.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from router.cluster.registry import WorkerRegistry, WorkerState
from router.metrics.router_metrics import Metrics
from router.routing.dispatcher import Dispatcher
from router.routing.policy import Policy, make_policy
from router.routing.prefix_index import PrefixIndex
from scripts.fleetsim.sim_worker import CostModel, SimWorker
from scripts.fleetsim.workload import SimRequest
from shared.protocol import Generate, Message, TokenDelta, Usage
from shared.sampling import SamplingParams

HEARTBEAT_S = 1.0  # the router's default heartbeat interval


@dataclass(frozen=True)
class FleetShape:
    workers: int = 2
    capacity_blocks: int = 355  # 500 MiB of float32 K/V of the default model, 32-token blocks
    block_size: int = 32
    cost: CostModel = CostModel()


@dataclass
class FleetResult:
    hit_rate: float  # cached / prompt tokens, as the workers count them
    requests_per_worker: list[int]
    evicted_blocks: int
    sim_seconds: float

    @property
    def imbalance(self) -> float:
        """max / mean requests per worker."""
        counts = self.requests_per_worker
        return max(counts) / (sum(counts) / len(counts))


def policy_of(policy: str | Policy) -> Policy:
    return make_policy(policy) if isinstance(policy, str) else policy


class Fleet:
    def __init__(self, shape: FleetShape, policy: str | Policy):
        self.now = 0.0
        self.index = PrefixIndex(clock=lambda: self.now)
        self.registry = WorkerRegistry()
        self.workers: dict[bytes, SimWorker] = {}
        for k in range(shape.workers):
            sim = SimWorker(
                f"w{k:02d}", shape.capacity_blocks, shape.block_size, shape.cost, self.index.apply
            )
            identity = sim.worker_id.encode()
            self.workers[identity] = sim
            self.registry.add(WorkerState(sim.register(), identity, last_seen=0.0))
        self.dispatcher = Dispatcher(
            self.registry,
            self.index,
            policy_of(policy),
            self._send,
            Metrics().model("model"),
            max_pending=1 << 30,
            max_resubmits=0,
        )
        self._events: list[tuple[float, int, str, object]] = []
        self._order = itertools.count()
        self._started_at = 0.0

    def run(
        self, requests: Sequence[SimRequest], concurrency: int | None = None, warmup: int = 0
    ) -> FleetResult:
        """Open loop (each request at its arrival time), or closed loop with `concurrency`
        clients (a request starts when a client's previous one finishes), as loadgen runs.
        The first `warmup` requests fill the caches and are not counted."""
        self._warmup_left = warmup
        self._baseline = self._counters()
        self._backlog = list(reversed(requests)) if concurrency else []
        for request in requests if not concurrency else []:
            self._at(request.arrival_s, "arrive", request)
        for _ in range(concurrency or 0):
            self._next_client_request()
        self._at(HEARTBEAT_S, "heartbeat", None)
        while self._events:
            self.now, _, kind, payload = heapq.heappop(self._events)
            if kind == "arrive":
                self._arrive(payload)
            elif kind == "finish":
                self._finish(*payload)
            elif kind == "heartbeat" and len(self._events) > 0:
                self._heartbeats()
        end = self._counters()
        hits, prompts, counts = (
            [b - a for a, b in zip(before, after, strict=True)]
            for before, after in zip(self._baseline, end, strict=True)
        )
        return FleetResult(
            hit_rate=sum(hits) / max(1, sum(prompts)),
            requests_per_worker=counts,
            evicted_blocks=sum(w.cache.evicted_blocks for w in self.workers.values()),
            sim_seconds=self.now - self._started_at,
        )

    def _counters(self) -> tuple[list[int], list[int], list[int]]:
        sims = list(self.workers.values())
        return (
            [w.hit_tokens for w in sims],
            [w.prompt_tokens for w in sims],
            [w.requests for w in sims],
        )

    def _at(self, when: float, kind: str, payload) -> None:
        heapq.heappush(self._events, (when, next(self._order), kind, payload))

    def _arrive(self, request: SimRequest) -> None:
        if self._warmup_left == 0:
            self._baseline = self._counters()
            self._started_at = self.now
        self._warmup_left -= 1
        sampling = SamplingParams(max_tokens=request.max_tokens)
        self.dispatcher.start(
            f"r{next(self._order)}", request.token_ids, sampling, cache_key=request.cache_key
        )

    def _send(self, identity: bytes, msg: Message) -> None:
        """The dispatcher's socket: a Generate starts on the simulated worker."""
        if isinstance(msg, Generate):
            sim = self.workers[identity]
            done_at = sim.start(msg.request_id, msg.token_ids, msg.sampling.max_tokens, self.now)
            self._at(done_at, "finish", (identity, msg.request_id))

    def _finish(self, identity: bytes, wire_id: str) -> None:
        done = self.workers[identity].finish(wire_id)
        usage = Usage(done.prompt_tokens, 0, done.cached_tokens)
        state = self.registry.by_identity(identity)
        self.dispatcher.on_delta(state, TokenDelta(wire_id, (), "stop", usage))
        self._next_client_request()

    def _next_client_request(self) -> None:
        if self._backlog:
            self._at(self.now, "arrive", self._backlog.pop())

    def _heartbeats(self) -> None:
        for identity, sim in self.workers.items():
            self.registry.by_identity(identity).on_heartbeat(sim.heartbeat())
        self.index.purge_expired()
        self._at(self.now + HEARTBEAT_S, "heartbeat", None)
