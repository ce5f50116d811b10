"""Load generator math: SSE parsing, per-request metrics, percentiles, report, arrivals."""

from __future__ import annotations

import json
import random
import statistics

import numpy as np
import pytest

from scripts.loadgen.client import RequestResult, SSEParser, apply_chunk
from scripts.loadgen.runner import poisson_arrivals
from scripts.loadgen.stats import percentile, requests_per_worker, summarize


def test_sse_parser_joins_events_split_across_reads():
    parser = SSEParser()
    stream = b'data: {"a": 1}\n\n: a comment\r\ndata: {"b":\r\ndata: 2}\r\n\r\ndata: [DONE]\n\n'
    events = []
    for i in range(0, len(stream), 3):
        events += parser.feed(stream[i : i + 3])
    assert events == ['{"a": 1}', '{"b":\n2}', "[DONE]"]


def test_sse_parser_close_returns_an_unterminated_last_event():
    parser = SSEParser()
    assert parser.feed(b"data: [DONE]") == []
    assert parser.close() == ["[DONE]"]


def chunk(content=None, role=None, usage=None) -> dict:
    delta = {k: v for k, v in (("role", role), ("content", content)) if v is not None}
    return {"choices": [{"index": 0, "delta": delta}], "usage": usage}


def test_ttft_is_the_first_content_not_the_role_chunk_and_tpot_spreads_the_rest():
    r = RequestResult(start=10.0, end=0.0)
    apply_chunk(chunk(role="assistant", content=""), r, 10.1)
    apply_chunk(chunk(content="Hel"), r, 10.5)
    apply_chunk(chunk(content="lo"), r, 10.7)
    apply_chunk(chunk(content="!"), r, 10.9)
    r.end = 11.0
    assert r.text == "Hello!"
    assert r.ttft == pytest.approx(0.5)
    assert r.output_tokens == 3  # no usage: one token per content delta
    assert r.tpot == pytest.approx(0.5 / 2)
    assert r.e2e == pytest.approx(1.0)


def test_usage_chunk_overrides_the_delta_count_and_reports_cached_tokens():
    r = RequestResult(start=0.0, end=2.0)
    apply_chunk(chunk(content="two tokens"), r, 1.0)
    usage = {
        "prompt_tokens": 100,
        "completion_tokens": 5,
        "total_tokens": 105,
        "prompt_tokens_details": {"cached_tokens": 64},
    }
    apply_chunk({"choices": [], "usage": usage}, r, 1.5)
    assert (r.output_tokens, r.prompt_tokens, r.cached_tokens) == (5, 100, 64)
    assert r.tpot == pytest.approx(1.0 / 4)


def test_one_token_has_no_tpot_and_an_error_chunk_fails_the_request():
    r = RequestResult(start=0.0, end=1.0)
    apply_chunk(chunk(content="x"), r, 0.5)
    assert r.tpot is None
    apply_chunk({"error": {"message": "worker lost", "type": "server_error"}}, r, 0.6)
    assert not r.ok and "worker lost" in r.error


@pytest.mark.parametrize("n", [1, 2, 5, 100, 1001])
def test_percentile_matches_numpy_linear(n):
    rng = random.Random(n)
    values = [rng.expovariate(1.0) for _ in range(n)]
    for q in (0, 50, 95, 99, 100):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))
    assert percentile([], 50) is None


def done(start, first, end, tokens, prompt=None, cached=None, error=None) -> RequestResult:
    return RequestResult(
        start, end, first, tokens, None if prompt is None else tokens, prompt, cached, error
    )


def test_report_math():
    results = [
        done(0.0, 0.1, 1.1, 11, prompt=100, cached=0),
        done(0.0, 0.3, 2.3, 11, prompt=100, cached=80),
        done(1.0, 1.2, 3.2, 21, prompt=200, cached=100),
        done(1.0, None, 1.5, 0, error="HTTP 429: busy"),
        done(1.0, None, 1.6, 0, error="HTTP 429: busy"),
    ]
    report = summarize(results, elapsed_s=4.0)
    assert (report["requests"], report["completed"], report["errors"]) == (5, 3, 2)
    assert report["first_errors"] == ["HTTP 429: busy"]
    assert report["requests_per_s"] == pytest.approx(0.75)
    assert report["output_tokens"] == 43
    assert report["output_tokens_per_s"] == pytest.approx(43 / 4, abs=0.01)
    assert report["ttft_ms"]["p50"] == pytest.approx(200)
    assert report["ttft_ms"]["p99"] == pytest.approx(np.percentile([100, 300, 200], 99) * 1)
    assert report["tpot_ms"]["p50"] == pytest.approx(100)  # 1.0s/10, 2.0s/10, 2.0s/20
    assert report["e2e_ms"]["p95"] == pytest.approx(np.percentile([1100, 2300, 2200], 95))
    assert report["cache_hit_rate"] == pytest.approx(180 / 400)
    assert report["tokens_counted_from"] == "usage"
    json.dumps(report)  # JSON-ready


