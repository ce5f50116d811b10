"""The router's aiohttp application factory: wiring only."""

from __future__ import annotations

from aiohttp import web

from router import anthropic_api, handlers, keys
from router.api_keys import ApiKeys
from router.config import RouterConfig
from router.lifecycle import abort_streams, cluster_ctx, tokenizer_ctx
from router.metrics import Metrics
from router.middleware import count_requests, errors_as_json
from router.security import limit_body, require_api_key


def create_app(config: RouterConfig) -> web.Application:
    app = web.Application(
        # Outermost first: metrics and JSON errors see everything; the key check comes before
        # the body is looked at.
        middlewares=[count_requests, errors_as_json, require_api_key, limit_body],
        client_max_size=config.max_body_bytes,
    )
    app[keys.CONFIG] = config
    app[keys.API_KEYS] = ApiKeys(config.api_keys, config.per_key_concurrency)
    app[keys.METRICS] = Metrics(*config.model_ids)
    app.cleanup_ctx.append(tokenizer_ctx)
    app.cleanup_ctx.append(cluster_ctx)
    app.on_shutdown.append(abort_streams)
    app.router.add_post("/v1/chat/completions", handlers.chat_completions)
    app.router.add_post("/v1/completions", handlers.completions)
    app.router.add_post("/v1/messages", anthropic_api.messages)
    app.router.add_get("/v1/models", handlers.models)
    app.router.add_get("/v1/models/{model}", handlers.model)
    app.router.add_get("/v1/cluster", handlers.cluster)
    app.router.add_get("/health", handlers.health)
    app.router.add_get("/metrics", handlers.metrics)
    return app
