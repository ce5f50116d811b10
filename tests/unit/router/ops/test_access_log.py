"""The access log: polls at DEBUG, one JSON line per request with --log-requests."""

from __future__ import annotations

import dataclasses
import json
import logging

from aiohttp.test_utils import TestClient, TestServer

from fleet.launch import Served, commands, load_settings
from fleet.launch import build_parser as launch_parser
from router.app import create_app
from router.cli import parse_args
from router.config import ModelSpec, RouterConfig
from router.http.access_log import AccessLogger
from shared.config.sections import ModelSection
from tests.conftest import LiveCluster

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


async def served(tiny_model_dir, **overrides) -> LiveCluster:
    config = RouterConfig(
        models=(ModelSpec(tiny_model_dir),), zmq_bind="tcp://127.0.0.1:*", responses_store="memory"
    )
    app = create_app(dataclasses.replace(config, **overrides))
    server = TestServer(app)
    await server.start_server(access_log_class=AccessLogger)  # as router/cli.py runs it
    client = TestClient(server)
    await client.start_server()
    cluster = LiveCluster(client)
    await cluster.add_worker("w1")
    return cluster


def access_lines(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "router.access" and r.levelno >= logging.INFO]


async def test_log_requests_writes_one_json_line_per_request_and_skips_polls(
    tiny_model_dir, caplog
):
    caplog.set_level(logging.INFO)
    cluster = await served(tiny_model_dir, log_requests=True)
    try:
        for _ in range(3):  # what launch-cluster and the fleet page do all day
            assert (await cluster.client.get("/v1/cluster")).status == 200
            assert (await cluster.client.get("/health")).status == 200
        resp = await cluster.client.post("/v1/chat/completions", json=CHAT)
        body = await resp.json()
        stream = await cluster.client.post("/v1/chat/completions", json=CHAT | {"stream": True})
        await stream.read()
        assert (await cluster.client.get("/v1/nope")).status == 404
    finally:
        await cluster.close()
    lines = [json.loads(r.getMessage()) for r in access_lines(caplog)]
    assert [line["path"] for line in lines] == ["/v1/chat/completions"] * 2 + ["/v1/nope"]
    whole, streamed, missing = lines
    assert whole["request_id"] == body["id"] and whole["model"] == "tiny"
    assert whole["status"] == 200 and whole["stream"] is False
    assert whole["prompt_tokens"] == body["usage"]["prompt_tokens"]
    assert whole["completion_tokens"] == body["usage"]["completion_tokens"]
    assert whole["duration_s"] > 0 and whole["remote"] == "127.0.0.1"
    assert streamed["stream"] is True and streamed["completion_tokens"] >= 1
    assert missing["status"] == 404 and "model" not in missing


async def test_without_log_requests_a_request_is_one_text_line(tiny_model_dir, caplog):
    caplog.set_level(logging.INFO)
    cluster = await served(tiny_model_dir)
    try:
        await cluster.client.get("/v1/cluster")
        assert (await cluster.client.post("/v1/chat/completions", json=CHAT)).status == 200
    finally:
        await cluster.close()
    [line] = [r.getMessage() for r in access_lines(caplog)]
    assert line.startswith("127.0.0.1 POST /v1/chat/completions 200 tiny ")


def test_log_requests_is_a_router_flag_and_launch_cluster_passes_it_on(tiny_model_dir):
    model = ["--model", str(tiny_model_dir)]
    assert parse_args([*model, "--log-requests"]).log_requests is True
    assert parse_args(model).log_requests is False
    args, fleet = load_settings(launch_parser(), [*model, "--log-requests"])
    assert fleet.router.log_requests is True
    one = Served(ModelSection(path=str(tiny_model_dir)), tiny_model_dir, 1)
    (router_cmd,), _ = commands(args, fleet, [one], 5555)
    assert "--log-requests" in router_cmd
