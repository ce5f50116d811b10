"""A worker whose step loop is stuck keeps heartbeating (the link thread does that): the router
sees its loop counter stand still while it has work, takes it out of service, and moves its
requests to another worker."""

from __future__ import annotations

import asyncio

from router.http import app_keys

MODEL = "tiny"


async def test_wedged_worker_is_taken_out_and_its_request_completes_elsewhere(make_cluster):
    cluster = await make_cluster(wedged_after_s=0.3)
    stuck = await cluster.add_worker("stuck", wedged=True)
    api = cluster.openai()
    task = asyncio.create_task(
        api.completions.create(model=MODEL, prompt=[1, 2, 3, 4], max_tokens=6)
    )
    await cluster.wait_until(lambda: stuck.received)
    fresh = await cluster.add_worker("fresh")
    resp = await asyncio.wait_for(task, 5)
    assert resp.choices[0].finish_reason == "length" and resp.usage.completion_tokens == 6
    assert fresh.received[0].token_ids == (1, 2, 3, 4)
    registry = cluster.app[app_keys.CLUSTER].registry
    stuck_state = registry.get("stuck")
    assert stuck_state.wedged and not stuck_state.healthy
    await asyncio.sleep(0.2)  # its heartbeats go on: they do not bring it back
    assert not registry.get("stuck").healthy
    view = await (await cluster.client.get("/v1/cluster")).json()
    assert {w["id"]: w["healthy"] for w in view["workers"]} == {"stuck": False, "fresh": True}
    # new requests go to the healthy worker only
    await api.completions.create(model=MODEL, prompt=[5, 6, 7], max_tokens=2)
    assert len(stuck.received) == 1 and len(fresh.received) == 2


async def test_an_idle_worker_with_a_still_counter_is_not_wedged(make_cluster):
    cluster = await make_cluster(wedged_after_s=0.2)
    idle = await cluster.add_worker("idle", wedged=True)  # no request: not busy, not judged
    await asyncio.sleep(0.5)
    assert cluster.app[app_keys.CLUSTER].registry.get("idle").healthy
    assert not idle.received
