"""Embedding requests in flight: sent to the least-loaded worker of their model, answered by
one Embeddings each, moved to another worker when theirs is lost.

An embedding has no prefix to reuse (no KV cache on the worker), so routing is by load alone:
requests in flight there, plus what its heartbeat says is queued. The handler awaits the
job's future and never sees a move."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from router.routing.dispatcher import NoWorkerAvailable, Overloaded
from shared.protocol import Abort, Embed, Embeddings, Message

if TYPE_CHECKING:
    from router.cluster.registry import WorkerRegistry, WorkerState

log = logging.getLogger(__name__)


@dataclass(eq=False)
class EmbedJob:
    request_id: str
    inputs: tuple[tuple[int, ...], ...]
    dimensions: int = 0
    future: asyncio.Future[Embeddings] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    worker_id: str | None = None
    attempt: int = 0

    @property
    def wire_id(self) -> str:
        return f"{self.request_id}#{self.attempt}"


class EmbedDispatcher:
    """The embedding jobs of one model (`model`), over its workers."""

    def __init__(
        self,
        registry: WorkerRegistry,
        send: Callable[[bytes, Message], None],
        model: str,
        max_pending: int,
        max_resubmits: int,
    ):
        self._registry, self._send, self.model = registry, send, model
        self._max_pending, self._max_resubmits = max_pending, max_resubmits
        self._jobs: dict[str, EmbedJob] = {}  # by wire id

    @property
    def num_pending(self) -> int:
        return len(self._jobs)

    def start(self, request_id: str, inputs, dimensions: int = 0) -> EmbedJob:
        """Send a new job; Overloaded or NoWorkerAvailable if it cannot be sent."""
        if len(self._jobs) >= self._max_pending:
            raise Overloaded
        job = EmbedJob(request_id, tuple(tuple(ids) for ids in inputs), dimensions)
        self._route(job)
        return job

    def on_reply(self, worker: WorkerState, msg: Embeddings) -> None:
        job = self._jobs.get(msg.request_id)
        if job is None or job.worker_id != worker.worker_id:
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

    def cancel(self, job: EmbedJob) -> None:
        """The client left: forget the job, tell its worker (a no-op once answered)."""
        if job.wire_id not in self._jobs:
            return
        worker = self._untrack(job)
        if worker is not None:
            self._send(worker.identity, Abort(job.wire_id))

    def on_worker_lost(self, worker: WorkerState) -> None:
        for wire_id in list(worker.inflight):
            job = self._jobs.get(wire_id)
            if job is None:
                continue
            self._untrack(job)
            if job.attempt >= self._max_resubmits:
                self._fail(job, f"embedding failed on {job.attempt + 1} workers in turn")
                continue
            job.attempt += 1
            try:
                self._route(job)
            except NoWorkerAvailable:
                self._fail(job, "the worker serving this request was lost and no other is up")

    def fail_all(self, reason: str) -> None:
        for job in list(self._jobs.values()):
            self.cancel(job)
            self._fail(job, reason)

    def _route(self, job: EmbedJob) -> None:
        workers = [w for w in self._registry.healthy(self.model) if w.info.task == "embed"]
        if not workers:
            raise NoWorkerAvailable
        worker = min(workers, key=_load)
        job.worker_id = worker.worker_id
        self._jobs[job.wire_id] = job
        worker.inflight.add(job.wire_id)
        self._send(worker.identity, Embed(job.wire_id, job.inputs, job.dimensions))

    def _untrack(self, job: EmbedJob) -> WorkerState | None:
        self._jobs.pop(job.wire_id, None)
        worker = self._registry.get(job.worker_id) if job.worker_id else None
        if worker is not None:
            worker.untrack(job.wire_id)
        return worker

    def _fail(self, job: EmbedJob, reason: str) -> None:
        if not job.future.done():
            job.future.set_result(Embeddings(job.wire_id, error=reason))


def _load(worker: WorkerState) -> int:
    waiting = worker.heartbeat.waiting if worker.heartbeat else 0
    return len(worker.inflight) + waiting
