"""Repeated comparison runs: medians, spread and ratios to the best peer."""

from __future__ import annotations

from scripts.loadgen.compare import parse_args
from scripts.loadgen.rounds import medians, medians_table


def run(config: str, rate: float, ttft: float, workload: str = "chat") -> dict:
    return {
        "config": config,
        "workload": workload,
        "requests_per_s": rate,
        "ttft_ms": {"p95": ttft},
        "roofline": {"fraction_of_bound": rate / 4},
    }


def test_medians_and_spread_per_configuration_and_workload():
    rows = [run("ours-1", r, 100) for r in (1.0, 3.0, 2.0)] + [
        {"config": "ours-1", "workload": "chat", "failed": "did not start"}
    ]
    (entry,) = medians(rows)
    assert entry["runs"] == 4 and entry["failed_runs"] == 1
    assert entry["requests_per_s"] == {"median": 2.0, "min": 1.0, "max": 3.0}
    assert entry["fraction_of_bound"]["median"] == 0.5


def test_ratio_is_to_the_peer_with_the_best_median_rate():
    rows = [run("ours-1", 3.0, 50), run("mlx_lm", 1.0, 400), run("vllm_mlx", 1.5, 200)]
    rows += [run("ours-1", 3.0, 50, "long"), run("mlx_lm", 0.5, 900, "long")]
    chat, mlx_lm, vllm, long, _ = medians(rows)
    assert chat["vs_best_peer"] == {"peer": "vllm_mlx", "requests_per_s": 2.0, "ttft_p95": 0.25}
    assert "vs_best_peer" not in mlx_lm and "vs_best_peer" not in vllm
    assert long["vs_best_peer"]["requests_per_s"] == 6.0
    table = medians_table(medians(rows))
    assert "2.0x req/s (vllm_mlx)" in table and "3 [3-3]" in table


def test_compare_takes_repeats_and_roofline():
    args = parse_args(["--repeats", "3", "--roofline"])
    assert args.repeats == 3 and args.roofline
