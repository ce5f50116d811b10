"""What the router knows, as JSON and Prometheus text: models, health, metrics, the cluster."""

from __future__ import annotations

from aiohttp import web

from router.cluster.models import unknown_model
from router.http import app_keys
from router.placement.operator import hosts_json, leadership_json, model_json
from router.routing.models import ServedModel


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
    """OpenAI's model object, plus what vLLM and OpenRouter add: the context length, and the
    kinds of input the model takes (`input_modalities`, OpenRouter's name: "image" when the
    model has a vision tower whose images we place; docs/api.md, "Images"), and its dialect:
    the tool-call and reasoning formats the router reads in its replies."""
    tokenizer = served.tokenizer
    modalities = ["text", "image"] if tokenizer.vision is not None else ["text"]
    return (
        {
            "id": served.id,
            "object": "model",
            "created": 0,
            "owned_by": "mlx-fleet",
            "max_model_len": tokenizer.context_length,
            "aliases": list(served.spec.aliases),
            "healthy_workers": len(app[app_keys.CLUSTER].registry.healthy(served.id)),
            "input_modalities": modalities,
            "dialect": _dialect(served),
            # "embed": served by /v1/embeddings only, vectors of `dimensions` values
            "task": "chat" if served.embedding is None else "embed",
        }
        | ({} if served.embedding is None else {"dimensions": served.embedding.dimensions})
        | (_placement(app, served.id))
    )


def _placement(app: web.Application, model: str) -> dict:
    """With host agents: the model's catalog state (loaded where, loading, available)."""
    demand = app[app_keys.DEMAND]
    return {"placement": model_json(demand, model)} if demand.placer.hosts else {}


def _dialect(served: ServedModel) -> dict | None:
    """How the model writes tool calls and reasoning (router/chat/dialects; docs/api.md)."""
    dialect = served.tokenizer.dialect
    return None if dialect is None else dialect.describe()


async def health(request: web.Request) -> web.Response:
    """200 while some model has a worker (or a host agent can load one); each model's
    healthy workers. Before any worker registered (within worker_wait_s of the start) its
    status is "starting": requests then wait for their workers."""
    app = request.app
    per_model = {
        m.id: len(app[app_keys.CLUSTER].registry.healthy(m.id)) for m in app[app_keys.MODELS]
    }
    healthy = sum(per_model.values())
    demand = app[app_keys.DEMAND]
    loads = demand.active  # host agents load models on demand: ready to serve
    status = 200 if healthy or loads else 503
    if healthy or loads:
        state = "ok"
    elif demand.starting(app[app_keys.CONFIG].worker_wait_s):
        state = "starting"
    else:
        state = "no_workers"
    return web.json_response(
        {
            "status": state,
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
            "dialects": {m.id: _dialect(m) for m in app[app_keys.MODELS]},
            "policy": app[app_keys.CONFIG].policy,
            "pending_requests": _pending(app),
            "workers": workers,
            "cache": cl.registry.cache_summary(),
            "hosts": hosts_json(app[app_keys.DEMAND]),  # host agents (router/placement/)
            "placement": leadership_json(app[app_keys.DEMAND]),  # who places, of the routers
        }
    )


def _pending(app: web.Application) -> int:
    return sum(m.dispatcher.num_pending for m in app[app_keys.MODELS])
