"""The worker process: an Engine driven by messages from the router.

The engine loop runs in the main thread: take what arrived (Generate, Abort, Shutdown),
run one engine step, send the deltas and KV events. It never waits on the socket (the link
thread owns that), and when idle it sleeps on the inbound queue.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from shared.protocol import (
    Abort,
    Generate,
    GroupReport,
    Heartbeat,
    KVEvents,
    Message,
    Register,
    RegisterAck,
    SendInventory,
    Shutdown,
    TokenDelta,
    Usage,
)
from shared.sampling import InvalidRequest
from worker.connection import RouterConnection
from worker.engine.engine import Engine, EngineOverloaded
from worker.inventory import inventory
from worker.live import LiveRequests, Stage
from worker.peer.channel import PeerChannel
from worker.peer.node import PULL_TIMEOUT_S, PeerNode
from worker.peer.prefill import PREFILL_SAMPLING
from worker.routers import RouterLinks
from worker.tracing import WorkerTracing
from worker.vision.preparing import ImagePreparer
from worker.watchdog import LoopWatchdog

if TYPE_CHECKING:
    from worker.vision.encoder import PreparedImages

log = logging.getLogger(__name__)

IDLE_WAIT_S = 0.05
PHASES_EVERY_S = 1.0  # phase percentiles sort a window: refreshed this often, not per step
PREFILL_RATE_EWMA = 0.2  # weight of one prefill step in the measured prefill rate


class WorkerLoop:
    """The worker's main loop: messages from the router in, engine steps, deltas out."""

    def __init__(
        self,
        engine: Engine,
        endpoint: str | Sequence[str],
        worker_id: str,
        model_id: str,
        configure_socket=None,
        group: GroupReport | None = None,
        on_idle: Callable[[], None] | None = None,
        watchdog_s: float = 0.0,
        otlp_endpoint: str | None = None,
        kv_publisher=None,
        peers: PeerChannel | None = None,
        pull_timeout_s: float = PULL_TIMEOUT_S,
        role: str = "both",
    ):
        """`endpoint`: the router's ZeroMQ address, or several routers' (each gets it all:
        registration, heartbeats, KV events, the inventory; requests come from any);
        `group` and `on_idle`: for a tensor-parallel group's leader, the ranks it reports
        and what it runs between idle waits (the keepalive its followers expect);
        `watchdog_s`: the process exits when the loop is stuck this long (0: never);
        `peers`: this worker's KV endpoint for peer block transfer (None: none), and
        `pull_timeout_s` the longest it waits for a peer's blocks; `role`: what it announces
        it does (shared/config/choices.py WORKER_ROLES)."""
        self.engine, self.worker_id, self.on_idle = engine, worker_id, on_idle
        self.kv_publisher = kv_publisher  # KV events in vLLM's format too (worker/kv_publish.py)
        refused = engine.kv.cannot("peer")
        if peers is not None and refused is not None:
            log.warning("peer KV transfer off: %s", refused)
            peers = None
        self.peer = None
        if peers is not None:
            self.peer = PeerNode(engine, peers, self._wake, pull_timeout_s)
        self.prefill_rate = 0.0  # tokens/s, EWMA over steps that prefilled
        self.live = LiveRequests()  # every request held, from arrival to its end
        # image requests are prepared (decoded, preprocessed) on these threads, not this one
        self.images = ImagePreparer(
            lambda msg: engine.intake.prepare(list(msg.token_ids), msg.images), self._wake
        )
        register = Register(
            worker_id=worker_id,
            model_id=model_id,
            block_size=engine.block_size,
            kv_capacity_blocks=engine.kv_capacity_blocks,
            host=socket.gethostname(),
            pid=os.getpid(),
            attention=engine.attention_report,
            group=group,
            kv_endpoint=self.peer.endpoint if self.peer is not None else "",
            role=role,
            window_blocks=engine.kv.rule.window_blocks,  # the hit rule, for the router
            state_snapshots=engine.states is not None,
            chunk_blocks=engine.kv.rule.chunk_blocks,
            vision=engine.intake.vision is not None,
            vision_note="" if engine.intake.vision is not None else engine.intake.vision_note,
        )
        self._phases, self._phases_at = None, 0.0
        self.turns, self.watchdog = 0, LoopWatchdog(watchdog_s)  # loop progress (issue 24)
        self._load = self._heartbeat()
        endpoints = (endpoint,) if isinstance(endpoint, str) else tuple(endpoint)
        self.routers = RouterLinks(endpoints, register, lambda: self._load, configure_socket)
        self.stopping = threading.Event()
        # None unless an OTLP endpoint is configured (the setting or $OTEL_EXPORTER_OTLP_ENDPOINT)
        self.tracing = engine.tracing = WorkerTracing.start(worker_id, otlp_endpoint)

    def serve_forever(self) -> int:
        """Run until Shutdown, stop(), or the router refuses us; the exit code."""
        if self.peer is not None:
            self.peer.start()
        self.routers.start()
        self.watchdog.start()
        try:
            while not self.stopping.is_set():
                hold = self.engine.hold_s()  # batch work waiting for an interactive request
                # idle, a turn every IDLE_WAIT_S at least (a TP leader's keepalive, the watchdog)
                if hold > 0:
                    wait = min(hold, IDLE_WAIT_S)
                else:
                    wait = 0.0 if self.engine.has_work() else IDLE_WAIT_S
                for link, msg in self.routers.arrivals(wait):
                    self._handle(link, msg)
                for msg, prepared in self.images.ready():
                    self._admit(msg, prepared)
                if self.peer is not None:
                    for msg in self.peer.turn():
                        self._generate(msg)
                if self.engine.has_work() and self.engine.hold_s() == 0:
                    self._step()
                elif self.on_idle is not None:
                    self.on_idle()
                self._load = self._heartbeat()
                self.watchdog.turned()
        finally:
            self.watchdog.stop()
            self.images.close()
            self.routers.stop()
            if self.kv_publisher is not None:
                self.kv_publisher.close()
            if self.peer is not None:
                self.peer.stop()
        return 1 if self.routers.refused else 0

    def stop(self) -> None:
        self.stopping.set()

    def _wake(self) -> None:
        """Wakes the loop from its idle wait: a peer's fetch to serve, or a pull done."""
        self.routers.wake()

    def _handle(self, link: RouterConnection, msg: Message) -> None:
        if isinstance(msg, Generate):
            if msg.request_id in self.live:  # the first one runs on, answered where it came from
                running = InvalidRequest(f"request {msg.request_id!r} is already running")
                self.routers.send(link, self._error(msg, running))
                return
            self.live.arrived(link, msg)
            if self.peer is not None and self.peer.park(msg):
                self.live.moved(msg.request_id, Stage.PARKED)
            else:
                self._generate(msg)
        elif isinstance(msg, Abort):
            self._abort(msg)
        elif isinstance(msg, Shutdown):
            log.info("shutdown requested by the router: %s", msg.reason or "no reason")
            self.stop()
        elif isinstance(msg, RegisterAck):  # a refusal, or an acceptance, passed on by the link
            if not msg.accepted:
                self.stop()
                return
            self._send_inventory(link)
            if self.peer is not None:
                self.peer.set_peers(self.routers.peers(link, msg.peers))
        elif isinstance(msg, SendInventory):  # the router lost some of our KV events
            log.warning("the router at %s asked for the inventory: %s", link.endpoint, msg.reason)
            self._send_inventory(link)
        else:
            log.warning("ignored an unexpected %s from the router", type(msg).__name__)

    def _abort(self, msg: Abort) -> None:
        """The request (or one choice, `msg.index`) stopped wherever it is."""
        if msg.index is not None:
            if self.engine.abort(msg.request_id, msg.index):
                self.live.choice_ended(msg.request_id)  # that choice sends no final delta
        else:
            live = self.live.ended(msg.request_id)
            stage = live.stage if live is not None else Stage.ENGINE
            if stage is Stage.PARKED and self.peer is not None:
                self.peer.abort(msg.request_id)
            elif stage is Stage.PREPARING:
                self.images.cancel(msg.request_id)
            else:
                self.engine.abort(msg.request_id, None)
        if self.tracing is not None:
            self.tracing.aborted(msg.request_id, msg.index)

    def _generate(self, msg: Generate) -> None:
        """Queue `msg` in the engine; one with images once they are prepared (`_admit`)."""
        if not msg.images:
            self._admit(msg, None)
        else:
            self.live.moved(msg.request_id, Stage.PREPARING)
            self.images.submit(msg)

    def _admit(self, msg: Generate, prepared: PreparedImages | InvalidRequest | None) -> None:
        if isinstance(prepared, InvalidRequest):
            self._refuse(msg, prepared)
            return
        if msg.request_id not in self.live:
            return  # aborted while its images were prepared or its prefix fetched
        self.live.moved(msg.request_id, Stage.ENGINE)
        sampling, n = (PREFILL_SAMPLING, 1) if msg.prefill_only else (msg.sampling, msg.n)
        ids = list(msg.token_ids)
        try:
            self.engine.add_request(
                msg.request_id, ids, sampling, n, msg.images, prepared, msg.priority, msg.pins
            )
        except (InvalidRequest, EngineOverloaded) as exc:
            self._refuse(msg, exc)
        else:
            if self.tracing is not None:
                self.tracing.queued(msg)

    def _refuse(self, msg: Generate, exc: Exception) -> None:
        """`msg` answered with its error: it ends here."""
        held = self.live.ended(msg.request_id)
        self.routers.send(held.link if held is not None else None, self._error(msg, exc))

    @staticmethod
    def _error(msg: Generate, exc: Exception) -> TokenDelta:
        usage = Usage(len(msg.token_ids), 0, 0)
        return TokenDelta(msg.request_id, (), "error", usage, error=str(exc))

    def _step(self) -> None:
        prefilled, start = self.engine.stats_.prefill_tokens, time.perf_counter()
        deltas = self.engine.step()
        elapsed = time.perf_counter() - start
        self.engine.stats_.busy_s += elapsed
        prefilled = self.engine.stats_.prefill_tokens - prefilled
        if prefilled > 0:
            rate = prefilled / max(elapsed, 1e-6)
            old = self.prefill_rate or rate
            self.prefill_rate = PREFILL_RATE_EWMA * rate + (1 - PREFILL_RATE_EWMA) * old
        for delta in deltas:
            link, delta = self.live.outgoing(delta)
            if delta is None:
                continue
            if self.tracing is not None:
                self.tracing.delta(delta)
            self.routers.send(link, delta)
        self._send_events()

    def _send_events(self) -> None:
        events = self.engine.drain_kv_events()
        if events:
            self.routers.broadcast(KVEvents(self.worker_id, tuple(events)))
            if self.kv_publisher is not None:
                self.kv_publisher.publish(events)

    def _send_inventory(self, link: RouterConnection) -> None:
        """Everything this worker holds, to a router that just accepted it: the events due
        first (so that every event after the snapshot follows it on the link), then the
        snapshot's parts back to back. See worker/inventory.py."""
        self._send_events()
        start = time.perf_counter()
        parts = inventory(self.engine, self.worker_id)
        for part in parts:
            link.send(part)
        log.info(
            "inventory of %d blocks (%d parts) sent to %s in %.1f ms",
            sum(len(p.block_hashes) for p in parts),
            len(parts),
            link.endpoint,
            (time.perf_counter() - start) * 1e3,
        )

    def _heartbeat(self) -> Heartbeat:
        now = time.monotonic()
        if now - self._phases_at >= PHASES_EVERY_S:
            self._phases, self._phases_at = self.engine.phases(), now
        load, self.turns = self.engine.load(), self.turns + 1
        peer = self.peer
        return Heartbeat(
            worker_id=self.worker_id,
            phases=self._phases,
            loop_turns=self.turns,
            links=peer.links.snapshot() if peer else (),
            prefill_tokens_per_s=self.prefill_rate,
            pulled_blocks=peer.pulled_blocks if peer else 0,
            pull_failures=peer.pull_failures if peer else 0,
            **load._asdict(),
        )
