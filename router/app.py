"""The router's aiohttp application factory: wiring only."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from router.http import app_keys
from router.http.api_keys import ApiKeys
from router.http.endpoints import (
    admin,
    batches,
    embeddings,
    files,
    generation,
    info,
    ollama,
    stored_responses,
    tokenize,
)
from router.http.endpoints.dashboard import PAGE_PATHS, fleet_page
from router.http.middleware import count_requests, errors_as_json
from router.http.security import add_ratelimit_headers, limit_body, require_api_key
from router.lifecycle import (
    abort_streams,
    batch_ctx,
    cluster_ctx,
    state_ctx,
    stop_batches,
    tokenizer_ctx,
)
from router.metrics.router_metrics import Metrics
from router.metrics.tracing import router_tracer

if TYPE_CHECKING:
    from router.config import RouterConfig


def create_app(config: RouterConfig) -> web.Application:
    app = web.Application(
        # Outermost first: metrics and JSON errors see everything; the key check comes before
        # the body is looked at.
        middlewares=[count_requests, errors_as_json, require_api_key, limit_body],
        client_max_size=config.max_body_bytes,
    )
    app[app_keys.CONFIG] = config
    app[app_keys.API_KEYS] = ApiKeys(config.api_keys, config.per_key_concurrency)
    app[app_keys.METRICS] = Metrics(*config.model_ids)
    app[app_keys.TRACER] = router_tracer(config.otlp_endpoint)  # None unless configured
    app.on_response_prepare.append(add_ratelimit_headers)
    app.cleanup_ctx.append(state_ctx)  # stored responses, budgets: opened first, closed last
    app.cleanup_ctx.append(tokenizer_ctx)
    app.cleanup_ctx.append(cluster_ctx)
    app.cleanup_ctx.append(batch_ctx)  # after the cluster: its lines need the dispatchers
    app.on_shutdown.append(stop_batches)
    app.on_shutdown.append(abort_streams)
    app.router.add_post("/v1/chat/completions", generation.chat_completions)
    app.router.add_post("/v1/completions", generation.completions)
    app.router.add_post("/v1/messages", generation.messages)
    app.router.add_post("/v1/embeddings", embeddings.embeddings)
    app.router.add_post("/v1/responses", generation.responses)
    app.router.add_get("/v1/responses/{id}", stored_responses.get)
    app.router.add_delete("/v1/responses/{id}", stored_responses.delete)
    app.router.add_get("/v1/responses/{id}/input_items", stored_responses.input_items)
    app.router.add_post("/v1/responses/{id}/cancel", stored_responses.cancel)
    app.router.add_post("/v1/files", files.upload)
    app.router.add_get("/v1/files", files.list_files)
    app.router.add_get("/v1/files/{id}", files.retrieve)
    app.router.add_delete("/v1/files/{id}", files.delete)
    app.router.add_get("/v1/files/{id}/content", files.content)
    app.router.add_post("/v1/batches", batches.create)
    app.router.add_get("/v1/batches", batches.list_batches)
    app.router.add_get("/v1/batches/{id}", batches.retrieve)
    app.router.add_post("/v1/batches/{id}/cancel", batches.cancel)
    app.router.add_post("/v1/messages/count_tokens", tokenize.count_tokens)
    app.router.add_post("/tokenize", tokenize.tokenize)
    app.router.add_post("/detokenize", tokenize.detokenize)
    app.router.add_get("/v1/models", info.models)
    app.router.add_get("/v1/models/{model}", info.model)
    app.router.add_get("/v1/cluster", info.cluster)
    app.router.add_get("/v1/admin/models", admin.catalog)  # placement (router/placement/)
    app.router.add_post("/v1/admin/models/{model}/load", admin.load)
    app.router.add_post("/v1/admin/models/{model}/pull", admin.pull)
    app.router.add_post("/v1/admin/models/{model}/unload", admin.unload)
    app.router.add_post("/v1/admin/models/{model}/pin", admin.pin)
    app.router.add_post("/api/chat", ollama.chat)  # Ollama's API (docs/api.md)
    app.router.add_post("/api/generate", ollama.generate_text)
    app.router.add_post("/api/embed", ollama.embed)
    app.router.add_post("/api/embeddings", ollama.embeddings)
    app.router.add_get("/api/tags", ollama.tags)
    app.router.add_get("/api/ps", ollama.ps)
    app.router.add_post("/api/show", ollama.show_model)
    app.router.add_get("/api/version", ollama.version)
    app.router.add_post("/api/pull", ollama.pull)
    app.router.add_delete("/api/delete", ollama.delete)
    app.router.add_get("/health", info.health)
    app.router.add_get("/metrics", info.metrics)
    for path in PAGE_PATHS:  # the fleet page (its data calls need the key)
        app.router.add_get(path, fleet_page)
    return app
