"""Every typed AppKey of the router app, in one place."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from aiohttp import web

from router.api.batch.objects import Records
from router.api.responses.store import ResponseStore
from router.cluster.listener import Cluster
from router.cluster.models import ModelTable
from router.cluster.worker_socket import WorkerSocket
from router.config import RouterConfig
from router.http.api_keys import ApiKeys
from router.http.budgets import KeyBudgets
from router.metrics.router_metrics import Metrics
from router.placement.demand import Demand
from router.placement.leadership import Leadership
from router.routing.models import ServedModel
from router.text.tokenizer import ModelTokenizer

CONFIG = web.AppKey("config", RouterConfig)
METRICS = web.AppKey("metrics", Metrics)
TOKENIZERS = web.AppKey("tokenizers", dict[str, ModelTokenizer])  # by model id
# None: prompts are parsed and tokenized on the event loop
TOKENIZE_POOL = web.AppKey("tokenize_pool", ThreadPoolExecutor | None)
CLUSTER = web.AppKey("cluster", Cluster)
MODELS = web.AppKey(
    "models", ModelTable[ServedModel]
)  # each with its tokenizer, index and dispatcher
LINK = web.AppKey("link", WorkerSocket)  # the ZeroMQ socket the workers connect to
API_KEYS = web.AppKey("api_keys", ApiKeys)
RESPONSES = web.AppKey("responses", ResponseStore)  # /v1/responses kept (router/store/)
BUDGETS = web.AppKey("budgets", KeyBudgets)  # requests and tokens per minute per key
TRACER = web.AppKey("tracer", object)  # an OpenTelemetry Tracer; None: tracing off
RECORDS = web.AppKey("records", Records)  # files, batches, their progress (router/store/)
BATCH_RUNNER = web.AppKey("batch_runner", object)  # router/http/batch_runner.BatchRunner
DEMAND = web.AppKey("demand", Demand)  # catalog models placed on host agents by demand
LEADERSHIP = web.AppKey("leadership", Leadership)  # who places: this router, or the lease's
