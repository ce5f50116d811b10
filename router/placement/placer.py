"""Placement: which host loads a catalog model, what it evicts to make room, and the host
agents' messages (shared/placement/messages.py).

A model is placed on an alive host that can read its files and has room by the estimates:
its budget less what its workers take (each worker's estimate, or its measured memory when
that is more) and the starts it was asked for. Without room there, idle workers of other
models are stopped, least recently used first — never a pinned model's, one with requests in
flight, or one its model's `min_workers` needs — and the start is sent once they are gone
(the host checks its budget again and refuses what does not fit). A host that already holds
a Hub model's files (no fetch) is chosen first, then the one with the fewest evictions, then
the least recently used victims, then the most room.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from router.placement.catalog import Entry, Start
from router.placement.hosts import HostState
from router.placement.load_failure import cause_of
from shared.placement.footprint import gib
from shared.placement.messages import (
    HOST_PROTOCOL_VERSION,
    FetchEnded,
    FetchModel,
    HostAck,
    HostHello,
    HostReport,
    HostWorker,
    StartWorker,
    StopWorker,
    WorkerExited,
)
from shared.protocol import ReRegister

if TYPE_CHECKING:
    from router.cluster.registry import WorkerRegistry, WorkerState

log = logging.getLogger(__name__)


class Placer:
    def __init__(
        self,
        registry: WorkerRegistry,
        entries: dict[str, Entry],
        send: Callable[[bytes, object], None],
        retire: Callable[[str, str], None],
        clock: Callable[[], float],
        report_interval_s: float = 1.0,
        leading: Callable[[], bool] = lambda: True,
    ):
        self.registry, self.entries = registry, entries
        self._send, self._retire, self._clock = send, retire, clock
        self.report_interval_s = report_interval_s
        self.leading = leading  # this router leads placement (router/placement/leadership.py)
        self.hosts: dict[str, HostState] = {}
        self.served: set[str] = set()  # models some worker registered for, ever
        self.joined = asyncio.Event()  # set, then replaced, when a worker registers
        self.fetch_ended: dict[str, dict[str, FetchEnded]] = {}  # model -> host -> last end

    # ------------------------------------------------------------ the hosts' messages

    def handle(self, identity: bytes, msg: object) -> None:
        if isinstance(msg, HostHello):
            self._hello(identity, msg)
            return
        host = next((h for h in self.hosts.values() if h.identity == identity), None)
        if host is None or not host.alive:
            self._send(identity, ReRegister("this router does not know this host; say hello"))
            return
        host.last_seen = self._clock()
        if isinstance(msg, HostReport):
            self._report(host, msg)
        elif isinstance(msg, WorkerExited):
            self._exited(host, msg)
        elif isinstance(msg, FetchEnded):
            self._fetched(host, msg)

    def _hello(self, identity: bytes, msg: HostHello) -> None:
        if msg.protocol_version != HOST_PROTOCOL_VERSION:
            reason = f"host protocol {msg.protocol_version} != router's {HOST_PROTOCOL_VERSION}"
            self._send(identity, HostAck(False, reason))
            return
        old = self.hosts.get(msg.host_id)
        host = HostState(msg, identity, self._clock(), msg.budget_bytes)
        host.workers = {w.worker_id: w for w in msg.workers}
        if old is not None:  # the agent restarted (or this router did): what it lost is gone
            host.stopping = old.stopping & set(host.workers)
            for entry in self.entries.values():
                for start in [s for s in entry.starts.values() if s.host_id == host.id]:
                    if start.sent and start.worker_id not in host.workers:
                        del entry.starts[start.worker_id]
                entry.wake()
        self.hosts[msg.host_id] = host
        log.info(
            "host %s (%s) joined: budget %s, %d catalog models readable, %d workers running",
            msg.host_id,
            msg.host,
            gib(msg.budget_bytes),
            len(msg.models),
            len(msg.workers),
        )
        self._send(identity, HostAck(True, report_interval_s=self.report_interval_s))

    def _report(self, host: HostState, msg: HostReport) -> None:
        host.budget_bytes = msg.budget_bytes
        host.reported(msg.held, msg.fetches)
        host.workers = {w.worker_id: w for w in msg.workers}
        for gone in host.stopping - set(host.workers):
            self._gone(host, gone)
        for w in host.over_estimate():
            log.debug(
                "worker %s measures %s, over its estimate %s",
                w.worker_id,
                gib(w.rss_bytes),
                gib(w.estimate_bytes),
            )

    def _exited(self, host: HostState, msg: WorkerExited) -> None:
        host.workers.pop(msg.worker_id, None)
        entry = self.entries.get(msg.model)
        start = entry.starts.pop(msg.worker_id, None) if entry else None
        if not msg.asked:
            log.warning(
                "host %s: worker %s (%s) ended: %s", host.id, msg.worker_id, msg.model, msg.reason
            )
            if entry is not None and start is not None:  # it never registered: the load failed
                cause = f"on host {host.id}: {cause_of(msg.reason)}"
                entry.fail(cause, self._clock(), detail=msg.reason)
        self._retire(msg.worker_id, msg.reason if not msg.asked else "stopped by its host")
        self._gone(host, msg.worker_id)

    def _fetched(self, host: HostState, msg: FetchEnded) -> None:
        """A host's fetch ended: its files are held there now, or the model's pull failed
        (a start that waited for it fails by its own WorkerExited)."""
        host.fetches.pop(msg.model, None)
        if msg.ok and msg.model not in host.held:
            host.held = (*host.held, msg.model)
        if not msg.ok:
            log.warning("host %s: fetching %s failed: %s", host.id, msg.model, msg.reason)
        self.fetch_ended.setdefault(msg.model, {})[host.id] = msg
        if (entry := self.entries.get(msg.model)) is not None:
            entry.wake()

    def _gone(self, host: HostState, worker_id: str) -> None:
        """A worker of `host` no longer runs: starts that waited for its room may go."""
        host.stopping.discard(worker_id)
        host.workers.pop(worker_id, None)
        for entry in self.entries.values():
            for start in list(entry.starts.values()):
                start.after.discard(worker_id)
                ready = not start.after and not start.sent and start.host_id == host.id
                if ready and self.leading():  # (a follower's mirror waits for the leader)
                    self._send_start(entry, start, host)
            entry.wake()

    def on_registered(self, worker: WorkerState) -> None:
        """A worker registered: the start that asked for it is done."""
        self.served.add(worker.model)
        self.joined.set()
        self.joined = asyncio.Event()
        entry = self.entries.get(worker.model)
        if entry is not None:
            entry.starts.pop(worker.worker_id, None)
            entry.failure = ""
            entry.wake()

    # ------------------------------------------------------------ placing

    def alive(self) -> list[HostState]:
        return [h for h in self.hosts.values() if h.alive]

    def starting_on(self, host: HostState) -> int:
        """Bytes of starts sent to `host` that it does not report yet: what it holds, or is
        about to, beside its workers (stopping ones included until they are gone)."""
        return self._starts_on(host, sent=True)

    def reserved_on(self, host: HostState) -> int:
        """Bytes of starts asked of `host` that wait for their victims to go: the room those
        free is promised to them, though the victims still hold it."""
        return self._starts_on(host, sent=False)

    def _starts_on(self, host: HostState, sent: bool) -> int:
        return sum(
            entry.estimate_bytes
            for entry in self.entries.values()
            for s in entry.starts.values()
            if s.host_id == host.id and s.sent == sent and s.worker_id not in host.workers
        )

    def free(self, host: HostState) -> int:
        """Room for a new start: the budget less the workers, the starts sent, and those
        that wait for their victims (so no two starts are promised the same room)."""
        return host.budget_bytes - host.used(self.starting_on(host) + self.reserved_on(host))

    def place(self, entry: Entry, evict: bool = True) -> Start | None:
        """Mutates: ask a host for one more worker of `entry` (stopping idle workers first
        when `evict`), or None when no host has room now."""
        best = None
        for host in self.alive():
            if not host.reads(entry.id):
                continue
            victims = self._victims(host, entry, self.free(host)) if evict else []
            room = self.free(host) + sum(HostState.cost(v) for v in victims or [])
            if victims is None or room < entry.estimate_bytes:
                continue
            # a host that holds its files (no fetch), then the fewest evictions, of the
            # models used longest ago, then the most room
            newest = max((self._last_used(v) for v in victims), default=float("-inf"))
            key = (not host.holds(entry.id), len(victims), newest, -room)
            if best is None or key < best[0]:
                best = (key, host, victims)
        if best is None:
            return None
        _, host, victims = best
        worker_id = entry.new_worker_id(host.id)
        while worker_id in host.workers or self.registry.get(worker_id):  # a router restarted
            worker_id = entry.new_worker_id(host.id)
        start = Start(worker_id, host.id, {v.worker_id for v in victims})
        entry.starts[start.worker_id] = start
        for victim in victims:
            self.stop(host, victim.worker_id, f"making room for {entry.id}")
        if not start.after and not start.sent:  # (its victims may be gone already)
            self._send_start(entry, start, host)
        return start

    def _victims(self, host: HostState, entry: Entry, free: int) -> list[HostWorker] | None:
        """The fewest idle workers (least recently used models first) whose stopping makes
        room for `entry` on `host`: [] when it fits already, None when it cannot."""
        if free >= entry.estimate_bytes:
            return []
        chosen: list[HostWorker] = []
        for worker in sorted(self.evictable(host, entry.id), key=self._last_used):
            chosen.append(worker)
            free += HostState.cost(worker)
            if free >= entry.estimate_bytes:
                return chosen
        return None

    def evictable(self, host: HostState, for_model: str) -> list[HostWorker]:
        """Workers of `host` that may be stopped for another model."""
        out = []
        for worker in host.workers.values():
            other = self.entries.get(worker.model)
            if worker.model == for_model or worker.worker_id in host.stopping or other is None:
                continue
            if other.pinned or worker.worker_id in other.starts:
                continue
            if not self.idle(worker.worker_id) or self.loaded(other) <= other.min_workers:
                continue
            out.append(worker)
        return out

    def idle(self, worker_id: str) -> bool:
        """No request of ours or another router's runs or waits there."""
        state = self.registry.get(worker_id)
        return state is None or (state.load == 0 and not state.inflight)

    def loading(self, entry: Entry) -> set[str]:
        """Its workers on the way: the starts asked, and the processes hosts report that have
        not registered (a start another router asked for, the instant before it died)."""
        reported = {
            w.worker_id
            for h in self.alive()
            for w in h.workers.values()
            if w.model == entry.id and w.worker_id not in h.stopping
        }
        unregistered = {wid for wid in reported if self.registry.get(wid) is None}
        return set(entry.starts) | unregistered

    def live(self, entry: Entry) -> int:
        """Its workers serving or on the way: what `max_workers` bounds."""
        return len({w.worker_id for w in self.registry.healthy(entry.id)} | self.loading(entry))

    def loaded(self, entry: Entry) -> int:
        """Its workers running on hosts and not asked to stop."""
        return sum(
            1
            for h in self.alive()
            for w in h.workers.values()
            if w.model == entry.id and w.worker_id not in h.stopping
        )

    def _last_used(self, worker: HostWorker) -> float:
        entry = self.entries.get(worker.model)
        return entry.last_used if entry else float("-inf")

    def stop(self, host: HostState, worker_id: str, why: str) -> None:
        """Mutates: the worker takes no new request and its host stops it."""
        host.stopping.add(worker_id)
        log.info("stopping worker %s on %s: %s", worker_id, host.id, why)
        self._retire(worker_id, why)
        self._send(host.identity, StopWorker(worker_id, why))

    def _send_start(self, entry: Entry, start: Start, host: HostState) -> None:
        start.sent = True
        log.info(
            "starting %s on host %s as %s (%s by estimate)",
            entry.id,
            host.id,
            start.worker_id,
            gib(entry.estimate_bytes),
        )
        msg = StartWorker(start.worker_id, entry.id, entry.estimate_bytes, entry.kv_bytes)
        self._send(host.identity, msg)

    def fetch(self, host: HostState, model: str) -> None:
        """Mutates: `host` fetches `model`'s files (its FetchEnded says how it went)."""
        self.fetch_ended.get(model, {}).pop(host.id, None)
        self._send(host.identity, FetchModel(model))

    def lose_host(self, host: HostState, why: str) -> None:
        """Mutates: a silent host is gone; what it was loading will be placed again."""
        log.warning("host %s lost: %s", host.id, why)
        host.alive = False
        host.workers.clear()  # they end with their agent (a survivor goes by its heartbeats)
        for entry in self.entries.values():
            for start in [s for s in entry.starts.values() if s.host_id == host.id]:
                del entry.starts[start.worker_id]
            entry.wake()

    # ------------------------------------------------------------ several routers

    def stopped_by_leader(self, host: HostState, worker_id: str) -> None:
        """Mutates (a follower): the leader asked `host` to stop the worker; it takes no new
        request of ours either."""
        if worker_id not in host.stopping:
            host.stopping.add(worker_id)
            self._retire(worker_id, "stopped by the placement leader")

    def send_waiting(self) -> None:
        """Mutates (the leader): send the starts whose victims are gone (those a router that
        took over found waiting: their victims went while it followed)."""
        for entry in self.entries.values():
            for start in list(entry.starts.values()):
                host = self.hosts.get(start.host_id)
                if not start.sent and not start.after and host is not None and host.alive:
                    self._send_start(entry, start, host)

    def forget_lost_starts(self, now: float, grace_s: float) -> None:
        """Mutates (the leader): a start learnt from another leader that its host has not
        reported `grace_s` after, and that never registered, was lost with that leader (it
        died before sending it, or the host refused it to that leader alone)."""
        for entry in self.entries.values():
            for start in list(entry.starts.values()):
                host = self.hosts.get(start.host_id)
                reported = host is not None and start.worker_id in host.workers
                young = start.adopted_at is None or now - start.adopted_at < grace_s
                if young or not start.sent or reported:
                    continue
                log.warning(
                    "start %s (%s) was lost with the last leader", start.worker_id, entry.id
                )
                del entry.starts[start.worker_id]
                entry.wake()
