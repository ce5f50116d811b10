"""/metrics through prometheus-client: vLLM's names where vLLM has the series, ours elsewhere."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from router.cluster.registry import WorkerState
from router.metrics.router_metrics import Metrics
from router.metrics.worker_metrics import WORKER_SERIES
from shared.protocol import Heartbeat, Register, WorkerPhases

MODEL = "tiny"


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """Every sample of an exposition, keyed by (name, sorted labels)."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def worker(worker_id: str, running: int, waiting: int, free: int, total: int) -> WorkerState:
    state = WorkerState(
        Register(worker_id, "smol", 16, total, "h", 1), b"id-" + worker_id.encode(), 0.0
    )
    state.heartbeat = Heartbeat(worker_id, running, waiting, free, total, 0, 7, 20)
    return state


def test_cluster_gauges_carry_vllm_names_and_sum_over_workers():
    text = Metrics("smol").render([worker("a", 2, 1, 25, 100), worker("b", 1, 0, 75, 100)], 4)
    got = samples(text)
    label = (("model_name", "smol"),)
    assert got[("vllm:num_requests_running", label)] == 3
    assert got[("vllm:num_requests_waiting", label)] == 1
    assert got[("vllm:kv_cache_usage_perc", label)] == 0.5  # 100 of 200 blocks used
    assert got[("mlx_fleet_worker_kv_used_blocks", (("worker", "a"),))] == 75
    assert got[("mlx_fleet_worker_cache_hit_tokens_total", (("worker", "b"),))] == 7
    assert got[("mlx_fleet_pending_requests", ())] == 4


def test_phase_fields_are_exported_per_worker_and_preemptions_summed():
    a, b = worker("a", 0, 0, 1, 1), worker("b", 0, 0, 1, 1)
    for w, n in ((a, 2), (b, 3)):
        phases = WorkerPhases(preemptions=n, prefill_chunk_p50_ms=12.5)
        w.heartbeat = Heartbeat(w.worker_id, 0, 0, 1, 1, 0, 0, 0, phases)
    got = samples(Metrics("smol").render([a, b], 0))
    assert got[("vllm:num_preemptions_total", (("model_name", "smol"),))] == 5
    assert got[("mlx_fleet_worker_phase_preemptions_total", (("worker", "b"),))] == 3
    assert got[("mlx_fleet_worker_phase_prefill_chunk_p50_ms", (("worker", "a"),))] == 12.5


def test_every_worker_series_is_exported_for_every_worker():
    got = samples(Metrics("smol").render([worker("a", 0, 0, 1, 1), worker("b", 0, 0, 1, 1)], 0))
    names = {name for name, _ in got}
    for series in WORKER_SERIES:
        suffix = "_total" if series.kind == "counter" else ""
        name = f"mlx_fleet_worker_{series.name}{suffix}"
        assert {(name, (("worker", w),)) for w in "ab"} <= set(got), name
    assert "mlx_fleet_worker_phase_decode_tick_p95_ms" in names


def test_request_latencies_and_finish_reasons():
    metrics = Metrics("smol")
    smol = metrics.model("smol")
    smol.first_token(0.2)
    smol.output_tokens(0.3, 3)  # three tokens in one delta: three intervals of 0.1
    smol.request_finished("length", 0.5)
    smol.usage(prompt=10, completion=4, cached=6)
    got = samples(metrics.render([], 0))
    label = (("model_name", "smol"),)
    assert got[("vllm:time_to_first_token_seconds_count", label)] == 1
    assert got[("vllm:inter_token_latency_seconds_count", label)] == 3
    assert abs(got[("vllm:inter_token_latency_seconds_sum", label)] - 0.3) < 1e-9
    assert got[("vllm:e2e_request_latency_seconds_sum", label)] == 0.5
    assert got[("vllm:request_success_total", (("finished_reason", "length"), *label))] == 1
    assert got[("vllm:prompt_tokens_total", label)] == 10
    assert got[("vllm:generation_tokens_total", label)] == 4
    assert got[("vllm:prefix_cache_queries_total", label)] == 10
    assert got[("vllm:prefix_cache_hits_total", label)] == 6


def test_two_apps_keep_separate_registries():
    one, two = Metrics("x"), Metrics("x")  # the global registry would refuse the second
    one.model("x").usage(5, 1, 0)
    assert samples(two.render([], 0))[("vllm:prompt_tokens_total", (("model_name", "x"),))] == 0


async def test_non_streaming_request_records_ttft_and_inter_token_latency(make_cluster):
    cluster = await make_cluster()
    await cluster.add_worker("w1")
    api = cluster.openai()
    await api.completions.create(model=MODEL, prompt="hello", max_tokens=5)
    got = samples(await (await cluster.client.get("/metrics")).text())
    label = (("model_name", MODEL),)
    assert got[("vllm:time_to_first_token_seconds_count", label)] == 1
    assert got[("vllm:inter_token_latency_seconds_count", label)] == 4  # 5 tokens, 4 gaps
    assert got[("vllm:e2e_request_latency_seconds_count", label)] == 1
    assert got[("vllm:request_success_total", (("finished_reason", "length"), *label))] == 1
    assert got[("vllm:generation_tokens_total", label)] == 5
    assert got[("mlx_fleet_worker_registrations_total", (("worker", "w1"),))] == 1
    assert got[("mlx_fleet_worker_routed_total", (("worker", "w1"),))] == 1
