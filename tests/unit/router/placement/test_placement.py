"""Placement's rules, through the host agents' messages and a fake clock: where a model goes,
what is evicted (idle, unpinned, least recently used; never a busy or pinned one), that no
host goes over its budget by the estimates, keep-alive, load failures, lost hosts."""

from __future__ import annotations

import asyncio

import pytest

from router.cluster.registry import WorkerRegistry, WorkerState
from router.errors import ApiError
from router.placement.catalog import FOREVER, Entry, keep_alive_of
from router.placement.demand import Demand
from router.placement.operator import hosts_json
from router.placement.placer import Placer
from shared.placement.messages import (
    HostHello,
    HostReport,
    HostWorker,
    StartWorker,
    StopWorker,
    WorkerExited,
)
from shared.protocol import Register

GIB = 1 << 30


class Fleet:
    """A placer and its demand over fake hosts that do what they are told at once."""

    def __init__(self, budgets: dict[str, int], models: dict[str, int], **settings):
        self.now = 0.0
        self.starts_finish = True  # False: the hosts take starts and never start anything
        self.stops_finish = True  # False: a stopped worker's process stays until `exit`
        self.sent: list[tuple[bytes, object]] = []
        self.registry = WorkerRegistry()
        entries = {m: Entry(m, size, GIB // 4, **settings.get(m, {})) for m, size in models.items()}
        self.placer = Placer(self.registry, entries, self.send, self.retire, lambda: self.now)
        self.demand = Demand(self.placer, self.registry, 60.0, 5.0, lambda: self.now)
        self.procs: dict[str, dict[str, HostWorker]] = {h: {} for h in budgets}
        for host, budget in budgets.items():
            hello = HostHello(host, host, 1, budget, tuple(models))
            self.placer.handle(host.encode(), hello)

    def send(self, identity: bytes, msg: object) -> None:
        self.sent.append((identity, msg))
        host = identity.decode()
        if isinstance(msg, StartWorker) and not self.starts_finish:
            return
        if isinstance(msg, StartWorker):  # the host's own check: never over its budget
            used = sum(w.estimate_bytes for w in self.procs[host].values())
            assert used + msg.estimate_bytes <= self.placer.hosts[host].budget_bytes
            self.procs[host][msg.worker_id] = HostWorker(
                msg.worker_id, msg.model, 7, msg.estimate_bytes
            )
        elif isinstance(msg, StopWorker) and self.stops_finish:
            self.exit(host, msg.worker_id)

    def exit(self, host: str, worker_id: str) -> None:
        worker = self.procs[host].pop(worker_id)
        self.placer.handle(host.encode(), WorkerExited(host, worker_id, worker.model, True, ""))

    def retire(self, worker_id: str, why: str) -> None:
        self.registry.remove(worker_id)

    def report(self) -> None:
        for host, procs in self.procs.items():
            budget = self.placer.hosts[host].budget_bytes
            self.placer.handle(host.encode(), HostReport(host, budget, tuple(procs.values())))

    def register_started(self) -> None:
        """Every started worker registers with the router."""
        for procs in self.procs.values():
            for w in procs.values():
                if self.registry.get(w.worker_id) is None:
                    info = Register(w.worker_id, w.model, 16, 100, "h", 7)
                    state = WorkerState(info, w.worker_id.encode(), self.now)
                    self.registry.add(state)
                    self.placer.on_registered(state)

    def tick(self) -> None:
        """The hosts report, then placement's once-a-second turn."""
        self.report()
        self.demand.tick()

    def where(self, model: str) -> list[str]:
        return [h for h, procs in self.procs.items() for w in procs.values() if w.model == model]

    def load(self, model: str) -> None:
        self.placer.entries[model].last_used = self.now
        assert self.placer.place(self.placer.entries[model]) is not None
        self.register_started()
        self.report()


def test_a_model_goes_where_there_is_room_then_evicts_the_least_recently_used():
    fleet = Fleet({"h0": 3 * GIB, "h1": 3 * GIB}, {"a": 2 * GIB, "b": 2 * GIB, "c": 2 * GIB})
    fleet.load("a")
    fleet.now = 1
    fleet.load("b")
    assert fleet.where("a") != fleet.where("b")  # the host with more room
    fleet.now = 2
    fleet.load("c")  # no room: the idle model used longest ago (a) goes
    assert fleet.where("a") == [] and fleet.where("c") != fleet.where("b")
    stops = [m for _, m in fleet.sent if isinstance(m, StopWorker)]
    assert len(stops) == 1 and "making room for c" in stops[0].reason


def test_busy_and_pinned_models_are_never_evicted():
    fleet = Fleet({"h0": 3 * GIB}, {"a": 2 * GIB, "b": 2 * GIB}, a={"pinned": True})
    fleet.load("a")
    assert fleet.placer.place(fleet.placer.entries["b"]) is None  # a is pinned
    fleet.placer.entries["a"].pinned = False
    worker = fleet.registry.healthy("a")[0]
    worker.inflight.add("req-1#0")  # a request in flight there
    assert fleet.placer.place(fleet.placer.entries["b"]) is None
    worker.inflight.clear()
    assert fleet.placer.place(fleet.placer.entries["b"]) is not None


def test_measured_memory_over_the_estimate_counts():
    fleet = Fleet({"h0": 5 * GIB}, {"a": 2 * GIB, "b": 2 * GIB})
    fleet.load("a")
    worker = next(iter(fleet.procs["h0"].values()))
    fleet.procs["h0"][worker.worker_id] = HostWorker(worker.worker_id, "a", 7, 2 * GIB, 4 * GIB)
    fleet.report()  # it measures 4 GiB: b no longer fits beside it without evicting it
    fleet.load("b")
    assert fleet.where("a") == [] and fleet.where("b") == ["h0"]


def test_idle_workers_go_after_their_keep_alive_and_min_workers_stay():
    fleet = Fleet(
        {"h0": 8 * GIB}, {"a": GIB, "b": GIB}, a={"keep_alive_s": 10}, b={"min_workers": 1}
    )
    fleet.load("a")
    fleet.tick()  # b is kept loaded without demand
    fleet.register_started()
    fleet.report()
    assert fleet.where("b") == ["h0"]
    fleet.now = 5
    fleet.tick()
    assert fleet.where("a") == ["h0"]
    fleet.now = 11
    fleet.tick()
    assert fleet.where("a") == [] and fleet.where("b") == ["h0"]  # b: min_workers 1


async def test_a_request_waits_for_its_model_and_gets_the_load_error():
    fleet = Fleet({"h0": 4 * GIB}, {"a": GIB, "bad": GIB})
    waiting = asyncio.ensure_future(fleet.demand.ready("a"))
    await asyncio.sleep(0.01)
    assert fleet.where("a") == ["h0"] and not waiting.done()
    fleet.register_started()
    await asyncio.wait_for(waiting, 2)  # served once its worker registered
    fleet.starts_finish = False  # the host: no start
    failed = asyncio.ensure_future(fleet.demand.ready("bad"))
    await asyncio.sleep(0.01)
    start = next(m for _, m in fleet.sent if isinstance(m, StartWorker) and m.model == "bad")
    reason = "exit code 1: SafetensorError: invalid header in model.safetensors"
    fleet.placer.handle(b"h0", WorkerExited("h0", start.worker_id, "bad", False, reason))
    fleet.tick()  # before the waiter wakes: the failed model is not placed again
    assert len([m for _, m in fleet.sent if isinstance(m, StartWorker) and m.model == "bad"]) == 1
    with pytest.raises(ApiError) as raised:
        await asyncio.wait_for(failed, 2)
    assert (
        raised.value.status == 503 and "invalid header in model.safetensors" in raised.value.message
    )
    with pytest.raises(ApiError):  # the next request hears it at once, for a while
        await fleet.demand.ready("bad")


async def test_a_lost_host_loading_a_model_is_replaced_by_another():
    fleet = Fleet({"h0": 4 * GIB, "h1": 2 * GIB}, {"a": GIB})
    fleet.starts_finish = False
    waiting = asyncio.ensure_future(fleet.demand.ready("a"))
    await asyncio.sleep(0.01)
    assert [i for i, m in fleet.sent if isinstance(m, StartWorker)] == [b"h0"]
    fleet.now = 6  # h0 goes silent past the timeout; h1 keeps reporting
    fleet.placer.hosts["h1"].last_seen = 6
    fleet.demand.tick()
    await asyncio.sleep(0.01)
    assert [i for i, m in fleet.sent if isinstance(m, StartWorker)] == [b"h0", b"h1"]
    waiting.cancel()


def test_too_large_for_every_host_is_said_at_once():
    fleet = Fleet({"h0": 2 * GIB}, {"huge": 3 * GIB})
    with pytest.raises(ApiError) as raised:
        asyncio.run(fleet.demand.ready("huge"))
    assert raised.value.code == "model_too_large" and "3.00 GiB" in raised.value.message


@pytest.mark.parametrize(
    "given, seconds",
    [
        (None, None),
        (30, 30.0),
        ("5m", 300.0),
        ("1h", 3600.0),
        ("250ms", 0.25),
        (-1, FOREVER),
        (0, 0.0),
    ],
)
def test_keep_alive_values(given, seconds):
    assert keep_alive_of(given) == seconds


@pytest.mark.parametrize("bad", ["soon", True, [5], "5 days"])
def test_bad_keep_alive_is_a_400(bad):
    with pytest.raises(ApiError) as raised:
        keep_alive_of(bad)
    assert raised.value.status == 400 and raised.value.param == "keep_alive"


async def test_a_host_agent_that_restarts_mid_load_has_its_start_placed_again():
    fleet = Fleet({"h0": 4 * GIB}, {"a": GIB})
    fleet.starts_finish = False
    waiting = asyncio.ensure_future(fleet.demand.ready("a"))
    await asyncio.sleep(0.01)
    assert fleet.placer.entries["a"].starts
    fleet.placer.handle(b"h0", HostHello("h0", "h0", 2, 4 * GIB, ("a",)))  # no workers
    assert not fleet.placer.entries["a"].starts  # its worker died with the old agent
    fleet.demand.tick()
    starts = [m for i, m in fleet.sent if isinstance(m, StartWorker)]
    assert len(starts) == 2 and starts[1].worker_id != starts[0].worker_id
    waiting.cancel()


def test_a_model_whose_requests_queue_gets_another_worker_up_to_max_workers():
    from shared.protocol import Heartbeat

    fleet = Fleet({"h0": 8 * GIB}, {"a": GIB}, a={"max_workers": 2})
    fleet.load("a")
    [worker] = fleet.registry.healthy("a")
    worker.on_heartbeat(
        Heartbeat(
            worker.worker_id,
            running=4,
            waiting=3,
            free_blocks=1,
            total_blocks=9,
            cached_blocks=0,
            hit_tokens=0,
        )
    )
    fleet.tick()
    assert len(fleet.where("a")) == 1  # not for a moment's queue
    fleet.now = 3
    fleet.tick()
    fleet.register_started()
    assert len(fleet.where("a")) == 2
    for w in fleet.registry.healthy("a"):
        w.heartbeat = worker.heartbeat
    fleet.now = 10
    fleet.tick()
    assert len(fleet.where("a")) == 2  # max_workers


def test_a_restarted_router_never_reuses_a_running_worker_id():
    fleet = Fleet({"h0": 8 * GIB}, {"a": GIB}, a={"max_workers": 3})
    fleet.load("a")
    fleet.placer.entries["a"].next_worker = 0  # as a new router process counts
    start = fleet.placer.place(fleet.placer.entries["a"])
    assert start is not None and start.worker_id not in fleet.registry.healthy("a")[0].worker_id


async def test_keep_alive_counts_from_the_end_of_the_last_reply():
    fleet = Fleet({"h0": 8 * GIB}, {"a": GIB}, a={"keep_alive_s": 30})
    fleet.load("a")
    fleet.tick()  # idle since 0
    await fleet.demand.ready("a")  # a request at 0, whose reply ends at 50 between ticks
    fleet.now = 50
    fleet.demand.replied("a")
    fleet.now = 79
    fleet.tick()
    assert fleet.where("a") == ["h0"]  # 29 s after the reply, though 79 s after the request
    fleet.now = 80
    fleet.tick()
    assert fleet.where("a") == []


def test_cluster_hosts_never_show_more_than_their_budget_through_an_eviction():
    fleet = Fleet({"h0": 3 * GIB}, {"a": 2 * GIB, "b": 2 * GIB})
    fleet.stops_finish = False
    samples = []

    def sample():
        fleet.report()
        samples.extend(hosts_json(fleet.demand))

    fleet.load("a")
    sample()
    fleet.now = 1
    start = fleet.placer.place(fleet.placer.entries["b"])  # evicts a: stopping, b waits
    assert start is not None and not start.sent
    sample()
    assert samples[-1]["used_bytes"] == 2 * GIB  # a, stopping, still holds its room
    assert fleet.placer.place(fleet.placer.entries["a"], evict=False) is None  # promised to b
    [victim] = fleet.procs["h0"]
    fleet.exit("h0", victim)  # a's process is gone: b is sent
    assert start.sent
    samples.extend(hosts_json(fleet.demand))  # sent, not reported yet
    assert samples[-1]["used_bytes"] == 2 * GIB
    fleet.register_started()
    sample()
    assert all(s["used_bytes"] <= s["budget_bytes"] and s["free_bytes"] >= 0 for s in samples)
