"""The worker's OpenTelemetry spans (opt-in; shared/tracing.py holds the set-up).

Each request the router sends becomes, under the router's `route` span (its W3C context
arrives in Generate.trace_context; without one, a trace of its own):

    generate          queued -> last choice finished (request id, worker, prompt, n)
    ├── queue         queued -> its first prefill chunk starts
    ├── prefill       one per prompt chunk: tokens, offset, sequences in the step
    └── decode        first token -> finished: tokens, finish reason (one span, not per token)

Spans are made with explicit times when what they cover is over (a chunk, the decode), so a
step pays one `is None` test with tracing off; with it on, a few objects per chunk.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from shared import tracing
from shared.tracing import REQUEST_ID

if TYPE_CHECKING:
    from collections.abc import Iterable

    from shared.protocol import Generate, TokenDelta


@dataclass
class _Request:
    span: Any  # `generate`
    parent: Any  # the context its children hang under
    queued_ns: int
    open_choices: int
    first_token_ns: int | None = None
    tokens: int = 0
    finishes: set[str] = field(default_factory=set)


class WorkerTracing:
    """The spans of the requests in this worker, by wire id."""

    def __init__(self, tracer: Any, worker_id: str) -> None:
        self._tracer, self._worker_id = tracer, worker_id
        self._requests: dict[str, _Request] = {}

    @classmethod
    def start(cls, worker_id: str, otlp_endpoint: str | None) -> WorkerTracing | None:
        """None (tracing off) unless an endpoint is configured."""
        tracer = tracing.tracer("mlx-fleet-worker", otlp_endpoint)
        return None if tracer is None else cls(tracer, worker_id)

    def queued(self, msg: Generate) -> None:
        from opentelemetry.trace import SpanKind, set_span_in_context

        span = self._tracer.start_span(
            "generate",
            context=tracing.context_of(msg.trace_context),
            kind=SpanKind.SERVER,
            attributes={
                REQUEST_ID: msg.request_id.rpartition("#")[0] or msg.request_id,
                "mlx_fleet.wire_id": msg.request_id,
                "mlx_fleet.worker": self._worker_id,
                "gen_ai.usage.input_tokens": len(msg.token_ids),
                "mlx_fleet.n": msg.n,
            },
        )
        parent = set_span_in_context(span)
        self._requests[msg.request_id] = _Request(span, parent, time.time_ns(), msg.n)

    def prefill(
        self, chunks: Iterable[tuple[str, int, int]], started: float, elapsed: float
    ) -> None:
        """A step that ran these prompt chunks (request id, tokens, offset: the tokens
        computed before) began at perf_counter() `started`."""
        end_ns = time.time_ns() - int((time.perf_counter() - started - elapsed) * 1e9)
        start_ns = end_ns - int(elapsed * 1e9)
        chunks = list(chunks)
        for request_id, num_tokens, offset in chunks:
            req = self._requests.get(request_id)
            if req is None:
                continue
            if req.queued_ns >= 0:  # its first chunk: the queue wait is over
                self._span(req, "queue", req.queued_ns, start_ns, {})
                req.queued_ns = -1
            attributes = {
                "mlx_fleet.prefill_tokens": num_tokens,
                "mlx_fleet.prefill_offset": offset,
                "mlx_fleet.step_sequences": len(chunks),
            }
            self._span(req, "prefill", start_ns, end_ns, attributes)

    def delta(self, delta: TokenDelta) -> None:
        req = self._requests.get(delta.request_id)
        if req is None:
            return
        if delta.token_ids and req.first_token_ns is None:
            req.first_token_ns = time.time_ns()
        req.tokens += len(delta.token_ids)
        if delta.finish_reason is not None:
            req.finishes.add(delta.finish_reason)
            req.open_choices -= 1
            if req.open_choices <= 0 or delta.finish_reason in ("error", "abort"):
                self._finish(delta.request_id)

    def aborted(self, request_id: str, index: int | None) -> None:
        req = self._requests.get(request_id)
        if req is None:
            return
        req.finishes.add("abort")
        req.open_choices -= 1
        if index is None or req.open_choices <= 0:
            self._finish(request_id)

    def _finish(self, request_id: str) -> None:
        req = self._requests.pop(request_id)
        finish = ",".join(sorted(req.finishes))
        if req.first_token_ns is not None:
            attributes = {"gen_ai.usage.output_tokens": req.tokens}
            attributes |= {"gen_ai.response.finish_reasons": finish}
            self._span(req, "decode", req.first_token_ns, time.time_ns(), attributes)
        req.span.set_attribute("gen_ai.response.finish_reasons", finish)
        req.span.set_attribute("gen_ai.usage.output_tokens", req.tokens)
        req.span.end()

    def _span(self, req: _Request, name: str, start_ns: int, end_ns: int, attributes) -> None:
        span = self._tracer.start_span(
            name, context=req.parent, start_time=start_ns, attributes=attributes
        )
        span.end(end_time=max(start_ns, end_ns))
