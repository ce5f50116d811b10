"""A body for /v1/embeddings answered: checked and tokenized, one Embed to a worker of the
model, the vectors back in OpenAI's form. Shared by the endpoint and a batch's lines."""

from __future__ import annotations

from aiohttp import web

from router.api.embeddings.parse import parse_embeddings
from router.api.embeddings.render import embeddings_reply
from router.errors import embedding_failed, no_workers, not_an_embedding_model, overloaded
from router.http import app_keys
from router.http.generate import parse_off_loop, wait_for_model
from router.routing.dispatcher import NoWorkerAvailable, Overloaded


async def embed(app: web.Application, body: dict, request_id: str) -> tuple[dict, str, int]:
    """`body` answered: (OpenAI's reply, the model served, its prompt tokens); ApiError as a
    live request gets it. The endpoint's and a batch line's (router/http/batch_runner.py)."""
    served = app[app_keys.MODELS].for_request(body)
    if served.embedding is None:
        raise not_an_embedding_model(served.id)
    await wait_for_model(app, served.id, body)
    req = await parse_off_loop(
        app, parse_embeddings, body, served.tokenizer, served.embedding, served.id
    )
    try:
        job = served.dispatcher.start_embed(request_id, req.inputs, req.dimensions)
    except Overloaded:
        raise overloaded() from None
    except NoWorkerAvailable:
        raise no_workers(served.id) from None
    try:
        answer = await job.future
    finally:
        job.cancel()  # the client left before the answer: abort it there
        app[app_keys.DEMAND].replied(served.id)
    if answer.error is not None:
        raise embedding_failed(answer.error)
    served.metrics.usage(req.prompt_tokens, 0, 0)
    reply = embeddings_reply(answer.vectors, req.encoding_format, served.id, req.prompt_tokens)
    return reply, served.id, req.prompt_tokens
