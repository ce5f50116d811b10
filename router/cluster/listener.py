"""The router's side of the worker protocol: registration, heartbeats, KV events, liveness.

Replies (token deltas, embeddings) and lost workers go up to the jobs' owner of each model
through the `WorkerReplies` it subscribed (router.routing's dispatcher subscribes itself); the
cluster knows nothing of what is above it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from router.cluster.registry import WorkerRegistry, WorkerState
from shared.placement.messages import FetchEnded, HostHello, HostReport, WorkerExited
from shared.protocol import (
    PROTOCOL_VERSION,
    Embeddings,
    Heartbeat,
    KVEvents,
    KVInventory,
    Message,
    Register,
    RegisterAck,
    ReRegister,
    SendInventory,
    TokenDelta,
)

HOST_MESSAGES = (HostHello, HostReport, WorkerExited, FetchEnded)  # router/placement/ reads them

if TYPE_CHECKING:
    from router.cluster.models import ClusterModel, ModelTable
    from router.metrics.router_metrics import Metrics

log = logging.getLogger(__name__)

INVENTORY_RETRY_S = 5.0  # an inventory asked for and not in by then is asked for again


class WorkerReplies(Protocol):
    """Who takes a model's replies: the owner of its requests in flight."""

    def on_delta(self, worker: WorkerState, delta: TokenDelta) -> None:
        """Tokens (and at the end, a finish reason and usage) of a request sent to `worker`."""

    def on_embeddings(self, worker: WorkerState, msg: Embeddings) -> None:
        """The answer to an Embed sent to `worker`."""

    def on_worker_lost(self, worker: WorkerState) -> None:
        """`worker` is gone (already out of the healthy set): move or end its requests."""


