"""The soak's per-process report: RSS each minute, and a worker's RSS split into what its MLX
holds (from its heartbeats) and the rest, the host's, whose slope tells a leak."""

from __future__ import annotations

from scripts.soak.procs import Sampler


def sampler_with(points: list[tuple[float, dict]]) -> Sampler:
    sampler = Sampler(launcher_pid=0)
    sampler.series[("worker", 42)] = points
    return sampler


def test_a_worker_whose_mlx_memory_grows_has_a_flat_host_share():
    # RSS climbs 100 MB over the hour, all of it MLX's kept prefixes: the host share is flat
    points = [
        (
            t,
            {
                "rss_mb": 1200 + t / 36,
                "open_files": 9,
                "threads": 12,
                "mlx_active_mb": 1000 + t / 36,
                "mlx_cache_mb": 30.0,
                "prefix_kv_mb": t / 36,
            },
        )
        for t in range(0, 3601, 10)
    ]
    (report,) = sampler_with(points).report()
    assert report["rss_slope_mb_per_hour"] == 100.0
    assert report["host_slope_mb_per_hour"] == 0.0
    assert report["host_mb_first"] == report["host_mb_last"] == 170.0
    assert report["prefix_kv_mb_max"] == 100.0 and report["mlx_active_mb_last"] == 1100.0
    assert len(report["rss_mb_each_minute"]) == 61
    assert report["rss_mb_each_minute"][:2] == [1200, 1202]


def test_a_process_the_router_never_described_reports_rss_only():
    points = [(t, {"rss_mb": 140.0, "open_files": 20, "threads": 11}) for t in range(0, 300, 5)]
    (report,) = sampler_with(points).report()
    assert report["rss_slope_mb_per_hour"] == 0.0
    assert "host_mb_last" not in report
    assert report["rss_mb_each_minute"] == [140] * 5
