"""KV events in vLLM's format (worker/kv_publish.py), read back as a vLLM subscriber reads them:
msgspec structs with `array_like=True, tag=True` (vLLM's published types, field for field),
over a real SUB socket; the replay socket; and a worker loop publishing what its cache does."""

from __future__ import annotations

import threading

import msgspec
import pytest
import zmq

from shared.hashing import ROOT_PARENT_HASH, hash_blocks
from shared.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from shared.protocol import Generate, Register, RegisterAck, TokenDelta
from shared.sampling import SamplingParams
from tests.support.engine_fixtures import make_engine, tiny_model
from tests.unit.worker.engine.test_worker_loop import FakeRouter
from worker.kv_publish import END_SEQ, VllmEventPublisher
from worker.loop import WorkerLoop


# vLLM's wire types (vllm/distributed/kv_events.py, as its subscribers declare them)
class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, tag=True):
    pass


class VBlockStored(KVCacheEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None = None


class VBlockRemoved(KVCacheEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None


class VAllBlocksCleared(KVCacheEvent, tag="AllBlocksCleared"):
    pass


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True):
    ts: float
    events: list[VBlockStored | VBlockRemoved | VAllBlocksCleared]
    data_parallel_rank: int | None = None


DECODER = msgspec.msgpack.Decoder(KVEventBatch)


ANY_PORT = "tcp://127.0.0.1:*"


@pytest.fixture
def ctx():
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


def subscribe(ctx: zmq.Context, endpoint: str, publisher: VllmEventPublisher) -> zmq.Socket:
    """A SUB socket that has joined (slow joiner: publish probes until one arrives)."""
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    for _ in range(100):
        publisher.publish([AllBlocksCleared()])
        if sub.poll(100):
            while sub.poll(50):
                sub.recv_multipart()
            return sub
    raise TimeoutError("the SUB socket never joined")


def recv_batch(sub: zmq.Socket) -> tuple[bytes, int, KVEventBatch]:
    assert sub.poll(5000), "no batch published"
    topic, seq, payload = sub.recv_multipart()
    return topic, int.from_bytes(seq, "big"), DECODER.decode(payload)


def test_events_decode_as_vllm_decodes_them(ctx):
    pub = VllmEventPublisher(ANY_PORT, topic="kv@w0")
    try:
        sub = subscribe(ctx, pub.endpoint, pub)
        tokens = list(range(100, 132))
        h0, h1 = hash_blocks(tokens, 16)
        pub.publish(
            [
                BlockStored(h0, ROOT_PARENT_HASH, tuple(tokens[:16]), 16),
                BlockStored(h1, h0, tuple(tokens[16:]), 16),
                BlockRemoved((h1, h0)),
                AllBlocksCleared(),
            ]
        )
        topic, seq, batch = recv_batch(sub)
        assert topic == b"kv@w0" and seq > 0 and batch.data_parallel_rank == 0
        first, second, removed, cleared = batch.events
        assert first == VBlockStored([h0], None, tokens[:16], 16, None, "GPU")
        assert second.parent_block_hash == h0 and second.token_ids == tokens[16:]
        assert removed == VBlockRemoved([h1, h0], "GPU")
        assert isinstance(cleared, VAllBlocksCleared)
        pub.publish([AllBlocksCleared()])
        assert recv_batch(sub)[1] == seq + 1  # sequence numbers are consecutive
    finally:
        pub.close()


def test_replay_sends_buffered_batches_then_the_end_marker(ctx):
    pub = VllmEventPublisher(ANY_PORT, ANY_PORT)
    try:
        sub = subscribe(ctx, pub.endpoint, pub)
        pub.publish([BlockRemoved((7,))])
        _, seq, _ = recv_batch(sub)
        req = ctx.socket(zmq.DEALER)
        req.connect(pub.replay_endpoint)
        req.send_multipart([b"", seq.to_bytes(8, "big")])
        assert req.poll(5000)
        _, got_seq, payload = req.recv_multipart()
        assert int.from_bytes(got_seq, "big") == seq
        assert DECODER.decode(payload).events == [VBlockRemoved([7], "GPU")]
        assert req.poll(5000)
        assert req.recv_multipart()[1:] == [END_SEQ, b""]
        req.send_multipart([b"garbage"])  # malformed: ignored, the publisher keeps going
        pub.publish([BlockRemoved((8,))])
        assert recv_batch(sub)[2].events == [VBlockRemoved([8], "GPU")]
    finally:
        pub.close()


def test_a_bound_address_is_refused_at_start(ctx):
    pub = VllmEventPublisher(ANY_PORT)
    try:
        with pytest.raises(zmq.ZMQError):
            VllmEventPublisher(pub.endpoint)
    finally:
        pub.close()


def test_worker_publishes_what_its_prefix_cache_stores(ctx):
    """A real worker loop with --kv-events-publish: the blocks its cache stores for a prompt
    reach a vLLM subscriber with the hashes the router gets."""
    pub = VllmEventPublisher(ANY_PORT)
    router = FakeRouter()
    engine = make_engine(tiny_model("llama", seed=5))
    server = WorkerLoop(engine, router.endpoint, "w-pub", "tiny", kv_publisher=pub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        router.recv_until(Register)
        router.send(RegisterAck(accepted=True, heartbeat_interval_s=0.1))
        sub = subscribe(ctx, pub.endpoint, pub)
        prompt = [(7 * i + 3) % 90 + 1 for i in range(3 * engine.block_size + 5)]
        router.send(Generate("r1", tuple(prompt), SamplingParams(max_tokens=2, temperature=0)))
        while (delta := router.recv_until(TokenDelta)).finish_reason is None:
            pass
        stored = []
        while len(stored) < 3:
            stored += [e for e in recv_batch(sub)[2].events if isinstance(e, VBlockStored)]
        expected = hash_blocks(prompt, engine.block_size)[:3]
        assert [e.block_hashes[0] for e in stored[:3]] == expected
        assert stored[0].parent_block_hash is None
        assert stored[1].parent_block_hash == expected[0]
        assert delta.finish_reason == "length"
    finally:
        server.stop()
        thread.join(timeout=5)
        router.close()


def test_launch_cluster_gives_each_worker_its_own_port(tmp_path):
    from fleet.launch import build_parser, commands, offset_port, served_models
    from shared.config.fleet import load_with_flags
    from tests.support.tiny_model import build_tiny_model

    model = build_tiny_model(tmp_path / "A")
    argv = ["--model", str(model), "--workers", "3", "--kv-events-publish", "tcp://*:5557"]
    args, fleet = load_with_flags(build_parser(), argv, {"cluster": {}})
    _, workers = commands(args, fleet, served_models(args, fleet), 5999)
    ports = [w[w.index("--kv-events-publish") + 1] for w in workers]
    assert ports == ["tcp://*:5557", "tcp://*:5558", "tcp://*:5559"]
    assert offset_port("ipc:///tmp/kv", 2) == "ipc:///tmp/kv_2"
