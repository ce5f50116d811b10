"""Hit rate and load imbalance vs fleet size, one line per policy and the capacity bound."""

from __future__ import annotations

from pathlib import Path


def plot_fleet(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fleet_rows = [r for r in rows if r["scenario"].startswith("fleet-")]
    policies = sorted({r["policy"] for r in fleet_rows})
    fig, (hits, skew) = plt.subplots(1, 2, figsize=(10, 4))
    for policy in policies:
        mine = sorted((r for r in fleet_rows if r["policy"] == policy), key=lambda r: r["workers"])
        workers = [r["workers"] for r in mine]
        style = "k--" if policy == "capacity_bound" else "o-"
        hits.plot(workers, [r["hit_rate"] for r in mine], style, label=policy)
        if policy != "capacity_bound":
            skew.plot(workers, [r["imbalance"] for r in mine], "o-", label=policy)
    tenants = fleet_rows[0]["tenants"] if fleet_rows else 0
    hits.set(
        xlabel="workers",
        ylabel="prefix-cache hit rate (tokens)",
        ylim=(0, 1),
        title=f"{tenants} Zipf tenants, multi-turn, 355 KV blocks/worker",
    )
    skew.set(xlabel="workers", ylabel="max / mean requests per worker", title="load imbalance")
    skew.axhline(1.3, color="grey", linestyle=":", label="30% bound")
    for ax in (hits, skew):
        ax.set_xscale("log", base=2)
        ax.set_xticks([r["workers"] for r in fleet_rows if r["policy"] == policies[0]])
        ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
