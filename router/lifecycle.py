"""Resources and background tasks of the router app (aiohttp cleanup contexts), and shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Coroutine
from concurrent.futures import ThreadPoolExecutor

from aiohttp import web

from router import keys
from router.cluster import Cluster
from router.dispatch import Dispatcher
from router.link import WorkerLink
from router.policy import make_policy
from router.prefix_index import PrefixIndex
from router.tokenization import ModelTokenizer
from router.workers import WorkerRegistry

log = logging.getLogger(__name__)


async def tokenizer_ctx(app: web.Application) -> AsyncIterator[None]:
    config = app[keys.CONFIG]
    tokenizer = await asyncio.to_thread(
        ModelTokenizer.load, config.model_dir, config.context_length
    )
    if config.chat_template is not None:
        tokenizer.set_chat_template(config.chat_template)
    tokenizer.tool_call_parser = config.tool_call_parser
    app[keys.TOKENIZER] = tokenizer
    threads = config.tokenizer_threads
    pool = ThreadPoolExecutor(threads, thread_name_prefix="tokenize") if threads else None
    app[keys.TOKENIZE_POOL] = pool
    yield
    if pool is not None:
        pool.shutdown(wait=False, cancel_futures=True)


async def parse_off_loop(app: web.Application, parse, *args):
    """`parse(*args)` (body checks, chat template, tokenizer) in the tokenize pool when there
    is one, else here; its ApiError reaches the caller either way."""
    pool = app[keys.TOKENIZE_POOL]
    if pool is None:
        return parse(*args)
    return await asyncio.get_running_loop().run_in_executor(pool, parse, *args)


async def cluster_ctx(app: web.Application) -> AsyncIterator[None]:
    """The ZeroMQ socket, the worker registry and dispatcher, and their background tasks."""
    config = app[keys.CONFIG]
    metrics = app[keys.METRICS]
    # The lambda looks `cluster` up when called: it is built below, after the link.
    curve_files = None
    if config.curve_enabled:
        curve_files = (config.curve_secret_key, config.curve_authorized_keys)
    link = WorkerLink(
        config.zmq_bind,
        on_unreachable=lambda identity: cluster.lose_identity(identity),
        curve_files=curve_files,
    )
    registry = WorkerRegistry()
    index = PrefixIndex(config.prefix_ttl_s)
    policy = make_policy(
        config.policy,
        config.prefill_weight,
        config.balance_abs_threshold,
        config.balance_rel_threshold,
    )
    dispatcher = Dispatcher(
        registry,
        index,
        policy,
        link.send,
        metrics,
        config.max_pending_requests,
        config.max_resubmits,
    )
    cluster = Cluster(
        registry,
        index,
        dispatcher,
        link.send,
        metrics,
        config.heartbeat_interval_s,
        config.heartbeat_timeout_s,
    )
    app[keys.LINK] = link
    app[keys.DISPATCHER] = dispatcher
    app[keys.CLUSTER] = cluster
    log.info("listening for workers on %s", link.endpoint)
    tasks = [_task(link.receive(cluster.handle)), _task(cluster.watch_heartbeats())]
    yield
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    link.close()


async def abort_streams(app: web.Application) -> None:
    """on_shutdown: end every request in flight with an error, so open streams close."""
    if keys.DISPATCHER in app:
        app[keys.DISPATCHER].fail_all("the router is shutting down")


def _task(coro: Coroutine) -> asyncio.Task:
    return asyncio.get_running_loop().create_task(coro)
