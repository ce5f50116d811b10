"""What the router knows about each worker: registration, liveness, load, counters."""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from router.metrics.kv_blocks import KVBlocks
from shared.protocol import LinkRate, Peer

if TYPE_CHECKING:
    from shared.protocol import Heartbeat, Register

EVICTION_RATE_SMOOTHING = 0.05
RECENT_ERRORS = 5  # per worker, for the fleet page and /v1/cluster


@dataclass(eq=False)
class WorkerState:
    info: Register
    identity: bytes  # the ZeroMQ routing id of the worker's DEALER socket
    last_seen: float
    healthy: bool = True
    heartbeat: Heartbeat | None = None
    inflight: set[str] = field(default_factory=set)  # wire ids of requests sent there
    requests_served: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens of requests served here that hit the cache
    # blocks its prefix cache evicts per heartbeat, smoothed over ~20 heartbeats: evictions
    # come in bursts (one prompt's worth at a time), so one interval alone says little
    eviction_rate: float = 0.0
    # the served model's id (the router maps an alias the worker registered with to it)
    model: str = ""
    # the engine loop's progress (Heartbeat.loop_turns): when it last moved or the worker was
    # idle, and whether the router took it out of service for not moving while busy
    progress_at: float = 0.0
    wedged: bool = False
    # the last few errors of its requests and of its process ("HH:MM:SS what"), kept across
    # re-registrations of the same worker id
    errors: deque = field(default_factory=lambda: deque(maxlen=RECENT_ERRORS))
    # requests of ours that ended after its last heartbeat: that heartbeat still counts them
    ended_since_heartbeat: int = 0

    # the fleet cache: measured link rates to peers (by peer id, the latest heartbeat's)
    links: dict[str, LinkRate] = field(default_factory=dict)
    # KV events: the number of the last KVEvents applied (None: none numbered yet), when
    # the router last asked for the inventory after a gap (None: not waiting for one), and
    # how many gaps it saw
    kv_seq: int | None = None
    inventory_asked_at: float | None = None
    kv_gaps: int = 0

    def __post_init__(self):
        self.model = self.model or self.info.model_id

    def on_heartbeat(self, msg: Heartbeat, now: float | None = None) -> None:
        last = self.heartbeat.loop_turns if self.heartbeat else -1
        idle = msg.running + msg.waiting == 0 and not self.inflight
        moved = msg.loop_turns != last or msg.loop_turns == 0  # 0: a worker that can't say
        if now is not None and (moved or idle):
            self.progress_at, self.wedged = now, False
        previous = self.heartbeat.evicted_blocks if self.heartbeat else msg.evicted_blocks
        evicted = max(0, msg.evicted_blocks - previous)
        self.eviction_rate += EVICTION_RATE_SMOOTHING * (evicted - self.eviction_rate)
        self.heartbeat = msg
        self.ended_since_heartbeat = 0
        self.links.update((link.peer_id, link) for link in msg.links)

    # ------------------------------------------------------------ the fleet cache

    @property
    def kv_endpoint(self) -> str:
        return self.info.kv_endpoint

    @property
    def role(self) -> str:
        return self.info.role

    @property
    def kv_layout(self) -> str:
        """How its KV blocks are stored ("float16", "q8g64"; "": not reported)."""
        return self.info.attention.kv_layout if self.info.attention else ""

    @property
    def layout_key(self) -> tuple[str, int, str, int]:
        """Workers with equal keys hold interchangeable KV blocks: same model, block size,
        K/V layout (dtype, quantization) and tensor-parallel split."""
        tp = self.info.group.size if self.info.group else 1
        return (self.model, self.block_size, self.kv_layout, tp)

    @property
    def block_bytes(self) -> int:
        """Bytes of one KV block (all layers, K and V); 0: the worker did not say."""
        per_token = self.info.attention.kv_bytes_per_token if self.info.attention else 0
        return per_token * self.block_size

    @property
    def prefill_tokens_per_s(self) -> float:
        """Measured prefill rate; 0: not measured yet."""
        return self.heartbeat.prefill_tokens_per_s if self.heartbeat else 0.0

    @property
    def pulled_blocks(self) -> int:
        return self.heartbeat.pulled_blocks if self.heartbeat else 0

    @property
    def pull_failures(self) -> int:
        return self.heartbeat.pull_failures if self.heartbeat else 0

    def note_error(self, what: str) -> None:
        self.errors.append(f"{time.strftime('%H:%M:%S')} {what[:200]}")

    @property
    def worker_id(self) -> str:
        return self.info.worker_id

    @property
    def block_size(self) -> int:
        return self.info.block_size

    @property
    def load(self) -> int:
        """Running + waiting requests.

        The router's own in-flight count is exact and current; the heartbeat is late but also
        sees requests of other routers. The larger of the two, rather than their sum, so that a
        request is not counted twice; the heartbeat less ours that ended since it was sent.
        """
        reported = self.heartbeat.running + self.heartbeat.waiting if self.heartbeat else 0
        return max(reported - self.ended_since_heartbeat, len(self.inflight))

    def untrack(self, wire_id: str) -> None:
        """One of our requests there ended (or moved): out of its in-flight set, and out of
        what its last heartbeat reported (else an idle holder looks busy for a heartbeat and
        loses its prefix's next request to a worker that must pull or recompute it)."""
        if wire_id in self.inflight:
            self.inflight.discard(wire_id)
            self.ended_since_heartbeat += 1

    def to_json(self) -> dict:
        hb = self.heartbeat
        return {
            "id": self.worker_id,
            "healthy": self.healthy,
            "host": self.info.host,
            "pid": self.info.pid,
            "model": self.model,
            "block_size": self.block_size,
            "load": self.load,
            "inflight": len(self.inflight),
            "running": hb.running if hb else None,
            "waiting": hb.waiting if hb else None,
            "kv_layout": self.kv_layout or None,
            "kv_bytes_per_token": getattr(self.info.attention, "kv_bytes_per_token", None),
            "kv_groups": [
                {
                    "kind": g.kind,
                    "layers": g.layers,
                    "bytes_per_token": g.bytes_per_token,
                    "paged_layers": g.paged_layers,
                }
                for g in getattr(self.info.attention, "kv_groups", ())
            ],
            "kv_total_blocks": hb.total_blocks if hb else self.info.kv_capacity_blocks,
            "kv_free_blocks": hb.free_blocks if hb else None,
            "kv_held_blocks": KVBlocks.of(hb).held if hb else None,
            "kv_cached_blocks": hb.cached_blocks if hb else None,  # full blocks
            "kv_cached_partial_blocks": hb.cached_partial_blocks if hb else None,
            "kv_pinned_blocks": hb.pinned_blocks if hb else 0,  # kept by cache hints
            "kv_pins": hb.pins if hb else 0,
            "state_snapshots": hb.state_snapshots if hb else 0,  # hybrid models' states
            "state_snapshot_bytes": hb.state_snapshot_bytes if hb else 0,
            "state_slots": hb.state_slots if hb else 0,
            "state_kept": hb.state_kept if hb else 0,  # reply-end copies of running sequences
            "cache_hit_tokens": hb.hit_tokens if hb else 0,
            "kv_checks": hb.kv_checks if hb else 0,  # integrity checks of its KV, while idle
            "kv_check_failures": hb.kv_check_failures if hb else 0,
            "errors": list(self.errors),
            "requests_served": self.requests_served,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "attention": _as_json(self.info.attention),
            "tensor_parallel": _as_json(self.info.group),
            "phases": _as_json(hb.phases if hb else None),
            "kv_endpoint": self.kv_endpoint,
            "role": self.role,
            "vision": self.info.vision,  # takes images (mlx-vlm installed, family served)
            "vision_note": self.info.vision_note or None,  # why not, when not
            "prefill_tokens_per_s": self.prefill_tokens_per_s,
            "links": [dataclasses.asdict(link) for link in self.links.values()],
            "pulled_blocks": self.pulled_blocks,
            "pull_failures": self.pull_failures,
        }


