"""The load generator against real sockets: the router with stand-in workers, and a tiny
hand-written SSE server (no usage chunk, errors)."""

from __future__ import annotations

import asyncio
import json

from aiohttp import web
from aiohttp.test_utils import TestServer

from scripts.loadgen import cli
from scripts.loadgen.runner import LoadConfig, run_load
from scripts.loadgen.workloads import Shape

SMALL = Shape(tenants=2, prefix_words=30, question_words=4, turns=3, answer_words=8, shots=2)


async def router_with_workers(make_cluster, n: int, **worker_options):
    cluster = await make_cluster(context_length=8192, policy="cache_aware")
    for i in range(n):
        await cluster.add_worker(f"w{i}", **worker_options)
    return cluster, str(cluster.client.make_url("")).rstrip("/")


def config(url: str, **overrides) -> LoadConfig:
    options = dict(url=url, requests=16, concurrency=4, max_tokens=5, shape=SMALL, warmup=1)
    return LoadConfig(**{**options, **overrides})


async def test_closed_loop_against_the_router_counts_tokens_cache_hits_and_workers(make_cluster):
    cluster, url = await router_with_workers(make_cluster, 2)
    progress = []
    report = await run_load(config(url), lambda done, total: progress.append((done, total)))
    assert (report["completed"], report["errors"], report["not_sent"]) == (16, 0, 0)
    assert report["model"] == "tiny"  # asked /v1/models
    assert report["output_tokens"] == 16 * 5 and report["tokens_counted_from"] == "usage"
    assert report["policy"] == "cache_aware"
    assert sum(report["requests_per_worker"].values()) == 16  # the warmup is not counted
    assert set(report["worker_phases"]) == set(report["requests_per_worker"])
    assert report["cache_hit_rate"] > 0.3  # 2 tenants' long system prompts
    assert progress[-1] == (16, 16) and len(progress) == 16
    for metric in ("ttft_ms", "tpot_ms", "e2e_ms"):
        assert all(v is not None and v >= 0 for v in report[metric].values())
    assert report["ttft_ms"]["p50"] <= report["e2e_ms"]["p50"]


async def test_control_workload_hits_the_cache_far_less_than_multi_tenant(make_cluster):
    _, url = await router_with_workers(make_cluster, 1)
    shared = await run_load(config(url, workload="multi_tenant", seed=1))
    control = await run_load(config(url, workload="control", seed=2))
    assert control["errors"] == 0
    assert control["cache_hit_rate"] < 0.2 < shared["cache_hit_rate"]


async def test_open_loop_sends_everything_and_reports_its_rate(make_cluster):
    _, url = await router_with_workers(make_cluster, 2, token_delay_s=0.002)
    report = await run_load(config(url, workload="multi_turn", rate=200.0, requests=12))
    assert report["mode"] == "open" and report["rate"] == 200.0 and "concurrency" not in report
    assert (report["completed"], report["errors"]) == (12, 0), report["first_errors"]


async def test_a_run_stops_starting_requests_after_its_time_limit(make_cluster):
    _, url = await router_with_workers(make_cluster, 1, token_delay_s=0.01)
    report = await run_load(config(url, requests=50, concurrency=1, max_duration_s=0.0))
    assert report["completed"] == 0 and report["not_sent"] == 50


# ------------------------------------------------------------ a hand-written server


def sse(body: dict | str) -> bytes:
    return b"data: " + (body if isinstance(body, str) else json.dumps(body)).encode() + b"\n\n"


async def plain_server(mode: str) -> TestServer:
    """Streams 'a', 'b', 'c' as three deltas with no usage chunk; or fails in `mode`."""

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
        if mode == "reject":
            return web.json_response({"error": {"message": "model not found"}}, status=404)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(sse({"choices": [{"index": 0, "delta": {"role": "assistant"}}]}))
        for text in "abc":
            await asyncio.sleep(0.001)
            await resp.write(sse({"choices": [{"index": 0, "delta": {"content": text}}]}))
        if mode == "malformed":
            await resp.write(sse({"choices": "not a list of choices"}))
        if mode == "midstream_error":
            await resp.write(sse({"error": {"message": "worker lost", "code": 500}}))
        if mode != "no_done":
            await resp.write(sse("[DONE]"))
        return resp

    async def models(request):
        return web.json_response({"object": "list", "data": [{"id": "plain"}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server


async def test_without_usage_tokens_are_counted_from_deltas_and_no_cluster_info():
    server = await plain_server("ok")
    try:
        report = await run_load(config(str(server.make_url("")), requests=4))
    finally:
        await server.close()
    assert report["completed"] == 4 and report["output_tokens"] == 12
    assert report["tokens_counted_from"] == "deltas"
    assert report["cache_hit_rate"] is None and report["requests_per_worker"] is None


async def test_failures_are_counted_with_their_messages():
    for mode, message in [
        ("reject", "HTTP 404"),
        ("midstream_error", "stream error: worker lost"),
        ("no_done", "without [DONE]"),
        ("malformed", "malformed stream chunk"),
    ]:
        server = await plain_server(mode)
        try:
            report = await run_load(config(str(server.make_url("")), requests=3, model="m"))
        finally:
            await server.close()
        assert report["errors"] == 3 and report["completed"] == 0
        assert len(report["first_errors"]) == 1 and message in report["first_errors"][0]


async def test_cli_prints_one_json_report_line(capsys):
    server = await plain_server("ok")
    argv = [
        "--url",
        str(server.make_url("")),
        "--requests",
        "3",
        "--quiet",
        "--workload",
        "few_shot",
        "--shots",
        "1",
        "--max-tokens",
        "3",
    ]
    try:
        code = await asyncio.to_thread(cli.main, argv)
    finally:
        await server.close()
    lines = capsys.readouterr().out.strip().splitlines()
    assert code == 0 and len(lines) == 1
    report = json.loads(lines[0])
    assert report["workload"] == "few_shot" and report["completed"] == 3
