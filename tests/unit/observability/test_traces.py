"""Spans per request across router and worker, exported when an OTLP endpoint is set."""

from __future__ import annotations

import threading
import time

import pytest
import zmq

from shared.protocol import Generate, Register, RegisterAck, TokenDelta, decode, encode
from shared.sampling import SamplingParams
from shared.tracing import REQUEST_ID, traces_url
from tests.support.engine_fixtures import make_engine, tiny_model
from tests.unit.observability.conftest import by_name
from worker.loop import WorkerLoop

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hello there"}]}
ENDPOINT = "http://127.0.0.1:4318"


async def test_a_request_through_the_router_makes_its_spans(spans, make_cluster):
    cluster = await make_cluster(otlp_endpoint=ENDPOINT)
    worker = await cluster.add_worker("w1")
    reply = await cluster.client.post("/v1/chat/completions", json=CHAT | {"max_tokens": 5})
    assert reply.status == 200, await reply.text()
    body = await reply.json()

    (root,) = by_name(spans, "request")
    (queue,) = by_name(spans, "queue")
    (route,) = by_name(spans, "route")
    (stream,) = by_name(spans, "stream")
    assert root.attributes[REQUEST_ID] == body["id"]
    assert root.attributes["gen_ai.request.model"] == "tiny"
    assert root.attributes["http.route"] == "/v1/chat/completions"
    assert root.attributes["mlx_fleet.time_to_first_token_s"] > 0
    assert route.attributes[REQUEST_ID] == body["id"]
    assert route.attributes["mlx_fleet.worker"] == "w1"
    assert route.attributes["mlx_fleet.policy"] == "cache_aware"
    assert route.attributes["mlx_fleet.cached_blocks_matched"] == 0
    assert route.attributes["gen_ai.request.model"] == "tiny"
    assert stream.attributes["gen_ai.usage.output_tokens"] == body["usage"]["completion_tokens"]
    assert stream.attributes["gen_ai.response.finish_reasons"] == "length"
    for child in (queue, route, stream):
        assert child.parent.span_id == root.context.span_id
        assert child.context.trace_id == root.context.trace_id
    assert queue.end_time <= route.start_time

    # the Generate carried the route span's W3C context to the worker
    (generate,) = worker.received
    traceparent = generate.trace_context["traceparent"]
    assert traceparent.split("-")[1:3] == [
        f"{route.context.trace_id:032x}",
        f"{route.context.span_id:016x}",
    ]
    # ... which survives the wire
    assert decode(encode(generate)).trace_context == generate.trace_context


async def test_the_second_request_of_a_prefix_sees_its_cached_blocks(spans, make_cluster):
    cluster = await make_cluster(otlp_endpoint=ENDPOINT)
    await cluster.add_worker("w1")
    long = CHAT | {"messages": [{"role": "user", "content": "a shared prefix " * 8}]}
    for _ in range(2):
        reply = await cluster.client.post("/v1/chat/completions", json=long | {"max_tokens": 2})
        assert reply.status == 200
    first, second = by_name(spans, "route")
    assert first.attributes["mlx_fleet.cached_blocks_matched"] == 0
    assert second.attributes["mlx_fleet.cached_blocks_matched"] > 0


async def test_a_client_traceparent_is_the_request_spans_parent(spans, make_cluster):
    cluster = await make_cluster(otlp_endpoint=ENDPOINT)
    await cluster.add_worker("w1")
    trace_id, span_id = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    headers = {"traceparent": f"00-{trace_id}-{span_id}-01"}
    reply = await cluster.client.post(
        "/v1/chat/completions", json=CHAT | {"max_tokens": 2, "stream": True}, headers=headers
    )
    assert reply.status == 200
    await reply.read()
    (root,) = by_name(spans, "request")
    assert f"{root.context.trace_id:032x}" == trace_id
    assert f"{root.parent.span_id:016x}" == span_id
    assert root.attributes["mlx_fleet.stream"] is True


