"""A worker's KV blocks by state in /v1/cluster, /metrics and the fleet page: free, held by
requests, cached full blocks, cached partial tails; an idle worker's add up to its total."""

from __future__ import annotations

import asyncio

from prometheus_client.parser import text_string_to_metric_families

from router.http.endpoints.dashboard import _page
from router.metrics.kv_blocks import KVBlocks
from shared.protocol import Heartbeat

STATES = ("kv_free_blocks", "kv_held_blocks", "kv_cached_blocks", "kv_cached_partial_blocks")


def test_held_is_what_neither_the_free_list_nor_the_cache_accounts_for():
    hb = Heartbeat("w", 1, 0, 50, 100, 30, 0, cached_partial_blocks=6)
    assert KVBlocks.of(hb) == KVBlocks(
        total=100, free=50, held=14, cached_full=30, cached_partial=6
    )
    older = Heartbeat("w", 0, 0, 60, 100, 30, 0)  # a worker that does not report tails
    assert KVBlocks.of(older).held == 10


async def test_cluster_metrics_and_page_show_every_state(make_cluster):
    cluster = await make_cluster()
    await cluster.add_worker("w1", kv_capacity_blocks=64, partial_blocks=3)
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi " * 20}], "max_tokens": 2}
    assert (await cluster.client.post("/v1/chat/completions", json=chat)).status == 200

    for _ in range(100):  # until a heartbeat after the request shows its cached blocks
        (w,) = (await (await cluster.client.get("/v1/cluster")).json())["workers"]
        if w["kv_cached_blocks"]:
            break
        await asyncio.sleep(0.02)
    assert w["kv_cached_blocks"] > 0 and w["kv_cached_partial_blocks"] == 3
    assert w["kv_held_blocks"] == 0
    assert sum(w[k] for k in STATES) == w["kv_total_blocks"] == 64

    text = await (await cluster.client.get("/metrics")).text()
    got = {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.labels.get("worker") == "w1"
    }
    for key in STATES:
        assert f"mlx_fleet_worker_{key}" in got, key
    assert sum(got[f"mlx_fleet_worker_{k}"] for k in STATES) == 64
    assert got["mlx_fleet_worker_kv_cached_partial_blocks"] == 3

    page = _page().decode()
    for key in STATES:
        assert f"w.{key}" in page, key  # the KV cell shows each state
