"""Every typed AppKey of the router app, in one place."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from aiohttp import web

from router.api_keys import ApiKeys
from router.cluster import Cluster
from router.config import RouterConfig
from router.dispatch import Dispatcher
from router.link import WorkerLink
from router.metrics import Metrics
from router.tokenization import ModelTokenizer

CONFIG = web.AppKey("config", RouterConfig)
METRICS = web.AppKey("metrics", Metrics)
TOKENIZER = web.AppKey("tokenizer", ModelTokenizer)
# None: prompts are parsed and tokenized on the event loop
TOKENIZE_POOL = web.AppKey("tokenize_pool", ThreadPoolExecutor | None)
CLUSTER = web.AppKey("cluster", Cluster)
DISPATCHER = web.AppKey("dispatcher", Dispatcher)
LINK = web.AppKey("link", WorkerLink)
API_KEYS = web.AppKey("api_keys", ApiKeys)
