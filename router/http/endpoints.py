"""HTTP endpoints: OpenAI-compatible completions, models, health, metrics, cluster view."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable

from aiohttp import web

from router.api.errors import ApiError, no_workers, overloaded
from router.api.openai.parse import GenerationRequest, parse_chat, parse_completion
from router.api.openai.render import ResponseBuilder, chat_deltas, chat_message
from router.chat.output import ChatReader
from router.cluster.models import ServedModel, unknown_model
from router.http import app_keys, choices
from router.http.body import json_object_body
from router.lifecycle import parse_off_loop
from router.routing.dispatcher import Job, NoWorkerAvailable, Overloaded
from router.text.logprobs import LogprobsRenderer
from router.text.pieces import pieces, usage_of

Parser = Callable[..., GenerationRequest]


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, parse_chat, "chatcmpl")


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, parse_completion, "cmpl")


async def models(request: web.Request) -> web.Response:
    """Every served model, with its aliases and the workers serving it now."""
    app = request.app
    return web.json_response(
        {"object": "list", "data": [_model_json(app, m) for m in app[app_keys.MODELS]]}
    )


async def model(request: web.Request) -> web.Response:
    """GET /v1/models/{model}: one model, by its id or an alias."""
    name = request.match_info["model"]
    served = request.app[app_keys.MODELS].get(name)
    if served is None:
        raise unknown_model(name, request.app[app_keys.MODELS].ids)
    return web.json_response(_model_json(request.app, served))


def _model_json(app: web.Application, served: ServedModel) -> dict:
    return {
        "id": served.id,
        "object": "model",
        "created": 0,
        "owned_by": "mlx-fleet",
        "max_model_len": served.tokenizer.context_length,
        "aliases": list(served.spec.aliases),
        "healthy_workers": len(app[app_keys.CLUSTER].registry.healthy(served.id)),
    }


async def health(request: web.Request) -> web.Response:
    """200 while some model has a worker; each model's healthy workers."""
    app = request.app
    per_model = {
        m.id: len(app[app_keys.CLUSTER].registry.healthy(m.id)) for m in app[app_keys.MODELS]
    }
    healthy = sum(per_model.values())
    status = 200 if healthy else 503
    return web.json_response(
        {
            "status": "ok" if healthy else "no_workers",
            "healthy_workers": healthy,
            "models": per_model,
        },
        status=status,
    )


async def metrics(request: web.Request) -> web.Response:
    app = request.app
    text = app[app_keys.METRICS].render(app[app_keys.CLUSTER].registry, _pending(app))
    content_type = "text/plain; version=0.0.4; charset=utf-8"  # Prometheus text format
    return web.Response(body=text.encode(), headers={"Content-Type": content_type})


async def cluster(request: web.Request) -> web.Response:
    app = request.app
    cl = app[app_keys.CLUSTER]
    workers = [
        w.to_json() | {"index_blocks": cl.models[w.model].index.num_blocks(w.worker_id)}
        for w in cl.registry
    ]
    return web.json_response(
        {
            "models": app[app_keys.MODELS].ids,
            "policy": app[app_keys.CONFIG].policy,
            "pending_requests": _pending(app),
            "workers": workers,
        }
    )


def _pending(app: web.Application) -> int:
    return sum(m.dispatcher.num_pending for m in app[app_keys.MODELS])


# ------------------------------------------------------------ generation


async def _generate(request: web.Request, parse: Parser, id_prefix: str) -> web.StreamResponse:
    app = request.app
    body = await json_object_body(request)
    served = app[app_keys.MODELS].for_request(body)
    max_tokens_cap = app[app_keys.CONFIG].max_tokens_cap
    req = await parse_off_loop(app, parse, body, served.tokenizer, served.id, max_tokens_cap)
    request_id = f"{id_prefix}-{uuid.uuid4().hex}"
    job = _start(served, request_id, req)
    builder = ResponseBuilder(req.kind, request_id, req.model, logprobs=_renderer(served, req))
    try:
        if req.n > 1:
            return await (choices.stream if req.stream else choices.whole)(
                request, served, job, req, builder
            )
        if req.stream:
            return await _stream(request, served, job, req, builder)
        return await _whole(served, job, req, builder)
    finally:
        served.dispatcher.cancel(job)  # no-op when finished; aborts on disconnect/error


