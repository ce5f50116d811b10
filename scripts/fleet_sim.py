"""`python scripts/fleet_sim.py`: the fleet simulator's experiments (scripts/fleetsim).

Hit rate vs worker count (16/32/64) for each policy and the capacity bound, load imbalance,
the two-worker KV-pressure configuration of issue 15 (24 and 16 tenants), prompt_cache_key on
conversations that share a key but not a prefix (2/4/8 workers, with and without keys), the router's
own CPU per request with its overhead at offered rates. One JSON line per row on stdout and
in --out; a plot of hit rate vs workers in --plot. A few minutes of one core with defaults.

    python scripts/fleet_sim.py --out docs/bench/fleet_sim.jsonl --plot docs/bench/fleet_sim.png
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root

from scripts.fleetsim import overhead, scenarios  # noqa: E402
from scripts.fleetsim.plot import plot_fleet  # noqa: E402


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="fleet_sim", description=__doc__.splitlines()[2])
    p.add_argument("--workers", type=ints, default=[16, 32, 64], help="fleet sizes")
    p.add_argument("--requests-per-worker", type=int, default=200)
    p.add_argument(
        "--pressure-tenants",
        type=ints,
        default=[24, 16],
        help="tenants of the two-worker KV-pressure runs",
    )
    p.add_argument("--pressure-requests", type=int, default=1000)
    p.add_argument("--seeds", type=ints, default=[0, 1, 2], help="pressure-run seeds")
    p.add_argument("--as-run-seeds", type=int, default=20, help="seeds of the 72-request runs")
    p.add_argument("--overhead-rates", type=ints, default=[100, 1000, 3000], help="req/s")
    p.add_argument(
        "--conversation-workers",
        type=ints,
        default=[2, 4, 8],
        help="fleet sizes of the prompt_cache_key runs",
    )
    p.add_argument(
        "--skip", default="", help="comma-separated: fleet, pressure, conversations, overhead"
    )
    p.add_argument("--out", type=Path, help="JSON lines file")
    p.add_argument("--plot", type=Path, help="PNG: hit rate vs workers")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    skip = {s.strip() for s in args.skip.split(",")}
    rows: list[dict] = []

    def emit(new_rows: list[dict]) -> None:
        for row in new_rows:
            print(json.dumps(row), flush=True)
        rows.extend(new_rows)

    if "fleet" not in skip:
        for workers in args.workers:
            emit(scenarios.run(scenarios.fleet(workers, 0, args.requests_per_worker)))
    if "pressure" not in skip:
        for tenants in args.pressure_tenants:
            for seed in args.seeds:
                scenario = scenarios.pressure(tenants, seed, args.pressure_requests)
                policies = ("cache_aware", "cache_aware_no_partition", "round_robin")
                emit(scenarios.run(scenario, policies))
        for tenants in args.pressure_tenants:  # as the real run: 72 requests, many seeds
            for seed in range(args.as_run_seeds):
                scenario = scenarios.pressure_as_run(tenants, seed)
                emit(scenarios.run(scenario, ("cache_aware", "round_robin")))
    if "conversations" not in skip:  # prompt_cache_key: the same traffic with and without
        for closed in (False, True):
            for key_per in ("tenant", "conversation"):
                for workers in args.conversation_workers:
                    scenario = scenarios.conversations(workers, 0, 300, key_per, closed)
                    for keys in (False, True):
                        emit(scenarios.run(scenario, ("cache_aware",), keys=keys))
    if "overhead" not in skip:
        emit(overhead.summarize(overhead.measure_service_times(), args.overhead_rates))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    if args.plot and any(r["scenario"].startswith("fleet-") for r in rows):
        plot_fleet(rows, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
