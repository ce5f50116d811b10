"""Placement of Hub models (issue 51): a host that holds a model's files is preferred; the
hosts' fetch reports become the percentage a waiting request is told and /v1/models'
`fetching`; a host's failed fetch fails the start that waited for it with the file named."""

from __future__ import annotations

import asyncio

import pytest

from router.errors import ApiError
from router.placement import operator
from router.placement import prefetch as prefetch_module
from router.placement.operator import model_json
from shared.placement.messages import (
    FetchEnded,
    FetchModel,
    HostFetch,
    HostHello,
    HostReport,
    StartWorker,
    WorkerExited,
)
from tests.unit.router.placement.test_placement import GIB, Fleet


def starts(fleet: Fleet) -> list[tuple[str, str]]:
    return [(ident.decode(), m.model) for ident, m in fleet.sent if isinstance(m, StartWorker)]


def hello(fleet: Fleet, host: str, held: tuple[str, ...] = ()) -> None:
    msg = HostHello(host, host, 1, 8 * GIB, ("hub",), held=held)
    fleet.placer.handle(host.encode(), msg)


def test_a_host_that_holds_the_files_is_chosen_over_a_roomier_one():
    fleet = Fleet({"a": 8 * GIB, "b": 4 * GIB}, {"hub": GIB})
    fleet.starts_finish = False
    fleet.placer.place(fleet.placer.entries["hub"])
    assert starts(fleet) == [("a", "hub")]  # nothing held: the most room
    fleet = Fleet({"a": 8 * GIB, "b": 4 * GIB}, {"hub": GIB})
    fleet.starts_finish = False
    hello(fleet, "b", held=("hub",))
    fleet.placer.place(fleet.placer.entries["hub"])
    assert starts(fleet) == [("b", "hub")]


def test_a_report_of_a_fetch_is_the_percentage_a_waiting_request_reads():
    fleet = Fleet({"a": 8 * GIB}, {"hub": GIB})
    assert fleet.demand.loading_note("hub") == "loading hub"
    report = HostReport("a", 8 * GIB, (), fetches=(HostFetch("hub", 250_000, 1_000_000),))
    fleet.placer.handle(b"a", report)
    note = fleet.demand.loading_note("hub")
    assert note == "loading hub: fetching its files from the Hub, 25% (0.2 MB of 1.0 MB)"
    placement = model_json(fleet.demand, "hub")
    assert placement["fetching"] == {
        "a": {"done_bytes": 250_000, "total_bytes": 1_000_000, "percent": 25}
    }
    assert placement["held_on"] == []
    fleet.placer.handle(b"a", FetchEnded("a", "hub", True))
    assert fleet.demand.loading_note("hub") == "loading hub"
    assert model_json(fleet.demand, "hub")["held_on"] == ["a"]
    fleet.placer.handle(b"a", HostReport("a", 8 * GIB, (), held=("hub",)))
    assert fleet.placer.hosts["a"].holds("hub")


def test_a_failed_fetch_fails_the_load_naming_the_file():
    fleet = Fleet({"a": 8 * GIB}, {"hub": GIB})
    fleet.starts_finish = False
    start = fleet.placer.place(fleet.placer.entries["hub"])
    why = "model.safetensors of org/hub@main failed its checksum: sha256 1, the Hub says 2"
    fleet.placer.handle(b"a", FetchEnded("a", "hub", False, why))
    fleet.placer.handle(b"a", WorkerExited("a", start.worker_id, "hub", False, why))
    failure = fleet.placer.entries["hub"].failing(fleet.now)
    assert "model.safetensors" in failure and "checksum" in failure
    assert fleet.placer.fetch_ended["hub"]["a"].reason == why


def test_the_admin_pull_fetches_onto_a_host_and_refuses_a_path_model():
    fleet = Fleet({"a": 8 * GIB, "b": 2 * GIB}, {"hub": GIB, "local": GIB})
    fleet.placer.entries["hub"].source = "org/hub"
    with pytest.raises(ApiError) as refused:
        operator.pull(fleet.demand, "local")
    assert refused.value.status == 409 and "read from a path" in refused.value.message
    operator.pull(fleet.demand, "hub")
    assert [(i.decode(), m) for i, m in fleet.sent if isinstance(m, FetchModel)] == [
        ("a", FetchModel("hub"))  # the most room
    ]
    hello(fleet, "b", held=("hub",))
    fleet.sent.clear()
    assert operator.pull(fleet.demand, "hub")["held_on"] == ["b"]
    assert fleet.sent == []  # held: nothing to fetch


async def test_api_pull_steps_follow_the_host_until_it_holds_the_files(monkeypatch):
    monkeypatch.setattr(prefetch_module, "POLL_S", 0.0)
    fleet = Fleet({"a": 8 * GIB}, {"hub": GIB})
    steps = prefetch_module.prefetch(fleet.demand, "hub")
    fleet.placer.handle(b"a", HostReport("a", 8 * GIB, (), fetches=(HostFetch("hub", 5, 10),)))
    assert await anext(steps) == prefetch_module.PrefetchStep("a", 5, 10)
    fleet.placer.handle(b"a", FetchEnded("a", "hub", True))
    assert (await anext(steps)).done
    again = prefetch_module.prefetch(fleet.demand, "hub")  # held now: done at once
    assert (await anext(again)).done
    fleet = Fleet({"a": 8 * GIB}, {"hub": GIB})
    step = asyncio.ensure_future(anext(prefetch_module.prefetch(fleet.demand, "hub")))
    await asyncio.sleep(0)  # FetchModel sent
    fleet.placer.handle(b"a", FetchEnded("a", "hub", False, "config.json failed its checksum"))
    with pytest.raises(ApiError) as failed:
        await step
    assert failed.value.status == 503 and "config.json failed its checksum" in failed.value.message