def _start(served: ServedModel, request_id: str, req: GenerationRequest) -> Job:
    try:
        return served.dispatcher.start(request_id, req.prompt_ids, req.sampling, req.n)
    except Overloaded:
        raise overloaded() from None
    except NoWorkerAvailable:
        raise no_workers(served.id) from None


def _renderer(served: ServedModel, req: GenerationRequest) -> LogprobsRenderer | None:
    if not req.sampling.logprobs:
        return None
    return LogprobsRenderer(served.tokenizer, req.kind, req.sampling.top_logprobs)


async def _whole(served: ServedModel, job: Job, req: GenerationRequest, builder) -> web.Response:
    texts, entries = [], []
    async for piece in pieces(job, served.tokenizer, served.dispatcher, req.stop):
        texts.append(piece.text)
        entries += piece.logprobs
        finish_reason = piece.finish_reason
    usage = usage_of(job)
    _count_usage(served, usage)
    reply = "".join(texts)
    if req.kind == "chat":
        reader = ChatReader(req.tool_family, req.starts_in_reasoning)
        reply = chat_message(reader.feed(reply) + reader.finish())
        finish_reason = reader.finish_reason(finish_reason)
    body = builder.full(reply, finish_reason, usage, tuple(entries))
    return web.json_response(body)


async def _stream(
    request, served: ServedModel, job: Job, req: GenerationRequest, builder
) -> web.StreamResponse:
    started = time.perf_counter()
    stream = aiter(pieces(job, served.tokenizer, served.dispatcher, req.stop))
    piece = await anext(stream)  # an error before the first token is a plain HTTP error
    served.metrics.first_chunk.observe(time.perf_counter() - started)
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    try:
        try:
            await _send_pieces(response, builder, req, piece, stream)
        except ApiError as e:  # headers are sent: the error goes in the stream, as OpenAI does
            await _send_event(response, e.body())
        else:
            usage = usage_of(job)
            _count_usage(served, usage)
            if req.include_usage:
                await _send_event(response, builder.usage_chunk(usage))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
    except ConnectionResetError:
        pass  # the client left; _generate aborts the job
    return response


async def _send_pieces(
    response, builder: ResponseBuilder, req: GenerationRequest, piece, stream
) -> None:
    include_usage = req.include_usage
    reader = ChatReader(req.tool_family, req.starts_in_reasoning) if req.kind == "chat" else None
    first = True
    while piece is not None:
        done = piece.finish_reason is not None
        parts = _stream_parts(reader, piece.text, done)
        if not parts and (piece.logprobs or first):
            parts = [""]
        entries = piece.logprobs  # they go with the piece's first chunk
        for part in parts:
            chunk = builder.chunk(part, None, first, include_usage, entries)
            await _send_event(response, chunk)
            entries = ()
            first = False
        if done:
            reason = reader.finish_reason(piece.finish_reason) if reader else piece.finish_reason
            await _send_event(response, builder.chunk("", reason, False, include_usage))
        piece = await anext(stream, None)


def _stream_parts(reader: ChatReader | None, text: str, done: bool) -> list:
    """What to send for a piece of text: itself, or for chat the deltas its events make."""
    if reader is None:
        return [text] if text else []
    events = reader.feed(text) + (reader.finish() if done else [])
    return [delta for e in events for delta in chat_deltas(e)]


async def _send_event(response: web.StreamResponse, body: dict) -> None:
    await response.write(b"data: " + json.dumps(body).encode() + b"\n\n")


def _count_usage(served: ServedModel, usage) -> None:
    served.metrics.usage(usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens)
