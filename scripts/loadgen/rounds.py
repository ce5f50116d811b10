"""Repeated runs: the median and spread of each (configuration, workload) over its rounds, and
each median's ratio to the best peer's. One run decides nothing on a shared 2-core machine:
the comparison runner interleaves rounds (A B C, A B C, ...) so drift hits every
configuration alike, and reports these."""

from __future__ import annotations

import statistics
from collections.abc import Callable

# (name, what to read from one run's report); higher is better for the first, lower for ttft
FIGURES: dict[str, Callable[[dict], float | None]] = {
    "requests_per_s": lambda r: r.get("requests_per_s"),
    "output_tokens_per_s": lambda r: r.get("output_tokens_per_s"),
    "ttft_p95_ms": lambda r: (r.get("ttft_ms") or {}).get("p95"),
    "tbt_p95_ms": lambda r: (r.get("tbt_ms") or {}).get("p95"),
    "cache_hit_rate": lambda r: r.get("cache_hit_rate"),
    "local_hit_rate": lambda r: (r.get("fleet_cache") or {}).get("local_hit_rate"),
    "hit_rate_with_pulls": lambda r: (r.get("fleet_cache") or {}).get("hit_rate_with_pulls"),
    "fraction_of_bound": lambda r: (r.get("roofline") or {}).get("fraction_of_bound"),
    "fraction_of_shared_bound": lambda r: (r.get("roofline") or {}).get("fraction_of_shared_bound"),
}
PEERS = ("mlx_lm", "vllm_mlx")


def medians(rows: list[dict]) -> list[dict]:
    """Per (config, workload), in first-seen order: runs, failures, and for each figure its
    median, min and max over the runs that completed."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["config"], row.get("workload", "")), []).append(row)
    summary = []
    for (config, workload), runs in groups.items():
        ok = [r for r in runs if "failed" not in r]
        entry: dict = {"config": config, "workload": workload, "runs": len(runs)}
        entry["failed_runs"] = len(runs) - len(ok)
        for name, read in FIGURES.items():
            values = [v for v in map(read, ok) if v is not None]
            if values:
                entry[name] = {
                    "median": round(statistics.median(values), 4),
                    "min": round(min(values), 4),
                    "max": round(max(values), 4),
                }
        summary.append(entry)
    _add_peer_ratios(summary)
    return summary


def _add_peer_ratios(summary: list[dict]) -> None:
    """Each of our configurations' median req/s over the best peer's, and p95 TTFT over the
    peer's with the best req/s, per workload."""
    for workload in dict.fromkeys(e["workload"] for e in summary):
        entries = [e for e in summary if e["workload"] == workload and "requests_per_s" in e]
        peers = [e for e in entries if e["config"] in PEERS]
        if not peers:
            continue
        best = max(peers, key=lambda e: e["requests_per_s"]["median"])
        for entry in entries:
            if entry["config"] in PEERS:
                continue
            rate = entry["requests_per_s"]["median"] / best["requests_per_s"]["median"]
            entry["vs_best_peer"] = {"peer": best["config"], "requests_per_s": round(rate, 3)}
            if "ttft_p95_ms" in entry and "ttft_p95_ms" in best:
                ttft = entry["ttft_p95_ms"]["median"] / best["ttft_p95_ms"]["median"]
                entry["vs_best_peer"]["ttft_p95"] = round(ttft, 3)


def medians_table(summary: list[dict]) -> str:
    """Markdown: median [min-max] of each figure, and the ratios to the best peer."""
    head = ["config", "workload", "runs", "req/s", "p95 TTFT ms", "p95 TBT ms", "hit rate"]
    head += ["hit local", "hit +pulls", "of bound", "of bound, shared K/V", "vs peer"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for e in summary:
        ratio = e.get("vs_best_peer")
        vs = f"{ratio['requests_per_s']}x req/s ({ratio['peer']})" if ratio else ""
        cells = [e["config"], e["workload"], f"{e['runs'] - e['failed_runs']}/{e['runs']}"]
        figures = ("requests_per_s", "ttft_p95_ms", "tbt_p95_ms", "cache_hit_rate")
        cells += [_spread(e.get(k)) for k in (*figures, "local_hit_rate", "hit_rate_with_pulls")]
        cells += [_spread(e.get(k)) for k in ("fraction_of_bound", "fraction_of_shared_bound")]
        cells.append(vs)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _spread(figure: dict | None) -> str:
    if figure is None:
        return ""
    return f"{figure['median']:g} [{figure['min']:g}-{figure['max']:g}]"
