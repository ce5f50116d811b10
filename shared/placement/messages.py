"""The router <-> host agent messages: one host agent per machine starts and stops the workers
the routers place there (fleet/host/, router/placement/).

A host agent connects a DEALER socket to each router's ZeroMQ address, as a worker does, and
says `HostHello` first (again when a router answers `ReRegister`: it restarted). The router
answers `HostAck`, then sends `StartWorker` / `StopWorker`; the agent sends a `HostReport`
every `report_interval_s` (its workers, their real memory) and `WorkerExited` when one of its
worker processes ends (asked to, crashed, or failed to load: `reason` says which). The host is
the authority on its budget: a `StartWorker` its estimates cannot fit is refused at once with a
`WorkerExited`, so routers that place at the same time never take a host over it.

A catalog model with a Hub `source` is fetched by the agent that is asked to start it (or
told `FetchModel`: Ollama's /api/pull) before its worker starts: its reports carry each
fetch's bytes (`HostFetch`) and the Hub models whose files it holds, checked (`held`);
`FetchEnded` says how one ended (a failed fetch also fails the starts that waited for it).

The workers it starts register with the routers themselves (shared/protocol.py `Register`).
The tags live in shared/protocol.py's MESSAGE_TYPES (one codec for the socket)."""

from __future__ import annotations

from dataclasses import dataclass

HOST_PROTOCOL_VERSION = 1


@dataclass(frozen=True, slots=True)
class HostWorker:
    """One worker process of a host agent, as it reports it."""

    worker_id: str
    model: str  # the catalog id it serves
    pid: int  # 0: not started yet, its model's files are being fetched
    estimate_bytes: int  # what the placement counted for it (StartWorker's)
    rss_bytes: int = 0  # its resident memory, measured (0: not measured yet)


@dataclass(frozen=True, slots=True)
class HostFetch:
    """A fetch of a catalog model's files from the Hub, under way on a host."""

    model: str
    done_bytes: int  # in the cache now, a resumed fetch's earlier bytes included
    total_bytes: int  # 0: the Hub has not answered yet


@dataclass(frozen=True, slots=True)
class HostHello:
    """First message of a host agent to a router; re-sent after ReRegister."""

    host_id: str
    host: str  # the machine's name
    pid: int
    budget_bytes: int  # memory the agent's workers may use, by their estimates
    models: tuple[str, ...]  # catalog ids whose files this host can read
    workers: tuple[HostWorker, ...] = ()  # still running from before (a router restarted)
    total_bytes: int = 0  # the machine's memory (unified memory on a Mac)
    protocol_version: int = HOST_PROTOCOL_VERSION
    held: tuple[str, ...] = ()  # catalog ids of Hub models whose files are here, checked
    fetches: tuple[HostFetch, ...] = ()


@dataclass(frozen=True, slots=True)
class HostAck:
    accepted: bool
    reason: str = ""
    report_interval_s: float = 1.0


@dataclass(frozen=True, slots=True)
class HostReport:
    """Every `report_interval_s`: the host's budget and its live worker processes."""

    host_id: str
    budget_bytes: int
    workers: tuple[HostWorker, ...]
    held: tuple[str, ...] = ()  # as HostHello's
    fetches: tuple[HostFetch, ...] = ()


@dataclass(frozen=True, slots=True)
class StartWorker:
    """Start a worker for catalog model `model` under `worker_id` (unique in the fleet)."""

    worker_id: str
    model: str
    estimate_bytes: int  # weights + KV budget + runtime: counted against the host's budget
    kv_memory_bytes: int  # the worker's KV budget (its --kv-memory)


@dataclass(frozen=True, slots=True)
class StopWorker:
    worker_id: str
    reason: str = ""


@dataclass(frozen=True, slots=True)
class WorkerExited:
    """A worker process of the host ended, or a StartWorker was refused (pid 0)."""

    host_id: str
    worker_id: str
    model: str
    asked: bool  # it was stopped by StopWorker (not a failure)
    reason: str  # refused / exit code and the last lines of its log


@dataclass(frozen=True, slots=True)
class FetchModel:
    """Fetch catalog model `model`'s files from the Hub into this host's cache (no worker)."""

    model: str


@dataclass(frozen=True, slots=True)
class FetchEnded:
    """A host's fetch of `model` ended: its files are here and checked, or `reason` says why
    not (the file whose checksum is wrong, the Hub's answer)."""

    host_id: str
    model: str
    ok: bool
    reason: str = ""


HOST_MESSAGE_TYPES: dict[int, type] = {
    30: HostHello,
    31: HostReport,
    32: WorkerExited,
    33: FetchEnded,
    40: HostAck,
    41: StartWorker,
    42: StopWorker,
    43: FetchModel,
}