class WorkerRegistry:
    def __init__(self):
        self._by_id: dict[str, WorkerState] = {}
        self._by_identity: dict[bytes, WorkerState] = {}

    def add(self, state: WorkerState) -> WorkerState | None:
        """Register `state`, returning the state it replaces (same worker id), if any."""
        old = self._by_id.pop(state.worker_id, None)
        if old is not None:
            self._by_identity.pop(old.identity, None)
        self._by_id[state.worker_id] = state
        self._by_identity[state.identity] = state
        return old

    def remove(self, worker_id: str) -> None:
        """Forget a worker that is gone for good (stopped by its host)."""
        state = self._by_id.pop(worker_id, None)
        if state is not None:
            self._by_identity.pop(state.identity, None)

    def by_identity(self, identity: bytes) -> WorkerState | None:
        return self._by_identity.get(identity)

    def get(self, worker_id: str) -> WorkerState | None:
        return self._by_id.get(worker_id)

    def healthy(self, model: str | None = None) -> list[WorkerState]:
        """Healthy workers (of `model` only, when given)."""
        return [
            w for w in self._by_id.values() if w.healthy and (model is None or w.model == model)
        ]

    def peers_of(self, worker: WorkerState) -> tuple[Peer, ...]:
        """The other healthy workers whose KV blocks `worker` can use (same layout key) and
        that say where to fetch them: RegisterAck.peers."""
        return tuple(
            Peer(w.worker_id, w.kv_endpoint)
            for w in self.healthy(worker.model)
            if w is not worker and w.kv_endpoint and w.layout_key == worker.layout_key
        )

    def cache_summary(self) -> dict:
        """The fleet's prefix-cache hit rate from the workers' counters, local hits apart from
        blocks pulled from peers (a worker's hit_tokens count the pulled blocks too: the
        request they were pulled for hits them once they are in). Over the workers that decode:
        a prefill worker's prompt is also its decoder's, which counts it (pulled), once."""
        decoders = [w for w in self._by_id.values() if w.role != "prefill"]
        prompt = sum(w.heartbeat.prompt_tokens for w in decoders if w.heartbeat)
        hits = sum(w.heartbeat.hit_tokens for w in decoders if w.heartbeat)
        pulled = sum(w.pulled_blocks * w.block_size for w in decoders)
        local = max(0, hits - pulled)
        return {
            "prompt_tokens": prompt,
            "local_hit_tokens": local,
            "pulled_tokens": pulled,
            "local_hit_rate": local / prompt if prompt else 0.0,
            "hit_rate_with_pulls": hits / prompt if prompt else 0.0,
        }

    def wedged(self, now: float, after_s: float) -> list[WorkerState]:
        """Healthy workers with work whose engine loop has not moved for `after_s`."""
        return [w for w in self.healthy() if w.load and now - w.progress_at > after_s]

    def stale(self, now: float, timeout_s: float) -> list[WorkerState]:
        """Healthy workers silent for longer than `timeout_s`."""
        return [w for w in self.healthy() if now - w.last_seen > timeout_s]

    def __iter__(self) -> Iterator[WorkerState]:
        return iter(list(self._by_id.values()))

    def __len__(self) -> int:
        return len(self._by_id)


def _as_json(report) -> dict | None:
    return dataclasses.asdict(report) if report is not None else None
