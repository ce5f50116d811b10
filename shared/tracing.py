"""OpenTelemetry set-up both processes share (opt-in; docs/deploy.md, "Traces and dashboards").

Tracing is on when an OTLP endpoint is configured: the `otlp_endpoint` setting ([router],
[worker]) or the standard OTEL_EXPORTER_OTLP_ENDPOINT variable. Off, nothing here imports
OpenTelemetry: `tracer()` returns None and every hook is an `is None` test. The packages are
the `tracing` extra (pip install 'mlx-fleet[tracing]').

The W3C trace context crosses the wire as Generate.trace_context (`traceparent`/`tracestate`),
so a worker's spans hang under the router's `route` span of the same request.
"""

from __future__ import annotations

import os
from typing import Any

ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"
REQUEST_ID = "mlx_fleet.request_id"  # the attribute every span of a request carries


class TracingUnavailable(RuntimeError):
    """An endpoint is configured but the OpenTelemetry packages are not installed."""


def endpoint_of(setting: str | None) -> str | None:
    """The OTLP endpoint in force: the setting, else $OTEL_EXPORTER_OTLP_ENDPOINT, else None."""
    return setting or os.environ.get(ENDPOINT_ENV) or None


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL of a collector's base address (as the env variable means it)."""
    base = endpoint.rstrip("/")
    return base if base.endswith("/v1/traces") else f"{base}/v1/traces"


def tracer(service: str, setting: str | None) -> Any:
    """An OpenTelemetry Tracer exporting to the configured endpoint, or None (tracing off).
    Its provider is private (the global one is left to the host program)."""
    endpoint = endpoint_of(setting)
    if endpoint is None:
        return None
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
    except ImportError as exc:
        raise TracingUnavailable(
            f"an OTLP endpoint is configured ({endpoint}) but OpenTelemetry is not installed: "
            "pip install 'mlx-fleet[tracing]'"
        ) from exc
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(span_processor(endpoint))
    return provider.get_tracer("mlx_fleet")


def span_processor(endpoint: str) -> Any:
    """Batches spans to the collector over OTLP/HTTP (tests put an in-memory exporter here)."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    return BatchSpanProcessor(OTLPSpanExporter(endpoint=traces_url(endpoint)))


def carrier_of(span: Any) -> dict[str, str]:
    """The W3C trace context that makes a remote span a child of `span`."""
    from opentelemetry.trace import set_span_in_context
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, context=set_span_in_context(span))
    return carrier


def context_of(carrier: Any) -> Any:
    """The parent context a W3C carrier (a Generate's trace_context, HTTP headers) names;
    an empty context (a new trace) when it names none."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract(carrier or {})
