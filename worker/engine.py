"""The engine a worker runs: requests in, token deltas out (the protocol's own TokenDelta).

engine = Engine.from_path(model_dir, EngineConfig())
engine.add_request("r1", token_ids, SamplingParams(max_tokens=32))
while engine.has_work():
    for delta in engine.step(): ...
"""

from __future__ import annotations

import itertools
import logging
import random
import time
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from shared.kv_events import KVEvent
from shared.protocol import TokenDelta, Usage
from shared.sampling import InvalidRequest, SamplingParams
from worker.config import EngineConfig
from worker.engine_stats import EngineStats
from worker.kv.block_pool import BlockPool
from worker.kv.memory import memory_budget_bytes, num_blocks_for_budget
from worker.kv.radix_cache import RadixCache
from worker.model_runner import ModelRunner, probe_shape
from worker.sampler import sample
from worker.scheduler import PrefillChunk, Scheduler
from worker.sequence import Sequence, Status

log = logging.getLogger(__name__)


@dataclass
class _InFlight:
    seqs: list[Sequence]
    tokens: mx.array  # (B,) sampled, maybe not computed yet
    logprobs: mx.array | None
    started: float


# Most context slots that folded prefill rows may gather in one step (see Engine._run).
FOLD_CONTEXT_SLOTS = 16384


class EngineOverloaded(RuntimeError):
    """The waiting queue is full; try again later."""


