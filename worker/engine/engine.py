"""The engine a worker runs: requests in, token deltas out (the protocol's own TokenDelta):
`Engine.from_path(dir, EngineConfig())`, `add_request(...)`, then `step()` while `has_work()`."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import mlx.core as mx
import mlx.nn as nn

from shared.kv_events import BlockRemoved
from worker.attention import select_backend
from worker.config import EngineConfig
from worker.engine import startup
from worker.engine.caches import KVManager
from worker.engine.caches import states as states_mod  # hybrid models' recurrent states
from worker.engine.kv_event_log import KVEventLog
from worker.engine.outputs import OutputBuilder
from worker.engine.requests import RequestIntake
from worker.engine.scheduler import Scheduler
from worker.engine.sequence import Sequence, Status
from worker.engine.speculative import accepted_prefix
from worker.engine.stats import EngineLoad, EngineStats, KVAudit, engine_stats
from worker.engine.step_kind import (
    ForwardCosts,
    StepPlan,
    forward_costs,
    forward_input,
    still_running,
)
from worker.kv.radix_cache import RadixCache
from worker.runner.grammar import GrammarCompiler
from worker.runner.model_runner import LayerTimes, ModelRunner
from worker.runner.model_support import ModelShape, UnsupportedModel, probe_shape
from worker.runner.plan import Forward, StepKind

if TYPE_CHECKING:
    from shared.kv_events import KVEvent
    from shared.protocol import CachePin, ImageInput, TokenDelta, WorkerPhases
    from shared.sampling import SamplingParams
    from worker.runner.sampler import TokenLogprob, TokenLogprobs
    from worker.tracing import WorkerTracing
    from worker.vision.encoder import PreparedImages

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
    (the scheduler advances or finishes sequences), token deltas out.

    `Engine(...)` only assembles (pool, cache, scheduler, runner: no forward pass);
    `Engine.create(...)` or `Engine.from_path(...)` also checks the model and warms it up
    (`worker.engine.startup`), which is what a server wants."""

    def __init__(
        self,
        model: nn.Module,
        shape: ModelShape,
        config: EngineConfig | None = None,
        max_context: int = 4096,
        grammars: GrammarCompiler | None = None,
        make_runner: Callable[..., ModelRunner] = ModelRunner,
        costs: ForwardCosts | None = None,
    ):
        """`shape`: the model's, from `probe_shape(model)` (a forward pass, so the builder's).
        `costs`: the prices the scheduler's fold rule weighs (None: the model's own,
        `forward_costs`; tests of a tiny model pass the default model's).
        `make_runner(model, pool, scratch_block, backend, layout, states, kept_prefix_bytes)`:
        the runner the steps go through, made with its cache layout (`ModelShape.layout`), a
        hybrid model's state pool and the kept prefixes' share of the memory plan; a
        tensor-parallel group's leader passes one that first broadcasts the plan to the other
        ranks (`worker.tp.runner`)."""
        self.config = config or EngineConfig()
        self.grammars = grammars  # for grammar-constrained requests; None refuses them
        self.config.validate()
        self.model, self.max_context, self.shape = model, max_context, shape
        self.config, num_blocks, self.memory = startup.size_memory(self.config, shape, model)
        self.pool = startup.make_pool(self.config, shape, num_blocks)
        self.kv_events = KVEventLog(self.config.block_size)
        self.states = states_mod.make_states(self.config, shape, self.kv_events.record)
        self.cache = RadixCache(self.pool, self.config.block_size, on_event=self._kv_event)
        config, pool = self.config, self.pool

        def open_disk(refused: str | None):
            return startup.open_disk_tier(config, model, pool, refused)

        self.kv = KVManager(self.pool, self.cache, self.config, self.states, open_disk)
        self.disk = self.kv.disk  # the KV manager's tier (None: off), as tests and benches read it
        self.scratch_block = self.kv.take_scratch_block()  # padding rows write here
        pad_states = self.states is None or states_mod.honours_padding(model)
        self.scheduler = Scheduler(
            self.kv,
            self.config,
            max_context,
            costs or forward_costs(model, self.pool),
            pad_states=pad_states,
        )
        self.backend, self.attention_report = select_backend(
            self.config.attention_backend, shape, self.config.block_size, self.pool
        )
        states = self.states.pool if self.states is not None else None
        self.runner = make_runner(
            model,
            self.pool,
            self.scratch_block,
            self.backend,
            shape.layout(),
            states,
            startup.kept_prefix_bytes(self.memory),
        )
        self._refuse_what_the_caches_cannot()
        self.outputs = OutputBuilder()
        self.intake = RequestIntake(self.config, shape.vocab_size, max_context, self.kv, grammars)
        self.stats_, self.kv_audit = EngineStats(), KVAudit(self.check_integrity)
        self._inflight: _InFlight | None = None  # a decode step queued, its tokens unread
        self._pending_failures: list[TokenDelta] = []
        self._last_resolved, self._steps = 0.0, 0
        self.tracing: WorkerTracing | None = None  # spans of prefill chunks (worker/tracing.py)

    @classmethod
    def create(
        cls,
        model: nn.Module,
        config: EngineConfig | None = None,
        max_context: int = 4096,
        grammars: GrammarCompiler | None = None,
        make_runner: Callable[..., ModelRunner] = ModelRunner,
        costs: ForwardCosts | None = None,
    ) -> Engine:
        """An engine ready to serve: probed, assembled, checked and warmed up (unless not)."""
        shape = probe_shape(model)
        engine = cls(model, shape, config, max_context, grammars, make_runner, costs)
        engine._check_and_warm_up()
        return engine

    @classmethod
    def from_path(
        cls, model_dir: Path, config: EngineConfig | None = None, costs: ForwardCosts | None = None
    ) -> Engine:
        from shared.models.loading import load_model
        from shared.models.store import context_length

        config = config or EngineConfig()
        model, tokenizer = load_model(model_dir, config.compute_dtype)
        grammars = GrammarCompiler.from_hf_tokenizer(tokenizer, probe_shape(model).vocab_size)
        engine = cls.create(
            model, config, max_context=context_length(model_dir), grammars=grammars, costs=costs
        )
        return engine.open_vision(model_dir, tokenizer)

    def _check_and_warm_up(self) -> None:
        """The forwards after assembly (`worker.engine.startup.checks`): MLX's memory limits
        set to the budget first (when the engine sized itself from one), the model checked and
        each layer's mode decided, an untested architecture compared with mlx-lm, a warm-up
        (unless `config.warmup` is off); then the disk tier's blocks announced."""
        if self.memory is not None:
            startup.apply_memory_plan(self.memory)
        states = self.states.pool if self.states is not None else None
        gathered = startup.check_model(
            self.runner, self.model, self.shape, self.scratch_block, states
        )
        kv_groups = startup.kv_groups(self.pool, self.shape.kinds(), gathered)
        self.attention_report = replace(self.attention_report, kv_groups=kv_groups)
        startup.verify_greedy(self, self.model, self.shape.vocab_size, self.config.block_size)
        if self.config.warmup:
            startup.warm_up(self, self.config.block_size)
            self.stats_ = EngineStats()  # the warm-up's steps are not the worker's
        self.kv_events.stored(self.kv.stored_on_disk())

    def _refuse_what_the_caches_cannot(self) -> None:
        """What the KV manager decided the model's caches cannot do, applied: a tensor-parallel
        group refused, speculative decoding turned off (and, for a hybrid model, said that the
        disk tier and peer transfers are off)."""
        if self.runner.tensor_parallel and (why := self.kv.cannot("tp")) is not None:
            raise UnsupportedModel(
                f"tensor-parallel groups do not serve this model: {why}; serve this one with "
                "one worker per model replica"
            )
        if self.config.speculative != "off" and (why := self.kv.cannot("drafts")) is not None:
            log.info("speculative decoding off: %s", why)
            self.config = replace(self.config, speculative="off")
        if self.states is not None:
            log.info("KV disk tier and peer transfers off: they carry no recurrent states yet")

    def open_vision(self, model_dir: Path, tokenizer) -> Engine:
        """A vision model's image side (worker/vision), on the intake; or, on the intake, why
        its images are refused (no `vision` extra, a family not served). Returns the engine."""
        from shared.models.loading import resolve_compute_dtype
        from shared.models.vision import has_vision, read_config
        from worker.vision.encoder import open_vision as open_encoder

        if not has_vision(read_config(model_dir)):  # a text model never touches the vision code
            return self
        name = resolve_compute_dtype(self.config.compute_dtype)
        dtype = getattr(mx, name) if name != "quantized" else None
        trunk = self.runner.trunk
        encoder, note = open_encoder(
            model_dir, trunk.embedding, dtype, tokenizer.convert_ids_to_tokens
        )
        if encoder is not None and encoder.mrope is not None:  # Qwen-VL: 3-D image positions
            from worker.vision.mrope import install_mrope

            install_mrope(trunk.module, *encoder.mrope)
        if encoder is not None and encoder.deepstack_layers:  # Qwen3-VL
            from worker.vision.deepstack import install_deepstack

            install_deepstack(trunk.module, encoder.deepstack_layers)
        self.intake.vision = encoder
        self.intake.vision_note = note or self.intake.vision_note
        return self

    # ---- what the worker loop reads ----------------------------------------------------

    @property
    def block_size(self) -> int:
        return self.kv.block_size

    @property
    def kv_capacity_blocks(self) -> int:
        """The units requests can use: the pool less the scratch block's (and its pages)."""
        return self.kv.usable_units(self.scratch_block)

    def load(self) -> EngineLoad:
        """Queue and KV figures for the heartbeat (counters; now and then, idle, the KV audit)."""
        self.kv.pins.expire()  # every loop turn, idle ones too: due pins released
        self.kv_audit.maybe(busy=self.has_work())
        load = EngineLoad.of(self.scheduler, self.kv.figures(), self.kv_audit)
        return load._replace(total_blocks=self.kv_capacity_blocks)

    def phases(self) -> WorkerPhases:
        """The phase metrics (percentiles over a window: not for every step) and memory."""
        return self.stats_.phases(self.runner.prefix_kv.nbytes)

    # ---- requests ----------------------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        token_ids: list[int],
        sampling: SamplingParams,
        n: int = 1,
        images: tuple[ImageInput, ...] = (),
        prepared: PreparedImages | None = None,
        priority: int = 0,
        pins: tuple[CachePin, ...] = (),
    ) -> None:
        """Queue a request for `n` choices (choice i's deltas carry index i), its cache `pins`,
        its `images` (`prepared` by `intake.prepare` on any thread, else here); InvalidRequest."""
        self.intake.check(request_id, token_ids, sampling, n, self.outputs.is_open, images, pins)
        if len(self.scheduler.waiting) >= self.config.max_waiting:
            raise EngineOverloaded(f"{len(self.scheduler.waiting)} requests are already waiting")
        seq = self.intake.sequence(request_id, token_ids, sampling, n, images, prepared, pins)
        seq.priority = priority  # its class: shared.protocol INTERACTIVE or BATCH
        self.outputs.open(request_id, n)
        self.scheduler.add(seq)

    def abort(self, request_id: str, index: int | None = None) -> bool:
        """Stop a request (or only its choice `index`) and free its blocks now; False if it
        is unknown or already done."""
        if not self.outputs.is_open(request_id):
            return False
        seqs = self.scheduler.sequences_of(request_id)
        if index is not None:
            seqs = [s for s in seqs if s.choice == index]
            if not seqs:
                return False  # done already, or not forked yet (then it runs; it is ignored)
        for seq in seqs:
            self.scheduler.remove(seq)
            self.outputs.close_choice(request_id)
        if index is None:
            self.outputs.forget(request_id)
        return True

    def has_work(self) -> bool:
        return (
            self.scheduler.has_work() or self._inflight is not None or bool(self._pending_failures)
        )

    def hold_s(self) -> float:
        """Seconds `step` would do nothing: batch work waiting for an interactive request
        likely on its way (worker/engine/batch_yield.py); 0 when a step has something to do."""
        if self._inflight is not None or self._pending_failures:
            return 0.0
        return self.scheduler.hold_s()

    def drain_kv_events(self) -> list[KVEvent]:
        return self.kv_events.drain(self.kv.dropped_from_disk())

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
        for part in map(still_running, plan.split()):
            if part.kind is not StepKind.IDLE:
                deltas += self._execute(part)
        return deltas

    def _launch(self, plan: StepPlan, device_tokens: mx.array | None) -> None:
        """Queue the DECODE `plan` on the device; its tokens stay in flight until resolved.
        `device_tokens`: the inputs, the in-flight step's samples (else the host tokens)."""
        start = time.perf_counter()
        times = self._profile_sample()
        try:
            out = self.runner.run(self._input(plan), device_tokens, times)
            mx.async_eval(*out.outputs)
        except Exception as exc:  # building the graph failed: nothing is in flight
            self._pending_failures += self.fail_step(plan.decode, exc)
            return
        for seq in plan.decode:
            self.scheduler.computed(seq, 1, in_flight=True)  # cached once read (`_resolve`)
        self.stats_.record_decode_shape(plan.decode, self.block_size, self.pool.bytes_per_block)
        if times is not None:
            self.stats_.record_layer_times(times)
        seqs = plan.sequences()
        self._inflight = _InFlight([seqs[k] for k in out.requests], out.tokens, out.logprobs, start)

    def _input(self, plan: StepPlan) -> Forward:
        """What the runner is handed for `plan` (one forward): plain data, the requests ended
        since its last forward (it drops their rng keys) and the blocks copied on write."""
        return forward_input(plan, self.scheduler.take_finished(), self.kv.take_copies())

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
            live = [s for s in inflight.seqs if s.status is Status.RUNNING]
            return deltas + self.fail_step(live, exc)
        for seq in inflight.seqs:  # its writes are done: its blocks may enter the cache
            seq.num_in_flight -= 1
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
        failed = self.intake.encode_images(plan, self.fail_step)
        if failed:
            plan = still_running(plan)
            if plan.kind is StepKind.IDLE:
                return failed
        return failed + self._forward(plan)

    def _forward(self, plan: StepPlan) -> list[TokenDelta]:
        start = time.perf_counter()
        times = self._profile_sample()
        try:
            out = self.runner.run(self._input(plan), None, times)
            mx.eval(*out.outputs)
            tokens = out.tokens.tolist() if out.tokens is not None else []
            logprobs = out.logprobs.tolist() if out.logprobs is not None else [None] * len(tokens)
            scored = out.prompt.tolist() if out.prompt is not None else []
        except Exception as exc:  # a failed forward must not take the other requests down
            return self.fail_step(plan.decode + [c.seq for c in plan.prefill], exc)
        elapsed = time.perf_counter() - start
        if plan.decode:
            self.stats_.record_decode(elapsed, len(plan.decode))
            self.stats_.record_decode_shape(plan.decode, self.block_size, self.pool.bytes_per_block)
        if plan.prefill:
            self.stats_.record_prefill(elapsed, plan)
        if times is not None:
            self.stats_.record_layer_times(times)
        if self.tracing is not None and plan.prefill:
            chunks = [(s.request_id, n, s.num_computed) for s, n in plan.prefill]
            self.tracing.prefill(chunks, start, elapsed)
        for seq, n in plan.prefill:
            self.scheduler.computed(seq, n)
        seqs = plan.sequences()
        self.outputs.record_prompt([(seqs[key], *rest) for key, *rest in scored])
        decoding = {id(s) for s in plan.decode}
        deltas, at = [], 0
        for seq, count in zip([seqs[k] for k in out.requests], out.counts, strict=True):
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

    def _advance(self, seq: Sequence, tokens: list[int], logprobs: list) -> TokenDelta:
        """`seq` produced `tokens` (one, or several when drafts were accepted): the scheduler
        appends them (and ends it on a stop or a limit); its delta. With max_tokens 0 it ends
        here ("length"), its prompt scored, nothing generated."""
        emitted: list[int] = []
        entries: list[TokenLogprob | None] = []
        reason = None
        if seq.sampling.max_tokens == 0:
            tokens, logprobs, reason = [], [], "length"
            self.scheduler.remove(seq)
        for token, logprob in zip(tokens, logprobs, strict=True):
            reason = self.scheduler.append_token(seq, token, logprob and logprob.logprob)
            # a stop token ends the text, unshown; a token that completed the grammar is shown
            if token not in seq.sampling.stop_token_ids:
                emitted.append(token)
                entries.append(logprob)
            if reason is not None:
                break
        return self.outputs.delta(seq, emitted, entries, reason, len(tokens))

    def fail(self, seq: Sequence, message: str) -> TokenDelta:
        """End `seq`'s whole request with an error (every choice of it: one failed)."""
        self.outputs.forget(seq.request_id)
        for other in [seq, *self.scheduler.sequences_of(seq.request_id)]:
            if other.status is not Status.FINISHED:
                self.scheduler.drop(other)
        return self.outputs.error(seq, message)

    def fail_step(
        self, seqs: list[Sequence], exc: Exception, what: str = "the model step failed"
    ) -> list[TokenDelta]:
        """End the requests of a failed step (or of the part of it that failed: `what`) with
        an error, their blocks freed; the others go on."""
        return self.fail_all(seqs, self.outputs.failure(seqs, exc, what))

    def fail_all(self, seqs: list[Sequence], message: str) -> list[TokenDelta]:
        """End the requests of `seqs` with an error: one delta per request still open (n > 1:
        its choices end together)."""
        seen: set[str] = set()
        live = [s for s in seqs if not (s.request_id in seen or seen.add(s.request_id))]
        return [self.fail(s, message) for s in live if self.outputs.is_open(s.request_id)]

    def _profile_sample(self) -> LayerTimes | None:
        """Every `PROFILE_EVERY`-th step is profiled layer by layer (write and attention
        time); the evaluation it forces costs that one step, not the others."""
        self._steps += 1
        return LayerTimes() if self._steps % PROFILE_EVERY == 0 else None

    # ---- upkeep ------------------------------------------------------------------------

    def _kv_event(self, event: KVEvent) -> None:
        """The radix cache's events: to the router less removals of blocks the disk tier
        keeps; to the state pool all (blocks that leave the cache take their snapshots)."""
        heard = self.kv.left_the_worker(event) if isinstance(event, BlockRemoved) else event
        if heard is not None:
            self.kv_events.record(heard)
        if self.states is not None:
            self.states.on_event(event)

    def forget_cache(self) -> None:
        """Drop the prefix cache and the KV events not sent yet: after the start-up checks'
        internal requests, which the router must never hear of."""
        self.kv.reset()
        self.kv_events.clear()

    def stats(self) -> dict:
        kv = self.kv
        return engine_stats(
            self.load(), kv.figures(), kv.held_blocks(), kv.disk_blocks(), self.stats_
        )

    def check_integrity(self) -> None:
        """Raise unless the pool and the prefix cache are consistent (cheap enough when idle)."""
        running = [s.key for s in self.scheduler.running]
        self.kv.check_integrity(running)  # the pins, a hybrid's state pool, per-sequence records
