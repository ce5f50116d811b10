"""Tracing off (no endpoint configured): nothing exported, OpenTelemetry never imported."""

from __future__ import annotations

import os
import subprocess
import sys

from shared import tracing
from shared.tracing import ENDPOINT_ENV
from tests.unit.observability.conftest import by_name

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}

# Import every module with a tracing hook, build both sides' tracers unconfigured, and report
# which opentelemetry modules got loaded.
PROBE = """
import sys
import router.app, router.http.generate, router.routing.dispatcher, router.metrics.tracing
import worker.loop, worker.engine.engine, worker.tracing
from router.metrics.tracing import router_tracer
from worker.tracing import WorkerTracing
assert router_tracer(None) is None and WorkerTracing.start("w", None) is None
print(sorted(m for m in sys.modules if m.startswith("opentelemetry")))
"""


def test_no_module_imports_opentelemetry_when_no_endpoint_is_set():
    env = {k: v for k, v in os.environ.items() if k != ENDPOINT_ENV}
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


async def test_nothing_is_exported_without_an_endpoint(spans, make_cluster, monkeypatch):
    asked = []
    monkeypatch.setattr(tracing, "span_processor", lambda endpoint: asked.append(endpoint))
    cluster = await make_cluster()
    worker = await cluster.add_worker("w1")
    reply = await cluster.client.post("/v1/chat/completions", json=CHAT)
    assert reply.status == 200
    assert asked == [] and spans.get_finished_spans() == ()
    assert worker.received[0].trace_context is None  # nothing extra on the wire


async def test_the_env_variable_turns_tracing_on(spans, make_cluster, monkeypatch):
    monkeypatch.setenv(ENDPOINT_ENV, "http://127.0.0.1:4318")
    cluster = await make_cluster()
    await cluster.add_worker("w1")
    assert (await cluster.client.post("/v1/chat/completions", json=CHAT)).status == 200
    assert len(by_name(spans, "request")) == 1
