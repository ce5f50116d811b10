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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from shared.config.choices import DEFAULT_KV_DISK_DIR
from shared.kv_events import BlockRemoved, BlockStored, KVEvent
from shared.protocol import TokenDelta, Usage
from shared.sampling import InvalidRequest, SamplingParams
from worker.attention.hook import AttentionSinksUnsupported
from worker.attention.select import select_backend
from worker.config import EngineConfig
from worker.engine.scheduler import PrefillChunk, Scheduler, StepKind, StepPlan
from worker.engine.sequence import Sequence, Status
from worker.engine.speculative import DraftState, accepted_prefix
from worker.engine.stats import EngineStats
from worker.kv.block_pool import BlockPool
from worker.kv.disk_store import DiskKVStore
from worker.kv.disk_tier import DiskTier, block_layout, model_fingerprint
from worker.kv.memory import memory_budget_bytes, num_blocks_for_budget
from worker.kv.radix_cache import RadixCache
from worker.runner.grammar import GrammarCompiler
from worker.runner.logits_processors import LogitsState
from worker.runner.model_runner import LayerTimes, ModelRunner
from worker.runner.model_support import (
    COVERED_ARCHITECTURES,
    UnsupportedModel,
    check_seam,
    model_type,
    probe_shape,
    reference_greedy,
    verification_prompt,
)
from worker.runner.sampler import TokenLogprob, TokenLogprobs, delta_logprob_fields

log = logging.getLogger(__name__)

PROFILE_EVERY = 64  # every n-th step is timed layer by layer (phase metrics)


@dataclass
class _InFlight:
    seqs: list[Sequence]
    tokens: mx.array  # (B,) sampled, maybe not computed yet
    logprobs: TokenLogprobs | None
    started: float


class EngineOverloaded(RuntimeError):
    """The waiting queue is full; try again later."""


