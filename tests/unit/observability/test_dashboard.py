"""deploy/grafana/mlx-fleet.json: a valid dashboard whose every query names a real metric."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

DASHBOARD = Path(__file__).resolve().parents[3] / "deploy" / "grafana" / "mlx-fleet.json"
KEY = "sk-dashboard-test"
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
# PromQL words that look like metric names: functions, aggregations, keywords, variables
PROMQL_WORDS = {"sum", "by", "rate", "increase", "histogram_quantile", "le", "without", "on"}
NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def metric_names(expr: str) -> set[str]:
    """The metric names an expression reads: identifiers outside label matchers, legend
    templates and range brackets that are neither PromQL words nor label names."""
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\"[^\"]*\"", " ", expr)  # matchers, ranges, strings
    expr = re.sub(r"\b(by|without|on)\s*\([^)]*\)", " ", expr)  # grouping labels
    return {m for m in NAME.findall(expr) if m not in PROMQL_WORDS and not m[0].isdigit()}


def test_it_is_a_dashboard_with_a_datasource_variable(dashboard):
    assert dashboard["title"] == "mlx-fleet" and dashboard["uid"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert dashboard["panels"]
    for panel in dashboard["panels"]:
        assert panel["title"] and panel["targets"], panel
        assert panel["datasource"]["uid"] == "${datasource}"
        for target in panel["targets"]:
            assert target["expr"] and target["refId"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def test_it_covers_what_an_operator_watches(dashboard):
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    for needed in (
        "mlx_fleet_http_requests_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:e2e_request_latency_seconds_bucket",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "mlx_fleet_worker_running",
        "mlx_fleet_worker_waiting",
        "mlx_fleet_worker_kv_used_blocks",
        "vllm:prefix_cache_hits_total",
        "mlx_fleet_worker_phase_decode_tick_p95_ms",
        "mlx_fleet_key_requests_total",
    ):
        assert needed in exprs, needed
    assert "histogram_quantile(0.95" in exprs


async def test_every_metric_it_queries_is_one_the_router_exposes(dashboard, make_cluster):
    cluster = await make_cluster(api_keys=(KEY,))  # so the per-key series have samples
    await cluster.add_worker("w1")
    auth = {"Authorization": f"Bearer {KEY}"}
    reply = await cluster.client.post("/v1/chat/completions", json=CHAT, headers=auth)
    assert reply.status == 200
    text = await (await cluster.client.get("/metrics", headers=auth)).text()
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    exposed = {NAME.match(line).group(0) for line in lines}
    used = set()
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            used |= metric_names(target["expr"])
    used |= {"vllm:num_requests_running"}  # the $model variable's query
    assert used, "no metric names found in the dashboard"
    missing = sorted(used - exposed)
    assert not missing, f"the dashboard queries metrics /metrics does not expose: {missing}"


def test_the_name_extraction_skips_labels_and_functions():
    expr = (
        'histogram_quantile(0.95, sum by (le, endpoint) (rate(a_bucket{model_name=~"$m"}'
        "[$__rate_interval]))) / b_total"
    )
    assert metric_names(expr) == {"a_bucket", "b_total"}
