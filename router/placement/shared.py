"""What the routers of one fleet say to each other about placement, as plain JSON
(router/placement/leadership.py says who says what):

- the leader's **state**: each catalog model's starts in flight, its last load failure, its
  settings (`pinned`, `min_workers`, the keep-alive a request set), when it was last used,
  and every host's workers asked to stop. Followers mirror it; a router taking over starts
  from it, so a load the old leader began is counted (and finished), not begun again. The
  operator's `pinned` and `min_workers` are taken only from a leader whose config file gave
  the model the same settings as ours: a router restarted with a new config keeps its own.
- a follower's **demand**: for each model its requests wait for or used, how many wait, when
  it was last used and any keep-alive a request set. The leader folds every follower's in:
  last use and keep-alive are the newest of all, waiting requests add up.

Times cross as wall-clock seconds (each router's clock is monotonic, and its own): `offset`
is this router's `wall - monotonic`, so a wall time is `local + offset`.
"""

from __future__ import annotations

import math

from router.placement.catalog import Entry, Start
from router.placement.placer import Placer

NEVER = float("-inf")
# Of both shapes, and in the store's key names: routers of two versions (a fleet mid-upgrade)
# each follow a leader of their own, as routers without a shared store do.
VERSION = 1


def _wall(local: float, offset: float) -> float | None:
    return None if local == NEVER else local + offset


def _local(wall: float | None, offset: float) -> float:
    return NEVER if wall is None else wall - offset


# ------------------------------------------------------------ the leader's state


def state_of(placer: Placer, offset: float) -> dict:
    """The leader's state (JSON-able)."""
    models = {}
    for entry in placer.entries.values():
        models[entry.id] = {
            "starts": [
                {"worker": s.worker_id, "host": s.host_id, "after": sorted(s.after), "sent": s.sent}
                for s in entry.starts.values()
            ],
            "failure": entry.failure,
            "failure_detail": entry.failure_detail,
            "failed_at": _wall(entry.failed_at, offset),
            "pinned": entry.pinned,
            "min_workers": entry.min_workers,
            "configured": entry.configured,
            "keep_alive_s": entry.keep_alive_s,
            "keep_alive_at": _wall(entry.keep_alive_at, offset),
            "last_used": _wall(entry.last_used, offset),
            "next_worker": entry.next_worker,
        }
    stopping = {h.id: sorted(h.stopping) for h in placer.hosts.values() if h.stopping}
    return {"version": VERSION, "models": models, "stopping": stopping}


def adopt(placer: Placer, state: dict, offset: float, now: float) -> None:
    """Mutates: mirror the leader's `state` (a model this router's catalog lacks is skipped;
    a start whose worker registered here already is done)."""
    if state.get("version") != VERSION:
        return
    for model, told in state.get("models", {}).items():
        entry = placer.entries.get(model)
        if entry is not None:
            _adopt_entry(placer, entry, told, offset, now)
    for host_id, worker_ids in state.get("stopping", {}).items():
        host = placer.hosts.get(host_id)
        for worker_id in worker_ids:
            if host is not None and worker_id in host.workers:
                placer.stopped_by_leader(host, worker_id)


def _adopt_entry(placer: Placer, entry: Entry, told: dict, offset: float, now: float) -> None:
    if told["configured"] == entry.configured:  # (else: one of us has a new config file)
        entry.pinned, entry.min_workers = bool(told["pinned"]), int(told["min_workers"])
    _take_keep_alive(entry, told["keep_alive_s"], _local(told["keep_alive_at"], offset))
    entry.last_used = max(entry.last_used, _local(told["last_used"], offset))
    entry.next_worker = max(entry.next_worker, int(told["next_worker"]))
    failed_at = _local(told["failed_at"], offset)
    if failed_at > entry.failed_at or (not told["failure"] and entry.failure):
        entry.failure, entry.failure_detail = told["failure"], told["failure_detail"]
        entry.failed_at = failed_at
    starts = {}
    for s in told["starts"]:
        if placer.registry.get(s["worker"]) is not None:
            continue  # it registered here before the leader heard
        start = entry.starts.get(s["worker"]) or Start(s["worker"], s["host"], adopted_at=now)
        start.after, start.sent = set(s["after"]), bool(s["sent"])
        starts[start.worker_id] = start
    if starts.keys() != entry.starts.keys():
        entry.starts = starts
        entry.wake()


def _take_keep_alive(entry: Entry, keep_alive_s: float, at: float) -> None:
    """The keep-alive a request set at `at`, when newer than the one `entry` has."""
    if at > entry.keep_alive_at and math.isfinite(at):
        entry.keep_alive_s, entry.keep_alive_at = float(keep_alive_s), at


# ------------------------------------------------------------ a follower's demand


def demand_of(entries: dict[str, Entry], offset: float, now: float) -> dict:
    """A follower's demand (JSON-able): the models its requests wait for or used."""
    models = {}
    for entry in entries.values():
        if not entry.waiting and entry.last_used <= 0.0 and entry.keep_alive_at == NEVER:
            continue
        models[entry.id] = {
            "waiting": entry.waiting,
            "last_used": _wall(entry.last_used, offset),
            "keep_alive_s": entry.keep_alive_s,
            "keep_alive_at": _wall(entry.keep_alive_at, offset),
        }
    return {"version": VERSION, "at": now + offset, "models": models}


def merge(entries: dict[str, Entry], demands: list[dict], offset: float) -> None:
    """Mutates: the leader folds the followers' demand into its catalog."""
    for entry in entries.values():
        entry.waiting_elsewhere = 0
    for demand in demands:
        if demand.get("version") != VERSION:
            continue
        for model, told in demand.get("models", {}).items():
            entry = entries.get(model)
            if entry is None:
                continue
            entry.waiting_elsewhere += int(told["waiting"])
            entry.last_used = max(entry.last_used, _local(told["last_used"], offset))
            _take_keep_alive(entry, told["keep_alive_s"], _local(told["keep_alive_at"], offset))
