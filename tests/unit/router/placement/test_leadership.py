"""One placement for several routers (issue 50), against a real redis-server
(tests/support/redis_server.py): the lease is held by one router, renewed while it lives and
taken over once it runs out; a follower never asks a host for anything, its waiting request
reaching the leader through the store; the leader's starts are mirrored, so a router taking
over finishes a load instead of starting another (`max_workers` holds across routers)."""

from __future__ import annotations

import asyncio

import pytest

from router.cluster.registry import WorkerRegistry, WorkerState
from router.errors import ApiError
from router.placement import operator
from router.placement.catalog import Entry
from router.placement.demand import Demand
from router.placement.leadership import SoleLeader
from router.placement.placer import Placer
from router.store.redis_client import connect
from router.store.redis_placement import LEADER, RedisLeadership
from shared.placement.messages import HostHello, HostReport, HostWorker, StartWorker, StopWorker
from shared.protocol import Register

GIB = 1 << 30
LEASE_S = 5.0  # held through a test, however slow the machine
SHORT_LEASE_S = 0.3  # for the test that watches one run out; the routers' setting is >= 2 s


@pytest.fixture
async def client(redis_url):
    made = connect(redis_url)
    yield made
    await made.aclose()


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def wall(self) -> float:
        """The wall clock, moving with the monotonic one as the real ones do."""
        return self.now + 1_764_000_000.0


