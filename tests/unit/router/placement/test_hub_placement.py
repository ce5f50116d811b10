"""Placement of Hub models (issue 51): a host that holds a model's files is preferred; the
hosts' fetch reports become the percentage a waiting request is told and /v1/models'
`fetching`; a host's failed fetch fails the start that waited for it with the file named."""

from __future__ import annotations

from router.placement.operator import model_json
from shared.placement.messages import (
    FetchEnded,
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
