"""Tracing tests export to the SDK's in-memory exporter instead of an OTLP collector."""

from __future__ import annotations

import pytest

from shared import tracing


@pytest.fixture
def spans(monkeypatch):
    """The exporter every tracer made during the test writes to (synchronously)."""
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    monkeypatch.delenv(tracing.ENDPOINT_ENV, raising=False)
    monkeypatch.setattr(tracing, "span_processor", lambda endpoint: SimpleSpanProcessor(exporter))
    return exporter


def by_name(exporter, name: str) -> list:
    return [s for s in exporter.get_finished_spans() if s.name == name]
