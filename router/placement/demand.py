"""Models loaded by demand: a request for a catalog model with no live worker waits (bounded)
while one is placed; workers past their keep-alive go, `min_workers` stay, a queue that
grows gets another worker (up to `max_workers`); silent hosts are lost. The operator's load,
unload and pin (router/http/endpoints/admin.py) act through the same rules.

Only with host agents: a fleet of hand-started workers (no host ever said hello) behaves as
before, a request for a model with no worker being a 503 at once.

Several routers (issue 50): only the leader (router/placement/leadership.py) starts and stops
workers; a follower's waiting request asks the leader through the shared store, and is
answered when the worker registers with it. Each turn, a router reads what the others said
(`pull`), ticks, and says its part (`push`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from router.errors import ApiError, model_unavailable
from router.placement import shared
from router.placement.catalog import FAILURE_HOLD_S, Entry
from router.placement.leadership import Leadership, SoleLeader
from router.placement.placer import Placer
from shared.placement.footprint import gib

if TYPE_CHECKING:
    from router.cluster.registry import WorkerRegistry

log = logging.getLogger(__name__)

NOTE_EVERY_S = 5.0  # a waiting stream is told so this often (an SSE comment)
NOTE_FETCH_EVERY_S = 1.0  # and this often while its model's files are fetched (a percentage)
SCALE_UP_AFTER_S = 2.0  # requests waiting on every worker of a model this long: one more
LOST_START_S = 5.0  # a start learnt from another leader, unreported by its host this long: lost


class Demand:
    def __init__(
        self,
        placer: Placer,
        registry: WorkerRegistry,
        load_timeout_s: float,
        host_timeout_s: float,
        clock: Callable[[], float],
        lead: Leadership | None = None,
        wall: Callable[[], float] = time.time,
    ):
        self.placer, self.registry = placer, registry
        self.entries = placer.entries
        self.load_timeout_s, self.host_timeout_s = load_timeout_s, host_timeout_s
        self.clock, self.wall = clock, wall
        self.lead: Leadership = lead or SoleLeader()
        self._share_failing = False
        self.outbox: list[dict] = []  # the operator's orders for the leader (a follower's)
        # the leader does the forwarded orders (router/placement/operator.py `apply`)
        self.on_orders: Callable[[list[dict]], None] = lambda orders: None
        self.started_at = clock()
        self._idle_since: dict[str, float] = {}  # worker id -> when it last had no work

    @property
    def active(self) -> bool:
        """Some host agent serves this router: models load on demand."""
        return bool(self.placer.alive())

    # ------------------------------------------------------------ a request's wait

    async def ready(
        self,
        model: str,
        keep_alive_s: float | None = None,
        note: Callable[[], Awaitable[None]] | None = None,
        worker_wait_s: float = 0.0,
        lost: bool = False,
    ) -> None:
        """Until `model` has a healthy worker (at once when it has one); 503 naming the cause
        when its load fails, cannot be placed, or takes longer than load_timeout_s. A model
        nothing places (no catalog entry, or no host agent) is waited for only when the
        request `lost` its worker: `worker_wait_s` at most (`until_started` waits for the
        first workers). `note` is awaited every NOTE_EVERY_S while waiting."""
        entry = self.entries.get(model)
        if entry is not None:
            entry.last_used = self.clock()
            if keep_alive_s is not None:
                entry.keep_alive_s, entry.keep_alive_at = keep_alive_s, self.clock()
        if self.registry.healthy(model):
            return
        if entry is None or not self.active:
            if lost:  # its worker was lost: one may come back, or another start
                await self.wait_for_worker(model, self.clock() + worker_wait_s, note)
            return
        deadline, noted = self.clock() + self.load_timeout_s, self.clock()
        entry.waiting += 1
        try:
            while not self.registry.healthy(model):
                self.check(entry)
                if not self.placer.loading(entry):
                    await self._ask(entry)
                left = deadline - self.clock()
                if left <= 0:
                    raise self._timed_out(entry)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(entry.changed.wait(), min(left, 1.0))
                every = NOTE_FETCH_EVERY_S if self.fetching(model) else NOTE_EVERY_S
                if note is not None and self.clock() - noted >= every:
                    noted = self.clock()
                    await note()
        finally:
            entry.waiting -= 1
            entry.last_used = self.clock()

    async def wait_for_worker(
        self,
        model: str,
        deadline: float,
        note: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """Until `model` has a healthy worker or `deadline` passes (then the caller finds
        none: its 503)."""
        noted = self.clock()
        while not self.registry.healthy(model):
            left = deadline - self.clock()
            if left <= 0:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.placer.joined.wait(), min(left, 1.0))
            if note is not None and self.clock() - noted >= NOTE_EVERY_S:
                noted = self.clock()
                await note()

    async def until_started(
        self, model: str, wait_s: float, note: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        """While `model`'s workers are still starting (none has registered since the router
        started, `wait_s` ago at most): until one registers."""
        if model not in self.placer.served:
            await self.wait_for_worker(model, self.started_at + wait_s, note)

    def fetching(self, model: str) -> tuple[int, int] | None:
        """Bytes (done, total) of the fetches of `model`'s files under way on the hosts, or
        None when none is."""
        fetches = [h.fetches[model] for h in self.placer.alive() if model in h.fetches]
        if not fetches:
            return None
        return sum(f.done_bytes for f in fetches), sum(f.total_bytes for f in fetches)

    def loading_note(self, model: str) -> str:
        """What a request waiting for `model` is told: `loading M`, with the percentage of
        its files fetched while a host fetches them."""
        if (fetching := self.fetching(model)) is None:
            return f"loading {model}"
        done, total = fetching
        if not total:
            return f"loading {model}: fetching its files from the Hub"
        return (
            f"loading {model}: fetching its files from the Hub, {100 * done // total}% "
            f"({_mb(done)} of {_mb(total)})"
        )

    def starting(self, wait_s: float) -> bool:
        """No worker has registered yet, and the router started less than `wait_s` ago."""
        return not self.placer.served and self.clock() - self.started_at < wait_s

    def replied(self, model: str) -> None:
        """Mutates: a reply of `model` ended; its keep-alive counts from now (a reply shorter
        than a tick is never seen busy, so its worker's idle time alone would count from
        before the request)."""
        entry = self.entries.get(model)
        if entry is not None:
            entry.last_used = self.clock()

    async def _ask(self, entry: Entry) -> None:
        """One worker of `entry`, nothing loading it: the leader places it; a follower tells
        the leader at once (it would hear at the follower's next turn anyway)."""
        if self.lead.leading:
            self.placer.place(entry)
        else:
            await self.lead.publish_demand(self._demand())

    def check(self, entry: Entry) -> None:
        """503 now when `entry` cannot load: it failed lately, no host reads its files, or it
        is larger than every host's budget."""
        if failure := entry.failing(self.clock()):
            raise model_unavailable(
                f"the model '{entry.id}' failed to load {failure}",
                "model_load_failed",
                FAILURE_HOLD_S,
            )
        readers = [h for h in self.placer.alive() if h.reads(entry.id)]
        if not readers:
            raise model_unavailable(
                f"no host agent can read the files of the model '{entry.id}'",
                "model_not_on_any_host",
            )
        largest = max(h.budget_bytes for h in readers)
        if entry.estimate_bytes > largest:
            raise model_unavailable(
                f"the model '{entry.id}' needs {gib(entry.estimate_bytes)} by its estimate; "
                f"the largest host budget is {gib(largest)}",
                "model_too_large",
            )

    def _timed_out(self, entry: Entry) -> ApiError:
        if entry.starts:
            why = f"it is still loading after {self.load_timeout_s:g}s"
        else:
            why = (
                f"no host has {gib(entry.estimate_bytes)} free, and the models loaded there "
                "are pinned or busy"
            )
        return model_unavailable(
            f"the model '{entry.id}' is not loaded: {why}", "model_loading", 30
        )

    # ------------------------------------------------------------ once a second

    async def watch(self, period_s: float = 1.0) -> None:
        while True:
            await asyncio.sleep(period_s)
            await self._share(self.pull)
            try:
                self.tick()
            except Exception:  # one bad turn must not stop placement for good
                log.exception("placement tick failed")
            await self._share(self.push)

    async def _share(self, step: Callable[[], Awaitable[None]]) -> None:
        """`step`, a failure logged once until one succeeds again (a store that does not
        answer: the leader's lease runs out, and placement waits for it to come back)."""
        try:
            await step()
            self._share_failing = False
        except Exception as e:
            if not self._share_failing:
                log.warning("placement: sharing with the other routers failed: %s", e)
            self._share_failing = True

    def _offset(self) -> float:
        """This router's wall clock less its monotonic one: what the routers' times cross in."""
        return self.wall() - self.clock()

    def _demand(self) -> dict:
        return shared.demand_of(self.entries, self._offset(), self.clock())

    async def pull(self) -> None:
        """Mutates: renew or take the lease; mirror the leader's state (a follower, or a router
        that just took over), or fold the followers' demand in (the leader)."""
        was_leading = self.lead.leading
        pulled = await self.lead.pull()
        if pulled.state is not None:
            shared.adopt(self.placer, pulled.state, self._offset(), self.clock())
        if self.lead.leading:
            shared.merge(self.entries, pulled.demands, self._offset())
            self.on_orders(pulled.orders)
            if not was_leading:
                log.info("this router leads placement now (%s)", self.lead.router_id)
        elif was_leading:
            log.warning("this router no longer leads placement (leader: %s)", self.lead.leader)

    async def push(self) -> None:
        """The leader publishes its state; a follower its demand and the operator's orders."""
        orders, self.outbox = self.outbox, []
        if self.lead.leading:
            self.on_orders(orders)  # (asked while it followed)
            await self.lead.publish_state(shared.state_of(self.placer, self._offset()))
            return
        await self.lead.publish_demand(self._demand())
        if orders:
            try:
                await self.lead.send_orders(orders)
            except Exception:
                self.outbox[:0] = orders  # the next turn tries again
                raise

    def forward(self, order: dict) -> None:
        """Mutates (a follower): `order` goes to the leader at this router's next turn."""
        self.outbox.append(order)

    def tick(self) -> None:
        """Mutates: hosts silent too long are lost; then, when this router leads, idle workers
        past their keep-alive are stopped; min_workers are kept; a model whose requests queue
        gets another worker; requests waiting (here or on another router) for a model whose
        start was lost get a new one."""
        now = self.clock()
        for host in self.placer.alive():
            if now - host.last_seen > self.host_timeout_s:
                self.placer.lose_host(host, f"silent for {self.host_timeout_s:g}s")
        if not self.lead.leading:  # a follower: the leader decides
            return
        self.placer.forget_lost_starts(now, LOST_START_S)
        self.placer.send_waiting()
        for host in self.placer.alive():
            for worker in list(host.workers.values()):
                self._keep_alive(host, worker.worker_id, worker.model, now)
        for entry in self.entries.values():
            live, failing = self.placer.live(entry), entry.failing(now)
            waiting = entry.waiting + entry.waiting_elsewhere
            lost = waiting and not live  # requests wait, and nothing serves or loads it
            if (lost or live < entry.min_workers) and not failing:
                self.placer.place(entry)  # a start lost with its host, or min_workers short
            elif self._pressed(entry, now) and live < entry.max_workers and not failing:
                entry.pressure_since = None
                self.placer.place(entry)

    def _keep_alive(self, host, worker_id: str, model: str, now: float) -> None:
        entry = self.entries.get(model)
        if entry is None or worker_id in host.stopping or worker_id in entry.starts:
            return
        if not self.placer.idle(worker_id):
            self._idle_since.pop(worker_id, None)
            return
        since = self._idle_since.setdefault(worker_id, now)
        if entry.expired(since, now) and self.placer.loaded(entry) > entry.min_workers:
            self._idle_since.pop(worker_id, None)
            self.placer.stop(host, worker_id, f"idle past its keep_alive ({entry.keep_alive_s:g}s)")

    def _pressed(self, entry: Entry, now: float) -> bool:
        """Every worker of the model has had requests waiting for SCALE_UP_AFTER_S."""
        workers = self.registry.healthy(entry.id)
        waiting = workers and all(w.heartbeat and w.heartbeat.waiting for w in workers)
        if not waiting:
            entry.pressure_since = None
            return False
        if entry.pressure_since is None:
            entry.pressure_since = now
        return now - entry.pressure_since >= SCALE_UP_AFTER_S


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"
