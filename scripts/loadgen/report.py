"""The comparison's outputs: a markdown table and PNG plots (matplotlib, Agg backend)."""

from __future__ import annotations

from pathlib import Path

COLUMNS = (
    ("config", lambda r: r["config"]),
    ("workload", lambda r: r.get("workload", "")),
    ("ok/err", lambda r: f"{r.get('completed', 0)}/{r.get('errors', '-')}"),
    ("req/s", lambda r: r.get("requests_per_s")),
    ("out tok/s", lambda r: r.get("output_tokens_per_s")),
    ("TTFT p50", lambda r: r.get("ttft_ms", {}).get("p50")),
    ("TTFT p95", lambda r: r.get("ttft_ms", {}).get("p95")),
    ("TTFT p99", lambda r: r.get("ttft_ms", {}).get("p99")),
    ("TPOT p50", lambda r: r.get("tpot_ms", {}).get("p50")),
    ("TPOT p95", lambda r: r.get("tpot_ms", {}).get("p95")),
    ("TBT p95", lambda r: (r.get("tbt_ms") or {}).get("p95")),
    ("e2e p50", lambda r: r.get("e2e_ms", {}).get("p50")),
    ("e2e p95", lambda r: r.get("e2e_ms", {}).get("p95")),
    ("cache hit", lambda r: _percent(r.get("cache_hit_rate"))),
    ("hit local", lambda r: _percent((r.get("fleet_cache") or {}).get("local_hit_rate"))),
    ("hit +pulls", lambda r: _percent((r.get("fleet_cache") or {}).get("hit_rate_with_pulls"))),
    ("pulled tok", lambda r: (r.get("fleet_cache") or {}).get("pulled_tokens")),
    ("per worker", lambda r: _per_worker(r.get("requests_per_worker"))),
    ("busy", lambda r: _busy(r.get("busy_per_worker"))),
    ("tick p50", lambda r: _decoders_mean(r, "decode_tick_p50_ms")),
    ("K/V MB/tick", lambda r: _mb(_decoders_mean(r, "decode_kv_bytes_mean"))),
    ("draft accept", lambda r: _percent((r.get("speculation") or {}).get("acceptance"))),
)


def _percent(rate: float | None) -> str | None:
    return None if rate is None else f"{rate:.0%}"


def _decoders_mean(row: dict, key: str) -> float | None:
    """Mean of a phase figure over the workers that decoded (a prefill worker has none), from
    the workers' phases at the end of the run."""
    phases = [p for p in (row.get("worker_phases") or {}).values() if p]
    values = [p[key] for p in phases if p.get("decode_batch_mean") and p.get(key) is not None]
    return sum(values) / len(values) if values else None


def _mb(value: float | None) -> float | None:
    return None if value is None else value / 1e6


def _per_worker(counts: dict | None) -> str | None:
    return None if not counts else " / ".join(str(counts[w]) for w in sorted(counts))


def _busy(shares: dict | None) -> str | None:
    """Each worker's share of the run spent in engine steps, in worker order."""
    if not shares:
        return None
    return " / ".join(f"{shares[w]:.0%}" for w in sorted(shares))


def _cell(value) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):  # small rates keep three digits (0.295 req/s, not 0.3)
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def markdown_table(rows: list[dict]) -> str:
    """One row per (configuration, workload); times in ms; failed runs show their error."""
    lines = [
        "| " + " | ".join(name for name, _ in COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    for row in rows:
        if "failed" in row:
            first_line = row["failed"].splitlines()[0]
            cells = [row["config"], row.get("workload", ""), f"failed: {first_line}"]
            cells += [""] * (len(COLUMNS) - len(cells))
        else:
            cells = [_cell(get(row)) for _, get in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], out_dir: Path) -> list[Path]:
    """Per workload, one PNG of latency and throughput bars by configuration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for workload in dict.fromkeys(r["workload"] for r in rows if "failed" not in r):
        runs = [r for r in rows if r.get("workload") == workload and "failed" not in r]
        fig, axes = plt.subplots(2, 2, figsize=(11, 7), constrained_layout=True)
        fig.suptitle(f"{workload}: {runs[0]['mode']} loop, {runs[0]['requests']} requests")
        _bars(axes[0][0], runs, [("ttft_ms", "p50"), ("ttft_ms", "p95")], "TTFT (ms)")
        _bars(axes[0][1], runs, [("tpot_ms", "p50"), ("tpot_ms", "p95")], "TPOT (ms)")
        _bars(axes[1][0], runs, [("output_tokens_per_s", None)], "output tokens/s")
        _bars(axes[1][1], runs, [("cache_hit_rate", None)], "prefix-cache hit rate")
        path = out_dir / f"{workload}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def _bars(ax, runs: list[dict], series: list[tuple[str, str | None]], title: str) -> None:
    names = [r["config"] for r in runs]
    width = 0.8 / len(series)
    for i, (key, sub) in enumerate(series):
        values = [(r.get(key) or {}).get(sub) if sub else r.get(key) for r in runs]
        xs = [x + i * width for x in range(len(names))]
        ax.bar(xs, [v or 0 for v in values], width, label=sub or key)
    ax.set_xticks([x + width * (len(series) - 1) / 2 for x in range(len(names))], names)
    ax.tick_params(axis="x", labelrotation=20)
    ax.set_title(title)
    if len(series) > 1:
        ax.legend()
