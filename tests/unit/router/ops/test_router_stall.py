"""A router whose own event loop stalls (no CPU under load, a long GC) does not call its
workers lost for the heartbeats it could not read meanwhile."""

from __future__ import annotations

import asyncio
import time

from router.http import app_keys


async def test_a_stalled_router_keeps_its_workers(make_cluster):
    cluster = await make_cluster()  # heartbeats every 0.05 s, a worker lost after 0.4 s silent
    await cluster.add_worker("w1", token_delay_s=0.02)
    registry = cluster.app[app_keys.CLUSTER].registry
    (state,) = registry.healthy()
    api = cluster.openai()
    reply = asyncio.create_task(api.completions.create(model="tiny", prompt=[1, 2], max_tokens=30))
    await asyncio.sleep(0.2)
    time.sleep(0.8)  # the whole process stalls, mid-request: router and worker alike
    resp = await reply  # not failed as "worker lost"
    assert resp.choices[0].finish_reason == "length" and resp.usage.completion_tokens == 30
    assert state.healthy and registry.healthy() == [state]  # never lost (nor registered anew)


async def test_a_silent_worker_is_still_lost(make_cluster):
    cluster = await make_cluster()
    await cluster.add_worker("w1")
    registry = cluster.app[app_keys.CLUSTER].registry
    await cluster.kill_worker("w1")  # no more heartbeats, and the router is not stalled
    await cluster.wait_until(lambda: not registry.healthy(), timeout=1.0)