class Cluster:
    def __init__(
        self,
        registry: WorkerRegistry,
        models: ModelTable,
        send: Callable[[bytes, Message], None],
        metrics: Metrics,
        heartbeat_interval_s: float,
        heartbeat_timeout_s: float,
        wedged_after_s: float = float("inf"),
        clock: Callable[[], float] = time.monotonic,
    ):
        self.registry = registry
        self.models = models
        self._send = send
        self._metrics = metrics
        self._heartbeat_interval_s = heartbeat_interval_s
        self._heartbeat_timeout_s = heartbeat_timeout_s
        self._wedged_after_s = wedged_after_s
        self._clock = clock
        self._asked: dict[bytes, float] = {}  # unregistered peers asked to register, when
        # host agents' messages, and a registration (router/placement/, wired by lifecycle)
        self.on_host: Callable[[bytes, object], None] | None = None
        self.on_register: Callable[[WorkerState], None] | None = None
        self._replies: dict[str, WorkerReplies] = {}  # by model id (`subscribe`)

    def subscribe(self, model: str, replies: WorkerReplies) -> None:
        """Send the replies of `model`'s workers to `replies`, and tell it of lost ones."""
        self._replies[model] = replies

    def handle(self, identity: bytes, msg: Message) -> None:
        """One decoded message from the worker at `identity`."""
        if isinstance(msg, Register):
            self._register(identity, msg)
            return
        if isinstance(msg, HOST_MESSAGES):
            if self.on_host is not None:
                self.on_host(identity, msg)
            return
        worker = self.registry.by_identity(identity)
        if worker is None:
            self._ask_to_register(identity, msg)
            return
        worker.last_seen = self._clock()
        if isinstance(msg, TokenDelta):
            if msg.finish_reason == "error":
                worker.note_error(msg.error or "a request failed")
            if (replies := self._replies.get(worker.model)) is not None:
                replies.on_delta(worker, msg)
        elif isinstance(msg, Embeddings):
            if (replies := self._replies.get(worker.model)) is not None:
                replies.on_embeddings(worker, msg)
        elif isinstance(msg, Heartbeat):
            self._heartbeat(worker, msg)
        elif isinstance(msg, KVEvents):
            self._events(worker, msg)
        elif isinstance(msg, KVInventory):
            self._inventory(worker, msg)
        else:
            log.warning("dropped %s: not a worker-to-router message", type(msg).__name__)

    def _events(self, worker: WorkerState, msg: KVEvents) -> None:
        """Apply a worker's KV events; a number skipped (a frame lost on the way) asks for
        its inventory, which replaces what the index knows of it once it is in."""
        if msg.seq and worker.kv_seq is not None and msg.seq != worker.kv_seq + 1:
            worker.kv_gaps += 1
            self._ask_inventory(worker, f"KV events after {worker.kv_seq} up to {msg.seq} lost")
        elif msg.seq and self._inventory_overdue(worker):  # the one asked for was lost too
            self._ask_inventory(worker, "the inventory asked for did not come")
        worker.kv_seq = msg.seq or worker.kv_seq
        index = self._model_of(worker).index
        for event in msg.events:
            index.apply(worker.worker_id, event)

    def _inventory_overdue(self, worker: WorkerState) -> bool:
        asked = worker.inventory_asked_at
        return asked is not None and self._clock() - asked > INVENTORY_RETRY_S

    def _ask_inventory(self, worker: WorkerState, why: str) -> None:
        if worker.inventory_asked_at is None:
            log.warning("worker %s: %s; asking for its inventory", worker.worker_id, why)
        worker.inventory_asked_at = self._clock()
        self._send(worker.identity, SendInventory(why))

    def _inventory(self, worker: WorkerState, msg: KVInventory) -> None:
        """One part of what a (re-)registered worker holds; the last replaces its entries,
        and events numbered after `last_seq` follow it."""
        index = self._model_of(worker).index
        wid = worker.worker_id
        parts = (msg.part, msg.parts, msg.block_hashes, msg.windowless, msg.snapshots)
        if index.receive_inventory(wid, *parts):
            worker.kv_seq = msg.last_seq
            worker.inventory_asked_at = None
            log.info(
                "worker %s holds %d blocks (its inventory, %d part(s))",
                wid,
                index.num_blocks(wid),
                msg.parts,
            )

    def _ask_to_register(self, identity: bytes, msg: Message) -> None:
        """A peer we don't know (this router restarted, say) talks: ask it to register,
        at most once per heartbeat interval per peer."""
        now = self._clock()
        if now - self._asked.get(identity, float("-inf")) < self._heartbeat_interval_s:
            return
        if len(self._asked) > 4096:  # forget old peers rather than grow without bound
            self._asked.clear()
        self._asked[identity] = now
        log.info(
            "asked an unregistered peer %r to register (it sent %s)", identity, type(msg).__name__
        )
        self._send(identity, ReRegister("this router does not know this worker; register again"))

    def retire(self, worker_id: str, why: str) -> None:
        """A worker its host stops (or saw end): no new requests; gone from the registry."""
        worker = self.registry.get(worker_id)
        if worker is None:
            return
        if worker.healthy:
            log.info("worker %s retired: %s", worker_id, why)
            self._forget(worker)
        self.registry.remove(worker_id)

    def lose_identity(self, identity: bytes) -> None:
        """A send to `identity` failed: the worker is gone."""
        worker = self.registry.by_identity(identity)
        if worker is not None and worker.healthy:
            self._lose(worker, "unreachable")

    async def watch_heartbeats(self) -> None:
        """Forever: declare silent workers lost; purge expired optimistic index entries.

        A round that wakes more than a period late (this process got no CPU, or its loop was
        blocked) checks nothing: the heartbeats that came meanwhile are still unread, and the
        silence was the router's own, not the workers'. The next round checks, late or not."""
        period = min(self._heartbeat_interval_s, self._heartbeat_timeout_s / 4)
        skipped = False
        while True:
            slept_from = self._clock()
            await asyncio.sleep(period)
            if not skipped and self._clock() - slept_from > 2 * period:
                skipped = True
                continue
            skipped = False
            for worker in self.registry.stale(self._clock(), self._heartbeat_timeout_s):
                self._lose(worker, f"no heartbeat for {self._heartbeat_timeout_s:g}s")
            for worker in self.registry.wedged(self._clock(), self._wedged_after_s):
                worker.wedged = True  # heartbeats alone do not bring it back: progress does
                self._lose(worker, f"its step loop made no progress for {self._wedged_after_s:g}s")
            for model in self.models:
                model.index.purge_expired()

    def _register(self, identity: bytes, msg: Register) -> None:
        if msg.protocol_version != PROTOCOL_VERSION:
            reason = f"protocol version {msg.protocol_version} != router's {PROTOCOL_VERSION}"
            log.warning("rejected worker %s: %s", msg.worker_id, reason)
            self._send(identity, RegisterAck(accepted=False, reason=reason))
            return
        if msg.block_size < 1:
            self._send(identity, RegisterAck(accepted=False, reason="block_size must be >= 1"))
            return
        model = self._model_for(msg)
        if model is None:
            reason = (
                f"this router does not serve the model '{msg.model_id}'; it serves "
                + ", ".join(f"'{name}'" for name in self.models.ids)
            )
            log.warning("rejected worker %s: %s", msg.worker_id, reason)
            self._send(identity, RegisterAck(accepted=False, reason=reason))
            return
        task = "embed" if model.embedding is not None else "chat"
        if msg.task != task:
            reason = f"'{model.id}' is a {task} model here; this worker serves it as {msg.task}"
            log.warning("rejected worker %s: %s", msg.worker_id, reason)
            self._send(identity, RegisterAck(accepted=False, reason=reason))
            return
        now = self._clock()
        state = WorkerState(msg, identity, last_seen=now, model=model.id, progress_at=now)
        replaced = self.registry.add(state)
        self._metrics.worker_registered(msg.worker_id)
        if replaced is not None:
            state.errors.extend(replaced.errors)
            self._forget(replaced)
        model.index.set_window(msg.worker_id, msg.window_blocks, msg.chunk_blocks)
        model.index.set_snapshots(msg.worker_id, msg.state_snapshots)
        log.info(
            "worker %s registered from %s pid %d: model %s (block size %d, %d blocks)",
            msg.worker_id,
            msg.host,
            msg.pid,
            model.id,
            msg.block_size,
            msg.kv_capacity_blocks,
        )
        peers = self.registry.peers_of(state)
        ack = RegisterAck(
            accepted=True, heartbeat_interval_s=self._heartbeat_interval_s, peers=peers
        )
        self._send(identity, ack)
        if self.on_register is not None:
            self.on_register(state)

    def _model_for(self, msg: Register) -> ClusterModel | None:
        """The model a registering worker serves, by its id or an alias. A router of one
        model takes a worker that names another (a directory of another name, say: every
        worker served the router's one model before models were named), with a warning."""
        model = self.models.get(msg.model_id)
        if model is None and len(self.models) == 1:
            model = self.models.default
            log.warning(
                "worker %s says it serves '%s'; taking it as this router's only model '%s'",
                msg.worker_id,
                msg.model_id,
                model.id,
            )
        return model

    def _model_of(self, worker: WorkerState) -> ClusterModel:
        return self.models[worker.model]  # registration set it to a served model's id

    def _heartbeat(self, worker: WorkerState, msg: Heartbeat) -> None:
        worker.on_heartbeat(msg, self._clock())
        if not worker.healthy and not worker.wedged:
            log.info("worker %s is back", worker.worker_id)
            worker.healthy = True

    def _lose(self, worker: WorkerState, why: str) -> None:
        log.warning("worker %s lost: %s", worker.worker_id, why)
        worker.note_error(f"lost: {why}")
        self._metrics.worker_lost()
        self._forget(worker)

    def _forget(self, worker: WorkerState) -> None:
        """Drop a worker's index entries and move its requests elsewhere."""
        worker.healthy = False
        model = self._model_of(worker)
        model.index.drop_worker(worker.worker_id)
        if (replies := self._replies.get(worker.model)) is not None:
            replies.on_worker_lost(worker)
