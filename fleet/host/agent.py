"""The host agent's loop: one thread, one poller over its router sockets.

Each turn: HostHello to routers that have not acknowledged it, HostReport to those that have
(every report_interval_s), the routers' messages handled, and ended worker processes reported
as WorkerExited. A StartWorker is checked before anything starts (`refusal`, then `start`):
the catalog must list the model, its files must be readable here, and its estimate must fit
what the live workers' estimates leave of the budget. A model with a Hub `source` whose files
are not here yet is fetched first (fleet/host/fetches.py): its start waits, counted against the
budget, and goes once the fetch is done and checked, or fails with the fetch's reason."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import zmq

from fleet.host.catalog import Catalog
from fleet.host.fetches import Fetch
from fleet.host.links import RouterLink
from fleet.host.memory import rss_bytes
from fleet.host.processes import WorkerProcess, worker_command
from shared.placement.footprint import gib
from shared.placement.messages import (
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

log = logging.getLogger("fleet.host")

POLL_MS = 100


@dataclass(frozen=True)
class AgentSettings:
    host_id: str
    hostname: str
    pid: int
    budget_bytes: int
    total_bytes: int
    config: Path  # the fleet config its workers read their model from
    routers: tuple[str, ...]
    log_dir: Path
    stop_grace_s: float = 10.0


class HostAgent:
    def __init__(
        self,
        settings: AgentSettings,
        catalog: Catalog,
        env: dict,
        configure: Callable[[zmq.Socket], object] | None = None,
    ):
        self.settings, self.catalog, self.env = settings, catalog, env
        self.context = zmq.Context()
        self.links = [RouterLink(self.context, ep, configure) for ep in settings.routers]
        self.poller = zmq.Poller()
        for link in self.links:
            self.poller.register(link.socket, zmq.POLLIN)
        self.workers: dict[str, WorkerProcess] = {}
        self.fetches: dict[str, Fetch] = {}  # by catalog id
        self.waiting: dict[str, StartWorker] = {}  # starts waiting for a fetch, by worker id
        self.stopping = False
        self.exit_code = 0

    # ---- what the host holds ---------------------------------------------------------------

    @property
    def used_bytes(self) -> int:
        """The live workers' estimates (what placement counted for them), and those of the
        starts that wait for their model's fetch."""
        running = sum(w.start.estimate_bytes for w in self.workers.values())
        return running + sum(s.estimate_bytes for s in self.waiting.values())

    @property
    def free_bytes(self) -> int:
        return max(0, self.settings.budget_bytes - self.used_bytes)

    def hello(self) -> HostHello:
        s = self.settings
        return HostHello(
            s.host_id,
            s.hostname,
            s.pid,
            s.budget_bytes,
            self.catalog.servable(),
            self.live_workers(measure=False),
            s.total_bytes,
            held=self.catalog.held(),
            fetches=self.fetch_reports(),
        )

    def report(self) -> HostReport:
        s = self.settings
        workers = self.live_workers(measure=True)
        return HostReport(
            s.host_id, s.budget_bytes, workers, self.catalog.held(), self.fetch_reports()
        )

    def fetch_reports(self):
        return tuple(f.report() for f in self.fetches.values() if not f.done)

    def live_workers(self, measure: bool):
        """The worker processes, and the starts waiting for a fetch as workers of pid 0 (a
        router that restarted, or a new leader, knows them as loading: no second start)."""
        running = tuple(
            w.report(rss_bytes(w.pid) if measure else 0)
            for w in self.workers.values()
            if not w.exited
        )
        waiting = tuple(
            HostWorker(s.worker_id, s.model, 0, s.estimate_bytes) for s in self.waiting.values()
        )
        return running + waiting

    # ---- the loop --------------------------------------------------------------------------

    def request_stop(self) -> None:
        self.stopping = True

    def serve(self) -> int:
        """Until told to stop (a signal) or refused by a router; then stop the workers."""
        try:
            while not self.stopping:
                self.step(time.monotonic())
        finally:
            self.shutdown()
        return self.exit_code

    def step(self, now: float) -> None:
        for link in self.links:
            if not link.acked and now >= link.next_hello:
                link.send(self.hello())
                link.hello_sent(now)
            elif link.acked and now >= link.next_report:
                link.send(self.report())
                link.next_report = now + link.report_interval_s
        ready = dict(self.poller.poll(POLL_MS))
        for link in self.links:
            if link.socket in ready:
                self.handle(link, link.receive())
        self.reap()
        self.reap_fetches()

    def handle(self, link: RouterLink, msg) -> None:
        if isinstance(msg, HostAck):
            self.on_ack(link, msg)
        elif isinstance(msg, ReRegister):
            log.warning("%s asked for HostHello again: %s", link.endpoint, msg.reason)
            link.forget()
        elif isinstance(msg, StartWorker):
            self.start_worker(link, msg)
        elif isinstance(msg, StopWorker):
            self.stop_worker(link, msg)
        elif isinstance(msg, FetchModel):
            self.fetch_model(link, msg.model)
        elif msg is not None:
            log.warning("ignored a %s from %s", type(msg).__name__, link.endpoint)

    def on_ack(self, link: RouterLink, ack: HostAck) -> None:
        if not ack.accepted:
            log.error("the router at %s refused this host: %s", link.endpoint, ack.reason)
            self.exit_code = 1
            self.stopping = True
            return
        if not link.acked:
            log.info("registered with the router at %s", link.endpoint)
        link.acknowledged(ack.report_interval_s, time.monotonic())

    # ---- starting and stopping workers -----------------------------------------------------

    def refusal(self, start: StartWorker) -> str | None:
        """Why `start` cannot run here, or None (it fits the budget, its files are here)."""
        if start.worker_id in self.workers or start.worker_id in self.waiting:
            return f"{start.worker_id} is already running on {self.settings.host_id}"
        if (problem := self.catalog.problem(start.model)) is not None:
            return problem
        if start.estimate_bytes > self.free_bytes:
            return (
                f"{start.worker_id} ({start.model}) needs {gib(start.estimate_bytes)}, host "
                f"{self.settings.host_id} has {gib(self.free_bytes)} of "
                f"{gib(self.settings.budget_bytes)} free"
            )
        return None

    def start_worker(self, link: RouterLink, start: StartWorker) -> None:
        why = self.refusal(start)
        if why is None and self.fetch(start.model):
            self.waiting[start.worker_id] = start  # started once the files are here
            return
        if why is None:
            why = self.launch(start)
        if why is not None:
            log.warning("refused %s: %s", start.worker_id, why)
            link.send(WorkerExited(self.settings.host_id, start.worker_id, start.model, False, why))

    def launch(self, start: StartWorker) -> str | None:
        """Start the worker process of `start`; why it could not, or None."""
        s = self.settings
        cmd = worker_command(s.config, start, s.routers, start.worker_id)
        try:
            self.workers[start.worker_id] = WorkerProcess.launch(start, cmd, self.env, s.log_dir)
        except OSError as exc:
            return f"could not start a worker: {exc}"
        log.info(
            "started %s (%s), estimate %s", start.worker_id, start.model, gib(start.estimate_bytes)
        )
        return None

    # ---- fetching models from the Hub ------------------------------------------------------

    def fetch(self, model: str) -> bool:
        """Mutates: fetch `model`'s files unless they are here (or on their way); whether a
        start of it must wait for them."""
        if model in self.fetches:
            return True
        source = self.catalog.to_fetch(model)
        if source is None:
            return False
        self.fetches[model] = Fetch.start(model, source)
        return True

    def fetch_model(self, link: RouterLink, model: str) -> None:
        """FetchModel: its files fetched here; FetchEnded at once when they are here already
        (or it cannot be: the reason)."""
        if (problem := self.catalog.problem(model)) is not None:
            link.send(FetchEnded(self.settings.host_id, model, False, problem))
        elif not self.fetch(model):
            link.send(FetchEnded(self.settings.host_id, model, True))

    def reap_fetches(self) -> None:
        """Fetches that ended: said to every router; the starts that waited for one go, or
        fail with its reason."""
        for fetch in [f for f in self.fetches.values() if f.done]:
            del self.fetches[fetch.model]
            log.log(logging.INFO if fetch.ok else logging.WARNING, "%s", fetch.outcome())
            host_id = self.settings.host_id
            ended = FetchEnded(host_id, fetch.model, fetch.ok, fetch.error)
            for link in self.links:
                link.send(ended)
            for start in [s for s in self.waiting.values() if s.model == fetch.model]:
                del self.waiting[start.worker_id]
                why = self.launch(start) if fetch.ok else fetch.error
                if why is not None:
                    log.warning("refused %s: %s", start.worker_id, why)
                    for link in self.links:
                        link.send(WorkerExited(host_id, start.worker_id, start.model, False, why))

    def stop_worker(self, link: RouterLink, stop: StopWorker) -> None:
        worker = self.workers.get(stop.worker_id)
        if (waiting := self.waiting.pop(stop.worker_id, None)) is not None:  # the fetch goes on
            why = "stopped while its model's files were fetched"
            msg = WorkerExited(self.settings.host_id, stop.worker_id, waiting.model, True, why)
            link.send(msg)
            return
        if worker is None:  # gone already: say so, the router's view may be stale
            msg = WorkerExited(self.settings.host_id, stop.worker_id, "", True, "not running")
            link.send(msg)
            return
        log.info("stopping %s: %s", stop.worker_id, stop.reason or "asked")
        worker.stop(stop.reason, self.settings.stop_grace_s)

    def reap(self) -> None:
        """Report every worker process that ended to every router; kill overdue stops."""
        now = time.monotonic()
        for worker in list(self.workers.values()):
            worker.kill_if_overdue(now)
            if worker.exited:
                del self.workers[worker.worker_id]
                exited = worker.exit_message(self.settings.host_id)
                log.log(
                    logging.INFO if exited.asked else logging.WARNING,
                    "%s exited: %s",
                    worker.worker_id,
                    exited.reason,
                )
                for link in self.links:
                    link.send(exited)

    def shutdown(self) -> None:
        """SIGTERM every worker, SIGKILL those still there after the grace; close sockets."""
        for worker in self.workers.values():
            worker.stop("host agent stopping", self.settings.stop_grace_s)
        deadline = time.monotonic() + self.settings.stop_grace_s + 2.0
        while self.workers and time.monotonic() < deadline:
            self.reap()
            time.sleep(0.05)
        for link in self.links:
            link.close()
        self.context.term()
