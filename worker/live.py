"""Every request a worker holds, in one registry: from its `Generate` to its last choice's
final delta, or its abort. For each, where it is (fetching its prefix from a peer, its
images being prepared, in the engine), the router link that answers it, how many of its
choices are still to end, and whether it only prefills (disaggregated serving). The worker
loop asks it where an abort must go and what an engine delta becomes on the wire; a request
ends here, in one place, whichever way it ends."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from worker.peer.prefill import prefill_only_delta

if TYPE_CHECKING:
    from shared.protocol import Generate, TokenDelta
    from worker.connection import RouterConnection


class Stage(Enum):
    PARKED = "fetching its prefix's blocks from a peer"
    PREPARING = "its images being prepared"
    ENGINE = "queued or running in the engine"


@dataclass
class LiveRequest:
    link: RouterConnection  # its deltas go back on the link it came in on
    choices: int  # choices whose final delta is still to come
    prefill_only: bool
    stage: Stage = Stage.ENGINE


class LiveRequests:
    def __init__(self) -> None:
        self._live: dict[str, LiveRequest] = {}

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._live

    def arrived(self, link: RouterConnection, msg: Generate) -> None:
        """`msg` came in on `link`: held until its last choice ends or it is aborted."""
        choices = 1 if msg.prefill_only else msg.n
        self._live[msg.request_id] = LiveRequest(link, choices, msg.prefill_only)

    def moved(self, request_id: str, stage: Stage) -> None:
        """`request_id` is now at `stage`."""
        if (live := self._live.get(request_id)) is not None:
            live.stage = stage

    def outgoing(self, delta: TokenDelta) -> tuple[RouterConnection | None, TokenDelta | None]:
        """The engine's `delta` as its router gets it, and the link it goes on (None: a
        request no longer held, for every router, which drop what they do not know). A
        prefill-only request sends nothing until its end, then its "prefilled" delta. A final
        delta ends a choice, the last choice the request; an error or abort ends it whole."""
        live = self._live.get(delta.request_id)
        if live is None:
            return None, delta
        if live.prefill_only:
            delta = prefill_only_delta(delta)
            if delta is None:
                return live.link, None
        if delta.finish_reason in ("error", "abort"):  # the engine ends all choices at once
            self.ended(delta.request_id)
        elif delta.finish_reason is not None:
            self.choice_ended(delta.request_id)
        return live.link, delta

    def choice_ended(self, request_id: str) -> None:
        """One choice of `request_id` ended (its final delta sent, or it was aborted alone)."""
        live = self._live.get(request_id)
        if live is not None:
            live.choices -= 1
            if live.choices <= 0:
                del self._live[request_id]

    def ended(self, request_id: str) -> LiveRequest | None:
        """`request_id` ended as a whole (aborted, refused): what was held of it."""
        return self._live.pop(request_id, None)
