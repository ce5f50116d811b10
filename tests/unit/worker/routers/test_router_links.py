"""A worker and its routers, each a real ROUTER socket: the inventory after every accepted
registration, and several routers served at once, each answered on its own socket."""

from __future__ import annotations

import threading
import time

import pytest
import zmq

from shared.hashing import hash_blocks
from shared.protocol import (
    Generate,
    Heartbeat,
    KVEvents,
    KVInventory,
    Register,
    RegisterAck,
    ReRegister,
    SendInventory,
    TokenDelta,
    decode,
)
from shared.sampling import SamplingParams
from tests.support.engine_fixtures import make_engine, tiny_model
from tests.unit.worker.engine.test_worker_loop import FakeRouter
from worker.loop import WorkerLoop

PROMPT = tuple(range(1, 30))  # 3 full blocks of 8


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", seed=7)


@pytest.fixture
def serve(model):
    """serve(routers, **loop options) -> the WorkerLoop, running until the test ends."""
    started = []

    def start(routers: list[FakeRouter], **options) -> WorkerLoop:
        loop = WorkerLoop(
            make_engine(model), [r.endpoint for r in routers], "w-x", "tiny", **options
        )
        thread = threading.Thread(target=loop.serve_forever, daemon=True)
        thread.start()
        started.append((loop, thread, routers))
        return loop

    yield start
    for loop, thread, routers in started:
        loop.stop()
        thread.join(timeout=5)
        for router in routers:
            router.close()


def accept(router: FakeRouter) -> KVInventory:
    """Answer the worker's Register; the inventory it then sends."""
    router.recv_until(Register)
    router.send(RegisterAck(accepted=True, heartbeat_interval_s=0.1))
    return router.recv_until(KVInventory)


def generate(router: FakeRouter, request_id: str, prompt: tuple[int, ...] = PROMPT) -> TokenDelta:
    router.send(Generate(request_id, prompt, SamplingParams(max_tokens=3)))
    while True:
        delta = router.recv_until(TokenDelta)
        assert delta.request_id == request_id
        if delta.finish_reason:
            return delta


def test_each_registration_is_followed_by_the_inventory(serve):
    router = FakeRouter()
    serve([router])
    first = accept(router)
    assert (first.worker_id, first.block_hashes, first.part, first.parts) == ("w-x", (), 0, 1)
    generate(router, "r1")
    router.send(ReRegister("this router restarted"))  # as a restarted router answers
    again = accept(router)
    assert set(again.block_hashes) == set(hash_blocks(list(PROMPT), 8))


def numbers(router: FakeRouter, last) -> tuple[list[int], object]:
    """The `seq` of each KVEvents `router` receives, until a message for which `last` holds."""
    seqs = []
    while not last(msg := router.recv()):
        if isinstance(msg, KVEvents):
            seqs.append(msg.seq)
    return seqs, msg


def finished(msg) -> bool:
    return isinstance(msg, TokenDelta) and msg.finish_reason is not None


def test_kv_events_are_numbered_per_link_and_an_inventory_is_sent_when_asked(serve):
    """Each router's link numbers the KVEvents it carries 1, 2, ...; an inventory says the
    number of the last one before it; SendInventory (a router that saw a number skipped)
    is answered with the inventory on that link, which holds what the cache holds."""
    a, b = FakeRouter(), FakeRouter()
    serve([a, b])
    accept(a)
    a.send(Generate("r1", PROMPT, SamplingParams(max_tokens=3)))
    seqs, _ = numbers(a, finished)
    a.send(SendInventory("KV events after 0 up to 2 lost"))
    more, inventory = numbers(a, lambda m: isinstance(m, KVInventory))
    seqs += more
    assert seqs == list(range(1, len(seqs) + 1)) and inventory.last_seq == len(seqs) >= 1
    assert set(inventory.block_hashes) == set(hash_blocks(list(PROMPT), 8))
    b_inventory = accept(b)  # b's link numbers its own, on from its inventory's number
    a.send(Generate("r2", tuple(range(40, 60)), SamplingParams(max_tokens=3)))  # new blocks
    after_a, _ = numbers(a, finished)
    after_a += numbers(a, lambda m: isinstance(m, Heartbeat))[0]
    assert after_a[:1] == [inventory.last_seq + 1]
    assert b.recv_until(KVEvents).seq == b_inventory.last_seq + 1


def test_a_worker_serves_two_routers_each_on_its_own_socket(serve):
    a, b = FakeRouter(), FakeRouter()
    serve([a, b])
    assert accept(a).block_hashes == accept(b).block_hashes == ()
    final = generate(b, "from-b")
    assert final.usage.completion_tokens == 3
    events = a.recv_until(KVEvents)  # every router follows the cache
    assert {e.block_hash for e in events.events} == set(hash_blocks(list(PROMPT), 8))
    final = generate(a, "from-a")
    assert final.usage.cached_tokens >= 24  # the blocks b's request left (and its tail)
    deadline = time.monotonic() + 1
    while time.monotonic() < deadline:  # b hears nothing of a's request but its events
        if b.sock.poll(50):
            _, frame = b.sock.recv_multipart()
            msg = decode(frame)
            assert not (isinstance(msg, TokenDelta) and msg.request_id == "from-a")


def test_a_dead_router_stalls_nothing(serve):
    a, b = FakeRouter(), FakeRouter()
    tiny_queue = lambda sock: sock.setsockopt(zmq.SNDHWM, 2)  # noqa: E731
    loop = serve([a, b], configure_socket=tiny_queue)
    accept(a), accept(b)
    a.sock.close(linger=0)  # router a dies: its link's frames queue, then are dropped
    deadline = time.monotonic() + 10
    while loop.routers.dropped == 0:
        assert time.monotonic() < deadline, "nothing dropped for the dead router"
        b.recv_until(Heartbeat)
    assert generate(b, "still").usage.completion_tokens == 3
