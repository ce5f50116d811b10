"""The wire protocol: round trips, rejection of malformed frames, version check contract."""

from __future__ import annotations

import contextlib

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, BlockWindowsDropped
from shared.placement.messages import (
    FetchEnded,
    FetchModel,
    HostAck,
    HostFetch,
    HostHello,
    HostReport,
    HostWorker,
    StartWorker,
    StopWorker,
    WorkerExited,
)
from shared.protocol import (
    KV_EVENT_TYPES,
    MESSAGE_TYPES,
    PROTOCOL_VERSION,
    Abort,
    AttentionReport,
    Embed,
    Embeddings,
    Generate,
    Heartbeat,
    KVEvents,
    KVInventory,
    ProtocolError,
    Register,
    RegisterAck,
    ReRegister,
    SendInventory,
    Shutdown,
    TokenDelta,
    Usage,
    WorkerPhases,
    decode,
    encode,
)
from shared.sampling import SamplingParams

EXAMPLES = [
    Register("w1", "smollm", 16, 1024, "host-a", 4242),
    Register(
        "w1",
        "smollm",
        16,
        1024,
        "host-a",
        4242,
        attention=AttentionReport("mlx", "auto", "failed: mismatch 0.3", 1.5, 2.0),
    ),
    RegisterAck(accepted=False, reason="protocol version 0 != 1"),
    RegisterAck(accepted=True, heartbeat_interval_s=0.5),
    Heartbeat(
        "w1",
        running=2,
        waiting=1,
        free_blocks=10,
        total_blocks=20,
        cached_blocks=5,
        hit_tokens=64,
        prompt_tokens=128,
    ),
    Heartbeat(
        "w1", 0, 0, 1, 2, 0, 0, phases=WorkerPhases(decode_tick_p50_ms=80.5, decode_spikes=2)
    ),
    TokenDelta("r1", (1, 2, 3)),
    TokenDelta("r1", (), "length", Usage(10, 3, 8), logprobs=(-0.5, -1.0)),
    TokenDelta("r1", (), "error", error="out of memory"),
    KVEvents(
        "w1", (BlockStored(2**64 - 1, 0, (1, 2), 2), BlockRemoved((5, 6)), AllBlocksCleared())
    ),
    KVEvents("w1", (BlockWindowsDropped((7, 2**63)),), seq=12),
    KVInventory("w1", (1, 2**64 - 1, 5), windowless=(5,), part=1, parts=3, last_seq=11),
    Generate("r1", (1, 2, 3), SamplingParams(temperature=0.7, max_tokens=5, stop_token_ids=(2,))),
    Abort("r1"),
    Shutdown("bye"),
    ReRegister("router restarted"),
    SendInventory("events 4-6 lost"),
    Register("w2", "qwen3-embed", 32, 0, "host-b", 7, task="embed"),
    Embed("e-1#0", ((5, 6, 7), (8,)), dimensions=16),
    Embeddings("e-1#0", (b"\x00\x00\x80?" * 4, b"\x00" * 16), prompt_tokens=4),
    Embeddings("e-2#0", error="embedding failed: out of memory"),
    HostHello("mac-1", "mac-1.local", 99, 8 << 30, ("smollm",), (HostWorker("w", "s", 7, 1),)),
    HostReport("mac-1", 8 << 30, (HostWorker("mac-1-smollm-1", "smollm", 7, 1 << 30, 5 << 28),)),
    HostAck(True, report_interval_s=0.5),
    StartWorker("mac-1-smollm-1", "smollm", 1 << 30, 256 << 20),
    StopWorker("mac-1-smollm-1", "idle past its keep_alive"),
    WorkerExited("mac-1", "mac-1-smollm-1", "smollm", False, "exit code 1: corrupt weights"),
    HostReport("mac-1", 8 << 30, (), ("qwen",), (HostFetch("qwen3", 5 << 20, 300 << 20),)),
    FetchModel("qwen3"),
    FetchEnded("mac-1", "qwen3", False, "model.safetensors of org/qwen3@main failed its checksum"),
]


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda m: type(m).__name__)
def test_round_trip(msg):
    assert decode(encode(msg)) == msg


def test_every_message_type_has_an_example_and_tags_are_unique():
    assert {type(m) for m in EXAMPLES} == set(MESSAGE_TYPES.values())
    assert len(set(MESSAGE_TYPES.values())) == len(MESSAGE_TYPES)
    assert len(set(KV_EVENT_TYPES.values())) == len(KV_EVENT_TYPES)


def test_register_carries_the_protocol_version():
    assert decode(encode(Register("w", "m", 16, 1, "h", 1))).protocol_version == PROTOCOL_VERSION


def test_unknown_fields_are_ignored_for_forward_compatibility():
    frame = msgpack.packb([12, {"request_id": "r", "new_field": [1, 2]}])
    assert decode(frame) == Abort("r")


def test_heartbeat_body_fixture_is_valid():
    assert decode(msgpack.packb([2, _HEARTBEAT_BODY])) == Heartbeat("w", 0, 0, 0, 0, 0, 0)


def test_float_fields_accept_ints():
    frame = msgpack.packb([10, {"accepted": True, "heartbeat_interval_s": 2}])
    assert decode(frame).heartbeat_interval_s == 2.0