class Router:
    """One router's placement, its messages to the hosts kept (`sent`)."""

    def __init__(self, name: str, client, hosts: FakeHosts, clock: Clock, **entry_settings):
        self.name, self.hosts, self.clock = name, hosts, clock
        wall = clock.wall  # the lease itself runs on real time, in Redis and here
        self.lead = RedisLeadership(client, name, LEASE_S, wall=wall)
        self.client = client
        self.sent: list[tuple[str, object]] = []
        self.registry = WorkerRegistry()
        entries = {"m": Entry("m", GIB, GIB // 4, **entry_settings)}
        self.placer = Placer(
            self.registry, entries, self.send, self.retire, clock, leading=lambda: self.lead.leading
        )
        self.demand = Demand(self.placer, self.registry, 60.0, 5.0, clock, self.lead, wall)
        self.demand.on_orders = lambda orders: operator.apply(self.demand, orders)
        self.entry = entries["m"]
        for host in hosts.procs:
            hello = HostHello(host, host, 1, 8 * GIB, ("m",))
            self.placer.handle(host.encode(), hello)

    def send(self, identity: bytes, msg: object) -> None:
        self.sent.append((identity.decode(), msg))
        self.hosts.receive(identity.decode(), msg)

    def retire(self, worker_id: str, why: str) -> None:
        self.registry.remove(worker_id)

    def starts(self) -> list[StartWorker]:
        return [m for _, m in self.sent if isinstance(m, StartWorker)]

    async def turn(self) -> None:
        """The once-a-second turn: what the others said, the tick, this router's word."""
        for host, procs in self.hosts.procs.items():
            self.placer.handle(host.encode(), HostReport(host, 8 * GIB, tuple(procs.values())))
        await self.demand.pull()
        self.demand.tick()
        await self.demand.push()

    async def die(self) -> None:
        """SIGKILL, as the others see it: no more turns, and its lease runs out."""
        await self.client.pexpire(LEADER, 1)
        await asyncio.sleep(0.01)

    def register(self, worker_id: str) -> None:
        state = WorkerState(Register(worker_id, "m", 16, 100, "h", 7), worker_id.encode(), 0.0)
        self.registry.add(state)
        self.placer.on_registered(state)


class FakeHosts:
    """Hosts that start a worker process at once when told (it registers when the test says)."""

    def __init__(self, *names: str):
        self.procs: dict[str, dict[str, HostWorker]] = {n: {} for n in names}

    def receive(self, host: str, msg: object) -> None:
        if isinstance(msg, StartWorker):
            worker = HostWorker(msg.worker_id, msg.model, 7, msg.estimate_bytes)
            self.procs[host][msg.worker_id] = worker
        elif isinstance(msg, StopWorker):
            self.procs[host].pop(msg.worker_id, None)

    def workers(self) -> list[str]:
        return [wid for procs in self.procs.values() for wid in procs]


async def test_one_router_holds_the_lease_and_renews_it(client):
    first, second = RedisLeadership(client, "r1", LEASE_S), RedisLeadership(client, "r2", LEASE_S)
    await first.pull()
    await second.pull()
    assert first.leading and not second.leading
    assert second.leader == "r1" and first.leader == "r1"
    await asyncio.sleep(0.2)
    left = await client.pttl(LEADER)
    await first.pull()  # renewed: the lease's time to live starts again
    assert await client.pttl(LEADER) > left
    await second.pull()
    assert first.leading and not second.leading


async def test_a_lease_not_renewed_is_taken_over(client):
    first = RedisLeadership(client, "r1", SHORT_LEASE_S)
    second = RedisLeadership(client, "r2", LEASE_S)
    await first.pull()
    await asyncio.sleep(SHORT_LEASE_S * 1.5)  # r1 died: it renews no more
    assert not first.leading  # its own clock says so, before anyone tells it
    await second.pull()
    assert second.leading and await client.get(LEADER) == b"r2"
    await first.pull()  # r1 comes back: it follows
    assert not first.leading and first.leader == "r2"


async def test_a_router_stopping_hands_the_lease_over_at_once(client):
    first, second = RedisLeadership(client, "r1", LEASE_S), RedisLeadership(client, "r2", LEASE_S)
    await first.pull()
    await first.release()
    await second.pull()
    assert second.leading and not first.leading


def test_a_router_alone_leads_itself():
    assert SoleLeader().leading


async def test_a_follower_never_starts_workers_and_its_request_is_answered(client):
    clock, hosts = Clock(), FakeHosts("h0", "h1")
    leader = Router("r1", client, hosts, clock)
    follower = Router("r2", client, hosts, clock)
    await leader.turn()
    await follower.turn()
    assert leader.lead.leading and not follower.lead.leading
    notes: list[float] = []

    async def note() -> None:  # a streamed request's `: loading` comment
        notes.append(clock.now)

    waiting = asyncio.create_task(follower.demand.ready("m", note=note))
    await asyncio.sleep(0.05)
    assert follower.starts() == [] and not waiting.done()
    await leader.turn()  # reads the follower's demand: places the model
    assert len(leader.starts()) == 1
    clock.now += 6.0
    await leader.turn()
    await follower.turn()  # mirrors the start: the model is loading
    assert operator.state(follower.demand, follower.entry) == "loading"
    await asyncio.sleep(0.05)
    assert notes == [clock.now]  # the wait on the follower is told so, as on the leader
    worker_id = leader.starts()[0].worker_id
    for router in (leader, follower):  # the worker registers with every router
        router.register(worker_id)
    await asyncio.wait_for(waiting, 2)
    assert not any(isinstance(m, StartWorker | StopWorker) for _, m in follower.sent)


async def test_requests_through_both_routers_start_no_more_than_max_workers(client):
    clock, hosts = Clock(), FakeHosts("h0", "h1")
    routers = [Router(n, client, hosts, clock, max_workers=1) for n in ("r1", "r2")]
    for router in routers:
        await router.turn()
    waits = [asyncio.create_task(r.demand.ready("m")) for r in routers for _ in range(3)]
    for _ in range(5):
        await asyncio.sleep(0.02)
        for router in routers:
            await router.turn()
    assert len(hosts.workers()) == 1
    assert sum(len(r.starts()) for r in routers) == 1
    for router in routers:
        router.register(hosts.workers()[0])
    await asyncio.wait_for(asyncio.gather(*waits), 2)


async def test_a_router_taking_over_finishes_the_load_instead_of_starting_another(client):
    clock, hosts = Clock(), FakeHosts("h0", "h1")
    leader = Router("r1", client, hosts, clock)
    follower = Router("r2", client, hosts, clock)
    await leader.turn()
    await follower.turn()
    waiting = asyncio.create_task(follower.demand.ready("m"))
    await asyncio.sleep(0.05)
    await leader.turn()
    await follower.turn()
    assert len(leader.starts()) == 1
    await leader.die()
    for _ in range(3):
        clock.now += 1.0
        await follower.turn()
    assert follower.lead.leading
    assert follower.starts() == [] and len(hosts.workers()) == 1  # the load in flight counts
    follower.register(hosts.workers()[0])
    await asyncio.wait_for(waiting, 2)


async def test_a_start_the_old_leader_never_sent_is_placed_again(client):
    """The leader published a start and died before its host heard of it: the router that
    takes over drops it once its host has not reported it for a while, and places anew."""
    clock, hosts = Clock(), FakeHosts("h0")
    leader = Router("r1", client, hosts, clock)
    follower = Router("r2", client, hosts, clock)
    await leader.turn()
    await follower.turn()
    waiting = asyncio.create_task(follower.demand.ready("m"))
    await asyncio.sleep(0.05)
    await leader.turn()
    hosts.procs["h0"].clear()  # the start never reached the host
    await follower.turn()
    await leader.die()
    for _ in range(8):
        clock.now += 1.0
        await follower.turn()
        await asyncio.sleep(0.01)  # the waiting request asks again
    assert follower.lead.leading and len(follower.starts()) == 1
    follower.register(follower.starts()[0].worker_id)
    await asyncio.wait_for(waiting, 2)


async def test_a_keep_alive_set_through_a_follower_holds_for_the_leader(client):
    """A request on the follower sets the model's keep-alive for the fleet: the leader stops
    the idle worker by it, and the follower, which stops nothing, sees it stopped."""
    clock, hosts = Clock(), FakeHosts("h0")
    leader = Router("r1", client, hosts, clock, keep_alive_s=10.0)
    follower = Router("r2", client, hosts, clock, keep_alive_s=10.0)
    await leader.turn()
    await follower.turn()
    leader.entry.last_used = clock.now
    assert leader.placer.place(leader.entry) is not None
    worker_id = hosts.workers()[0]
    for router in (leader, follower):
        router.register(worker_id)
    clock.now += 8.0
    await follower.demand.ready("m", keep_alive_s=20.0)  # served at once by the follower
    for _ in range(3):
        clock.now += 5.0  # idle 10 s by the leader's first look at 113: its old keep-alive
        await follower.turn()
        await leader.turn()
    assert leader.entry.keep_alive_s == 20.0 and hosts.workers() == [worker_id]
    clock.now += 11.0  # 21 s
    await follower.turn()
    await leader.turn()
    assert hosts.workers() == [] and follower.starts() == []
    assert not any(isinstance(m, StopWorker) for _, m in follower.sent)


async def test_the_operators_orders_on_a_follower_are_done_by_the_leader(client):
    clock, hosts = Clock(), FakeHosts("h0")
    leader = Router("r1", client, hosts, clock, max_workers=2)
    follower = Router("r2", client, hosts, clock, max_workers=2)
    await leader.turn()
    await follower.turn()
    operator.load(follower.demand, "m")
    operator.pin(follower.demand, "m", True)
    await follower.turn()  # forwards them
    await leader.turn()  # does them
    assert len(leader.starts()) == 1 and leader.entry.pinned
    await follower.turn()
    assert follower.entry.pinned and follower.starts() == []
    for router in (leader, follower):
        router.register(hosts.workers()[0])
    busy = follower.registry.get(hosts.workers()[0])
    busy.inflight.add("req-1#0")
    with pytest.raises(ApiError) as refused:  # checked on the follower first, as on the leader
        operator.unload(follower.demand, "m")
    assert refused.value.status == 409
    busy.inflight.clear()
    operator.unload(follower.demand, "m")
    await follower.turn()
    await leader.turn()
    assert hosts.workers() == [] and leader.entry.min_workers == 0
    assert not any(isinstance(m, StartWorker | StopWorker) for _, m in follower.sent)


async def test_the_operators_settings_follow_a_leader_of_the_same_config_only(client):
    """A pin survives a change of leader; a router restarted with a new config file for the
    model (here min_workers 1) keeps its own settings instead."""
    clock, hosts = Clock(), FakeHosts("h0")
    leader = Router("r1", client, hosts, clock)
    same = Router("r2", client, hosts, clock)
    changed = Router("r3", client, hosts, clock, min_workers=1)
    await leader.turn()
    operator.pin(leader.demand, "m", True)
    await leader.turn()
    await same.turn()
    await changed.turn()
    assert same.entry.pinned and not changed.entry.pinned
    assert changed.entry.min_workers == 1
