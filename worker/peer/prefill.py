"""Disaggregated prefill (`Generate.prefill_only`): compute and cache a prompt's full blocks
for a decode worker to pull, and answer one delta with no tokens.

The engine runs such a request as a one-token greedy request: the prefill writes every prompt
token's K/V and the token sampled from its last logits ends it, with no decode step. When it
finishes, its full blocks stay in the prefix cache, unlocked (evictable, for a peer's fetch);
its token is dropped and the router gets one TokenDelta: no tokens, finish_reason "prefilled",
the usage with no completion tokens.
"""

from __future__ import annotations

from shared.protocol import TokenDelta, Usage
from shared.sampling import SamplingParams

PREFILLED = "prefilled"
PREFILL_SAMPLING = SamplingParams(max_tokens=1, temperature=0.0)


def prefill_only_delta(delta: TokenDelta) -> TokenDelta | None:
    """What a prefill-only request sends for the engine's `delta`: nothing until it ends,
    then its "prefilled" delta (an error or an abort as it is). Which requests only prefill
    is the worker's registry's to know (worker/live.py)."""
    if delta.finish_reason is None:
        return None
    if delta.finish_reason not in ("length", "stop"):  # an error or an abort, as it is
        return TokenDelta(delta.request_id, (), delta.finish_reason, delta.usage, error=delta.error)
    u = delta.usage
    usage = Usage(u.prompt_tokens, 0, u.cached_tokens) if u is not None else None
    return TokenDelta(delta.request_id, (), PREFILLED, usage)