_HEARTBEAT_BODY = {
    "worker_id": "w",
    "running": 0,
    "waiting": 0,
    "free_blocks": 0,
    "total_blocks": 0,
    "cached_blocks": 0,
    "hit_tokens": 0,
}
BAD_FRAMES = {
    "not msgpack": b"\xc1",
    "truncated": encode(Abort("r1"))[:-1],
    "trailing bytes": encode(Abort("r1")) + b"\x00",
    "not an array": msgpack.packb({"tag": 12}),
    "unknown tag": msgpack.packb([99, {}]),
    "bool tag": msgpack.packb([True, {"request_id": "r"}]),
    "body not a map": msgpack.packb([12, ["r"]]),
    "missing field": msgpack.packb([12, {}]),
    "wrong type": msgpack.packb([12, {"request_id": 5}]),
    "bool for int": msgpack.packb([2, {**_HEARTBEAT_BODY, "running": True}]),
    "null for required": msgpack.packb([12, {"request_id": None}]),
    "str in token list": msgpack.packb([3, {"request_id": "r", "token_ids": [1, "2"]}]),
    "token list not a list": msgpack.packb([3, {"request_id": "r", "token_ids": 7}]),
    "bad nested usage": msgpack.packb(
        [3, {"request_id": "r", "token_ids": [], "usage": {"prompt_tokens": 1}}]
    ),
    "bad sampling type": msgpack.packb(
        [11, {"request_id": "r", "token_ids": [], "sampling": {"temperature": "hot"}}]
    ),
    "unknown kv event": msgpack.packb([4, {"worker_id": "w", "events": [[9, {}]]}]),
    "bad kv event body": msgpack.packb(
        [4, {"worker_id": "w", "events": [[2, {"block_hashes": ["x"]}]]}]
    ),
    "binary for str": msgpack.packb([12, {"request_id": b"r"}], use_bin_type=True),
    "non-str map key": msgpack.packb([12, {1: "r"}], strict_types=False),
}


@pytest.mark.parametrize("frame", BAD_FRAMES.values(), ids=BAD_FRAMES.keys())
def test_malformed_frames_raise_protocol_error(frame):
    with pytest.raises(ProtocolError):
        decode(frame)


def test_encode_rejects_non_messages():
    with pytest.raises(TypeError):
        encode(Usage(1, 2, 3))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_decode_of_random_bytes_raises_only_protocol_error(frame):
    with contextlib.suppress(ProtocolError):
        decode(frame)


_wire_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)
_field_names = st.sampled_from(
    ["request_id", "token_ids", "worker_id", "events", "usage", "sampling", "accepted", "running"]
)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(sorted(MESSAGE_TYPES)), st.dictionaries(_field_names, _wire_values, max_size=6)
)
def test_decode_of_random_structured_bodies_raises_only_protocol_error(tag, body):
    try:
        msg = decode(msgpack.packb([tag, body]))
    except ProtocolError:
        return
    assert decode(encode(msg)) == msg


def test_metrics_show_each_workers_phases_and_attention_choice():
    from router.cluster.registry import WorkerState
    from router.metrics.router_metrics import Metrics

    report = AttentionReport("mlx", "auto", "failed: mismatch 0.3", 1.5, 2.0)
    worker = WorkerState(Register("w1", "m", 16, 10, "h", 1, attention=report), b"id", 0.0)
    worker.heartbeat = Heartbeat(
        "w1", 0, 0, 1, 2, 0, 0, phases=WorkerPhases(decode_tick_p95_ms=91.5, decode_spikes=3)
    )
    text = Metrics().render([worker], pending=0)
    assert 'mlx_fleet_worker_phase_decode_tick_p95_ms{worker="w1"} 91.5' in text
    assert "# TYPE mlx_fleet_worker_phase_decode_spikes_total counter" in text
    assert 'mlx_fleet_worker_phase_decode_spikes_total{worker="w1"} 3.0' in text
    assert (
        'mlx_fleet_worker_attention_info{backend="mlx",requested="auto",'
        'self_test="failed: mismatch 0.3",worker="w1"} 1.0'
    ) in text
    assert 'mlx_fleet_worker_attention_selftest_ms{which="reference",worker="w1"} 2.0' in text


def test_heartbeat_kv_pressure_fields_are_optional_and_smoothed_by_the_router():
    from router.cluster.registry import WorkerState

    older = msgpack.packb(
        [
            2,
            {
                "worker_id": "w1",
                "running": 0,
                "waiting": 0,
                "free_blocks": 1,
                "total_blocks": 2,
                "cached_blocks": 0,
                "hit_tokens": 0,
            },
        ]
    )
    assert decode(older).evicted_blocks == 0  # a worker without the field still decodes
    worker = WorkerState(Register("w1", "m", 16, 10, "h", 1), b"id", 0.0)
    for evicted in (100, 100, 140):  # cumulative counts, one heartbeat each
        beat = Heartbeat("w1", 0, 0, 0, 2, 0, 0, evictable_blocks=5, evicted_blocks=evicted)
        assert decode(encode(beat)) == beat
        worker.on_heartbeat(beat)
    # the first beat is the baseline (no rate from one sample), then 0, then 40 blocks
    assert 0 < worker.eviction_rate < 40
