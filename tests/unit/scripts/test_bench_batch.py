"""scripts/bench_batch.py's arguments and its per-pattern medians (the benchmark itself starts
a cluster and takes minutes: it is run by hand, docs/benchmarks.md)."""

from __future__ import annotations

import pytest

from scripts.bench_batch import build_parser, clients_of, median_line, patterns_of, tenants


def summary(p50_alone, p50_beside, p95_alone, p95_beside, status="completed", done=500):
    return {
        "lines": 500,
        "batch_status": status,
        "batch_completed": done,
        "batch_lines_per_s": 3.0,
        "ttft_p50_alone_s": p50_alone,
        "ttft_p50_beside_s": p50_beside,
        "ttft_p95_alone_s": p95_alone,
        "ttft_p95_beside_s": p95_beside,
        "ttft_p50_ratio": round(p50_beside / p50_alone, 2),
        "ttft_p95_ratio": round(p95_beside / p95_alone, 2),
    }


def test_defaults_run_both_patterns_three_times_beside_500_lines():
    args = build_parser().parse_args([])
    assert (args.pattern, args.repeats, args.lines) == ("both", 3, 500)
    assert patterns_of(args.pattern) == ("back-to-back", "busy")
    assert clients_of("back-to-back", args) == 1
    assert clients_of("busy", args) == 2 * args.workers


def test_one_pattern_and_its_clients_can_be_chosen():
    args = build_parser().parse_args(["--pattern", "busy", "--concurrency", "6"])
    assert patterns_of(args.pattern) == ("busy",) and clients_of("busy", args) == 6
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--pattern", "bursty"])
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--repeats", "0"])


def test_the_median_line_takes_medians_and_says_whether_the_target_was_met():
    runs = [
        summary(0.17, 0.20, 0.25, 0.30),
        summary(0.16, 0.35, 0.22, 0.50),
        summary(0.18, 0.19, 0.24, 0.26),
    ]
    line = median_line("back-to-back", runs)
    assert line["pattern"] == "back-to-back" and line["repeats"] == 3
    assert line["ttft_p50_alone_s"] == 0.17 and line["ttft_p50_beside_s"] == 0.2
    assert line["ttft_p50_ratio"] == 1.18  # the middle of 1.18, 2.19, 1.06
    assert line["ttft_p95_ratio"] == 1.2
    assert line["batch_finished"] == "3/3" and line["target_met"]


def test_a_slow_median_or_an_unfinished_batch_misses_the_target():
    slow = [summary(0.17, 0.35, 0.25, 0.5)] * 3
    assert median_line("busy", slow)["target_met"] is False
    unfinished = [
        summary(0.17, 0.18, 0.25, 0.26),
        summary(0.17, 0.18, 0.25, 0.26, done=499),
        summary(0.17, 0.18, 0.25, 0.26, status="failed"),
    ]
    line = median_line("busy", unfinished)
    assert line["batch_finished"] == "1/3" and line["target_met"] is False


def test_every_batch_brings_system_prompts_of_its_own():
    first, second = tenants(0), tenants(1)
    assert len(first) == 4 and len(set(first)) == 4
    assert not set(first) & set(second)
