#!/usr/bin/env python3
"""The charts of docs/benchmarks.md's first page, drawn from the current figures' JSON.

    .venv/bin/python scripts/bench_charts.py                 # docs/bench/current.json -> PNGs
    .venv/bin/python scripts/bench_charts.py --data F --out-dir D

It runs no benchmark: the figures in the JSON are copied from recorded runs (each entry names
its section of docs/benchmarks-history.md and the command that reproduces it). Writes
`current_serving.png` (ours beside the peers: req/s with the spread of repeated rounds, p95
TTFT), `current_engine.png` (decode tok/s against mlx-lm) and `current_routing.png` (routing
policies under KV pressure, and the fleet simulation's hit rates), and prints one JSON line
naming what it wrote.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)

ROOT = Path(__file__).resolve().parents[1]
OURS, PEER = "#0a64d6", "#9a9aa0"  # the fleet page's accent; a neutral grey for the peers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=ROOT / "docs/bench/current.json")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "docs/bench")
    args = parser.parse_args(argv)
    figures = json.loads(args.data.read_text())
    args.out_dir.mkdir(parents=True, exist_ok=True)
    written = [
        _save(serving(figures["serving"]), args.out_dir / "current_serving.png"),
        _save(engine(figures["engine"]), args.out_dir / "current_engine.png"),
        _save(routing(figures["routing"]), args.out_dir / "current_routing.png"),
    ]
    print(json.dumps({"written": [str(p) for p in written], "data": str(args.data)}))
    return 0


def serving(loads: dict):
    """Per load, req/s and p95 TTFT of each configuration, ours in colour."""
    fig, axes = plt.subplots(2, len(loads), figsize=(11, 6.5), constrained_layout=True)
    for column, load in enumerate(loads.values()):
        rows = load["rows"]
        runs = f"median of {load['runs']} rounds" if load["runs"] > 1 else "one run"
        _bars(axes[0][column], rows, "req_s", f"{load['title']}\nrequests/s ({runs})", "{:.3f}")
        axes[1][column].set_yscale("log")
        _bars(axes[1][column], rows, "ttft_p95_s", "p95 time to first token (s, log)", "{:.1f}")
    fig.suptitle("Serving: ours beside the peers (higher req/s, lower TTFT are better)")
    return fig


def engine(section: dict):
    """Decode tok/s, ours vs mlx-lm, each case's median, with the ratio above the pair."""
    rows = section["rows"]
    fig, ax = plt.subplots(figsize=(11, 4.2), constrained_layout=True)
    width = 0.38
    for i, row in enumerate(rows):
        ours, theirs = statistics.median(row["ours"]), statistics.median(row["mlx_lm"])
        ax.bar(i - width / 2, theirs, width, color=PEER, label="mlx-lm" if i == 0 else None)
        ax.bar(i + width / 2, ours, width, color=OURS, label="ours" if i == 0 else None)
        ax.annotate(
            f"{ours / theirs:.2f}x",
            (i, max(ours, theirs)),
            ha="center",
            xytext=(0, 3),
            textcoords="offset points",
        )
    ax.set_xticks(range(len(rows)), [f"{r['model']}\nbatch {r['batch']}" for r in rows])
    ax.set_ylabel("decode tokens/s")
    ax.set_title(section["title"])
    ax.margins(y=0.12)
    ax.legend(loc="upper right")
    return fig


def routing(section: dict):
    """The real two-worker run under pressure, and the simulation's hit rates by fleet size."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), constrained_layout=True)
    pressure = section["pressure"]
    rows = [dict(r, ours=r["config"] == "cache_aware") for r in pressure["rows"]]
    _bars(
        left,
        rows,
        "req_s",
        f"{pressure['title']}\nrequests/s (median of {pressure['runs']} rounds; hit rate below)",
        "{:.3f}",
    )
    left.set_xticks(range(len(rows)), [f"{r['config']}\n({r['hit_rate']:.0%} hit)" for r in rows])
    sim = section["simulation"]
    styles = {
        "capacity bound": {"color": "black", "linestyle": "--"},
        "cache_aware": {"color": OURS, "linewidth": 2.5},
        "least_load": {"color": "#2e9d5b"},
        "round_robin": {"color": "#e07b24"},
    }
    for name, rates in sim["hit_rate"].items():
        style = styles.get(name, {})
        right.plot(sim["workers"], [100 * r for r in rates], marker="o", label=name, **style)
    right.set_xscale("log", base=2)
    right.set_xticks(sim["workers"], [str(w) for w in sim["workers"]])
    right.set_xlabel("workers")
    right.set_ylabel("prefix-cache hit rate (%)")
    right.set_title("Fleet simulation (the real router, simulated workers)")
    right.legend()
    return fig


def _bars(ax, rows: list[dict], key: str, title: str, label: str) -> None:
    """One bar per row (ours coloured), with the min-max spread where the row has one."""
    values = [r[key] for r in rows]
    errors = None
    if all(f"{key}_range" in r for r in rows):
        spread = [r[f"{key}_range"] for r in rows]
        errors = [
            [v - lo for v, (lo, _) in zip(values, spread, strict=True)],
            [hi - v for v, (_, hi) in zip(values, spread, strict=True)],
        ]
    colours = [OURS if r["ours"] else PEER for r in rows]
    bars = ax.bar(range(len(rows)), values, color=colours, yerr=errors, capsize=4)
    ax.bar_label(bars, [label.format(v) for v in values], padding=2)
    ax.set_xticks(range(len(rows)), [_name(r) for r in rows])
    ax.set_title(title, fontsize=10)
    ax.margins(y=0.15)


def _name(row: dict) -> str:
    """A row's label; a run cut short by the benchmark's window says so (not a result)."""
    if row.get("requests") and row.get("ok", row["requests"]) < row["requests"]:
        return f"{row['config']}\n(unfinished: {row['ok']} of {row['requests']})"
    return row["config"]


def _save(fig, path: Path) -> Path:
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


if __name__ == "__main__":
    sys.exit(main())
