"""The router's OpenTelemetry spans (opt-in; shared/tracing.py holds the set-up).

One HTTP request is one trace, or a child of the client's when it sends `traceparent`:

    request                the whole HTTP request (endpoint, model, stream, finish reason)
    ├── queue              arrival -> routed: body, parse and tokenize (pool wait included)
    ├── route              one per attempt on a worker: worker, policy, prefix blocks matched;
    │                      the worker's spans (worker/tracing.py) are its children
    └── stream             first token -> last one out: tokens, time to first token

Tracing off, `RequestTrace.start` returns None and nothing here imports OpenTelemetry.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from shared import tracing
from shared.tracing import REQUEST_ID

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Mapping

    from shared.protocol import Generate


def router_tracer(otlp_endpoint: str | None) -> Any:
    """The router's tracer, or None when no endpoint is configured."""
    return tracing.tracer("mlx-fleet-router", otlp_endpoint)


class RequestTrace:
    """The spans of one HTTP request. Spans are started with explicit parents (never the
    ambient context), so fail-over in another task still lands in the right trace."""

    def __init__(self, tracer: Any, endpoint: str, headers: Mapping[str, str]) -> None:
        from opentelemetry.trace import SpanKind, set_span_in_context

        self._tracer = tracer
        self.root = tracer.start_span(
            "request",
            context=tracing.context_of(dict(headers)),
            kind=SpanKind.SERVER,
            attributes={"http.route": endpoint},
        )
        self._parent = set_span_in_context(self.root)
        self._queue: Any = tracer.start_span("queue", context=self._parent)
        self._routes: dict[str, Any] = {}  # open `route` spans by wire id
        self._first_token_ns: int | None = None
        self._started = time.perf_counter()
        self._tokens = 0
        self._finish: list[str] = []
        self._model = ""

    @classmethod
    def start(cls, tracer: Any, endpoint: str, headers: Mapping[str, str]) -> RequestTrace | None:
        return None if tracer is None else cls(tracer, endpoint, headers)

    def describe(self, request_id: str, model: str, stream: bool) -> None:
        self._model = model
        attributes = {REQUEST_ID: request_id, "gen_ai.request.model": model}
        self.root.set_attributes(attributes | {"mlx_fleet.stream": stream})

    def routed(self, msg: Generate, worker_id: str, matched_blocks: int, policy: str) -> Generate:
        """Open the attempt's `route` span; `msg` carrying its context to the worker."""
        if self._queue is not None:
            self._queue.end()
            self._queue = None
        span = self._tracer.start_span(
            "route",
            context=self._parent,
            attributes={
                REQUEST_ID: msg.request_id.rpartition("#")[0] or msg.request_id,
                "mlx_fleet.wire_id": msg.request_id,
                "gen_ai.request.model": self._model,
                "mlx_fleet.worker": worker_id,
                "mlx_fleet.policy": policy,
                "mlx_fleet.cached_blocks_matched": matched_blocks,
                "mlx_fleet.prompt_tokens": len(msg.token_ids),
            },
        )
        self._routes[msg.request_id] = span
        return replace(msg, trace_context=tracing.carrier_of(span))

    def unrouted(self, wire_id: str) -> None:
        """The attempt ended (finished, cancelled, or its worker was lost)."""
        span = self._routes.pop(wire_id, None)
        if span is not None:
            span.end()

    async def watch(self, items: AsyncIterator[tuple[int, Any]]) -> AsyncIterator[tuple[int, Any]]:
        """The reply's pieces, passed through, timing the first and counting the finishes."""
        async for index, piece in items:
            if self._first_token_ns is None:
                self._first_token_ns = time.time_ns()
                ttft = time.perf_counter() - self._started
                self.root.set_attribute("mlx_fleet.time_to_first_token_s", ttft)
            if piece.finish_reason is not None:
                self._finish.append(piece.finish_reason)
            yield index, piece

    def end(self, completion_tokens: int, error: BaseException | None) -> None:
        """Close every span left open: the stream out, the attempts, the request."""
        for wire_id in list(self._routes):
            self.unrouted(wire_id)
        if self._queue is not None:  # refused before it was routed
            self._queue.end()
        finish = ",".join(sorted(set(self._finish))) or ("error" if error else "abort")
        if self._first_token_ns is not None:
            self._tracer.start_span(
                "stream",
                context=self._parent,
                start_time=self._first_token_ns,
                attributes={
                    "gen_ai.usage.output_tokens": completion_tokens,
                    "gen_ai.response.finish_reasons": finish,
                },
            ).end()
        self.root.set_attribute("gen_ai.response.finish_reasons", finish)
        self.root.set_attribute("gen_ai.usage.output_tokens", completion_tokens)
        if error is not None:
            self.root.record_exception(error)
        self.root.end()
