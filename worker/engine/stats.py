"""Per-step figures the engine keeps for `stats()`: step times, batch sizes, preemptions, and
the phase metrics (decode tick percentiles and spikes, prefill chunk time, sampled K/V write
and attention time, blocks and K/V bytes a decode tick reads, prompt tokens folded into
decode forwards and the padding of prefill forwards)."""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import mlx.core as mx

from shared.protocol import WorkerPhases
from worker.attention.shared_prefix import gathered_keys
from worker.engine.step_kind import padding_tokens
from worker.runner.plan import StepKind

if TYPE_CHECKING:
    from worker.engine.caches import KVFigures
    from worker.engine.scheduler import Scheduler
    from worker.engine.step_kind import StepPlan

log = logging.getLogger(__name__)

WINDOW = 2048  # recent steps kept for percentiles
SHARED_KV_EVERY = 8  # decode ticks between counts of the K/V read with prefixes shared
SPIKE_S = 0.2  # a decode tick longer than this is a spike (a user sees the stream stall)


def percentile(values, q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class EngineStats:
    decode_times: deque = field(default_factory=lambda: deque(maxlen=WINDOW))
    decode_batches: deque = field(default_factory=lambda: deque(maxlen=WINDOW))
    prefill_times: deque = field(default_factory=lambda: deque(maxlen=WINDOW))
    decode_tokens: int = 0
    prefill_tokens: int = 0
    folded_tokens: int = 0  # prompt tokens run as one-token rows (MIXED forwards)
    folded_forwards: int = 0
    prefill_forwards: int = 0  # padded prefill forwards (each a weight pass of its own)
    prefill_padding: int = 0  # token slots those computed beyond their prompt tokens
    preemptions: int = 0
    busy_s: float = 0.0  # seconds in Engine.step since start (the worker loop adds them)
    drafted: int = 0  # speculative tokens proposed
    draft_accepted: int = 0
    spikes: int = 0
    spike_seconds: float = 0.0
    decode_blocks: deque = field(default_factory=lambda: deque(maxlen=WINDOW))
    decode_kv_bytes: deque = field(default_factory=lambda: deque(maxlen=WINDOW))
    decode_kv_shared_bytes: deque = field(default_factory=lambda: deque(maxlen=WINDOW))
    decode_shapes: int = 0
    layer_write_s: deque = field(default_factory=lambda: deque(maxlen=WINDOW))
    layer_attend_s: deque = field(default_factory=lambda: deque(maxlen=WINDOW))

    def record_decode(self, seconds: float, batch: int) -> None:
        self.decode_times.append(seconds)
        self.decode_batches.append(batch)
        self.decode_tokens += batch
        if seconds > SPIKE_S:
            self.spikes += 1
            self.spike_seconds += seconds

    def record_drafts(self, proposed: int, accepted: int) -> None:
        self.drafted += proposed
        self.draft_accepted += accepted
        self.decode_tokens += accepted  # tokens the step produced beyond one per sequence

    def record_decode_shape(self, seqs, block_size: int, bytes_per_block: int) -> None:
        """Blocks and K/V bytes a decode tick over `seqs` reads (from host counters): the bytes
        the pool holds per token (`bytes_per_block` / `block_size`), so with `--kv-bits` the
        packed values, scales and biases.
        Every `SHARED_KV_EVERY`th tick also the bytes with each shared prefix read once (the
        shared-prefix plan's keys, `gathered_keys`: the roofline's floor with sharing)."""
        lengths = [s.num_computed + 1 for s in seqs]
        per_token = bytes_per_block / block_size
        self.decode_blocks.append(sum(-(-n // block_size) for n in lengths))
        self.decode_kv_bytes.append(sum(lengths) * per_token)
        self.decode_shapes += 1
        if self.decode_shapes % SHARED_KV_EVERY == 1:
            keys = gathered_keys([s.block_ids for s in seqs], lengths, block_size)
            self.decode_kv_shared_bytes.append(keys * per_token)

    def record_layer_times(self, times) -> None:
        """A profiled step's K/V write and attention seconds, summed over its layers."""
        self.layer_write_s.append(times.write_s)
        self.layer_attend_s.append(times.attend_s)

    def record_prefill(self, seconds: float, plan: StepPlan) -> None:
        """One forward with prompt tokens: a MIXED one (folded rows) or a padded PREFILL."""
        tokens, slots = padding_tokens(plan)
        self.prefill_times.append(seconds)
        self.prefill_tokens += tokens
        if plan.kind is StepKind.PREFILL:
            self.prefill_forwards += 1
            self.prefill_padding += slots - tokens
        else:
            self.folded_forwards += 1
            self.folded_tokens += tokens

    def summary(self) -> dict:
        return {
            "decode_step_p50_ms": 1000 * percentile(self.decode_times, 0.5),
            "decode_step_p95_ms": 1000 * percentile(self.decode_times, 0.95),
            "decode_batch_mean": sum(self.decode_batches) / len(self.decode_batches)
            if self.decode_batches
            else 0.0,
            "prefill_chunk_p50_ms": 1000 * percentile(self.prefill_times, 0.5),
            "spec_drafted": self.drafted,
            "spec_accepted": self.draft_accepted,
            "spec_acceptance": self.draft_accepted / self.drafted if self.drafted else 0.0,
            "decode_spikes": self.spikes,
            "decode_spike_seconds": self.spike_seconds,
            "decode_blocks_mean": _mean(self.decode_blocks),
            "decode_kv_bytes_mean": _mean(self.decode_kv_bytes),
            "decode_kv_shared_bytes_mean": _mean(self.decode_kv_shared_bytes),
            "kv_write_ms_p50": 1000 * percentile(self.layer_write_s, 0.5),
            "attention_ms_p50": 1000 * percentile(self.layer_attend_s, 0.5),
            "decode_tokens": self.decode_tokens,
            "prefill_tokens": self.prefill_tokens,
            "folded_tokens": self.folded_tokens,
            "folded_forwards": self.folded_forwards,
            "prefill_forwards": self.prefill_forwards,
            "prefill_padding_tokens": self.prefill_padding,
            "preemptions": self.preemptions,
        }

    def phases(self, prefix_kv_bytes: int) -> WorkerPhases:
        """The figures the worker reports in its heartbeats, what MLX holds included
        (`prefix_kv_bytes`: what the runner keeps of gathered prefix K/V)."""
        return WorkerPhases(
            **memory_mb(prefix_kv_bytes),
            decode_tick_p50_ms=1000 * percentile(self.decode_times, 0.5),
            decode_tick_p95_ms=1000 * percentile(self.decode_times, 0.95),
            decode_spikes=self.spikes,
            decode_spike_seconds=self.spike_seconds,
            decode_batch_mean=_mean(self.decode_batches),
            decode_blocks_mean=_mean(self.decode_blocks),
            decode_kv_bytes_mean=_mean(self.decode_kv_bytes),
            decode_kv_shared_bytes_mean=_mean(self.decode_kv_shared_bytes),
            prefill_chunk_p50_ms=1000 * percentile(self.prefill_times, 0.5),
            kv_write_ms_p50=1000 * percentile(self.layer_write_s, 0.5),
            attention_ms_p50=1000 * percentile(self.layer_attend_s, 0.5),
            decode_tokens=self.decode_tokens,
            prefill_tokens=self.prefill_tokens,
            preemptions=self.preemptions,
            spec_drafted=self.drafted,
            spec_accepted=self.draft_accepted,
            folded_tokens=self.folded_tokens,
            folded_forwards=self.folded_forwards,
            prefill_forwards=self.prefill_forwards,
            prefill_padding_tokens=self.prefill_padding,
            busy_s=round(self.busy_s, 3),
        )


def memory_mb(prefix_kv_bytes: int) -> dict[str, float]:
    """What MLX holds, in MB: arrays alive, its buffer cache, and of the arrays the kept prefix
    K/V (worker/attention/prefix_kv.py), as WorkerPhases fields."""
    mb = 1 << 20
    return {
        "mlx_active_mb": round(mx.get_active_memory() / mb, 1),
        "mlx_cache_mb": round(mx.get_cache_memory() / mb, 1),
        "prefix_kv_mb": round(prefix_kv_bytes / mb, 1),
    }


def _mean(values) -> float:
    return sum(values) / len(values) if values else 0.0


class KVAudit:
    """The pool and prefix cache checked for consistency now and then while the engine is idle
    (a walk of the tree: milliseconds for thousands of blocks), so a long run shows that its
    KV bookkeeping held: counts in every heartbeat, the first failure in the log."""

    EVERY_S = 10.0

    def __init__(self, check, clock=time.monotonic):
        self.check, self.clock = check, clock
        self.checks = self.failures = 0
        self.last_error = ""
        self._at = clock()

    def maybe(self, busy: bool) -> None:
        if busy or self.clock() - self._at < self.EVERY_S:
            return
        self._at = self.clock()
        self.checks += 1
        try:
            self.check()
        except Exception as exc:  # any broken invariant: count it, say it, keep serving
            self.failures += 1
            if not self.last_error:
                log.error("KV integrity check failed: %s", exc)
            self.last_error = str(exc)


class EngineLoad(NamedTuple):
    """Queue and KV figures, as the heartbeat carries them (`total_blocks` less scratch), all
    in pool units: on a window model a block takes a unit and its window pages more units, so
    a figure in blocks beside a total in units would show an idle worker holding memory."""

    running: int
    waiting: int
    free_blocks: int
    total_blocks: int
    cached_blocks: int
    hit_tokens: int
    prompt_tokens: int
    evictable_blocks: int
    evicted_blocks: int
    kv_checks: int = 0
    kv_check_failures: int = 0
    cached_partial_blocks: int = 0  # partial tails beside the tree (cached_blocks: full only)
    state_snapshots: int = 0  # hybrid models: snapshots of the recurrent states kept
    state_snapshot_bytes: int = 0
    state_slots: int = 0  # ...the state pool's slots, and the reply-end copies kept in them
    state_kept: int = 0
    pinned_blocks: int = 0  # blocks cache pins keep from LRU (worker/kv/pins.py), and pins
    pins: int = 0

    @classmethod
    def of(cls, scheduler: Scheduler, kv: KVFigures, audit: KVAudit | None = None) -> EngineLoad:
        """`kv`: the KV manager's figures."""
        return cls(
            running=len(scheduler.running),
            waiting=len(scheduler.waiting),
            free_blocks=kv.free_units,  # units free or spare, as `total_blocks` counts units
            total_blocks=kv.total_blocks - 1,  # less the scratch block
            cached_blocks=kv.cached_blocks,
            hit_tokens=kv.hit_tokens,
            prompt_tokens=kv.hit_tokens + kv.miss_tokens,
            evictable_blocks=kv.evictable_blocks,
            evicted_blocks=kv.evicted_blocks,
            kv_checks=audit.checks if audit else 0,
            kv_check_failures=audit.failures if audit else 0,
            cached_partial_blocks=kv.cached_partial_units,
            pinned_blocks=kv.pinned_blocks,
            pins=kv.pins,
            **_snapshots(scheduler),
        )


def _snapshots(scheduler: Scheduler) -> dict:
    pool = getattr(scheduler.states, "pool", None)
    if pool is None:
        return {}
    return {
        "state_snapshots": len(pool.snapshots),
        "state_snapshot_bytes": pool.snapshot_bytes,
        "state_slots": pool.num_slots,
        "state_kept": pool.kept,
    }


def engine_stats(
    load: EngineLoad,
    kv: KVFigures,
    held_blocks: int,
    disk_blocks: int,
    steps: EngineStats,
) -> dict:
    """`Engine.stats()`: the load, the KV tiers' figures (the KV manager's, and its counts of
    held and disk blocks) and the step summary in one dict."""
    return {
        "running": load.running,
        "waiting": load.waiting,
        "total_blocks": kv.total_blocks,
        "free_blocks": load.free_blocks,
        "cached_blocks": load.cached_blocks,
        "cached_partial_blocks": load.cached_partial_blocks,
        "evictable_blocks": load.evictable_blocks,
        "held_blocks": held_blocks,
        "cache_hit_tokens": kv.hit_tokens,
        "disk_hit_tokens": kv.disk_hit_tokens,
        "disk_blocks": disk_blocks,
        "cache_miss_tokens": kv.miss_tokens,
        "partial_hit_tokens": kv.partial_hit_tokens,  # copied partial blocks (CoW)
        "pinned_blocks": load.pinned_blocks,
        "pins": load.pins,
        **steps.summary(),
    }
