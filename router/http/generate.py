"""The one generation pipeline, shared by every API adapter and by a batch's lines.

read the body -> pick the model -> parse (off the loop) -> start the job (one per prompt when a
completions request holds several: `req.batch`, merged by router/text/pieces.batch_pieces) ->
reply whole or as a stream -> cancel the jobs in `finally` (a no-op once finished; an abort
when the client left or an error cut it short). An error before the first token is a plain
HTTP error; once a stream's headers are sent it goes in the stream.

Who asked is a `Caller`: a live HTTP request (`LiveCaller`: streamed or whole, traced, its
key's budgets charged) or a batch's line (`LineCaller`: the whole body, nothing charged). How
its jobs are placed on workers is a `Lane` (interactive, or a batch's low priority).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol, TypeVar

from aiohttp import web

from router.api.adapter import Api, ChoiceText, Reply
from router.errors import ApiError, no_workers, only_embeddings, overloaded
from router.http import app_keys, sse
from router.http.access_log import note
from router.http.body import json_object_body
from router.http.images import request_images
from router.http.security import charge_tokens
from router.metrics.tracing import RequestTrace
from router.placement.catalog import keep_alive_of
from router.routing.dispatcher import Job, NoWorkerAvailable, Overloaded
from router.text.pieces import Piece, TextOptions, UsageCount, batch_pieces, usage_of_all
from shared.protocol import INTERACTIVE

if TYPE_CHECKING:
    from router.api.request import GenerationRequest
    from router.routing.models import ServedModel

Items = AsyncIterator[tuple[int, Piece]]  # (choice index, piece), as batch_pieces yields them
T = TypeVar("T")


@dataclass(frozen=True)
class Lane:
    """How a request's jobs are placed: `priority` (Generate.priority); with `per_worker`, a
    worker already holding that many low-priority jobs is not chosen (all are: 429,
    Overloaded); `placed()` is called once the jobs are on workers."""

    priority: int = INTERACTIVE
    per_worker: int = 0
    placed: Callable[[], None] | None = None


class Caller(Protocol[T]):
    """Who asked for a reply, and how it is handed over (its result: T)."""

    trace: RequestTrace | None

    def started(self, request_id: str, served: ServedModel, req: GenerationRequest) -> None:
        """The request has its id (before any job is started)."""

    async def deliver(self, served: ServedModel, jobs: list[Job], reply: Reply, items: Items) -> T:
        """Read `items` to the end and hand the reply over; ApiError as it is."""

    async def ended(self, jobs: list[Job]) -> None:
        """Called once the jobs are cancelled, however the request ended."""

    async def until_started(self, app: web.Application, model: str) -> None:
        """While `model`'s workers are still starting, until one registers (bounded)."""


async def generate(
    request: web.Request, api: Api, before_end: Callable[[], Awaitable[None]] | None = None
) -> web.StreamResponse:
    """`before_end`, when given, runs once the reply's end is built and before the client sees
    it (the Responses store's write: a client that continues on another router finds it)."""
    app = request.app
    trace = RequestTrace.start(app[app_keys.TRACER], request.path, request.headers)  # None: off
    body = await json_object_body(request)
    served = app[app_keys.MODELS].for_request(body)
    if served.embedding is not None:
        raise only_embeddings(served.id, request.path)
    opened, lost = None, 0
    while True:
        try:  # a catalog model no worker serves is loaded first (router/placement/)
            opened = await wait_for_model(app, served.id, body, request, api, opened, lost > 0)
        except StreamEnded as ended:
            return ended.response
        caller = LiveCaller(request, trace, opened, before_end)
        try:
            return await serve(app, api, body, served, Lane(), caller)
        except ApiError as error:
            opened = caller.opened
            if isinstance(error, WorkerLost) and lost < app[app_keys.CONFIG].max_resubmits:
                lost += 1  # the client saw none of it: placed again, as a new request is
                continue
            if opened is None:
                raise
            await sse.end_with(opened, api.stream_error(error))  # opened while it loaded
            return opened


async def answer(app: web.Application, api: Api, body: dict, lane: Lane) -> tuple[int, dict]:
    """`body` answered whole, without an HTTP request (a batch's line, router/http/batches.py):
    the reply a live request with the same body gets (not streamed), as (status, body); an
    error is its status and OpenAI error body. Nothing is charged to a key's budgets."""
    try:
        served = app[app_keys.MODELS].for_request(body)
        lost = 0
        while True:
            await wait_for_model(app, served.id, body, lost=lost > 0)
            try:
                return 200, await serve(app, api, body, served, lane, LineCaller())
            except WorkerLost:
                if lost >= app[app_keys.CONFIG].max_resubmits:
                    raise
                lost += 1
    except ApiError as e:
        return e.status, e.body()


