"""Fetching a catalog model's Hub files onto a host before any request needs them (Ollama's
/api/pull, the admin API's /pull): the host that holds them already answers at once; else
the one fetching them, else the reader with the most room, is told FetchModel, and its
reports are followed until its FetchEnded (router/http/endpoints/ollama.py streams them as
Ollama's status lines). No leader is asked: a fetch takes no memory, only disk."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from router.errors import model_unavailable

if TYPE_CHECKING:
    from router.placement.demand import Demand
    from router.placement.hosts import HostState

POLL_S = 0.5


@dataclass(frozen=True)
class PrefetchStep:
    """Where a pull is: its bytes so far (total 0: not known yet), or done."""

    host_id: str
    done_bytes: int = 0
    total_bytes: int = 0
    done: bool = False


def prefetch_host(demand: Demand, model: str) -> HostState:
    """The host to pull `model` onto (see the module docstring); 503 when none can read it."""
    readers = [h for h in demand.placer.alive() if h.reads(model)]
    if not readers:
        raise model_unavailable(
            f"no host agent can fetch the files of the model '{model}'", "model_not_on_any_host"
        )
    held = [h for h in readers if h.holds(model)]
    fetching = [h for h in readers if model in h.fetches]
    return (held or fetching or sorted(readers, key=demand.placer.free, reverse=True))[0]


async def prefetch(demand: Demand, model: str) -> AsyncIterator[PrefetchStep]:
    """The steps of pulling `model` onto a host, the last one `done`; 503 naming the cause
    when the host's fetch fails or the host is lost."""
    host = prefetch_host(demand, model)
    if host.holds(model):
        yield PrefetchStep(host.id, done=True)
        return
    demand.placer.fetch(host, model)  # (one under way goes on: its end is ours)
    last = None
    while True:
        ended = demand.placer.fetch_ended.get(model, {}).get(host.id)
        if ended is not None:
            if not ended.ok:
                raise model_unavailable(
                    f"pulling the model '{model}' failed on host {host.id}: {ended.reason}",
                    "model_pull_failed",
                )
            yield PrefetchStep(host.id, done=True)
            return
        if not host.alive:
            raise model_unavailable(
                f"host {host.id} was lost while pulling the model '{model}'", "host_lost", 5
            )
        fetch = host.fetches.get(model)
        step = PrefetchStep(host.id, fetch.done_bytes, fetch.total_bytes) if fetch else None
        if step is not None and step != last:
            last = step
            yield step
        await asyncio.sleep(POLL_S)
