"""A host agent's fetches of catalog models from the Hub: one thread each, so the agent's
loop keeps answering its routers while bytes arrive (shared/models/hub.py does the transfer and
the checks). The loop reads each fetch's bytes for its reports and, once a fetch is done,
starts the workers that waited for it, or fails them with its reason."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path

from shared.models.hub import Downloader, DownloadError, HubSource, Progress
from shared.placement.messages import HostFetch

log = logging.getLogger("fleet.host")


@dataclass(eq=False)
class Fetch:
    model: str  # the catalog id
    source: HubSource
    progress: Progress = field(default_factory=Progress)
    path: Path | None = None  # the checked snapshot, once done
    error: str = ""  # why it failed, once done
    _thread: threading.Thread | None = None

    @classmethod
    def start(cls, model: str, source: HubSource) -> Fetch:
        fetch = cls(model, source)
        fetch._thread = threading.Thread(target=fetch._run, name=f"fetch {model}", daemon=True)
        fetch._thread.start()
        log.info("fetching %s (%s) from the Hub", model, source)
        return fetch

    def _run(self) -> None:
        try:
            self.path = Downloader().pull(self.source, self.progress)
        except DownloadError as exc:
            self.error = str(exc)
        except Exception as exc:  # a thread's error must reach the router, not stderr only
            log.exception("fetching %s failed", self.source)
            self.error = f"fetching {self.source} failed: {type(exc).__name__}: {exc}"

    @property
    def done(self) -> bool:
        return self._thread is not None and not self._thread.is_alive()

    @property
    def ok(self) -> bool:
        return self.done and self.path is not None

    def report(self) -> HostFetch:
        return HostFetch(self.model, self.progress.done_bytes, self.progress.total_bytes)

    def outcome(self) -> str:
        """For the log: how it ended."""
        if self.ok:
            got = self.progress.fetched_bytes
            return f"fetched {self.model} ({self.source}): {got} bytes over the network"
        return f"fetching {self.model} failed: {self.error}"