def test_no_cached_tokens_reported_means_no_hit_rate():
    report = summarize([done(0.0, 0.1, 0.2, 2)], elapsed_s=1.0)
    assert report["cache_hit_rate"] is None and report["tokens_counted_from"] == "deltas"


def test_requests_per_worker_is_the_difference_of_two_cluster_snapshots():
    before = {"workers": [{"id": "w0", "requests_served": 3}, {"id": "w1", "requests_served": 1}]}
    after = {
        "workers": [
            {"id": "w0", "requests_served": 10},
            {"id": "w1", "requests_served": 1},
            {"id": "w2", "requests_served": 4},
        ]
    }
    assert requests_per_worker(before, after) == {"w0": 7, "w1": 0, "w2": 4}
    assert requests_per_worker(None, after) is None


def test_poisson_arrivals_are_seeded_and_have_the_rate():
    assert poisson_arrivals(50, 4.0, seed=1) == poisson_arrivals(50, 4.0, seed=1)
    assert poisson_arrivals(50, 4.0, seed=1) != poisson_arrivals(50, 4.0, seed=2)
    rate, n = 4.0, 4000
    arrivals = poisson_arrivals(n, rate, seed=3)
    gaps = np.diff([0.0, *arrivals])
    assert all(gaps > 0)
    assert statistics.fmean(gaps) == pytest.approx(1 / rate, rel=0.06)
    assert np.std(gaps) / np.mean(gaps) == pytest.approx(1.0, abs=0.08)  # exponential: CV = 1
    counts = np.bincount(np.floor(arrivals).astype(int))[:-1]  # arrivals per whole second
    assert counts.var() / counts.mean() == pytest.approx(1.0, abs=0.2)  # Poisson: var = mean
    with pytest.raises(ValueError):
        poisson_arrivals(3, 0.0, seed=0)


def test_time_between_tokens_pools_every_gap_of_every_request():
    fast = RequestResult(start=0.0, end=1.0, first_token=0.1, chunk_times=[0.1, 0.2, 0.3])
    slow = RequestResult(start=0.0, end=3.0, first_token=0.5, chunk_times=[0.5, 2.5])
    assert fast.tbt == pytest.approx([0.1, 0.1])
    tbt = summarize([fast, slow], 3.0)["tbt_ms"]
    assert tbt["p50"] == pytest.approx(100.0)
    assert tbt["p99"] == pytest.approx(percentile([100.0, 100.0, 2000.0], 99))


def test_fleet_cache_counts_pulled_tokens_apart_from_local_hits():
    from scripts.loadgen.stats import fleet_cache, pulled_blocks_per_worker

    def snapshot(prompt, local, pulled, blocks):
        cache = {"prompt_tokens": prompt, "local_hit_tokens": local, "pulled_tokens": pulled}
        workers = [{"id": w, "pulled_blocks": n} for w, n in blocks.items()]
        return {"cache": cache, "workers": workers}

    before = snapshot(100, 20, 0, {"w0": 0, "w1": 0})
    after = snapshot(1100, 420, 300, {"w0": 0, "w1": 10})
    assert fleet_cache(before, after) == {
        "prompt_tokens": 1000,
        "local_hit_tokens": 400,
        "pulled_tokens": 300,
        "local_hit_rate": 0.4,
        "hit_rate_with_pulls": 0.7,
    }
    assert pulled_blocks_per_worker(before, after) == {"w0": 0, "w1": 10}
    assert fleet_cache({"workers": []}, after) is None  # a server without the fleet cache


def test_busy_per_worker_is_each_workers_share_of_the_run_in_steps():
    from scripts.loadgen.report import markdown_table
    from scripts.loadgen.stats import busy_per_worker

    def snapshot(busy):
        return {"workers": [{"id": w, "phases": {"busy_s": s}} for w, s in busy.items()]}

    before = snapshot({"w0": 5.0, "w1": 1.0})
    after = snapshot({"w0": 95.0, "w1": 46.0})
    shares = busy_per_worker(before, after, elapsed_s=100.0)
    assert shares == {"w0": 0.9, "w1": 0.45}
    assert busy_per_worker(None, after, 100.0) is None
    assert busy_per_worker({"workers": [{"id": "w0", "phases": None}]}, after, 100.0)["w0"] == 0.95
    row = {"config": "c", "busy_per_worker": shares}
    assert "| 90% / 45% |" in markdown_table([row])
