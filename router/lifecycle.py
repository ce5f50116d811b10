"""Resources and background tasks of the router app (aiohttp cleanup contexts), and shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from aiohttp import web

from router.chat.dialects import detect_dialect
from router.chat.hazards import clock_hazard
from router.chat.history import probe_arguments
from router.cluster.listener import Cluster
from router.cluster.models import ModelTable
from router.cluster.registry import WorkerRegistry
from router.cluster.worker_socket import WorkerSocket
from router.http import app_keys
from router.http.batch_runner import BatchRunner
from router.http.budgets import budgets_of
from router.placement import operator
from router.placement.catalog import entry_of
from router.placement.demand import Demand
from router.placement.placer import Placer
from router.routing.dispatcher import Dispatcher
from router.routing.models import ServedModel
from router.routing.policy import make_policy
from router.routing.prefix_index import PrefixIndex
from router.store import open_state
from router.text.tokenizer import ModelTokenizer
from router.text.volatile import VolatileText
from shared.models.embedding import embedding_spec

if TYPE_CHECKING:
    from router.config import ModelSpec

log = logging.getLogger(__name__)


async def state_ctx(app: web.Application) -> AsyncIterator[None]:
    """The stored /v1/responses replies and the keys' budget windows (router/store/): this
    router's own (a SQLite file, or memory), or the fleet's shared Redis."""
    config = app[app_keys.CONFIG]
    state = open_state(config)
    app[app_keys.RESPONSES] = state.responses
    app[app_keys.RECORDS] = state.records
    app[app_keys.BUDGETS] = budgets_of(config, state.ledger)
    app[app_keys.LEADERSHIP] = state.leadership
    budgets = "shared (state_url)" if config.state_url else "memory"  # the URL may hold a password
    log.info("stored responses: %s; key budgets: %s", state.where, budgets)
    yield
    await state.close()


async def tokenizer_ctx(app: web.Application) -> AsyncIterator[None]:
    """Each model's tokenizer, and the pool that tokenizes prompts off the loop (if any)."""
    config = app[app_keys.CONFIG]
    tokenizers = {}
    volatile = VolatileText(config.volatile_prompt_patterns)
    for spec in config.models:
        tokenizer = await asyncio.to_thread(
            ModelTokenizer.load, spec.path, config.context_length, volatile
        )
        if config.chat_template is not None:
            tokenizer.set_chat_template(config.chat_template)
        dialect = detect_dialect(
            tokenizer.template_source,
            tokenizer.vocab,
            spec.tool_call_parser or config.tool_call_parser,
            spec.reasoning_parser or config.reasoning_parser,
        )
        tokenizer.set_dialect(probe_arguments(dialect, tokenizer))
        log.info("%s: %s", spec.served_id, tokenizer.dialect.describe())
        if (hazard := clock_hazard(tokenizer)) is not None:
            log.warning("%s: cache hazard: %s", spec.served_id, hazard)
        tokenizers[spec.served_id] = tokenizer
    app[app_keys.TOKENIZERS] = tokenizers
    threads = config.tokenizer_threads
    pool = ThreadPoolExecutor(threads, thread_name_prefix="tokenize") if threads else None
    app[app_keys.TOKENIZE_POOL] = pool
    yield
    if pool is not None:
        pool.shutdown(wait=False, cancel_futures=True)


async def cluster_ctx(app: web.Application) -> AsyncIterator[None]:
    """The ZeroMQ socket, the worker registry, each model's index and dispatcher, and the
    background tasks."""
    config = app[app_keys.CONFIG]
    metrics = app[app_keys.METRICS]
    # The lambda looks `cluster` up when called: it is built below, after the socket.
    curve_files = None
    if config.curve_enabled:
        curve_files = (config.curve_secret_key, config.curve_authorized_keys)
    link = WorkerSocket(
        config.zmq_bind,
        on_unreachable=lambda identity: cluster.lose_identity(identity),
        curve_files=curve_files,
    )
    registry = WorkerRegistry()

    def serve(spec: ModelSpec) -> ServedModel:
        """One model: its tokenizer, and its own prefix index, policy state and jobs."""
        index = PrefixIndex(config.prefix_ttl_s)
        policy = make_policy(
            config.policy,
            config.prefill_weight,
            config.balance_abs_threshold,
            config.balance_rel_threshold,
        )
        model_metrics = metrics.model(spec.served_id)
        dispatcher = Dispatcher(
            registry,
            index,
            policy,
            link.send,
            model_metrics,
            config.max_pending_requests,
            config.max_resubmits,
            model=spec.served_id,
            pulls=config.kv_pulls,
            prefill_timeout_s=config.prefill_timeout_s,
            prefill_min_tokens=config.prefill_min_tokens,
            batch_yield_s=config.batch_yield_s,
        )
        tokenizer = app[app_keys.TOKENIZERS][spec.served_id]
        served = ServedModel(spec, tokenizer, index, dispatcher, model_metrics)
        served.embedding = embedding_spec(spec.path, spec.task)  # NotServable: says why
        if served.embedding is not None:
            log.info("%s: an embedding model (%s)", spec.served_id, served.embedding)
        return served

    models = ModelTable([serve(spec) for spec in config.models])
    cluster = Cluster(
        registry,
        models,
        link.send,
        metrics,
        config.heartbeat_interval_s,
        config.heartbeat_timeout_s,
        wedged_after_s=config.wedged_after_s,
    )
    entries = {spec.served_id: entry_of(spec) for spec in config.models}
    lead = app[app_keys.LEADERSHIP]
    placer = Placer(
        registry,
        entries,
        link.send,
        cluster.retire,
        time.monotonic,
        config.heartbeat_interval_s,
        leading=lambda: lead.leading,
    )
    demand = Demand(
        placer, registry, config.load_timeout_s, config.heartbeat_timeout_s, time.monotonic, lead
    )
    cluster.on_host, cluster.on_register = placer.handle, placer.on_registered
    demand.on_orders = lambda orders: operator.apply(demand, orders)
    for served in models:
        served.dispatcher.listen(cluster)
    app[app_keys.LINK] = link
    app[app_keys.MODELS] = models
    app[app_keys.CLUSTER] = cluster
    app[app_keys.DEMAND] = demand
    log.info("listening for workers and host agents on %s", link.endpoint)
    tasks = [_task(link.receive(cluster.handle)), _task(cluster.watch_heartbeats())]
    tasks.append(_task(demand.watch()))
    yield
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    link.close()


async def batch_ctx(app: web.Application) -> AsyncIterator[None]:
    """The Batch API's runner (router/http/batch_runner.py): it takes up the batches in the
    store, those a previous run of this router left unfinished included."""
    runner = BatchRunner(app)
    app[app_keys.BATCH_RUNNER] = runner
    task = _task(runner.watch())
    yield
    await runner.stop()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def stop_batches(app: web.Application) -> None:
    """on_shutdown, before abort_streams: a batch's lines in flight stop unrecorded (the next
    start re-runs them) rather than recording the shutdown's error as their answer."""
    runner = app.get(app_keys.BATCH_RUNNER)
    if runner is not None:
        await runner.stop()


async def abort_streams(app: web.Application) -> None:
    """on_shutdown: end every request in flight with an error, so open streams close."""
    for model in app.get(app_keys.MODELS, ()):
        model.dispatcher.fail_all("the router is shutting down")


def _task(coro: Coroutine) -> asyncio.Task:
    return asyncio.get_running_loop().create_task(coro)