# ---------------------------------------------------------------- the worker's side


class RouterSocket:
    """A ROUTER socket standing in for the router, for a real WorkerLoop."""

    def __init__(self):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.endpoint = f"tcp://127.0.0.1:{self.sock.bind_to_random_port('tcp://127.0.0.1')}"
        self.identity = None

    def recv_until(self, kind, timeout: float = 20.0):
        deadline = time.monotonic() + timeout
        while self.sock.poll(int(max(0.0, deadline - time.monotonic()) * 1000)):
            self.identity, frame = self.sock.recv_multipart()
            msg = decode(frame)
            if isinstance(msg, kind) and getattr(msg, "finish_reason", True) is not None:
                return msg
        raise TimeoutError(f"no {kind.__name__}")

    def send(self, msg) -> None:
        self.sock.send_multipart([self.identity, encode(msg)])

    def close(self):
        self.sock.close(linger=0)
        self.ctx.term()


@pytest.fixture
def worker_loop(spans):
    router = RouterSocket()
    engine = make_engine(tiny_model("llama", seed=5), prefill_chunk=16, step_token_budget=16)
    server = WorkerLoop(engine, router.endpoint, "w-test", "tiny", otlp_endpoint=ENDPOINT)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    router.recv_until(Register)
    router.send(RegisterAck(accepted=True, heartbeat_interval_s=0.1))
    yield router
    server.stop()
    thread.join(timeout=5)
    router.close()


def test_an_engine_run_makes_the_workers_spans_under_the_routers(spans, worker_loop):
    router = worker_loop
    trace_id, route_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    context = {"traceparent": f"00-{trace_id}-{route_span}-01"}
    sampling = SamplingParams(max_tokens=6, temperature=0.0)
    router.send(Generate("chatcmpl-7#0", tuple(range(1, 41)), sampling, trace_context=context))
    last = router.recv_until(TokenDelta)
    assert last.finish_reason == "length"

    (generate,) = by_name(spans, "generate")
    (queue,) = by_name(spans, "queue")
    chunks = by_name(spans, "prefill")
    (decode_span,) = by_name(spans, "decode")
    assert f"{generate.parent.span_id:016x}" == route_span  # the router's route span
    assert f"{generate.context.trace_id:032x}" == trace_id
    assert generate.attributes[REQUEST_ID] == "chatcmpl-7"  # the router's request id
    assert generate.attributes["mlx_fleet.wire_id"] == "chatcmpl-7#0"
    assert generate.attributes["mlx_fleet.worker"] == "w-test"
    # 40 prompt tokens in chunks of at most 16: three chunks, in order
    assert [c.attributes["mlx_fleet.prefill_tokens"] for c in chunks] == [16, 16, 8]
    assert [c.attributes["mlx_fleet.prefill_offset"] for c in chunks] == [0, 16, 32]
    assert decode_span.attributes["gen_ai.usage.output_tokens"] == 6
    assert decode_span.attributes["gen_ai.response.finish_reasons"] == "length"
    for child in (queue, *chunks, decode_span):
        assert child.parent.span_id == generate.context.span_id
    assert queue.end_time <= chunks[0].start_time <= chunks[-1].end_time <= decode_span.end_time


def test_without_a_trace_context_the_worker_starts_a_trace_of_its_own(spans, worker_loop):
    router = worker_loop
    router.send(Generate("r-1#0", (1, 2, 3), SamplingParams(max_tokens=2, temperature=0.0)))
    router.recv_until(TokenDelta)
    (generate,) = by_name(spans, "generate")
    assert generate.parent is None
    assert generate.attributes[REQUEST_ID] == "r-1"


def test_the_env_variable_is_a_base_address():
    assert traces_url("http://c:4318") == "http://c:4318/v1/traces"
    assert traces_url("http://c:4318/v1/traces/") == "http://c:4318/v1/traces"
