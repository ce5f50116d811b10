"""Ollama's API (/api/*): chat and generate through the one pipeline (router/http/generate.py)
with the Ollama adapter, embeddings through the embeddings path (router/http/embed.py), and
what Ollama says of its models. Errors are `{"error": "..."}` (router/http/middleware.py)."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

from aiohttp import web

from router.api.adapter import StreamEvent
from router.api.checks import refuse_unknown_fields, typed_field
from router.api.ollama.adapter import OllamaApi
from router.api.ollama.models import ModelFiles, ModelView, running, show, tag
from router.api.ollama.parse import options_of, stream_of
from router.api.ollama.render import OLLAMA_API_VERSION, line
from router.errors import ApiError, bad_request
from router.http import app_keys, sse
from router.http.access_log import note
from router.http.body import json_object_body
from router.http.embed import embed as embed_body
from router.http.generate import generate, wait_for_model
from router.http.security import charge_tokens
from router.placement.prefetch import prefetch
from router.routing.models import ServedModel

NDJSON = "application/x-ndjson"
LATEST = ":latest"  # Ollama's default tag: `tiny:latest` is `tiny`
EMBED_FIELDS = frozenset({"model", "input", "truncate", "options", "keep_alive", "dimensions"})
EMBEDDINGS_FIELDS = frozenset({"model", "prompt", "options", "keep_alive"})


async def chat(request: web.Request) -> web.StreamResponse:
    return await _generation(request, OllamaApi("chat"), "messages")


async def generate_text(request: web.Request) -> web.StreamResponse:
    return await _generation(request, OllamaApi("generate"), "prompt")


async def _generation(request: web.Request, api: OllamaApi, input_key: str) -> web.StreamResponse:
    """Streamed as NDJSON unless `stream` is false (then one JSON object). A body without
    input (no messages, no prompt) loads the model and answers `done_reason: "load"`, as
    Ollama does."""
    body = await _body(request)
    if not body.get(input_key) and not body.get("images"):
        served = request.app[app_keys.MODELS].for_request(body)
        await wait_for_model(request.app, served.id, body)
        empty = {"message": {"role": "assistant", "content": ""}} if api.kind == "chat" else {}
        fields = empty or {"response": ""}
        return web.json_response(line(served.id, fields, True) | {"done_reason": "load"})
    request[sse.LINES] = NDJSON if stream_of(body) else "application/json"
    return await generate(request, api)


async def embed(request: web.Request) -> web.Response:
    """/api/embed: `input` a string or an array of them -> `embeddings`."""
    body = await _body(request)
    refuse_unknown_fields(body, EMBED_FIELDS, "/api/embed")
    typed_field(body, "truncate", bool, True)
    reply, served_id, prompt_tokens, timings = await _vectors(request, body, "input")
    vectors = [item["embedding"] for item in reply["data"]]
    return web.json_response(
        {"model": served_id, "embeddings": vectors, **timings, "prompt_eval_count": prompt_tokens}
    )


async def embeddings(request: web.Request) -> web.Response:
    """/api/embeddings (Ollama's older endpoint): one `prompt` -> one `embedding`."""
    body = await _body(request)
    refuse_unknown_fields(body, EMBEDDINGS_FIELDS, "/api/embeddings")
    reply, _, _, _ = await _vectors(request, body, "prompt")
    return web.json_response({"embedding": reply["data"][0]["embedding"]})


async def _vectors(request: web.Request, body: dict, input_key: str):
    """The embeddings path's answer to `body`, charged to the key as /v1/embeddings is, with
    Ollama's measured durations."""
    options_of(body)  # checked; sampling options do nothing to embeddings (docs/api.md)
    if not isinstance(body.get(input_key), str | list):
        raise bad_request(f"'{input_key}' must be a string or an array of strings", input_key)
    started = time.monotonic_ns()
    served = request.app[app_keys.MODELS].for_request(body)
    await wait_for_model(request.app, served.id, body)
    loaded = time.monotonic_ns()
    openai = {"model": served.id, "input": body[input_key]}
    openai |= {k: body[k] for k in ("dimensions", "keep_alive") if body.get(k) is not None}
    request_id = f"embd-{uuid.uuid4().hex}"
    reply, served_id, prompt_tokens = await embed_body(request.app, openai, request_id)
    note(request, request_id=request_id, model=served_id, stream=False)
    note(request, prompt_tokens=prompt_tokens, completion_tokens=0, cached_tokens=0)
    await charge_tokens(request, prompt_tokens, 0)
    timings = {"total_duration": time.monotonic_ns() - started, "load_duration": loaded - started}
    return reply, served_id, prompt_tokens, timings


async def tags(request: web.Request) -> web.Response:
    models = request.app[app_keys.MODELS]
    return web.json_response({"models": [tag(view_of(m)) for m in models]})


async def ps(request: web.Request) -> web.Response:
    """The models with workers now, and when keep_alive unloads each (catalog models)."""
    app = request.app
    registry = app[app_keys.CLUSTER].registry
    loaded = []
    for served in app[app_keys.MODELS]:
        workers = len(registry.healthy(served.id))
        if workers:
            loaded.append(running(view_of(served), workers, _expires(app, served.id)))
    return web.json_response({"models": loaded})


def _expires(app: web.Application, model: str) -> float | None:
    """When the catalog unloads `model` if no request comes (epoch seconds; None: never)."""
    demand = app[app_keys.DEMAND]
    entry = demand.entries.get(model)
    if entry is None or entry.pinned or not 0 <= entry.keep_alive_s < float("inf"):
        return None
    return time.time() + entry.last_used + entry.keep_alive_s - demand.clock()


async def show_model(request: web.Request) -> web.Response:
    body = await _body(request, name_key=True)
    refuse_unknown_fields(body, frozenset({"model", "verbose"}), "/api/show")
    served = request.app[app_keys.MODELS].for_request(body)
    return web.json_response(show(view_of(served)))


async def version(request: web.Request) -> web.Response:
    return web.json_response({"version": OLLAMA_API_VERSION})


async def pull(request: web.Request) -> web.StreamResponse:
    """A catalog model with a Hub `source` is fetched onto a host (router/placement/prefetch.py),
    its progress streamed as Ollama's status lines; a model whose files are there already
    (or that is read from a path) answers success at once; another is a 404."""
    body = await _body(request, name_key=True)
    refuse_unknown_fields(body, frozenset({"model", "insecure", "stream"}), "/api/pull")
    models = request.app[app_keys.MODELS]
    name = body.get("model")
    if not isinstance(name, str):
        raise bad_request("'model' is required and must be a string", "model")
    served = models.get(name)
    if served is None:
        raise ApiError(
            404,
            f"'{name}' is not in this fleet's catalog: add it to [[models]] (with source = "
            '"org/name" for a Hub repo); GET /api/tags lists the models it serves',
            "model",
        )
    source = served.spec.section.source
    demand = request.app[app_keys.DEMAND]
    steps = prefetch(demand, served.id) if source and demand.active else None
    if not stream_of(body):
        async for _ in steps or _nothing():
            pass
        return web.json_response({"status": "success"})
    request[sse.LINES] = NDJSON
    response = await sse.open_stream(request)
    await sse.send(response, [StreamEvent({"status": "pulling manifest"})])
    try:
        async for step in steps or _nothing():
            if not step.done and step.total_bytes:
                status = {"status": f"pulling {source}", "digest": f"{source}@{step.host_id}"}
                status |= {"total": step.total_bytes, "completed": step.done_bytes}
                await sse.send(response, [StreamEvent(status)])
    except ApiError as error:
        await sse.end_with(response, [StreamEvent({"error": error.message})])
        return response
    done = ["verifying sha256 digest", "writing manifest", "success"]
    await sse.end_with(response, [StreamEvent({"status": s}) for s in done])
    return response


async def _nothing():
    return
    yield


async def delete(request: web.Request) -> web.Response:
    body = await _body(request, name_key=True)
    served = request.app[app_keys.MODELS].for_request(body)
    raise bad_request(
        f"deleting a model is not supported: '{served.id}' is served from the fleet's catalog; "
        f"unload it with POST /v1/admin/models/{served.id}/unload",
        "model",
    )


async def _body(request: web.Request, name_key: bool = False) -> dict:
    """The body, its model named without Ollama's `:latest` tag when that is how we serve
    it; with `name_key`, the older `name` taken for `model` (/api/show, /api/pull)."""
    body = await json_object_body(request)
    if name_key and "name" in body and "model" not in body:
        body["model"] = body.pop("name")
    name = body.get("model")
    models = request.app[app_keys.MODELS]
    bare = name.removesuffix(LATEST) if isinstance(name, str) else None
    if bare != name and models.get(name) is None and models.get(bare) is not None:
        body["model"] = bare
    return body


def view_of(served: ServedModel) -> ModelView:
    embedding = served.embedding is not None
    return ModelView(served.id, served.tokenizer, embedding, model_files(served))


def model_files(served: ServedModel) -> ModelFiles:
    """The model directory's config.json, weights' bytes and last change."""
    path = Path(served.spec.path)
    config_path = path / "config.json"
    try:
        config = json.loads(config_path.read_text())
        modified = config_path.stat().st_mtime
    except (OSError, ValueError):
        config, modified = {}, 0.0
    size = sum(f.stat().st_size for f in path.glob("*.safetensors")) if path.is_dir() else 0
    return ModelFiles(config if isinstance(config, dict) else {}, size, modified)