class Engine:
    def __init__(
        self, model: nn.Module, config: EngineConfig | None = None, max_context: int = 4096
    ):
        self.config = config or EngineConfig()
        self.config.validate()
        self.model, self.max_context = model, max_context
        self.shape = probe_shape(model)
        self.pool = BlockPool(
            self._num_blocks(),
            self.config.block_size,
            num_layers=self.shape.num_layers,
            num_kv_heads=self.shape.num_kv_heads,
            head_dim=self.shape.head_dim,
            dtype=self.shape.kv_dtype,
        )
        self.scratch_block = self.pool.allocate(1)[0]  # padding rows write here
        self._events: list[KVEvent] = []
        self.cache = RadixCache(self.pool, self.config.block_size, on_event=self._events.append)
        self.scheduler = Scheduler(self.pool, self.cache, self.config)
        self.runner = ModelRunner(
            model, self.pool, self.scratch_block, self.config.attention_backend
        )
        self.stats_ = EngineStats()
        self._seqs: dict[str, Sequence] = {}
        self._arrivals = itertools.count()
        self._inflight: _InFlight | None = None  # a decode step queued, its tokens unread
        self._pending_failures: list[TokenDelta] = []
        self._last_resolved = 0.0
        if self.config.warmup:
            self._warmup()

    @classmethod
    def from_path(cls, model_dir: Path, config: EngineConfig | None = None) -> Engine:
        from shared.model_loading import load_model
        from shared.model_store import context_length

        config = config or EngineConfig()
        model, _ = load_model(model_dir, config.compute_dtype)
        return cls(model, config, max_context=context_length(model_dir))

    def _num_blocks(self) -> int:
        c, s = self.config, self.shape
        if c.num_blocks is not None:
            return c.num_blocks
        budget = c.kv_memory_bytes or memory_budget_bytes(c.kv_memory_fraction)
        return num_blocks_for_budget(
            budget, c.block_size, s.num_layers, s.num_kv_heads, s.head_dim, s.kv_dtype
        )

    # ---- requests ----------------------------------------------------------------------

    def add_request(self, request_id: str, token_ids: list[int], sampling: SamplingParams) -> None:
        """Queue a request; raise InvalidRequest (or EngineOverloaded) without side effects."""
        self._validate(request_id, token_ids, sampling)
        if len(self.scheduler.waiting) >= self.config.max_waiting:
            raise EngineOverloaded(f"{len(self.scheduler.waiting)} requests are already waiting")
        seed = sampling.seed if sampling.seed is not None else random.getrandbits(63)
        seq = Sequence(
            request_id=request_id,
            prompt_len=len(token_ids),
            tokens=list(token_ids),
            sampling=sampling,
            arrival=next(self._arrivals),
            rng_key=None if sampling.greedy else mx.random.key(seed),
        )
        self._seqs[request_id] = seq
        self.scheduler.add(seq)

    def _validate(self, request_id: str, token_ids: list[int], sampling: SamplingParams) -> None:
        if not isinstance(request_id, str) or not request_id:
            raise InvalidRequest("request_id must be a non-empty string")
        if request_id in self._seqs:
            raise InvalidRequest(f"request {request_id!r} is already running")
        if not token_ids:
            raise InvalidRequest("the prompt is empty")
        vocab = self.shape.vocab_size
        if any(not isinstance(t, int) or not 0 <= t < vocab for t in token_ids):
            raise InvalidRequest(f"prompt token ids must be integers in [0, {vocab})")
        if len(token_ids) >= self.max_context:
            raise InvalidRequest(
                f"the prompt has {len(token_ids)} tokens; this model's context is {self.max_context} "
                "tokens, and at least one must be left to generate"
            )
        usable = self.pool.num_blocks - 1  # less the scratch block
        if self.pool.blocks_for_tokens(len(token_ids) + 1) > usable:
            raise InvalidRequest(
                f"the prompt needs more KV memory than this worker has ({usable} blocks)"
            )
        sampling.validate()

    def abort(self, request_id: str) -> bool:
        """Stop a request and free its blocks now; False if it is unknown or already done."""
        seq = self._seqs.pop(request_id, None)
        if seq is None:
            return False
        self.scheduler.remove(seq)
        return True

    def has_work(self) -> bool:
        return (
            self.scheduler.has_work() or self._inflight is not None or bool(self._pending_failures)
        )

    def drain_kv_events(self) -> list[KVEvent]:
        events, self._events[:] = list(self._events), []
        return events

    # ---- the step ----------------------------------------------------------------------

    def step(self) -> list[TokenDelta]:
        """Schedule and run one step; return the token deltas it produced.

        Steady decoding is pipelined: a decode step is queued (`mx.async_eval`) with the
        previous step's sampled tokens still on the device as its input, and the host reads
        and hands out the previous step's tokens while it runs. Its deltas come one call later.
        Anything else (admissions, prefill, preemption, a sequence about to hit its limit)
        first settles the step in flight and runs as before.
        """
        if self._inflight is not None and self._can_pipeline():
            return self._decode_pipelined()
        deltas = self._resolve()
        plan = self.scheduler.schedule()
        self.stats_.preemptions += len(plan.preempted)
        if plan.decode and not plan.prefill:
            self._launch_decode(plan.decode, None)
            return deltas
        if plan.decode and self._fold_prefill(plan.prefill):
            start = time.perf_counter()
            deltas += self._run([PrefillChunk(s, 1) for s in plan.decode] + plan.prefill, flat=True)
            elapsed = time.perf_counter() - start
            self.stats_.record_decode(elapsed, len(plan.decode))
            self.stats_.record_prefill(elapsed, sum(c.num_tokens for c in plan.prefill))
            return deltas
        if plan.decode:
            start = time.perf_counter()
            deltas += self._run([PrefillChunk(s, 1) for s in plan.decode])
            self.stats_.record_decode(time.perf_counter() - start, len(plan.decode))
        if plan.prefill:
            start = time.perf_counter()
            deltas += self._run(plan.prefill)
            self.stats_.record_prefill(
                time.perf_counter() - start, sum(c.num_tokens for c in plan.prefill)
            )
        return deltas

    # ---- pipelined decode --------------------------------------------------------------

    def _can_pipeline(self) -> bool:
        """Whether the next step is the in-flight batch decoding once more, safely: nothing to
        admit or prefill, no sequence that the in-flight token could end by length, and room
        for every next slot without preempting."""
        seqs = self._inflight.seqs
        sched = self.scheduler
        if sched.waiting or len(sched.running) != len(seqs):
            return False
        for seq in seqs:
            if seq.status is not Status.RUNNING or seq.num_uncomputed != 0:
                return False
            if (
                seq.num_output + 1 >= seq.sampling.max_tokens
                or len(seq.tokens) + 2 >= self.max_context
            ):
                return False
        return sched.make_room(sum(sched.blocks_needed(s, s.num_computed + 1) for s in seqs))

    def _decode_pipelined(self) -> list[TokenDelta]:
        prev = self._inflight
        for seq in prev.seqs:  # _can_pipeline made room for these
            self.scheduler.grow(seq, seq.num_computed + 1)
        self._launch_decode(prev.seqs, prev.tokens)
        return self._resolve(prev)

    def _launch_decode(self, seqs: list[Sequence], tokens: mx.array | None) -> None:
        """Queue one decode step for `seqs`; its input is `tokens` (device) or their last
        host tokens. Leaves the sampled tokens in flight."""
        start = time.perf_counter()
        rows = [
            ([s.tokens[-1]] if tokens is None else [0], s.num_computed, s.block_ids) for s in seqs
        ]
        try:
            logits = self.runner.forward(rows, tokens)
            result, keys = sample(logits, [s.sampling for s in seqs], [s.rng_key for s in seqs])
            mx.async_eval(result.tokens, *(x for x in (result.logprobs, *keys) if x is not None))
        except Exception as exc:  # building the graph failed: nothing is in flight
            log.exception("decode step failed for %d sequences", len(seqs))
            self._pending_failures += [self._fail(s, f"the model step failed: {exc}") for s in seqs]
            return
        for seq, key in zip(seqs, keys, strict=True):
            seq.rng_key = key
            seq.num_computed += 1
        self._inflight = _InFlight(list(seqs), result.tokens, result.logprobs, start)

    def _resolve(self, inflight: _InFlight | None = None) -> list[TokenDelta]:
        """Read the tokens of the step in flight (or `inflight`) and advance its sequences."""
        deltas, self._pending_failures = self._pending_failures, []
        inflight = inflight or self._inflight
        if inflight is self._inflight:
            self._inflight = None
        if inflight is None:
            return deltas
        try:
            tokens = inflight.tokens.tolist()
            logprobs = inflight.logprobs.tolist() if inflight.logprobs is not None else None
        except Exception as exc:
            log.exception("decode step failed for %d sequences", len(inflight.seqs))
            live = [s for s in inflight.seqs if s.status is Status.RUNNING]
            return deltas + [self._fail(s, f"the model step failed: {exc}") for s in live]
        # a pipelined step starts on the device when the previous one ends, not at its launch
        now = time.perf_counter()
        self.stats_.record_decode(
            now - max(inflight.started, self._last_resolved), len(inflight.seqs)
        )
        self._last_resolved = now
        for i, seq in enumerate(inflight.seqs):
            if seq.status is Status.RUNNING:  # not aborted, nor ended by an earlier token
                deltas.append(self._advance(seq, tokens[i], logprobs[i] if logprobs else None))
        return deltas

    @staticmethod
    def _fold_prefill(prefill: list[PrefillChunk]) -> bool:
        """Whether these prefill chunks are small enough to ride in the decode forward as
        one-token rows (see `_run`): each such row gathers its whole context, so only short
        chunks are worth it."""
        return (
            sum(c.num_tokens * (c.seq.num_computed + c.num_tokens) for c in prefill)
            <= FOLD_CONTEXT_SLOTS
        )

    def _run(self, batch: list[PrefillChunk], flat: bool = False) -> list[TokenDelta]:
        """One forward for `batch`. `flat`: every token is its own one-token row at its own
        position, so decode rows and prefill chunks share one forward (and its matmuls) with
        no padding; each layer writes all rows' K/V before any row attends, so a prompt token
        still sees the tokens before it in the same chunk."""
        rows, last = [], []
        for s, n in batch:
            if flat:
                rows += [
                    (s.tokens[p : p + 1], p, s.block_ids)
                    for p in range(s.num_computed, s.num_computed + n)
                ]
            else:
                rows.append(
                    (s.tokens[s.num_computed : s.num_computed + n], s.num_computed, s.block_ids)
                )
            last.append(len(rows) - 1)
        finishing = [i for i, (s, n) in enumerate(batch) if s.num_computed + n == len(s.tokens)]
        try:
            logits = self.runner.forward(rows)
            sampled = self._sample(
                logits, [last[i] for i in finishing], [batch[i].seq for i in finishing]
            )
        except Exception as exc:  # a failed forward must not take the other requests down
            log.exception("forward pass failed for %d sequences", len(batch))
            return [self._fail(s, f"the model step failed: {exc}") for s, _ in batch]
        for seq, n in batch:
            seq.num_computed += n
            if seq.num_computed >= seq.prompt_len and seq.inserted_tokens < seq.prompt_len:
                self.scheduler.cache_computed(seq)  # let waiting requests share this prompt
        return [
            self._advance(batch[i].seq, tok, lp)
            for i, tok, lp in zip(finishing, *sampled, strict=True)
        ]

    def _sample(
        self, logits: mx.array, rows: list[int], seqs: list[Sequence]
    ) -> tuple[list[int], list[float | None]]:
        """Sample the next token of `seqs` from `logits[rows]`; always runs the forward."""
        if not seqs:
            mx.eval(logits)  # runs the forward, so the K/V writes land in the pool
            return [], []
        if len(rows) != logits.shape[0]:
            logits = logits[mx.array(rows, dtype=mx.int32)]
        result, keys = sample(logits, [s.sampling for s in seqs], [s.rng_key for s in seqs])
        mx.eval(logits, result.tokens, *(k for k in keys if k is not None))
        for seq, key in zip(seqs, keys, strict=True):
            seq.rng_key = key
        logprobs = result.logprobs.tolist() if result.logprobs is not None else [None] * len(seqs)
        return result.tokens.tolist(), logprobs

    def _advance(self, seq: Sequence, token: int, logprob: float | None) -> TokenDelta:
        seq.tokens.append(token)
        if seq.sampling.logprobs and logprob is not None:
            seq.logprobs.append(logprob)
        p = seq.sampling
        if token in p.stop_token_ids:
            return self._finish(seq, "stop", [])
        if seq.num_output >= p.max_tokens or len(seq.tokens) >= self.max_context:
            return self._finish(seq, "length", [token])
        return TokenDelta(seq.request_id, (token,), logprobs=(logprob,) if p.logprobs else None)

    def _finish(self, seq: Sequence, reason: str, tokens: list[int]) -> TokenDelta:
        self._seqs.pop(seq.request_id, None)
        self.scheduler.remove(seq)
        usage = Usage(seq.prompt_len, seq.num_output, seq.num_cached)
        logprobs = tuple(seq.logprobs[-1:]) if seq.sampling.logprobs and tokens else None
        return TokenDelta(seq.request_id, tuple(tokens), reason, usage, logprobs)

    def _fail(self, seq: Sequence, message: str) -> TokenDelta:
        self._seqs.pop(seq.request_id, None)
        if seq.status is not Status.FINISHED:
            self.scheduler.drop(seq)
        usage = Usage(seq.prompt_len, seq.num_output, seq.num_cached)
        return TokenDelta(seq.request_id, (), "error", usage, error=message)

    # ---- upkeep ------------------------------------------------------------------------

    def _warmup(self) -> None:
        """Run a short request through prefill and decode, then forget it, so the first real
        request pays no one-time costs (allocations, graph construction)."""
        start = time.perf_counter()
        self.add_request(
            "__warmup__", [0] * (self.config.block_size + 3), SamplingParams(max_tokens=3)
        )
        while self.has_work():
            self.step()
        self.cache.reset()
        self._events.clear()
        self.stats_ = EngineStats()
        log.info("warm-up took %.2fs", time.perf_counter() - start)

    def stats(self) -> dict:
        usage = self.pool.usage()
        return {
            "running": len(self.scheduler.running),
            "waiting": len(self.scheduler.waiting),
            "total_blocks": self.pool.num_blocks,
            "free_blocks": self.pool.num_free,
            "cached_blocks": self.cache.cached_blocks,
            "evictable_blocks": self.cache.evictable_blocks,
            "held_blocks": usage.held,
            "cache_hit_tokens": self.cache.hit_tokens,
            "cache_miss_tokens": self.cache.miss_tokens,
            **self.stats_.summary(),
        }

    def check_integrity(self) -> None:
        """Raise unless the pool and the prefix cache are consistent (cheap enough when idle)."""
        self.pool.check_integrity()
        self.cache.check_integrity()