class Engine:
    """Orchestration: requests in, `schedule()` -> `ModelRunner.run(plan)` -> postprocess
    (the scheduler advances or finishes sequences), token deltas out."""

    def __init__(
        self,
        model: nn.Module,
        config: EngineConfig | None = None,
        max_context: int = 4096,
        grammars: GrammarCompiler | None = None,
        make_runner: Callable[..., ModelRunner] = ModelRunner,
    ):
        """`make_runner(model, pool, scratch_block, backend)`: the runner the steps go
        through; a tensor-parallel group's leader passes one that first broadcasts the plan
        to the other ranks (`worker.tp.runner`)."""
        self.config = config or EngineConfig()
        self.grammars = grammars  # for grammar-constrained requests; None refuses them
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
        self.cache = RadixCache(self.pool, self.config.block_size, on_event=self._on_kv_event)
        self.disk = self._disk_tier()
        self.scheduler = Scheduler(self.pool, self.cache, self.config, max_context, self.disk)
        self.backend, self.attention_report = select_backend(
            self.config.attention_backend, self.shape, self.config.block_size
        )
        self.runner = make_runner(model, self.pool, self.scratch_block, self.backend)
        self.stats_ = EngineStats()
        self._open: dict[str, int] = {}  # request id -> its choices not finished yet
        self._arrivals = itertools.count()
        self._inflight: _InFlight | None = None  # a decode step queued, its tokens unread
        self._pending_failures: list[TokenDelta] = []
        self._last_resolved = 0.0
        self._steps = 0
        self._check_model()
        if self.config.warmup:
            self._warmup()
        if self.disk is not None:
            self._announce_disk_blocks()

    @classmethod
    def from_path(cls, model_dir: Path, config: EngineConfig | None = None) -> Engine:
        from shared.models.loading import load_model
        from shared.models.store import context_length

        config = config or EngineConfig()
        model, tokenizer = load_model(model_dir, config.compute_dtype)
        grammars = GrammarCompiler.from_hf_tokenizer(tokenizer, probe_shape(model).vocab_size)
        return cls(model, config, max_context=context_length(model_dir), grammars=grammars)

    def _num_blocks(self) -> int:
        c, s = self.config, self.shape
        if c.num_blocks is not None:
            return c.num_blocks
        budget = c.kv_memory_bytes or memory_budget_bytes(c.kv_memory_fraction)
        return num_blocks_for_budget(
            budget, c.block_size, s.num_layers, s.num_kv_heads, s.head_dim, s.kv_dtype
        )

    # ---- requests ----------------------------------------------------------------------

    def add_request(
        self, request_id: str, token_ids: list[int], sampling: SamplingParams, n: int = 1
    ) -> None:
        """Queue a request for `n` choices (sampled after one prefill; choice i's deltas carry
        index i); raise InvalidRequest (or EngineOverloaded) without side effects."""
        self._validate(request_id, token_ids, sampling)
        if not isinstance(n, int) or not 1 <= n <= self.config.max_running:
            raise InvalidRequest(f"n must be an integer in [1, {self.config.max_running}]")
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
            seed=seed,
            forks=n - 1,
            logits_state=LogitsState.create(
                sampling, token_ids, self.shape.vocab_size, self.grammars
            ),
            drafting=DraftState() if self._may_draft(sampling, n) else None,
        )
        self._open[request_id] = n
        self.scheduler.add(seq)

    def _may_draft(self, sampling: SamplingParams, n: int) -> bool:
        """Speculative decoding keeps greedy output identical; sampled requests don't draft."""
        # nor do requests with logit processors: their state advances once per step
        return (
            self.config.speculative != "off"
            and sampling.greedy
            and n == 1
            and not sampling.processes_logits
        )

    def _validate(self, request_id: str, token_ids: list[int], sampling: SamplingParams) -> None:
        if not isinstance(request_id, str) or not request_id:
            raise InvalidRequest("request_id must be a non-empty string")
        if request_id in self._open:
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
        sampling.validate(vocab)

    def abort(self, request_id: str, index: int | None = None) -> bool:
        """Stop a request (or only its choice `index`) and free its blocks now; False if it
        is unknown or already done."""
        if request_id not in self._open:
            return False
        seqs = self.scheduler.sequences_of(request_id)
        if index is not None:
            seqs = [s for s in seqs if s.choice == index]
            if not seqs:
                return False  # done already, or not forked yet (then it runs; it is ignored)
        for seq in seqs:
            self.scheduler.remove(seq)
            self._close_choice(request_id)
        if index is None:
            self._open.pop(request_id, None)
        return True

    def has_work(self) -> bool:
        return (
            self.scheduler.has_work() or self._inflight is not None or bool(self._pending_failures)
        )

    def drain_kv_events(self) -> list[KVEvent]:
        if self.disk is not None and (dropped := self.disk.store.drain_removed()):
            self._events.append(BlockRemoved(tuple(dropped)))
        events, self._events[:] = list(self._events), []
        return events

    # ---- the step ----------------------------------------------------------------------

    def step(self) -> list[TokenDelta]:
        """Schedule and run one step; return the token deltas it produced.

        Steady decoding is pipelined: while a decode step is in flight, the next one is
        queued (`mx.async_eval`) with that step's sampled tokens, still on the device, as its
        input, and the host reads and hands out the previous tokens while it runs. Anything
        else (admissions, prefill, preemption, a sequence about to hit its limit) first
        settles the step in flight.
        """
        inflight = self._inflight
        if (
            inflight is not None
            and self.config.pipeline_decode
            and self.scheduler.can_continue_decode(inflight.seqs)
        ):
            self._launch(self.scheduler.continue_decode(inflight.seqs), inflight.tokens)
            return self._resolve(inflight)
        deltas = self._resolve()
        plan = self.scheduler.schedule()
        self.stats_.preemptions += len(plan.preempted)
        if plan.kind is StepKind.DECODE and not any(s.draft for s in plan.decode):
            self._launch(plan, None)
            return deltas
        for part in plan.split():
            if part.kind is not StepKind.IDLE:
                deltas += self._execute(part)
        return deltas

    def _launch(self, plan: StepPlan, device_tokens: mx.array | None) -> None:
        """Queue the DECODE `plan` on the device; its tokens stay in flight until resolved.
        `device_tokens`: the inputs, the in-flight step's samples (else the host tokens)."""
        start = time.perf_counter()
        times = self._profile_sample()
        try:
            out = self.runner.run(plan, device_tokens, times)
            mx.async_eval(*out.outputs)
        except Exception as exc:  # building the graph failed: nothing is in flight
            log.exception("decode step failed for %d sequences", len(plan.decode))
            self._pending_failures += [
                self._fail(s, f"the model step failed: {exc}") for s in plan.decode
            ]
            return
        for seq in plan.decode:
            self.scheduler.computed(seq, 1)
        self.stats_.record_decode_shape(plan.decode, self.pool, self.shape)
        if times is not None:
            self.stats_.record_layer_times(times)
        self._inflight = _InFlight(out.seqs, out.tokens, out.logprobs, start)

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
                lp = logprobs[i] if logprobs else None
                deltas.append(self._advance(seq, [tokens[i]], [lp]))
        return deltas

    def _execute(self, plan: StepPlan) -> list[TokenDelta]:
        """Run the MIXED, DECODE or PREFILL `plan` to completion; its deltas."""
        start = time.perf_counter()
        times = self._profile_sample()
        try:
            out = self.runner.run(plan, None, times)
            mx.eval(*out.outputs)
            tokens = out.tokens.tolist() if out.tokens is not None else []
            logprobs = out.logprobs.tolist() if out.logprobs is not None else [None] * len(tokens)
        except Exception as exc:  # a failed forward must not take the other requests down
            seqs = plan.decode + [c.seq for c in plan.prefill]
            log.exception("forward pass failed for %d sequences", len(seqs))
            return [self._fail(s, f"the model step failed: {exc}") for s in seqs]
        elapsed = time.perf_counter() - start
        if plan.decode:
            self.stats_.record_decode(elapsed, len(plan.decode))
            self.stats_.record_decode_shape(plan.decode, self.pool, self.shape)
        if plan.prefill:
            self.stats_.record_prefill(elapsed, sum(c.num_tokens for c in plan.prefill))
        if times is not None:
            self.stats_.record_layer_times(times)
        for seq, n in plan.prefill:
            self.scheduler.computed(seq, n)
        decoding = {id(s) for s in plan.decode}
        deltas, at = [], 0
        for seq, count in zip(out.seqs, out.counts, strict=True):
            toks, lps = tokens[at : at + count], logprobs[at : at + count]
            at += count
            if seq.draft:  # keep what the model agrees with, and its own next token
                accepted = accepted_prefix(seq.draft, toks)
                seq.drafting.record(len(seq.draft), accepted)
                self.stats_.record_drafts(len(seq.draft), accepted)
                toks, lps = toks[: accepted + 1], lps[: accepted + 1]
                seq.draft = []
            if id(seq) in decoding:  # its input token and the accepted drafts are computed
                self.scheduler.computed(seq, len(toks))
            deltas.append(self._advance(seq, toks, lps))
        return deltas

    def _profile_sample(self) -> LayerTimes | None:
        """Every `PROFILE_EVERY`-th step is profiled layer by layer (write and attention
        time); the evaluation it forces costs that one step, not the others."""
        self._steps += 1
        return LayerTimes() if self._steps % PROFILE_EVERY == 0 else None

    def _advance(self, seq: Sequence, tokens: list[int], logprobs: list) -> TokenDelta:
        """`seq` produced `tokens` (one, or several when drafts were accepted); its delta."""
        emitted: list[int] = []
        entries: list[TokenLogprob | None] = []
        reason = None
        for token, logprob in zip(tokens, logprobs, strict=True):
            reason = self.scheduler.append_token(seq, token, logprob and logprob.logprob)
            # a stop token ends the text, unshown; a token that completed the grammar is shown
            if token not in seq.sampling.stop_token_ids:
                emitted.append(token)
                entries.append(logprob)
            if reason is not None:
                break
        lps = delta_logprob_fields(seq.sampling, entries)
        if reason is None:
            return TokenDelta(seq.request_id, tuple(emitted), index=seq.choice, **lps)
        self._close_choice(seq.request_id)
        usage = Usage(seq.prompt_len, seq.num_output, seq.num_cached)
        return TokenDelta(seq.request_id, tuple(emitted), reason, usage, index=seq.choice, **lps)

    def _fail(self, seq: Sequence, message: str) -> TokenDelta:
        """End `seq`'s whole request with an error (every choice of it: one failed)."""
        self._open.pop(seq.request_id, None)
        for other in [seq, *self.scheduler.sequences_of(seq.request_id)]:
            if other.status is not Status.FINISHED:
                self.scheduler.drop(other)
        usage = Usage(seq.prompt_len, seq.num_output, seq.num_cached)
        return TokenDelta(seq.request_id, (), "error", usage, error=message, index=seq.choice)

    def _close_choice(self, request_id: str) -> None:
        left = self._open.get(request_id, 0) - 1
        if left > 0:
            self._open[request_id] = left
        else:
            self._open.pop(request_id, None)

    # ---- upkeep ------------------------------------------------------------------------

    def _disk_tier(self) -> DiskTier | None:
        """The KV tier on disk, when configured: its files from an earlier run indexed."""
        if self.config.kv_disk_bytes is None:
            return None
        layout = block_layout(self.pool)
        root = Path(self.config.kv_disk_dir or DEFAULT_KV_DISK_DIR).expanduser()
        store = DiskKVStore(
            root, model_fingerprint(self.model, layout), layout, self.config.kv_disk_bytes
        )
        kept = store.scan()
        log.info("KV disk tier at %s: %d blocks from earlier runs", store.dir, kept)
        tier = DiskTier(self.pool, store)
        self.cache.set_evict_listener(tier.save)
        return tier

    def _on_kv_event(self, event: KVEvent) -> None:
        """Blocks evicted to the disk tier are still this worker's: not announced removed."""
        if isinstance(event, BlockRemoved) and self.disk is not None:
            kept = tuple(h for h in event.block_hashes if h not in self.disk.store)
            if not kept:
                return
            event = BlockRemoved(kept)
        self._events.append(event)

    def _announce_disk_blocks(self) -> None:
        """Tell the router what the disk holds (a restarted worker's returning prefixes)."""
        bs = self.config.block_size
        for block in self.disk.store.blocks():
            self._events.append(
                BlockStored(block.block_hash, block.parent_hash, block.token_ids, bs)
            )

    def _check_model(self) -> None:
        """Refuse a model the paged KV would serve wrongly (see `worker.runner.model_support`)."""
        probe = Sequence("__probe__", 1, [0], SamplingParams(max_tokens=1), arrival=-1)
        probe.block_ids = [self.scratch_block]
        plan = StepPlan(StepKind.PREFILL, [], [PrefillChunk(probe, 1)], [])
        try:
            mx.eval(*self.runner.run(plan).outputs)
        except AttentionSinksUnsupported as exc:
            raise UnsupportedModel(f"model type {model_type(self.model)!r}: {exc}") from exc
        check_seam(self.model, self.runner.last_caches)
        self.runner.last_caches = []
        name = model_type(self.model)
        if name not in COVERED_ARCHITECTURES:
            self._verify_greedy(name)

    def _verify_greedy(self, name: str) -> None:
        """For an architecture the tests do not cover: one prompt, greedy, against plain
        mlx-lm; refuse the model unless the tokens match."""
        prompt = verification_prompt(self.shape.vocab_size, self.config.block_size + 5)
        expected = reference_greedy(self.model, prompt, 4)
        got = self._run_alone(prompt, 4)
        if got != expected:
            raise UnsupportedModel(
                f"model type {name!r} is not among the tested architectures "
                f"({', '.join(sorted(COVERED_ARCHITECTURES))}) and its greedy output over the "
                f"paged KV differs from mlx-lm's ({got} vs {expected})"
            )
        log.info("model type %r: paged greedy output matches mlx-lm; serving it", name)

    def _run_alone(self, prompt: list[int], max_tokens: int) -> list[int]:
        """Greedy tokens of one internal request, run to the end; forgets its cache entries."""
        self.add_request("__check__", prompt, SamplingParams(max_tokens=max_tokens))
        tokens: list[int] = []
        while self.has_work():
            for delta in self.step():
                if delta.error:
                    raise UnsupportedModel(f"the load-time check failed: {delta.error}")
                tokens += delta.token_ids
        self.cache.reset()
        self._events.clear()
        return tokens

    def _warmup(self) -> None:
        """Run a short request through prefill and decode, then forget it, so the first real
        request pays no one-time costs (allocations, graph construction)."""
        start = time.perf_counter()
        self._run_alone([0] * (self.config.block_size + 3), 3)
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
            "disk_hit_tokens": self.disk.hit_tokens if self.disk else 0,
            "disk_blocks": len(self.disk.store.blocks()) if self.disk else 0,
            "cache_miss_tokens": self.cache.miss_tokens,
            **self.stats_.summary(),
        }

    def check_integrity(self) -> None:
        """Raise unless the pool and the prefix cache are consistent (cheap enough when idle)."""
        self.pool.check_integrity()
        self.cache.check_integrity()
