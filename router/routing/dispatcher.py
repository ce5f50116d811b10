"""Requests in flight: routing, replies back to their HTTP handlers, abort, fail-over.

Each HTTP request is a Job (router.routing.job). The job is sent to a worker under a wire id `<request_id>#<attempt>`;
when its worker is lost the job is re-sent elsewhere as prompt + tokens generated so far, with
max_tokens reduced, under the next attempt's wire id (late deltas of the old attempt are then
ignored). The handler reads the job's `events` queue and never sees the move. With
disaggregated prefill (router.routing.disagg) a job's first leg goes to a prefill worker.

An embedding model's requests are EmbedJobs in the same registry: sent to the least-loaded
embed worker (an embedding has no prefix to reuse, so load alone decides), answered by one
Embeddings, moved like a generation when their worker is lost.

Replies come up from the cluster's listener, which calls the dispatcher registered for the
model (`listen`); a job's reader stops it with `job.cancel()`, which the dispatcher gave it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from router.routing import disagg
from router.routing.affinity import PrefixAffinity
from router.routing.choose import PULL, choose
from router.routing.job import EmbedJob, batch_room, batch_rows
from router.routing.job import Job as Job  # the handlers import it from here
from shared.config.sections import RouterSection
from shared.protocol import (
    INTERACTIVE,
    Abort,
    CachePin,
    Embed,
    Embeddings,
    ImageInput,
    Message,
    TokenDelta,
    Usage,
)

if TYPE_CHECKING:
    from router.cluster.listener import Cluster
    from router.cluster.registry import WorkerRegistry, WorkerState
    from router.metrics.router_metrics import ModelMetrics
    from router.metrics.tracing import RequestTrace
    from router.routing.policy import Policy
    from router.routing.prefix_index import PrefixIndex
    from shared.sampling import SamplingParams

log = logging.getLogger(__name__)


class NoWorkerAvailable(Exception):
    """No healthy worker to send a request to."""


class Overloaded(Exception):
    """The router holds as many requests as it may."""


class Dispatcher:
    """The jobs of one model: routed to its workers (`model`; None: every worker) by its
    prefix index."""

    def __init__(
        self,
        registry: WorkerRegistry,
        index: PrefixIndex,
        policy: Policy,
        send: Callable[[bytes, Message], None],
        metrics: ModelMetrics,
        max_pending: int,
        max_resubmits: int,
        model: str | None = None,
        pulls: bool = True,
        prefill_timeout_s: float = 60.0,
        prefill_min_tokens: int = 0,
        batch_yield_s: float = RouterSection.batch_yield_s,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.model = model
        self._pulls = pulls  # the fleet cache: workers may pull prefixes from peers
        self._prefill_timeout_s = prefill_timeout_s  # disaggregated prefill's first leg...
        self._prefill_min_tokens = prefill_min_tokens  # ...taken by prompts this uncached
        self._registry = registry
        self._index = index
        self._policy = policy
        self._send = send
        self._metrics = metrics
        self._max_pending = max_pending
        self._max_resubmits = max_resubmits
        self._jobs: dict[str, Job | EmbedJob] = {}  # by wire id: the one registry in flight
        self._affinity = PrefixAffinity()
        # batch lines yield to live traffic: a worker whose last interactive job ended less
        # than batch_yield_s ago (by `clock`) keeps the small batch bound (job.batch_room)
        self._batch_yield_s = batch_yield_s
        self._clock = clock
        self._interactive_ended: dict[str, float] = {}  # by worker id

    @property
    def num_pending(self) -> int:
        return len(self._jobs)

    def listen(self, cluster: Cluster) -> None:
        """Take the replies of this model's workers, and hear when one is lost."""
        if self.model is None:
            raise ValueError("a dispatcher of every worker listens to no one model")
        cluster.subscribe(self.model, self)

    def start(
        self,
        request_id: str,
        prompt_ids: Sequence[int],
        sampling: SamplingParams,
        n: int = 1,
        cache_key: str | None = None,
        trace: RequestTrace | None = None,
        images: tuple[ImageInput, ...] = (),
        priority: int = INTERACTIVE,
        per_worker: int = 0,
        pins: tuple[CachePin, ...] = (),
    ) -> Job:
        """Route a new job and send it; Overloaded or NoWorkerAvailable if it cannot be.
        With n > 1 the handler reads each choice from `job.choices`."""
        if len(self._jobs) >= self._max_pending:
            raise Overloaded
        job = Job(request_id, tuple(prompt_ids), sampling, n=n, cache_key=cache_key, trace=trace)
        job.images, job.priority, job.per_worker = images, priority, per_worker
        job.pins, job.on_cancel = pins, self.cancel
        if n > 1:
            job.choices = [
                Job(request_id, job.prompt_ids, sampling, parent=job, index=i) for i in range(n)
            ]
            for choice in job.choices:
                choice.on_cancel = self.cancel
        self._route(job)
        return job

    def start_embed(
        self, request_id: str, inputs: Sequence[Sequence[int]], dimensions: int = 0
    ) -> EmbedJob:
        """Send a new embedding job; Overloaded or NoWorkerAvailable if it cannot be sent.
        The handler awaits `job.future` and never sees a move."""
        if len(self._jobs) >= self._max_pending:
            raise Overloaded
        job = EmbedJob(request_id, tuple(tuple(ids) for ids in inputs), dimensions)
        job.on_cancel = self.cancel
        self._route_embed(job)
        return job

    def on_delta(self, worker: WorkerState, delta: TokenDelta) -> None:
        job = self._jobs.get(delta.request_id)
        if not isinstance(job, Job) or job.worker_id != worker.worker_id:
            return  # a late delta of an attempt that was aborted or moved
        if job.prefilling:
            if delta.finish_reason is not None:
                ok = delta.finish_reason == disagg.PREFILLED
                if not ok:
                    log.warning("prefill of %s failed: %s", job.request_id, delta.error)
                self._prefilled(job, worker if ok else None)
            return
        self._time_tokens(job, len(delta.token_ids))
        if job.choices:
            self._on_choice_delta(worker, job, delta)
            return
        job.generated.extend(delta.token_ids)
        if delta.usage is not None:
            job.cached_tokens = min(delta.usage.cached_tokens, len(job.prompt_ids))
        if delta.finish_reason is not None:
            self._untrack(job)
            job.finished = True
            _credit(worker, delta)
            self._metrics.request_finished(delta.finish_reason, time.perf_counter() - job.sent_at)
        job.events.put_nowait(delta)

    def _time_tokens(self, job: Job, count: int) -> None:
        """TTFT and inter-token latency as the router sees them, streamed or not (for n > 1,
        of the request's deltas, whichever choice they carry)."""
        if count == 0:
            return
        now = time.perf_counter()
        if job.last_token_at is None:
            self._metrics.first_token(now - job.sent_at)
            count -= 1  # the first token has no interval before it
        if count:
            # tokens that came with the first share its arrival: intervals of 0
            self._metrics.output_tokens(now - (job.last_token_at or now), count)
        job.last_token_at = now

    def _on_choice_delta(self, worker: WorkerState, job: Job, delta: TokenDelta) -> None:
        if not 0 <= delta.index < len(job.choices):
            return
        choice = job.choices[delta.index]
        if delta.finish_reason in ("error", "abort"):  # the whole request ended
            for c in job.choices:
                if not c.finished:
                    c.finished = True
                    c.events.put_nowait(delta)
            self._untrack(job)
            job.finished = True
            return
        if choice.finished:
            return  # cancelled here (a stop string): its late tokens are not wanted
        choice.generated.extend(delta.token_ids)
        if delta.usage is not None:
            job.cached_tokens = min(delta.usage.cached_tokens, len(job.prompt_ids))
            choice.cached_tokens = job.cached_tokens
        if delta.finish_reason is not None:
            choice.finished = True
        choice.events.put_nowait(delta)
        self._finish_if_done(job, worker)

    def _finish_if_done(self, job: Job, worker: WorkerState | None) -> None:
        if job.finished or not all(c.finished for c in job.choices):
            return
        self._untrack(job)
        job.finished = True
        if worker is not None:
            usage = Usage(len(job.prompt_ids), job.completion_tokens, job.cached_tokens)
            _credit(worker, TokenDelta(job.wire_id, (), "stop", usage))
            self._metrics.request_finished("stop", time.perf_counter() - job.sent_at)

    def on_embeddings(self, worker: WorkerState, msg: Embeddings) -> None:
        job = self._jobs.get(msg.request_id)
        if not isinstance(job, EmbedJob) or job.worker_id != worker.worker_id:
            return  # a late answer of an attempt that was moved or cancelled
        self._untrack(job)
        if msg.error is None and len(msg.vectors) != len(job.inputs):
            msg = Embeddings(msg.request_id, error="the worker answered the wrong number")
        if msg.error is None:
            worker.requests_served += 1
            worker.prompt_tokens += msg.prompt_tokens
        else:
            worker.note_error(msg.error)
        if not job.future.done():
            job.future.set_result(msg)

    def cancel(self, job: Job | EmbedJob) -> None:
        """Stop a job the client no longer wants (disconnect, stop string); a choice of an
        n > 1 job stops alone. A no-op once the job is finished (an embedding: answered)."""
        if isinstance(job, EmbedJob):
            self._cancel_embed(job)
            return
        if job.finished:
            return
        job.finished = True
        if job.parent is not None:
            parent = job.parent
            worker = self._registry.get(parent.worker_id) if parent.worker_id else None
            if worker is not None and not parent.finished:
                self._send(worker.identity, Abort(parent.wire_id, index=job.index))
            self._finish_if_done(parent, None)
            return
        for choice in job.choices:
            choice.finished = True
        worker = self._untrack(job)
        if worker is not None:
            self._send(worker.identity, Abort(job.wire_id))

    def on_worker_lost(self, worker: WorkerState) -> None:
        """Move every job of a lost worker elsewhere (it has already left the healthy set)."""
        for wire_id in list(worker.inflight):
            job = self._jobs.get(wire_id)
            if isinstance(job, EmbedJob):
                self._untrack(job)
                self._resubmit_embed(job)
            elif job is not None and job.prefilling:
                self._send(worker.identity, Abort(wire_id))
                self._prefilled(job, None)
            elif job is not None:
                self._untrack(job)
                self._send(worker.identity, Abort(wire_id))  # in case it is only slow
                self._resubmit(job)

    def fail_all(self, reason: str) -> None:
        """End every job with an error (router shutting down)."""
        for job in list(self._jobs.values()):
            self.cancel(job)
            if isinstance(job, EmbedJob):
                _fail_embed(job, reason)
                continue
            for target in job.choices or [job]:
                target.events.put_nowait(_error_delta(job, reason))

    # ------------------------------------------------------------ internals

    def _route(self, job: Job) -> None:
        workers = self._registry.healthy(self.model)
        if job.images:  # only workers with the vision extra can place them
            workers = [w for w in workers if w.info.vision]
        if not workers:
            raise NoWorkerAvailable
        if job.per_worker and job.worker_id is None:  # a batch line: to a worker with room
            per = job.per_worker
            workers = [w for w in workers if self._batch_room(w, per) > 0]
            if not workers:
                raise Overloaded
        target = disagg.prefill_target(workers, job, self._index, self._prefill_min_tokens)
        if target is not None:
            self._start_prefill(job, target)
            return
        msg = job.continuation()
        choice = choose(
            self._policy,
            self._index,
            self._affinity,
            msg.token_ids,
            workers,
            job.cache_key,
            self._pulls,
            self._batch_rows(workers) if job.priority == INTERACTIVE else None,
        )
        worker, hashes, matched = choice.worker, choice.hashes, choice.matched
        prefill = self._registry.get(job.handover.worker_id) if job.handover else None
        hint = disagg.decode_hint(choice, job, prefill)
        if hint is not None:
            msg = dataclasses.replace(msg, pull=hint)
        self._index.add_optimistic(worker.worker_id, hashes)
        self._affinity.remember(hashes, worker.worker_id, job.cache_key)
        job.worker_id = worker.worker_id
        self._jobs[job.wire_id] = job
        worker.inflight.add(job.wire_id)
        pulled = (hint.num_blocks - matched) * worker.block_size if hint else 0
        kind = PULL if hint else choice.kind
        self._metrics.routed_to(worker.worker_id, matched * worker.block_size, kind, pulled)
        if job.trace is not None:
            msg = job.trace.routed(msg, worker.worker_id, matched, self._policy.name)
        self._send(worker.identity, msg)

    def batch_room(self, per_worker: int) -> int:
        """Low-priority jobs the healthy workers may take now (job.batch_room, summed)."""
        healthy = self._registry.healthy(self.model)
        return sum(max(0, self._batch_room(w, per_worker)) for w in healthy)

    def _batch_rows(self, workers: Sequence[WorkerState]) -> dict[str, int]:
        """Each worker's batch lines in flight, by worker id: an interactive request's policy
        weighs them (policy.Candidate.batch_rows; a batch line's does not)."""
        return {w.worker_id: batch_rows(map(self._jobs.get, w.inflight)) for w in workers}

    def _batch_room(self, worker: WorkerState, per_worker: int) -> int:
        """job.batch_room of one worker, counting an interactive job that ended there within
        batch_yield_s as running still."""
        ended = self._interactive_ended.get(worker.worker_id)
        lately = ended is not None and self._clock() - ended < self._batch_yield_s
        return batch_room(self._jobs, worker.inflight, per_worker, lately)

    def _start_prefill(self, job: Job, worker: WorkerState) -> None:
        job.prefilling = job.prefill_tried = True
        job.worker_id = worker.worker_id
        self._jobs[job.wire_id] = job
        worker.inflight.add(job.wire_id)
        msg = disagg.prefill_message(job)
        if job.trace is not None:
            msg = job.trace.routed(msg, worker.worker_id, 0, "prefill")
        with contextlib.suppress(RuntimeError):  # no running loop (a simulation): no timeout
            loop = asyncio.get_running_loop()
            job.prefill_timer = loop.call_later(self._prefill_timeout_s, self._prefill_late, job)
        self._send(worker.identity, msg)

    def _prefill_late(self, job: Job) -> None:
        worker = self._registry.get(job.worker_id) if job.worker_id else None
        if job.prefilling and not job.finished and worker is not None:
            log.warning("prefill of %s on %s timed out", job.request_id, worker.worker_id)
            self._send(worker.identity, Abort(job.wire_id))
            self._prefilled(job, None)

    def _prefilled(self, job: Job, worker: WorkerState | None) -> None:
        """The prefill leg ended (`worker`: the prefill worker that holds the prompt; None: it
        failed): on to a decoder, which pulls the prompt or computes it."""
        if job.prefill_timer is not None:
            job.prefill_timer.cancel()
        self._untrack(job)
        job.prefilling = False
        job.handover = disagg.handover_from(worker, job)
        try:
            self._route(job)
        except NoWorkerAvailable:
            job.lost = True
            self._fail(job, "no worker is available to decode this request")

    def _resubmit(self, job: Job) -> None:
        if job.choices and any(c.generated for c in job.choices):
            # the choices went their own ways: no single continuation carries them all
            self._fail(job, "the worker generating this request's choices was lost; retry it")
            return
        if job.tokens_left <= 0:
            job.finished = True
            job.events.put_nowait(TokenDelta(job.request_id, (), "length"))
            return
        if job.attempt >= self._max_resubmits:
            self._fail(job, f"request failed on {job.attempt + 1} workers in turn")
            return
        job.attempt += 1
        try:
            self._route(job)
        except NoWorkerAvailable:  # (the handler places it again if its client saw nothing)
            job.lost = True
            self._fail(job, "the worker serving this request was lost and no other is available")
            return
        self._metrics.resubmitted()
        log.info(
            "request %s moved to %s after %d tokens",
            job.request_id,
            job.worker_id,
            len(job.generated),
        )

    def _fail(self, job: Job, reason: str) -> None:
        job.finished = True
        for target in job.choices or [job]:
            target.finished = True
            target.events.put_nowait(_error_delta(job, reason))

    # ------------------------------------------------------------ embeddings

    def _route_embed(self, job: EmbedJob) -> None:
        workers = [w for w in self._registry.healthy(self.model) if w.info.task == "embed"]
        if not workers:
            raise NoWorkerAvailable
        worker = min(workers, key=_load)
        job.worker_id = worker.worker_id
        self._jobs[job.wire_id] = job
        worker.inflight.add(job.wire_id)
        self._send(worker.identity, Embed(job.wire_id, job.inputs, job.dimensions))

    def _cancel_embed(self, job: EmbedJob) -> None:
        if job.wire_id not in self._jobs:
            return
        worker = self._untrack(job)
        if worker is not None:
            self._send(worker.identity, Abort(job.wire_id))

    def _resubmit_embed(self, job: EmbedJob) -> None:
        if job.attempt >= self._max_resubmits:
            _fail_embed(job, f"embedding failed on {job.attempt + 1} workers in turn")
            return
        job.attempt += 1
        try:
            self._route_embed(job)
        except NoWorkerAvailable:
            _fail_embed(job, "the worker serving this request was lost and no other is up")

    def _untrack(self, job: Job | EmbedJob) -> WorkerState | None:
        self._jobs.pop(job.wire_id, None)
        if isinstance(job, Job) and job.trace is not None:
            job.trace.unrouted(job.wire_id)
        worker = self._registry.get(job.worker_id) if job.worker_id else None
        if worker is not None:
            worker.untrack(job.wire_id)
            if isinstance(job, Job) and job.priority == INTERACTIVE:
                self._interactive_ended[worker.worker_id] = self._clock()
        return worker


def _credit(worker: WorkerState, delta: TokenDelta) -> None:
    worker.requests_served += 1
    if delta.usage is not None:
        worker.prompt_tokens += delta.usage.prompt_tokens
        worker.completion_tokens += delta.usage.completion_tokens
        worker.cached_tokens += delta.usage.cached_tokens


def _error_delta(job: Job, reason: str) -> TokenDelta:
    return TokenDelta(job.request_id, (), "error", error=reason)


def _fail_embed(job: EmbedJob, reason: str) -> None:
    if not job.future.done():
        job.future.set_result(Embeddings(job.wire_id, error=reason))


def _load(worker: WorkerState) -> int:
    """An embed worker's load: requests in flight there, plus what its heartbeat says is
    queued."""
    waiting = worker.heartbeat.waiting if worker.heartbeat else 0
    return len(worker.inflight) + waiting