async def serve(
    app: web.Application, api: Api, body: dict, served: ServedModel, lane: Lane, caller: Caller[T]
) -> T:
    """The pipeline: `body` of `api` for `served`, its jobs placed in `lane`, the reply
    handed to `caller`."""
    workers = app[app_keys.CLUSTER].registry.healthy(served.id)
    images = await request_images(app, served, api.image_parts(body), workers)
    req = await parse_request(app, api, body, served, images)
    request_id = api.new_id()
    caller.started(request_id, served, req)
    if not app[app_keys.CLUSTER].registry.healthy(served.id):  # (a checked body, then)
        await caller.until_started(app, served.id)
    jobs: list[Job] = []
    try:
        # several prompts (completions): one job each, possibly on different workers
        for k, prompt_ids in enumerate(req.batch):
            one = replace(req, prompt_ids=prompt_ids)
            jobs.append(start_job(served, f"{request_id}-{k}", one, lane, caller.trace))
        if not req.batch:
            jobs.append(start_job(served, request_id, req, lane, caller.trace))
        if lane.placed is not None:
            lane.placed()
        reply = api.reply(req, request_id, served.tokenizer)
        items = batch_pieces(jobs, req.n, served.tokenizer, req.stop, text_options(req))
        items = items if caller.trace is None else caller.trace.watch(items)
        async with contextlib.aclosing(items):
            return await caller.deliver(served, jobs, reply, items)
    except ApiError as error:  # before the client saw a token (after, it is in the stream)
        if any(job.lost for job in jobs) and not isinstance(error, WorkerLost):
            raise WorkerLost(error) from error
        raise
    finally:
        for job in jobs:
            job.cancel()  # no-op when finished; aborts on disconnect/error
        app[app_keys.DEMAND].replied(served.id)  # keep_alive counts from here
        await caller.ended(jobs)


class LineCaller:
    """A batch's line: the whole body; nothing charged, nothing traced."""

    trace = None

    def started(self, request_id: str, served: ServedModel, req: GenerationRequest) -> None:
        pass

    async def until_started(self, app: web.Application, model: str) -> None:
        await app[app_keys.DEMAND].until_started(model, app[app_keys.CONFIG].worker_wait_s)

    async def deliver(
        self, served: ServedModel, jobs: list[Job], reply: Reply, items: Items
    ) -> dict:
        choices = await _choices(items)
        usage = usage_of_all(jobs)
        served.metrics.usage(usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens)
        return reply.whole(choices, usage)

    async def ended(self, jobs: list[Job]) -> None:
        pass


class LiveCaller:
    """A live HTTP request: streamed or whole, noted in the access log, traced when tracing
    is on, and what was generated charged to its key's budgets."""

    def __init__(
        self,
        request: web.Request,
        trace: RequestTrace | None,
        opened: web.StreamResponse | None,
        before_end: Callable[[], Awaitable[None]] | None,
    ):
        self.request, self.trace = request, trace
        self._opened = opened  # the stream opened while the model loaded (None: none was)
        self._before_end = before_end
        self._stream = False

    def started(self, request_id: str, served: ServedModel, req: GenerationRequest) -> None:
        self._stream = req.stream
        note(self.request, request_id=request_id, model=served.id, stream=req.stream)
        if self.trace is not None:
            self.trace.describe(request_id, served.id, req.stream)

    @property
    def opened(self) -> web.StreamResponse | None:
        """The stream opened while the request waited (None: none was)."""
        return self._opened

    async def until_started(self, app: web.Application, model: str) -> None:
        """A streamed request keeps its connection meanwhile with `: loading` comments."""

        async def note() -> None:
            self._opened = self._opened or await sse.open_stream(self.request)
            await sse.comment(self._opened, f"loading {model}")  # none on JSON lines

        wait_s = app[app_keys.CONFIG].worker_wait_s
        await app[app_keys.DEMAND].until_started(model, wait_s, note if self._stream else None)

    async def deliver(
        self, served: ServedModel, jobs: list[Job], reply: Reply, items: Items
    ) -> web.StreamResponse:
        if self._stream:
            return await self._streamed(served, jobs, reply, items)
        choices = await _choices(items)
        usage = usage_of_all(jobs)
        self._count_usage(served, usage)
        body = reply.whole(choices, usage)
        if self._before_end is not None:
            await self._before_end()
        return web.json_response(body)

    async def ended(self, jobs: list[Job]) -> None:
        error = sys.exc_info()[1]  # what ends the request, if it did not end well
        if jobs:  # what was generated is charged, however the request ended (a client that
            # leaves before the end must not escape its key's tokens-per-minute budget)
            usage = usage_of_all(jobs)
            await charge_tokens(self.request, usage.prompt_tokens, usage.completion_tokens)
        if self.trace is not None:
            self.trace.end(sum(job.completion_tokens for job in jobs), error)

    async def _streamed(
        self, served: ServedModel, jobs: list[Job], reply: Reply, items: Items
    ) -> web.StreamResponse:
        started = time.perf_counter()
        item = await anext(items)  # an error before the first token is a plain HTTP error
        served.metrics.first_chunk.observe(time.perf_counter() - started)
        response = self._opened or await sse.open_stream(self.request)  # the model loaded
        try:
            try:
                await sse.send(response, reply.stream_start(usage_of_all(jobs)))
                while item is not None:
                    await sse.send(response, reply.stream_piece(*item))
                    item = await anext(items, None)
                usage = usage_of_all(jobs)
                self._count_usage(served, usage)
                events = reply.stream_end(usage)
                if self._before_end is not None:
                    await self._before_end()
                await sse.send(response, events)
            except ApiError as e:  # headers are sent: the error goes in the stream
                await sse.send(response, reply.stream_error(e))
            await response.write_eof()
        except ConnectionResetError:
            pass  # the client left; serve() aborts the job
        return response

    def _count_usage(self, served: ServedModel, usage: UsageCount) -> None:
        served.metrics.usage(usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens)
        note(
            self.request,
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            cached_tokens=usage.cached_tokens,
        )


