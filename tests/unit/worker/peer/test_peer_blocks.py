"""Peer block transfer between two engines in one process, over real loopback sockets: each
engine's thread is the test's, which takes the loop's turns by hand."""

from __future__ import annotations

import time

import pytest
import zmq

from shared.hashing import hash_blocks
from shared.kv_events import BlockStored
from shared.kv_transfer import (
    FetchBlocks,
    FetchReply,
    Probe,
    ProbeReply,
    decode,
    encode,
    with_block_frames,
)
from shared.protocol import Generate, Peer, PullHint
from shared.sampling import SamplingParams
from tests.support.engine_fixtures import (
    make_engine,
    reference_greedy,
    run_to_completion,
    tiny_model,
)
from tests.unit.worker.quant.conftest import tiny_quantizable_model
from worker.peer.channel import PeerChannel
from worker.peer.fetch import ask
from worker.peer.node import PeerNode

PROMPT = [(7 * i + 3) % 97 for i in range(61)]  # 7 full blocks of 8 and a tail
GREEDY = SamplingParams(max_tokens=6, temperature=0.0)


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", seed=5)


def node(engine, timeout_s: float = 5.0) -> PeerNode:
    peer = PeerNode(engine, PeerChannel("tcp://127.0.0.1:0"), lambda: None, timeout_s)
    peer.start()
    return peer


@pytest.fixture
def pair(model):
    holder, puller = make_engine(model), make_engine(model)
    nodes = node(holder), node(puller)
    yield holder, puller, *nodes
    for n in nodes:
        n.stop()


def pull(puller_node, holders, msg, timeout: float = 15.0) -> list[Generate]:
    """Park `msg`, take turns (the holders serve) until it is ready to admit."""
    assert puller_node.park(msg)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for h in holders:
            h.turn()
        ready = puller_node.turn()
        if ready:
            return ready
        time.sleep(0.005)
    raise AssertionError("the pull never finished")


def generate(holder_node, num_blocks: int = 7, rid: str = "r1") -> Generate:
    hint = PullHint("holder", holder_node.endpoint, num_blocks)
    return Generate(rid, tuple(PROMPT), GREEDY, pull=hint)


def check_integrity(*engines) -> None:
    for e in engines:
        e.pool.check_integrity()
        e.cache.check_integrity()


def warm(holder) -> None:
    holder.add_request("warm", PROMPT, GREEDY)
    run_to_completion(holder)


def test_pulled_prefix_gives_the_recomputed_output(model, pair):
    holder, puller, holder_node, puller_node = pair
    warm(holder)
    msg = generate(holder_node)
    [ready] = pull(puller_node, [holder_node], msg)
    assert ready is msg and puller_node.pulled_blocks == 7 and puller_node.pull_failures == 0
    assert holder_node.blocks.served_blocks == 7
    stored = [e.block_hash for e in puller.drain_kv_events() if isinstance(e, BlockStored)]
    assert stored == hash_blocks(PROMPT, 8)  # the router hears of the pulled blocks
    puller.add_request(msg.request_id, PROMPT, GREEDY)
    out = run_to_completion(puller)
    assert out["r1"] == reference_greedy(model, PROMPT, 6)
    assert puller.load().hit_tokens == 56  # admission hit every pulled block
    assert puller_node.links.snapshot()[0].bytes_per_s > 0
    check_integrity(holder, puller)


def test_only_missing_blocks_are_fetched(model, pair):
    holder, puller, holder_node, puller_node = pair
    warm(holder)
    puller.add_request("mine", PROMPT[:24], GREEDY)  # caches 3 blocks here
    run_to_completion(puller)
    req = puller_node.blocks.wanted("x", PROMPT, 7)
    assert req.start_block == 3 and len(req.block_hashes) == 4
    pull(puller_node, [holder_node], generate(holder_node))
    assert puller_node.pulled_blocks == 4
    check_integrity(holder, puller)


def test_holder_without_the_blocks_falls_back(model, pair):
    holder, puller, holder_node, puller_node = pair
    msg = generate(holder_node)
    pull(puller_node, [holder_node], msg)
    assert puller_node.pull_failures == 1 and puller_node.pulled_blocks == 0
    puller.add_request(msg.request_id, PROMPT, GREEDY)
    assert run_to_completion(puller)["r1"] == reference_greedy(model, PROMPT, 6)
    check_integrity(holder, puller)


def test_foreign_model_blocks_are_refused(model):
    other = make_engine(tiny_model("llama", seed=6))
    puller = make_engine(model)
    other_node, puller_node = node(other), node(puller)
    try:
        warm(other)
        msg = generate(other_node)
        pull(puller_node, [other_node], msg)
        assert puller_node.pull_failures == 1 and puller_node.pulled_blocks == 0
        assert other_node.blocks.served_blocks == 0  # the holder refused the fingerprint
        puller.add_request(msg.request_id, PROMPT, GREEDY)
        assert run_to_completion(puller)["r1"] == reference_greedy(model, PROMPT, 6)
        check_integrity(other, puller)
    finally:
        other_node.stop()
        puller_node.stop()


