"""The worker process's server loop, against a real ROUTER socket playing the router."""

from __future__ import annotations

import threading
import time

import pytest

from shared.kv_events import BlockStored
from shared.protocol import (
    Abort,
    Generate,
    Heartbeat,
    KVEvents,
    Register,
    RegisterAck,
    Shutdown,
    TokenDelta,
    encode,
)
from shared.sampling import SamplingParams
from tests.support.engine_fixtures import make_engine, reference_greedy, tiny_model
from tests.support.kv_router import FakeRouter
from worker.loop import WorkerLoop


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", seed=5)


@pytest.fixture
def running(model):
    router = FakeRouter()
    server = WorkerLoop(make_engine(model), router.endpoint, "w-test", "tiny")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    reg = router.recv_until(Register)
    router.send(RegisterAck(accepted=True, heartbeat_interval_s=0.1))
    yield router, server, reg
    server.stop()
    thread.join(timeout=5)
    router.close()


def collect(router, request_id: str) -> tuple[list[int], TokenDelta]:
    tokens = []
    while True:
        msg = router.recv_until(TokenDelta)
        assert msg.request_id == request_id
        tokens.extend(msg.token_ids)
        if msg.finish_reason:
            return tokens, msg


def test_registers_generates_and_streams(running, model):
    router, _, reg = running
    assert (reg.worker_id, reg.model_id, reg.block_size) == ("w-test", "tiny", 8)
    router.send(Generate("r1", tuple(range(1, 20)), SamplingParams(max_tokens=6)))
    tokens, final = collect(router, "r1")
    assert tokens == reference_greedy(model, list(range(1, 20)), 6)
    assert final.finish_reason == "length" and final.usage.completion_tokens == 6


def test_kv_events_and_heartbeats_reach_the_router(running):
    router, _, _ = running
    router.send(Generate("r2", tuple(range(30)), SamplingParams(max_tokens=2)))
    events = router.recv_until(KVEvents)
    assert events.worker_id == "w-test"
    assert any(isinstance(e, BlockStored) for e in events.events)
    beat = router.recv_until(Heartbeat)
    assert beat.worker_id == "w-test" and beat.total_blocks == 255
    # the phase figures ride along once a step has run
    deadline = time.monotonic() + 10
    while beat.phases is None or beat.phases.prefill_tokens == 0:
        assert time.monotonic() < deadline, "no phase figures in the heartbeats"
        beat = router.recv_until(Heartbeat)
    assert beat.phases.prefill_chunk_p50_ms > 0
    assert beat.phases.busy_s > 0  # the loop's time in engine steps


def test_registration_says_which_attention_backend_and_why(running):
    _, _, reg = running
    assert reg.attention.backend == "mlx" and reg.attention.requested == "auto"
    assert reg.attention.self_test.startswith("not run: Metal is not available")


def test_bad_request_gets_an_error_delta(running):
    router, _, _ = running
    router.send(Generate("bad", (), SamplingParams()))
    msg = router.recv_until(TokenDelta)
    assert (msg.request_id, msg.finish_reason) == ("bad", "error")
    assert "empty" in msg.error


def test_abort_stops_a_request(running):
    router, server, _ = running
    router.send(Generate("long", tuple(range(10)), SamplingParams(max_tokens=400)))
    router.recv_until(TokenDelta)
    router.send(Abort("long"))
    deadline = time.monotonic() + 5
    while server.engine.has_work() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not server.engine.has_work()
    assert "long" not in server.live


def test_a_duplicate_id_is_refused_and_the_first_runs_on(running, model):
    router, server, _ = running
    prompt = tuple(range(1, 20))
    router.send(Generate("dup", prompt, SamplingParams(max_tokens=30)))
    router.send(Generate("dup", prompt, SamplingParams(max_tokens=30)))
    tokens, errors = [], []
    while True:
        msg = router.recv_until(TokenDelta)
        if msg.finish_reason == "error":
            errors.append(msg.error)
            continue
        tokens.extend(msg.token_ids)
        if msg.finish_reason:
            break
    assert errors == ["request 'dup' is already running"]
    assert tokens == reference_greedy(model, list(prompt), 30)
    assert "dup" not in server.live


def test_choices_end_one_by_one_and_an_aborted_choice_counts(running):
    """n=3: one choice aborted alone, two run to their end; the request is held until the
    last one's final delta, then let go."""
    router, server, _ = running
    router.send(Generate("three", tuple(range(1, 12)), SamplingParams(max_tokens=40), n=3))
    router.recv_until(TokenDelta)
    router.send(Abort("three", index=1))
    finals = set()
    while len(finals) < 2:
        msg = router.recv_until(TokenDelta)
        if msg.finish_reason:
            finals.add(msg.index)
    assert finals == {0, 2}
    deadline = time.monotonic() + 5
    while "three" in server.live and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "three" not in server.live


def test_malformed_frames_are_dropped(running, model):
    router, _, _ = running
    router.send_raw(b"\xc1 definitely not msgpack")
    router.send_raw(encode(Abort("x"))[:-2])
    router.send(Generate("after", (5, 6, 7), SamplingParams(max_tokens=3)))
    tokens, _ = collect(router, "after")
    assert tokens == reference_greedy(model, [5, 6, 7], 3)


def serve_once(model, router: FakeRouter, *answers) -> tuple[WorkerLoop, list[int]]:
    """Run a worker until it exits after `answers` to its Register; its exit codes."""
    server = WorkerLoop(make_engine(model), router.endpoint, "w-once", "tiny")
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(server.serve_forever()), daemon=True)
    thread.start()
    router.recv_until(Register)
    for msg in answers:
        router.send(msg)
    thread.join(timeout=5)
    router.close()
    return server, result


def test_shutdown_message_stops_the_worker(model):
    _, result = serve_once(model, FakeRouter(), RegisterAck(accepted=True), Shutdown("test"))
    assert result == [0]


def test_refused_registration_exits_nonzero(model):
    refusal = RegisterAck(accepted=False, reason="protocol version mismatch")
    server, result = serve_once(model, FakeRouter(), refusal)
    assert result == [1] and server.routers.refused == "protocol version mismatch"


def test_worker_registers_again_when_asked(running):
    router, _, reg = running
    from shared.protocol import ReRegister

    router.send(ReRegister("router restarted"))
    again = router.recv_until(Register)
    assert again.worker_id == reg.worker_id