def text_options(req: GenerationRequest) -> TextOptions:
    """How the reply's tokens become text: a chat reply that is read (router/chat/output.py)
    keeps its special tokens for the reader, which cuts them from what the client sees."""
    return TextOptions(req.include_stop_str, req.skip_special_tokens and not req.reads_chat)


async def parse_off_loop(app: web.Application, parse, *args):
    """`parse(*args)` (body checks, chat template, tokenizer) in the tokenize pool when there
    is one, else here; its ApiError reaches the caller either way."""
    pool = app[app_keys.TOKENIZE_POOL]
    if pool is None:
        return parse(*args)
    return await asyncio.get_running_loop().run_in_executor(pool, parse, *args)


async def parse_request(
    app: web.Application, api: Api, body: dict, served: ServedModel, images
) -> GenerationRequest:
    """The body as the neutral request (off the loop when a pool tokenizes); counts the
    per-request metadata its prompt lost (router/text/volatile.py)."""
    cap = app[app_keys.CONFIG].max_tokens_cap
    req = await parse_off_loop(app, api.parse, body, served.tokenizer, served.id, cap, images)
    served.metrics.volatile_removed(req.volatile_removed)
    return req


def start_job(
    served: ServedModel,
    request_id: str,
    req: GenerationRequest,
    lane: Lane,
    trace: RequestTrace | None = None,
) -> Job:
    try:
        return served.dispatcher.start(
            request_id,
            req.prompt_ids,
            req.sampling,
            req.n,
            cache_key=req.cache_key,
            trace=trace,
            images=req.images,
            priority=lane.priority,
            per_worker=lane.per_worker,
            pins=req.pins,
        )
    except Overloaded:
        raise overloaded() from None
    except NoWorkerAvailable:
        raise no_workers(served.id) from None


async def _choices(items: Items) -> list[ChoiceText]:
    """Every choice's text, last piece and logprobs, read to the end of `items`."""
    texts: dict[int, list[str]] = {}
    entries: dict[int, list] = {}
    last = {}
    async for index, piece in items:
        texts.setdefault(index, []).append(piece.text)
        entries.setdefault(index, []).extend(piece.logprobs)
        last[index] = piece
    return [ChoiceText("".join(texts[i]), last[i], tuple(entries[i])) for i in sorted(texts)]


async def wait_for_model(
    app: web.Application,
    model: str,
    body: dict,
    request: web.Request | None = None,
    api: Api | None = None,
    stream: web.StreamResponse | None = None,
    lost: bool = False,
) -> web.StreamResponse | None:
    """Until `model` has a worker; the stream opened meanwhile (None: none was), for a
    streamed `request` of `api` (`stream`: one opened by an earlier wait; `lost`: the request
    lost its worker before its first token). ApiError: a bad `keep_alive`, or the model cannot
    be loaded (raised as is before the stream opened; after, sent in it as `api` shapes
    errors)."""
    keep_alive = keep_alive_of(body.get("keep_alive"))
    demand = app[app_keys.DEMAND]
    opened: list[web.StreamResponse] = [] if stream is None else [stream]

    async def note() -> None:
        if not opened:
            opened.append(await sse.open_stream(request))
        await sse.comment(opened[0], demand.loading_note(model))

    streamed = request is not None and api is not None and body.get("stream") is True
    try:
        wait_s = app[app_keys.CONFIG].worker_wait_s
        await demand.ready(model, keep_alive, note if streamed else None, wait_s, lost)
    except ApiError as error:
        if not opened:
            raise
        await sse.end_with(opened[0], api.stream_error(error))
        raise StreamEnded(opened[0]) from None
    return opened[0] if opened else None


class WorkerLost(ApiError):
    """`error` ended a request whose worker was lost, with no other to take it, before the
    client saw a token: it may be placed again."""

    def __init__(self, error: ApiError):
        super().__init__(error.status, error.message, error.param, error.code, error.type)


class StreamEnded(Exception):
    """The stream opened while waiting was ended with an error: return its response."""

    def __init__(self, response: web.StreamResponse):
        super().__init__("the stream ended with an error")
        self.response = response
