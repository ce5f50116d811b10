"""The operator's view and controls: each catalog model's state, each host's budget and what
fills it; load, pull (a Hub model's files onto a host), unload and pin (router/http/endpoints/admin.py serves them)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from router.errors import ApiError, model_unavailable
from router.placement.prefetch import prefetch_host

if TYPE_CHECKING:
    from router.placement.catalog import Entry
    from router.placement.demand import Demand

log = logging.getLogger(__name__)


def state(demand: Demand, entry: Entry) -> str:
    """loaded (a worker serves it), loading, failed (lately), available (some host can load
    it), or unavailable (no host can read it, or no host agent serves this router)."""
    if demand.registry.healthy(entry.id):
        return "loaded"
    if entry.starts:
        return "loading"
    if entry.failing(demand.clock()):
        return "failed"
    if any(h.reads(entry.id) for h in demand.placer.alive()):
        return "available"
    return "unavailable"


def model_json(demand: Demand, model: str) -> dict:
    """The extension fields of /v1/models for `model` ({} outside the catalog)."""
    entry = demand.entries.get(model)
    if entry is None:
        return {}
    loaded_on = sorted(
        {h.id for h in demand.placer.alive() for w in h.workers.values() if w.model == model}
    )
    fetching = {
        h.id: {
            "done_bytes": f.done_bytes,
            "total_bytes": f.total_bytes,
            "percent": 100 * f.done_bytes // f.total_bytes if f.total_bytes else 0,
        }
        for h in demand.placer.alive()
        if (f := h.fetches.get(model)) is not None
    }
    held_on = sorted(h.id for h in demand.placer.alive() if h.holds(model))
    extra = {"fetching": fetching, "held_on": held_on}
    return {"state": state(demand, entry), "loaded_on": loaded_on} | entry.to_json() | extra


def hosts_json(demand: Demand) -> list[dict]:
    placer = demand.placer
    return [h.to_json(placer.starting_on(h)) for h in placer.hosts.values()]


def leadership_json(demand: Demand) -> dict:
    """This router's id, the leading router's, and whether this one leads."""
    lead = demand.lead
    return {"router": lead.router_id, "leader": lead.leader, "leading": lead.leading}


def _entry(demand: Demand, model: str) -> Entry:
    entry = demand.entries.get(model)
    if entry is None:
        raise ApiError(
            404, f"the model '{model}' is not in the catalog", "model", "model_not_found"
        )
    return entry


def _forwarded(demand: Demand, order: dict) -> bool:
    """On a follower, `order` goes to the leader (within a second or two), which acts on it
    as if asked itself: True. On the leader: False (act now)."""
    if demand.lead.leading:
        return False
    demand.forward(order)
    return True


def load(demand: Demand, model: str) -> dict:
    """Start one more worker of `model` (up to its max_workers); 503 when no host has room
    (on a follower: asked of the leader, which logs a start it cannot place)."""
    entry = _entry(demand, model)
    demand.check(entry)
    if demand.placer.live(entry) >= entry.max_workers:
        raise ApiError(
            409,
            f"the model '{model}' has its max_workers ({entry.max_workers}) loaded or loading",
            "model",
            "max_workers",
        )
    entry.last_used = demand.clock()
    if _forwarded(demand, {"op": "load", "model": model}):
        return model_json(demand, model)
    if demand.placer.place(entry) is None:
        raise model_unavailable(
            f"no host has room for the model '{model}' now (the models loaded are pinned or busy)",
            "no_room",
            30,
        )
    return model_json(demand, model)


def pull(demand: Demand, model: str) -> dict:
    """Fetch a Hub model's files onto a host (the one holding them: nothing to do); 409 for a
    model read from a path, 503 when no host can fetch it."""
    entry = _entry(demand, model)
    if entry.source is None:
        raise ApiError(
            409,
            f"the model '{model}' is read from a path, not fetched from the Hub: nothing to pull",
            "model",
            "not_a_hub_model",
        )
    host = prefetch_host(demand, model)
    if not host.holds(model):
        demand.placer.fetch(host, model)
    return model_json(demand, model)


def unload(demand: Demand, model: str) -> dict:
    """Stop every host-placed worker of `model` (its min_workers becomes 0); 409 while one
    has requests in flight."""
    entry = _entry(demand, model)
    workers = [
        (h, w.worker_id)
        for h in demand.placer.alive()
        for w in h.workers.values()
        if w.model == model and w.worker_id not in h.stopping
    ]
    busy = [wid for _, wid in workers if not demand.placer.idle(wid)]
    if busy:
        raise ApiError(
            409,
            f"the model '{model}' has requests in flight on {', '.join(busy)}; "
            "unload it once they end",
            "model",
            "model_busy",
        )
    if _forwarded(demand, {"op": "unload", "model": model}):
        return model_json(demand, model)
    entry.min_workers = 0
    for host, worker_id in workers:
        demand.placer.stop(host, worker_id, "unloaded by the operator")
    return model_json(demand, model)


def pin(demand: Demand, model: str, pinned: bool) -> dict:
    _entry(demand, model).pinned = pinned
    _forwarded(demand, {"op": "pin", "model": model, "pinned": pinned})
    return model_json(demand, model)


def apply(demand: Demand, orders: list[dict]) -> None:
    """Mutates (the leader): the operator's orders the followers forwarded, each done as if
    asked here; one that cannot be done now (no room, busy) is logged."""
    for order in orders:
        op, model = order.get("op"), str(order.get("model"))
        try:
            if op == "load":
                load(demand, model)
            elif op == "unload":
                unload(demand, model)
            elif op == "pin":
                pin(demand, model, bool(order.get("pinned")))
            else:
                log.warning("ignored an operator order of another router: %r", order)
        except ApiError as e:
            log.warning("the operator's %s of %s, from another router: %s", op, model, e.message)
