"""Responses of n > 1 choices: each choice's deltas become text on their own (detokenizer,
stop strings, logprobs), whole or streamed as chunks tagged with the choice's index.

The worker forks the request after one prefill (`Generate.n`); the dispatcher hands each
choice its own sub-job (`job.choices`), so `router.text.pieces.pieces` serves a choice as it
serves a whole request. A stop string ends its choice alone.
"""

from __future__ import annotations

import asyncio
import json

from aiohttp import web

from router.api.errors import ApiError
from router.api.openai.render import ResponseBuilder
from router.cluster.models import ServedModel
from router.routing.dispatcher import Job
from router.text.pieces import UsageCount, pieces

_DONE = object()


def usage_of_choices(job: Job) -> UsageCount:
    """The prompt counted once, the completions of every choice added up."""
    return UsageCount(len(job.prompt_ids), job.completion_tokens, job.cached_tokens)


async def whole(
    request: web.Request, served: ServedModel, job: Job, req, builder: ResponseBuilder
) -> web.Response:

    async def one(choice: Job):
        texts, entries, reason = [], [], "stop"
        async for piece in pieces(choice, served.tokenizer, served.dispatcher, req.stop):
            texts.append(piece.text)
            entries += piece.logprobs
            reason = piece.finish_reason or reason
        return "".join(texts), reason, tuple(entries)

    results = await asyncio.gather(*(one(c) for c in job.choices))
    usage = usage_of_choices(job)
    served.metrics.usage(usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens)
    return web.json_response(builder.full_choices(list(results), usage))


async def stream(
    request: web.Request, served: ServedModel, job: Job, req, builder: ResponseBuilder
) -> web.StreamResponse:
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(choice: Job) -> None:
        try:
            gen = pieces(choice, served.tokenizer, served.dispatcher, req.stop)
            async for piece in gen:
                await queue.put((choice.index, piece))
        except ApiError as e:
            await queue.put((choice.index, e))
        finally:
            await queue.put((choice.index, _DONE))

    tasks = [asyncio.create_task(pump(c)) for c in job.choices]
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    try:
        await response.prepare(request)
        started, running, failed = set(), len(tasks), False
        while running:
            index, item = await queue.get()
            if item is _DONE:
                running -= 1
            elif isinstance(item, ApiError):
                if not failed:
                    await _event(response, item.body())
                failed = True
            elif not failed:
                await _send_piece(response, builder, req.include_usage, index, item, started)
        if not failed:
            usage = usage_of_choices(job)
            served.metrics.usage(usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens)
            if req.include_usage:
                await _event(response, builder.usage_chunk(usage))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
    except ConnectionResetError:
        pass  # the client left; the handler aborts the job
    finally:
        for task in tasks:
            task.cancel()
    return response


async def _send_piece(response, builder, include_usage, index, piece, started: set) -> None:
    first = index not in started
    if piece.text or piece.logprobs or first:
        chunk = builder.chunk(piece.text, None, first, include_usage, piece.logprobs, index)
        await _event(response, chunk)
        started.add(index)
    if piece.finish_reason is not None:
        chunk = builder.chunk("", piece.finish_reason, False, include_usage, index=index)
        await _event(response, chunk)


async def _event(response: web.StreamResponse, body: dict) -> None:
    await response.write(b"data: " + json.dumps(body).encode() + b"\n\n")
