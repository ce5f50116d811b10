"""Percentiles and the per-run report computed from request results."""

from __future__ import annotations

import math
from collections.abc import Sequence

from scripts.loadgen.client import RequestResult

MAX_ERRORS_SHOWN = 5


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100), linear between closest ranks (numpy's default);
    None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1e3, 2)


def latency_summary(results: Sequence[RequestResult]) -> dict:
    """TTFT, TPOT, time between tokens (every gap between two content chunks of a request,
    pooled over the requests) and end-to-end latency percentiles in milliseconds, over
    successful requests."""
    ok = [r for r in results if r.ok]
    ttft = [r.ttft for r in ok if r.ttft is not None]
    tpot = [r.tpot for r in ok if r.tpot is not None]
    e2e = [r.e2e for r in ok]
    tbt = [gap for r in ok for gap in r.tbt]
    return {
        "ttft_ms": {f"p{q}": _ms(percentile(ttft, q)) for q in (50, 95, 99)},
        "tpot_ms": {f"p{q}": _ms(percentile(tpot, q)) for q in (50, 95)},
        "tbt_ms": {f"p{q}": _ms(percentile(tbt, q)) for q in (50, 95, 99)},
        "e2e_ms": {f"p{q}": _ms(percentile(e2e, q)) for q in (50, 95)},
    }


def cache_summary(results: Sequence[RequestResult]) -> dict:
    """Prefix-cache hit rate: cached prompt tokens / prompt tokens, summed over the requests
    whose usage reported cached tokens (None when none did)."""
    reported = [r for r in results if r.ok and r.cached_tokens is not None and r.prompt_tokens]
    prompt = sum(r.prompt_tokens for r in reported)
    cached = sum(r.cached_tokens for r in reported)
    return {
        "prompt_tokens": sum(r.prompt_tokens or 0 for r in results if r.ok),
        "cached_tokens": cached if reported else None,
        "cache_hit_rate": round(cached / prompt, 4) if prompt else None,
        "requests_reporting_cache": len(reported),
    }


def summarize(results: Sequence[RequestResult], elapsed_s: float) -> dict:
    """The report of one run: throughput, latency percentiles, cache use, errors."""
    ok = [r for r in results if r.ok]
    errors = [r.error for r in results if not r.ok]
    output_tokens = sum(r.output_tokens for r in ok)
    return {
        "requests": len(results),
        "completed": len(ok),
        "errors": len(errors),
        "first_errors": list(dict.fromkeys(errors))[:MAX_ERRORS_SHOWN],  # distinct, in order
        "elapsed_s": round(elapsed_s, 3),
        "requests_per_s": round(len(ok) / elapsed_s, 3) if elapsed_s > 0 else None,
        "output_tokens": output_tokens,
        "output_tokens_per_s": round(output_tokens / elapsed_s, 2) if elapsed_s > 0 else None,
        "tokens_counted_from": _token_source(ok),
        **latency_summary(results),
        **cache_summary(results),
    }


def _token_source(ok: Sequence[RequestResult]) -> str:
    from_usage = sum(r.usage_completion_tokens is not None for r in ok)
    if from_usage == len(ok):
        return "usage"
    return "deltas" if from_usage == 0 else "mixed"


def speculation(before: dict | None, after: dict | None) -> dict | None:
    """Draft tokens proposed and accepted over the run, summed over the workers (from their
    phase counters in two /v1/cluster snapshots); None without both or without drafts."""
    if before is None or after is None:
        return None

    def totals(snapshot: dict) -> dict[str, tuple[int, int]]:
        return {
            w["id"]: (w["phases"].get("spec_drafted", 0), w["phases"].get("spec_accepted", 0))
            for w in snapshot.get("workers", [])
            if w.get("phases")
        }

    start = totals(before)
    drafted = accepted = 0
    for worker, (d, a) in totals(after).items():
        d0, a0 = start.get(worker, (0, 0))
        drafted, accepted = drafted + d - d0, accepted + a - a0
    if drafted <= 0:
        return None
    return {"drafted": drafted, "accepted": accepted, "acceptance": accepted / drafted}


def requests_per_worker(before: dict | None, after: dict | None) -> dict[str, int] | None:
    """Requests each worker served between two /v1/cluster snapshots (None without both)."""
    if before is None or after is None:
        return None
    served_before = {w["id"]: w.get("requests_served", 0) for w in before.get("workers", [])}
    return {
        w["id"]: w.get("requests_served", 0) - served_before.get(w["id"], 0)
        for w in sorted(after.get("workers", []), key=lambda w: w["id"])
    }


def fleet_cache(before: dict | None, after: dict | None) -> dict | None:
    """The fleet's prefix-cache use over the run, from the `cache` of two /v1/cluster
    snapshots (the workers' counters): prompt tokens hit in the serving worker's own cache
    apart from those pulled from a peer's; None without both or from a server without it."""
    start, end = (before or {}).get("cache"), (after or {}).get("cache")
    if not start or not end:
        return None
    prompt = end["prompt_tokens"] - start["prompt_tokens"]
    local = end["local_hit_tokens"] - start["local_hit_tokens"]
    pulled = end["pulled_tokens"] - start["pulled_tokens"]
    return {
        "prompt_tokens": prompt,
        "local_hit_tokens": local,
        "pulled_tokens": pulled,
        "local_hit_rate": round(local / prompt, 4) if prompt > 0 else None,
        "hit_rate_with_pulls": round((local + pulled) / prompt, 4) if prompt > 0 else None,
    }


def pulled_blocks_per_worker(before: dict | None, after: dict | None) -> dict[str, int] | None:
    """KV blocks each worker pulled from peers between two /v1/cluster snapshots."""
    if before is None or after is None:
        return None
    start = {w["id"]: w.get("pulled_blocks", 0) for w in before.get("workers", [])}
    return {
        w["id"]: w.get("pulled_blocks", 0) - start.get(w["id"], 0)
        for w in sorted(after.get("workers", []), key=lambda w: w["id"])
    }


def busy_per_worker(before: dict | None, after: dict | None, elapsed_s: float) -> dict | None:
    """The share of `elapsed_s` each worker spent in engine steps (its phases' `busy_s`
    between two /v1/cluster snapshots): an idle worker beside a busy one is capacity lost."""
    if before is None or after is None or elapsed_s <= 0:
        return None

    def busy(snapshot: dict) -> dict[str, float]:
        return {
            w["id"]: (w.get("phases") or {}).get("busy_s", 0.0) for w in snapshot.get("workers", [])
        }

    start, end = busy(before), busy(after)
    return {w: round((end[w] - start.get(w, 0.0)) / elapsed_s, 3) for w in sorted(end)}
