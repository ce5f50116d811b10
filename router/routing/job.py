"""One request in flight, as the dispatcher (router.routing.dispatcher) tracks it: a
generation (`Job`) or an embedding (`EmbedJob`).

A job is what the layers below the dispatcher hold of it: its reader (router/text/pieces)
reads `events` and calls `cancel()` when it wants no more, which reaches the dispatcher through
the callback it gave the job; nothing below routing knows the dispatcher."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shared.protocol import (
    INTERACTIVE,
    CachePin,
    Embeddings,
    Generate,
    ImageInput,
    PullHint,
    TokenDelta,
)

if TYPE_CHECKING:
    from router.metrics.tracing import RequestTrace
    from shared.sampling import SamplingParams


@dataclass(eq=False)
class Job:
    request_id: str
    prompt_ids: tuple[int, ...]
    sampling: SamplingParams
    events: asyncio.Queue[TokenDelta] = field(default_factory=asyncio.Queue)
    generated: list[int] = field(default_factory=list)
    worker_id: str | None = None
    attempt: int = 0
    cached_tokens: int = 0  # prompt tokens the serving worker found in its cache
    finished: bool = False
    lost: bool = False  # ended because its worker was lost and no other could take it
    n: int = 1  # choices, forked by the worker after one prefill
    choices: list[Job] = field(default_factory=list)  # with n > 1: one sub-job per choice
    parent: Job | None = None  # of a choice
    index: int = 0  # of a choice
    sent_at: float = field(default_factory=time.perf_counter)
    last_token_at: float | None = None  # when tokens last arrived (None: none yet)
    cache_key: str | None = None  # prompt_cache_key: prefer the worker that served it last
    trace: RequestTrace | None = None  # its spans, when tracing is on
    # disaggregated prefill (router.routing.disagg): its prefill worker is computing the
    # prompt (`prefilling`), or it has been tried; the decode worker pulls from `handover`
    prefilling: bool = False
    prefill_tried: bool = False
    handover: PullHint | None = None
    prefill_timer: asyncio.TimerHandle | None = None
    # the prompt's images, in order (prompt_ids hold their keys): every leg and retry
    # carries them, and only workers that take images are sent the job
    images: tuple[ImageInput, ...] = ()
    priority: int = INTERACTIVE  # Generate.priority: BATCH for a batch's lines
    per_worker: int = 0  # > 0: first routed only to a worker with fewer low-priority jobs
    pins: tuple[CachePin, ...] = ()  # prefixes its worker keeps past it (cache_control...)
    # the dispatcher's cancel, given at construction: how a reader stops the job
    on_cancel: Callable[[Job], None] | None = field(default=None, repr=False)

    def cancel(self) -> None:
        """Stop the job: the client left, or a stop string ended it (a no-op once finished;
        a choice of an n > 1 job stops alone)."""
        if self.on_cancel is not None:
            self.on_cancel(self)

    @property
    def wire_id(self) -> str:
        return f"{self.request_id}#{self.attempt}" + ("p" if self.prefilling else "")

    @property
    def completion_tokens(self) -> int:
        return sum(len(c.generated) for c in self.choices) if self.choices else len(self.generated)

    @property
    def tokens_left(self) -> int:
        return self.sampling.max_tokens - len(self.generated)

    def continuation(self) -> Generate:
        """The Generate that carries on from where the job is (the whole job at first)."""
        sampling = dataclasses.replace(
            self.sampling,
            max_tokens=self.tokens_left,
            prior_output_tokens=len(self.generated),  # penalties and the grammar count them
        )
        ids = self.prompt_ids + tuple(self.generated)
        return Generate(
            self.wire_id,
            ids,
            sampling,
            self.n,
            images=self.images,
            priority=self.priority,
            pins=self.pins,
        )


@dataclass(eq=False)
class EmbedJob:
    """An embedding request in flight: answered by one Embeddings, set on `future`."""

    request_id: str
    inputs: tuple[tuple[int, ...], ...]
    dimensions: int = 0
    future: asyncio.Future[Embeddings] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    worker_id: str | None = None
    attempt: int = 0
    on_cancel: Callable[[EmbedJob], None] | None = field(default=None, repr=False)

    @property
    def wire_id(self) -> str:
        return f"{self.request_id}#{self.attempt}"

    def cancel(self) -> None:
        """The client left: forget the job, tell its worker (a no-op once answered)."""
        if self.on_cancel is not None:
            self.on_cancel(self)


def batch_room(
    jobs: dict[str, Job | EmbedJob],
    wire_ids: Iterable[str],
    per_worker: int,
    interactive_lately: bool = False,
) -> int:
    """Low-priority jobs a worker running `wire_ids` (of `jobs`) may still take: up to
    `per_worker` while it runs no interactive job and ran none lately (`interactive_lately`),
    a quarter of that (at least 1) while it does (a batch fills idle workers and trickles
    beside live traffic); negative when over.

    "Lately" matters: a client sending requests one after another leaves its worker without
    an interactive job for a few milliseconds between them, and a full `per_worker` of batch
    lines rushing in then would put the next request behind their prefill step."""
    # (ours: one model's; an embedding model's workers run no generation)
    running = [job for job in map(jobs.get, wire_ids) if isinstance(job, Job)]
    low = batch_rows(running)
    live = interactive_lately or len(running) > low
    bound = max(1, per_worker // 4) if live else per_worker
    return bound - low


def batch_rows(jobs: Iterable[Job | EmbedJob | None]) -> int:
    """How many of `jobs` are low-priority generations (a batch's lines)."""
    return sum(1 for job in jobs if isinstance(job, Job) and job.priority != INTERACTIVE)
