"""The fleet cache over real sockets: peers in RegisterAck, pull hints, what the router shows."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from router.http import app_keys
from shared.protocol import LinkRate, Peer, PullHint

MODEL = "tiny"
BLOCK = 4
FAST = 1e9


def prompt(seed: int, n: int = 40) -> list[int]:
    return [60 + (seed * 7 + i) % 200 for i in range(n)]


def peer_options(worker_id: str, *links: LinkRate, **more) -> dict:
    return {
        "kv_endpoint": f"tcp://127.0.0.1:1{len(worker_id)}{ord(worker_id[0])}",
        "kv_bytes_per_token": 1000,
        "links": links,
        "prefill_tokens_per_s": 100.0,
        **more,
    }


def samples(text: str) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_register_ack_names_the_peers_of_the_same_layout(make_cluster):
    cluster = await make_cluster()
    a = await cluster.add_worker("a", **peer_options("a"))
    b = await cluster.add_worker("b", **peer_options("b"))
    q8 = await cluster.add_worker("q", **peer_options("q", kv_layout="q8g64"))
    none = await cluster.add_worker("n")  # no KV endpoint: nobody fetches from it
    assert a.ack.peers == ()
    assert b.ack.peers == (Peer("a", a.config.kv_endpoint),)
    assert q8.ack.peers == ()
    assert none.ack.peers == ()  # and the others know nothing of it either


async def _busy_holder_cluster(make_cluster, **overrides):
    cluster = await make_cluster(**overrides)
    a = await cluster.add_worker("a", **peer_options("a", LinkRate("b", FAST, 0.001)))
    b = await cluster.add_worker("b", **peer_options("b", LinkRate("a", FAST, 0.001)))
    registry = cluster.app[app_keys.CLUSTER].registry
    await cluster.wait_until(lambda: all(w.links for w in registry))
    api = cluster.openai()
    await api.completions.create(model=MODEL, prompt=prompt(1), max_tokens=1)
    holder, idle = (a, b) if a.received else (b, a)
    state = registry.get(holder.config.worker_id)
    await cluster.wait_until(lambda: state.heartbeat.prompt_tokens == 40)
    state.inflight.update(f"other-{i}#0" for i in range(6))  # the holder is busy
    resp = await api.completions.create(model=MODEL, prompt=prompt(1) + [7, 8], max_tokens=1)
    return cluster, holder, idle, resp


async def test_busy_holder_the_idle_worker_is_told_to_pull(make_cluster):
    cluster, holder, idle, _ = await _busy_holder_cluster(make_cluster)
    assert len(idle.received) == 1
    hint = idle.received[0].pull
    assert hint == PullHint(holder.config.worker_id, holder.config.kv_endpoint, 10)

    got = samples(await (await cluster.client.get("/metrics")).text())
    kind = (("kind", "pull"), ("model_name", MODEL))
    assert got[("mlx_fleet_routing_decisions_total", kind)] == 1
    recompute = (("kind", "recompute"), ("model_name", MODEL))
    assert got[("mlx_fleet_routing_decisions_total", recompute)] == 1
    assert got[("mlx_fleet_prefix_pulled_tokens_total", (("model_name", MODEL),))] == 40
    idle_label = (("worker", idle.config.worker_id),)
    assert got[("mlx_fleet_worker_routed_pull_tokens_total", idle_label)] == 40
    assert got[("mlx_fleet_worker_pulled_blocks_total", idle_label)] == 0
    assert got[("mlx_fleet_worker_prefill_tokens_per_s", idle_label)] == 100.0
    link = (("peer", holder.config.worker_id), ("worker", idle.config.worker_id))
    assert got[("mlx_fleet_worker_link_bytes_per_second", link)] == FAST


async def test_pulls_off_the_holder_waits_or_the_idle_worker_recomputes(make_cluster):
    cluster, holder, idle, _ = await _busy_holder_cluster(make_cluster, kv_pulls=False)
    assert all(m.pull is None for m in holder.received + idle.received)
    assert len(holder.received) == 2  # 10 blocks to recompute cost more than 6 queued


async def test_cluster_page_shows_the_fleet_cache(make_cluster):
    cluster = await make_cluster()
    await cluster.add_worker("a", **peer_options("a", LinkRate("b", FAST, 0.002), pulled_blocks=7))
    registry = cluster.app[app_keys.CLUSTER].registry
    await cluster.wait_until(lambda: all(w.heartbeat for w in registry))
    body = await (await cluster.client.get("/v1/cluster")).json()
    (worker,) = body["workers"]
    assert worker["kv_endpoint"] == peer_options("a")["kv_endpoint"]
    assert worker["role"] == "both"
    assert worker["links"] == [{"peer_id": "b", "bytes_per_s": FAST, "latency_s": 0.002}]
    assert (worker["pulled_blocks"], worker["pull_failures"]) == (7, 0)
    assert worker["prefill_tokens_per_s"] == 100.0
    cache = body["cache"]
    assert cache["pulled_tokens"] == 7 * BLOCK
    assert set(cache) == {
        "prompt_tokens",
        "local_hit_tokens",
        "pulled_tokens",
        "local_hit_rate",
        "hit_rate_with_pulls",
    }


async def test_a_prefill_workers_prompts_are_not_counted_twice(make_cluster):
    cluster = await make_cluster()
    await cluster.add_worker("d", **peer_options("d", pulled_blocks=5))
    await cluster.add_worker("p", **peer_options("p", pulled_blocks=3), role="prefill")
    registry = cluster.app[app_keys.CLUSTER].registry
    await cluster.wait_until(
        lambda: len(list(registry)) == 2 and all(w.heartbeat for w in registry)
    )
    assert {w.worker_id: w.role for w in registry} == {"d": "both", "p": "prefill"}
    body = await (await cluster.client.get("/v1/cluster")).json()
    assert body["cache"]["pulled_tokens"] == 5 * BLOCK  # the decoder's only
