"""Routing and failures over real sockets: cache affinity, round robin, lost workers, aborts."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys

import msgpack
import openai
import pytest
import zmq
import zmq.asyncio

from router.http import app_keys
from shared.hashing import hash_blocks
from shared.kv_events import BlockRemoved, BlockStored
from shared.protocol import (
    PROTOCOL_VERSION,
    KVEvents,
    KVInventory,
    Register,
    SendInventory,
    decode,
    encode,
)
from tests.support.paths import ROOT

MODEL = "tiny"


def prompt(seed: int, n: int = 40) -> list[int]:
    return [60 + (seed * 7 + i) % 200 for i in range(n)]


def expected(alphabet, prompt_len, n):
    return [alphabet[(prompt_len + i) % len(alphabet)] for i in range(n)]


async def complete(api, token_ids, **kw):
    return await api.completions.create(model=MODEL, prompt=token_ids, max_tokens=2, **kw)


async def test_shared_prefix_goes_to_the_worker_that_holds_it(make_cluster):
    cluster = await make_cluster(policy="cache_aware")
    a = await cluster.add_worker("a")
    b = await cluster.add_worker("b")
    api = cluster.openai()
    await complete(api, prompt(1))
    await complete(api, prompt(2))  # equal cost: the idle workers take turns
    assert [len(a.received), len(b.received)] == [1, 1]
    first = a if a.received[0].token_ids == tuple(prompt(1)) else b
    second = b if first is a else a
    for _ in range(2):
        resp = await complete(api, prompt(1) + [70, 71, 72])
        await complete(api, prompt(2) + [80, 81])
    assert len(first.received) == 3 and len(second.received) == 3
    assert all(m.token_ids[:40] == tuple(prompt(1)) for m in first.received)
    assert resp.usage.prompt_tokens_details.cached_tokens == 40


async def test_in_flight_prefill_attracts_its_prefix_before_events_arrive(make_cluster):
    cluster = await make_cluster(policy="cache_aware", prefill_weight=1.0)
    a = await cluster.add_worker("a", silent=True)  # never answers, never sends KV events
    b = await cluster.add_worker("b", silent=True)
    dispatcher = cluster.dispatcher
    dispatcher.start("r1", prompt(1), _sampling())
    dispatcher.start("r2", prompt(1), _sampling())  # load 1 vs 0, but 10 blocks already "there"
    await cluster.wait_until(lambda: len(a.received) + len(b.received) == 2)
    assert sorted([len(a.received), len(b.received)]) == [0, 2]


def _sampling():
    from shared.sampling import SamplingParams

    return SamplingParams(max_tokens=1)


async def test_round_robin_distributes(make_cluster):
    cluster = await make_cluster(policy="round_robin")
    workers = [await cluster.add_worker(f"w{i}") for i in range(3)]
    api = cluster.openai()
    for _ in range(6):
        await complete(api, prompt(1))
    assert [len(w.received) for w in workers] == [2, 2, 2]


async def test_worker_killed_mid_stream_the_stream_completes_elsewhere(make_cluster):
    cluster = await make_cluster()
    w1 = await cluster.add_worker("w1", token_delay_s=0.03)
    api = cluster.openai()
    p = prompt(3)
    stream = await api.completions.create(
        model=MODEL, prompt=p, max_tokens=20, stream=True, stream_options={"include_usage": True}
    )
    chunks = [await anext(stream) for _ in range(3)]
    w2 = await cluster.add_worker("w2", token_delay_s=0.001)
    await cluster.kill_worker("w1")
    chunks += [c async for c in stream]
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    tokenizer = cluster.tokenizer
    assert text == tokenizer.decode(expected(w1.config.alphabet, len(p), 20))
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].usage.completion_tokens == 20 and chunks[-1].usage.prompt_tokens == 40
    (moved,) = w2.received
    done = len(moved.token_ids) - len(p)
    assert moved.token_ids[: len(p)] == tuple(p) and done >= 3
    assert moved.sampling.max_tokens == 20 - done
    assert (await cluster.client.get("/health")).status == 200
    view = await (await cluster.client.get("/v1/cluster")).json()
    assert {w["id"]: w["healthy"] for w in view["workers"]} == {"w1": False, "w2": True}


async def test_request_queued_on_a_stuck_worker_is_rerouted(make_cluster):
    cluster = await make_cluster()
    stuck = await cluster.add_worker("stuck", silent=True)
    task = asyncio.create_task(complete(cluster.openai(), prompt(4)))
    await cluster.wait_until(lambda: stuck.received)
    fresh = await cluster.add_worker("fresh")
    await cluster.kill_worker("stuck")
    resp = await task
    assert resp.choices[0].finish_reason == "length"
    assert fresh.received[0].token_ids == tuple(prompt(4))


async def test_real_worker_process_killed_mid_stream(make_cluster):
    cluster = await make_cluster()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.fake_worker",
            "--connect",
            cluster.zmq_endpoint,
            "--worker-id",
            "proc",
            "--token-delay",
            "0.03",
        ],
        cwd=str(ROOT),
    )
    try:
        registry = cluster.app[app_keys.CLUSTER].registry
        await cluster.wait_until(lambda: registry.get("proc") is not None, timeout=15)
        stream = await cluster.openai().completions.create(
            model=MODEL, prompt=prompt(5), max_tokens=30, stream=True
        )
        chunks = [await anext(stream) for _ in range(2)]
        await cluster.add_worker("backup")
        proc.send_signal(signal.SIGKILL)
        chunks += [c async for c in stream]
    finally:
        proc.kill()
        proc.wait()
    assert chunks[-1].choices[0].finish_reason == "length"
    tokenizer = cluster.tokenizer
    alphabet = cluster.workers["backup"][0].config.alphabet  # same default as the process
    assert "".join(c.choices[0].text for c in chunks) == tokenizer.decode(
        expected(alphabet, 40, 30)
    )


async def test_no_worker_left_ends_the_stream_with_an_error(make_cluster):
    cluster = await make_cluster()
    await cluster.add_worker("only", token_delay_s=0.03)
    stream = await cluster.openai().completions.create(
        model=MODEL, prompt=prompt(6), max_tokens=50, stream=True
    )
    await anext(stream)
    await cluster.kill_worker("only")
    with pytest.raises(openai.APIError, match="no other is available"):
        async for _ in stream:
            pass
    assert (await cluster.client.get("/health")).status == 503


async def test_client_disconnect_aborts_the_request(make_cluster):
    cluster = await make_cluster()
    worker = await cluster.add_worker("w1", token_delay_s=0.02)
    resp = await cluster.client.post(
        "/v1/completions",
        json={"model": MODEL, "prompt": "hello", "max_tokens": 200, "stream": True},
    )
    assert (await resp.content.readline()).startswith(b"data: ")
    resp.close()
    await cluster.wait_until(lambda: worker.aborted)
    assert worker.aborted == [worker.received[0].request_id]
    await cluster.wait_until(lambda: cluster.dispatcher.num_pending == 0)


async def test_protocol_mismatch_is_refused_and_garbage_is_dropped(make_cluster):
    cluster = await make_cluster()
    worker = await cluster.add_worker("old", protocol_version=PROTOCOL_VERSION + 1)
    assert not worker.ack.accepted and "protocol version" in worker.ack.reason
    assert (await cluster.client.get("/health")).status == 503
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(cluster.zmq_endpoint)
    for frame in [b"\xc1garbage", msgpack.packb([99, {}]), msgpack.packb([1, {"worker_id": 3}])]:
        await sock.send(frame)
    await sock.send_multipart([b"two", b"frames"])
    sock.close(linger=0)
    ctx.term()
    await cluster.add_worker("good")
    resp = await complete(cluster.openai(), prompt(7))
    assert resp.choices[0].finish_reason == "length"


async def test_reregistration_drops_the_workers_prefix_entries(make_cluster):
    cluster = await make_cluster()
    await cluster.add_worker("w1")
    await complete(cluster.openai(), prompt(8))
    index = cluster.app[app_keys.MODELS].default.index
    await cluster.wait_until(lambda: index.num_blocks("w1") == 10)
    await cluster.kill_worker("w1")
    await cluster.add_worker("w1")  # restarted with an empty cache
    assert index.num_blocks("w1") == 0


async def test_unknown_peer_is_asked_to_register(make_cluster):
    """A worker the router does not know (the router restarted) is told to register again."""
    from shared.protocol import Heartbeat, ReRegister, decode, encode

    cluster = await make_cluster()
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(cluster.zmq_endpoint)
    try:
        await sock.send(encode(Heartbeat("ghost", 0, 0, 10, 10, 0, 0)))
        assert await sock.poll(5000)
        assert isinstance(decode(await sock.recv()), ReRegister)
        await sock.send(encode(Heartbeat("ghost", 0, 0, 10, 10, 0, 0)))  # asked once per interval
        assert not await sock.poll(200)
    finally:
        sock.close(linger=0)
        ctx.term()


async def test_an_inventory_restores_a_registered_workers_index(make_cluster):
    """A worker registering with a router that knows nothing of it (restarted, or new to the
    fleet) sends what it holds; the index then equals it, events after it applied on top."""
    from shared.hashing import hash_blocks
    from shared.kv_events import BlockRemoved, BlockStored
    from shared.protocol import KVEvents, KVInventory, Register, decode, encode

    cluster = await make_cluster()
    index = cluster.app[app_keys.MODELS].default.index
    chain = hash_blocks(list(range(64)), 8)  # 8 blocks
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(cluster.zmq_endpoint)
    try:
        await sock.send(encode(Register("w9", "tiny", 8, 100, "host", 1)))
        assert await sock.poll(5000) and decode(await sock.recv()).accepted
        await sock.send(encode(KVEvents("w9", (BlockStored(chain[7], 0, (), 8),))))  # raced
        for part, blocks in enumerate((chain[:3], chain[3:5])):
            await sock.send(encode(KVInventory("w9", tuple(blocks), part=part, parts=2)))
        await sock.send(encode(KVEvents("w9", (BlockRemoved((chain[4],)),))))  # after it
        await cluster.wait_until(lambda: index.num_blocks("w9") == 4)
        assert index.match(chain, ["w9"]) == {"w9": 4}
        state = await (await cluster.client.get("/v1/cluster")).json()
        assert {w["id"]: w["index_blocks"] for w in state["workers"]} == {"w9": 4}
    finally:
        sock.close(linger=0)
        ctx.term()


# ---- KV events numbered per link (KVEvents.seq): a number skipped (frames dropped at ZeroMQ's
# queue limit) asks the worker for its inventory, which puts the index right again


CHAIN = hash_blocks(list(range(64)), 8)  # 8 chained blocks


def stored(i: int) -> BlockStored:
    return BlockStored(CHAIN[i], CHAIN[i - 1] if i else 0, (), 8)


async def next_request(sock) -> object | None:
    """The next message the router sends this worker (None within 300 ms)."""
    return decode(await sock.recv()) if await sock.poll(300) else None


async def test_an_event_gap_resyncs_the_index_from_the_inventory(make_cluster):
    cluster = await make_cluster()
    index = cluster.app[app_keys.MODELS].default.index
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(cluster.zmq_endpoint)
    try:
        await sock.send(encode(Register("w9", "tiny", 8, 100, "host", 1)))
        assert await sock.poll(5000) and decode(await sock.recv()).accepted
        await sock.send(encode(KVInventory("w9", tuple(CHAIN[:2]), last_seq=0)))
        await sock.send(encode(KVEvents("w9", (stored(2),), seq=1)))
        await sock.send(encode(KVEvents("w9", (stored(3),), seq=2)))
        await cluster.wait_until(lambda: index.num_blocks("w9") == 4)
        assert await next_request(sock) is None  # 1, 2: in order, nothing to ask

        # seq 3 is lost on the way: block 3 evicted, block 4 stored
        await sock.send(encode(KVEvents("w9", (stored(5),), seq=4)))
        ask = await next_request(sock)
        assert isinstance(ask, SendInventory) and "lost" in ask.reason
        await cluster.wait_until(lambda: index.num_blocks("w9") == 5)
        assert index.match(CHAIN, ["w9"]) == {"w9": 4}  # drifted: it still thinks 3 is there

        held = CHAIN[:3] + CHAIN[4:6]  # what the worker really holds
        await sock.send(encode(KVInventory("w9", tuple(held), last_seq=4)))
        await cluster.wait_until(lambda: index.match(CHAIN, ["w9"]) == {"w9": 3})
        assert index.num_blocks("w9") == 5
        await sock.send(encode(KVEvents("w9", (BlockRemoved((CHAIN[5],)),), seq=5)))
        await cluster.wait_until(lambda: index.num_blocks("w9") == 4)
        assert await next_request(sock) is None  # numbered on from the inventory's 4
        worker = cluster.app[app_keys.CLUSTER].registry.get("w9")
        assert worker.kv_gaps == 1 and worker.inventory_asked_at is None
    finally:
        sock.close(linger=0)
        ctx.term()


async def test_an_inventory_asked_for_and_lost_is_asked_for_again(make_cluster, monkeypatch):
    monkeypatch.setattr("router.cluster.listener.INVENTORY_RETRY_S", 0.0)
    cluster = await make_cluster()
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(cluster.zmq_endpoint)
    try:
        await sock.send(encode(Register("w8", "tiny", 8, 100, "host", 1)))
        assert await sock.poll(5000) and decode(await sock.recv()).accepted
        await sock.send(encode(KVEvents("w8", (stored(0),), seq=1)))
        await sock.send(encode(KVEvents("w8", (stored(2),), seq=3)))  # 2 lost
        assert isinstance(await next_request(sock), SendInventory)
        await sock.send(encode(KVEvents("w8", (stored(3),), seq=4)))  # no inventory came
        again = await next_request(sock)
        assert isinstance(again, SendInventory) and "did not come" in again.reason
        worker = cluster.app[app_keys.CLUSTER].registry.get("w8")
        assert worker.kv_gaps == 1
    finally:
        sock.close(linger=0)
        ctx.term()


async def test_an_older_worker_sending_unnumbered_events_is_never_asked(make_cluster):
    cluster = await make_cluster()
    index = cluster.app[app_keys.MODELS].default.index
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(cluster.zmq_endpoint)
    try:
        await sock.send(encode(Register("old", "tiny", 8, 100, "host", 1)))
        assert await sock.poll(5000) and decode(await sock.recv()).accepted
        for i in range(3):
            await sock.send(encode(KVEvents("old", (stored(i),))))  # seq 0 each
        await cluster.wait_until(lambda: index.num_blocks("old") == 3)
        assert await next_request(sock) is None
    finally:
        sock.close(linger=0)
        ctx.term()