def test_dead_holder_times_out_and_computes(model):
    puller = make_engine(model)
    puller_node = node(puller, timeout_s=0.5)
    ctx = zmq.Context()
    silent = ctx.socket(zmq.ROUTER)  # accepts the request, never answers
    port = silent.bind_to_random_port("tcp://127.0.0.1")
    try:
        msg = Generate(
            "r1", tuple(PROMPT), GREEDY, pull=PullHint("h", f"tcp://127.0.0.1:{port}", 7)
        )
        start = time.monotonic()
        pull(puller_node, [], msg)
        assert time.monotonic() - start < 3 and puller_node.pull_failures == 1
        puller.add_request("r1", PROMPT, GREEDY)
        assert run_to_completion(puller)["r1"] == reference_greedy(model, PROMPT, 6)
        check_integrity(puller)
    finally:
        silent.close(linger=0)
        ctx.term()
        puller_node.stop()


def test_garbage_frames_are_refused_and_serving_goes_on(model, pair):
    holder, puller, holder_node, puller_node = pair
    warm(holder)
    ctx = zmq.Context()
    try:
        for garbage in (b"\xc1\x00garbage", encode(Probe("p"))[:3], b""):
            sock = ctx.socket(zmq.DEALER)
            sock.connect(holder_node.endpoint)
            sock.send(garbage)
            assert sock.poll(5000)
            assert decode(sock.recv()).error
            sock.close(linger=0)
        good = puller_node.blocks.wanted("bad", PROMPT, 7)
        bad = FetchBlocks("bad", good.token_ids, 0, (1, 2, 3), good.fingerprint)  # wrong hashes
        reply = _served(ctx, holder_node, bad)
        assert reply.error and not reply.blocks
        probe = ask(ctx, holder_node.endpoint, Probe("p", 1000), 5.0)
        assert isinstance(probe, ProbeReply) and len(probe.payload) == 1000
    finally:
        ctx.destroy(linger=0)
    assert holder_node.server.refused == 3
    pull(puller_node, [holder_node], generate(holder_node))
    assert puller_node.pulled_blocks == 7
    check_integrity(holder, puller)


def _served(ctx, holder_node, req) -> FetchReply:
    sock = ctx.socket(zmq.DEALER)
    sock.connect(holder_node.endpoint)
    sock.send(encode(req))
    deadline = time.monotonic() + 5
    while not sock.poll(10) and time.monotonic() < deadline:
        holder_node.turn()
    head, *blocks = sock.recv_multipart()  # the message, then one frame per block
    sock.close(linger=0)
    return with_block_frames(decode(head), blocks)


def test_corrupt_blocks_are_dropped(model, pair):
    holder, puller, holder_node, puller_node = pair
    warm(holder)
    ctx = zmq.Context()
    try:
        req = puller_node.blocks.wanted("c", PROMPT, 7)
        reply = _served(ctx, holder_node, req)
    finally:
        ctx.destroy(linger=0)
    flipped = (bytes([reply.blocks[0][0] ^ 1]) + reply.blocks[0][1:],) + reply.blocks[1:]
    corrupt = FetchReply(**{**{f: getattr(reply, f) for f in reply.__slots__}, "blocks": flipped})
    with pytest.raises(Exception, match="checksum"):
        puller_node.blocks.load(req, corrupt)
    assert puller_node.blocks.load(req, reply) == 7
    check_integrity(holder, puller)


def test_abort_of_a_parked_request(model, pair):
    holder, puller, holder_node, puller_node = pair
    warm(holder)
    msg = generate(holder_node)
    assert puller_node.park(msg)
    assert puller_node.abort("r1") and puller_node.parked == 0
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and holder_node.blocks.served_blocks == 0:
        holder_node.turn()
        assert puller_node.turn() == []
    time.sleep(0.2)
    assert puller_node.turn() == [] and puller_node.pulled_blocks == 0
    check_integrity(holder, puller)


def test_probes_measure_the_links(model, pair):
    holder, puller, holder_node, puller_node = pair
    puller_node.set_peers((Peer("holder", holder_node.endpoint),))
    deadline = time.monotonic() + 10
    while not puller_node.links.snapshot() and time.monotonic() < deadline:
        time.sleep(0.05)
    [link] = puller_node.links.snapshot()
    assert link.peer_id == "holder" and link.bytes_per_s > 1e6 and 0 < link.latency_s < 1


def test_quantized_pools_travel_as_their_bytes():
    model = tiny_quantizable_model()
    holder, puller = make_engine(model, kv_bits=8), make_engine(model, kv_bits=8)
    holder_node, puller_node = node(holder), node(puller)
    try:
        warm(holder)
        msg = generate(holder_node)
        pull(puller_node, [holder_node], msg)
        assert puller_node.pulled_blocks == 7
        holder.add_request("again", PROMPT, GREEDY)
        puller.add_request("r1", PROMPT, GREEDY)
        assert run_to_completion(puller)["r1"] == run_to_completion(holder)["again"]
        check_integrity(holder, puller)
    finally:
        holder_node.stop()
        puller_node.stop()


def test_block_frames_belong_to_a_fetch_reply_only():
    from shared.kv_transfer import ProtocolError, reply_frames

    reply = FetchReply("r", "fp", "layout", (1, 2), (b"ab", b"cd"), "crc32:0")
    head, *blocks = reply_frames(reply)
    assert decode(head).blocks == () and blocks == [b"ab", b"cd"]
    assert with_block_frames(decode(head), blocks) == reply
    with pytest.raises(ProtocolError):
        with_block_frames(reply, [b"ef"])  # blocks both inside and after
    with pytest.raises(ProtocolError):
        with_block_frames(ProbeReply("p"), [b"ef"])
