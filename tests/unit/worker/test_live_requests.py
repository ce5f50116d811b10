"""The worker's one registry of live requests (worker/live.py): where each request is, the
link that answers it, and when it ends, whichever way it ends."""

from __future__ import annotations

from shared.protocol import Generate, TokenDelta, Usage
from shared.sampling import SamplingParams
from worker.live import LiveRequests, Stage
from worker.peer.prefill import PREFILLED

LINK_A, LINK_B = object(), object()  # (the registry only hands links back)


def delta(request_id: str, finish: str | None = None, index: int = 0) -> TokenDelta:
    return TokenDelta(request_id, (5,), finish, Usage(10, 1, 4), index=index)


def test_a_request_is_answered_on_its_link_until_its_last_choice_ends():
    live = LiveRequests()
    live.arrived(LINK_A, Generate("a", (1, 2), SamplingParams(), n=2))
    live.arrived(LINK_B, Generate("b", (1, 2), SamplingParams()))
    assert live.outgoing(delta("a")) == (LINK_A, delta("a"))
    assert live.outgoing(delta("b", "stop")) == (LINK_B, delta("b", "stop"))
    assert "b" not in live and "a" in live
    assert live.outgoing(delta("a", "length", index=1))[0] is LINK_A
    assert "a" in live  # one choice left
    live.choice_ended("a")  # aborted alone
    assert "a" not in live and len(live) == 0


def test_a_request_no_longer_held_goes_to_every_router():
    live = LiveRequests()
    assert live.outgoing(delta("gone", "abort")) == (None, delta("gone", "abort"))


def test_a_prefill_only_request_sends_one_delta_at_its_end():
    live = LiveRequests()
    live.arrived(LINK_A, Generate("p", (1, 2, 3), SamplingParams(), prefill_only=True, n=4))
    assert live.outgoing(delta("p")) == (LINK_A, None)
    link, final = live.outgoing(delta("p", "length"))
    assert link is LINK_A and final.finish_reason == PREFILLED and final.token_ids == ()
    assert final.usage == Usage(10, 0, 4) and "p" not in live


def test_stages_and_an_abort_of_the_whole_request():
    live = LiveRequests()
    live.arrived(LINK_A, Generate("x", (1,), SamplingParams()))
    live.moved("x", Stage.PARKED)
    held = live.ended("x")
    assert held.stage is Stage.PARKED and held.link is LINK_A
    assert live.ended("x") is None and "x" not in live


def test_an_error_ends_every_choice_at_once():
    """The engine sends one error delta for a request whose step failed, whatever its n."""
    live = LiveRequests()
    live.arrived(LINK_A, Generate("e", (1, 2), SamplingParams(), n=3))
    link, sent = live.outgoing(delta("e", "error"))
    assert link is LINK_A and sent.finish_reason == "error"
    assert "e" not in live and len(live) == 0
