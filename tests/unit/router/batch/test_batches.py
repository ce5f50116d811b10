"""The Batch API over stand-in workers: a batch's lines answered as live requests are, at low
priority; a malformed file fails validation with OpenAI's error lines, a bad line alone; a
cancel stops it; a restarted router resumes it without repeating a line."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import openai
import pytest

from router.config import ModelSpec
from shared.protocol import BATCH, Embed, Embeddings, Register
from tests.support.fake_worker import FakeWorker, FakeWorkerConfig
from tests.support.tp_group import save_tiny_model
from tests.unit.router.batch.conftest import MODEL, chat_line, finished, jsonl, lines_of

WINDOW = {"endpoint": "/v1/chat/completions", "completion_window": "24h"}


async def start(api, lines: list[dict], **options):
    source = await api.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
    return await api.batches.create(input_file_id=source.id, **{**WINDOW, **options})


async def test_each_line_gets_the_body_a_live_request_gets(make_cluster):
    cluster = await make_cluster()
    worker = await cluster.add_worker("w0")
    api = cluster.openai()
    lines = [chat_line(f"q{i}", f"question {i} " * (i + 1)) for i in range(4)]
    lines.append(chat_line("bad", "hi", max_tokens=-1))  # the endpoint refuses it: alone
    batch = await start(api, lines, metadata={"job": "eval"})
    assert batch.status == "validating" and batch.metadata == {"job": "eval"}
    done = await finished(api, batch.id)
    assert done.status == "completed", done
    assert done.request_counts.model_dump() == {"total": 5, "completed": 4, "failed": 1}
    assert done.completed_at and done.in_progress_at and done.finalizing_at
    assert {g.priority for g in worker.received} == {BATCH}
    output = {e["custom_id"]: e for e in await lines_of(api, done.output_file_id)}
    errors = await lines_of(api, done.error_file_id)
    assert sorted(output) == ["q0", "q1", "q2", "q3"]
    for line in lines[:4]:
        reply = await cluster.client.post("/v1/chat/completions", json=line["body"])
        live = await reply.json()
        got = output[line["custom_id"]]
        assert got["error"] is None and got["response"]["status_code"] == 200
        body = got["response"]["body"]
        assert body["id"] == got["response"]["request_id"]
        assert body["choices"] == live["choices"]
        for count in ("prompt_tokens", "completion_tokens", "total_tokens"):  # (cached: the
            assert body["usage"][count] == live["usage"][count]  # live one hits the cache)
        assert body["object"] == "chat.completion" and body["model"] == MODEL
    assert [e["custom_id"] for e in errors] == ["bad"]
    with pytest.raises(openai.BadRequestError) as live_error:
        await api.chat.completions.create(**lines[4]["body"])
    assert errors[0]["response"]["status_code"] == 400
    assert errors[0]["response"]["body"] == {"error": live_error.value.body}
    outputs = (await api.files.list(purpose="batch_output")).data
    assert {f.id for f in outputs} == {done.output_file_id, done.error_file_id}


@pytest.mark.parametrize(
    ("content", "codes"),
    [
        (b"not json\n", [("invalid_json_line", 1)]),
        (jsonl([chat_line("a", "x"), chat_line("a", "y")]), [("duplicate_custom_id", 2)]),
        (jsonl([{**chat_line("a", "x"), "url": "/v1/completions"}]), [("invalid_url", 1)]),
        (jsonl([{**chat_line("a", "x"), "method": "GET"}]), [("invalid_method", 1)]),
        (
            jsonl([{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions"}]),
            [("missing_required_parameter", 1)],
        ),
        (
            jsonl([chat_line("a", "x"), [1]]) + b"{\n",
            [("invalid_json_line", 2), ("invalid_json_line", 3)],
        ),
    ],
)
async def test_a_malformed_file_fails_validation_with_error_lines(make_cluster, content, codes):
    cluster = await make_cluster()
    await cluster.add_worker("w0")
    api = cluster.openai()
    source = await api.files.create(file=("in.jsonl", content), purpose="batch")
    batch = await api.batches.create(input_file_id=source.id, **WINDOW)
    done = await finished(api, batch.id)
    assert done.status == "failed" and done.failed_at and done.output_file_id is None
    assert [(e.code, e.line) for e in done.errors.data] == codes
    assert all(e.message for e in done.errors.data)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"endpoint": "/v1/images", "completion_window": "24h"}, "endpoint"),
        ({"endpoint": "/v1/chat/completions", "completion_window": "1h"}, "completion_window"),
        ({"endpoint": "/v1/chat/completions"}, "completion_window"),
        ({**WINDOW, "metadata": {"k": 1}}, "metadata"),
        ({**WINDOW, "priority": 2}, "priority"),
    ],
)
async def test_a_bad_create_body_is_a_400(make_cluster, body, param):
    cluster = await make_cluster()
    api = cluster.openai()
    source = await api.files.create(
        file=("in.jsonl", jsonl([chat_line("a", "x")])), purpose="batch"
    )
    reply = await cluster.client.post("/v1/batches", json={"input_file_id": source.id, **body})
    assert reply.status == 400
    assert (await reply.json())["error"]["param"] == param


async def test_an_unknown_file_or_batch_is_a_404(make_cluster):
    api = (await make_cluster()).openai()
    with pytest.raises(openai.NotFoundError):
        await api.batches.create(input_file_id="file-nope", **WINDOW)
    with pytest.raises(openai.NotFoundError):
        await api.batches.retrieve("batch_nope")


async def test_embeddings_lines_get_what_a_live_request_gets(make_cluster):
    cluster = await make_cluster()
    await cluster.add_worker("w0")
    api = cluster.openai()
    line = {
        "custom_id": "e",
        "method": "POST",
        "url": "/v1/embeddings",
        "body": {"model": MODEL, "input": "hello"},
    }
    batch = await start(api, [line], endpoint="/v1/embeddings")
    done = await finished(api, batch.id)
    live = await cluster.client.post("/v1/embeddings", json=line["body"])
    [error] = await lines_of(api, done.error_file_id)
    assert error["response"]["status_code"] == live.status
    assert error["response"]["body"] == await live.json()


class EmbedWorker(FakeWorker):
    """A stand-in embed worker: every input answered with the vector [0, 1, 2, 3]."""

    def _register_msg(self) -> Register:
        return dataclasses.replace(super()._register_msg(), task="embed")

    def _handle(self, msg) -> None:
        if isinstance(msg, Embed):
            vectors = tuple(np.arange(4, dtype="<f4").tobytes() for _ in msg.inputs)
            asyncio.ensure_future(self._send(Embeddings(msg.request_id, vectors, 2)))


async def test_an_embeddings_batch_returns_the_vectors_a_live_request_gets(make_cluster, tmp_path):
    directory = save_tiny_model(tmp_path / "tiny-emb")
    cluster = await make_cluster(models=(ModelSpec(directory, id="emb", task="embed"),))
    worker = EmbedWorker(FakeWorkerConfig(cluster.zmq_endpoint, "w-e", model_id="emb"))
    cluster.workers["w-e"] = (worker, asyncio.create_task(worker.run()))
    await asyncio.wait_for(worker.registered.wait(), 5)
    api = cluster.openai()
    body = {"model": "emb", "input": ["hello", "world"]}
    line = {"custom_id": "e", "method": "POST", "url": "/v1/embeddings", "body": body}
    done = await finished(api, (await start(api, [line], endpoint="/v1/embeddings")).id)
    live = await (await cluster.client.post("/v1/embeddings", json=body)).json()
    assert done.request_counts.model_dump() == {"total": 1, "completed": 1, "failed": 0}
    [entry] = await lines_of(api, done.output_file_id)
    assert entry["response"]["status_code"] == 200
    assert entry["response"]["body"]["data"] == live["data"]
    assert [d["embedding"] for d in live["data"]] == [[0.0, 1.0, 2.0, 3.0]] * 2


async def test_a_cancelled_batch_keeps_its_answered_lines(make_cluster):
    cluster = await make_cluster(batch_lines_per_worker=1)
    await cluster.add_worker("w0", token_delay_s=0.02)
    api = cluster.openai()
    lines = [chat_line(f"q{i:02}", f"question {i}", max_tokens=3) for i in range(30)]
    batch = await start(api, lines)
    while (await api.batches.retrieve(batch.id)).request_counts.completed < 2:
        await cluster.wait_until(lambda: True)
    cancelling = await api.batches.cancel(batch.id)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at
    done = await finished(api, batch.id)
    assert done.status == "cancelled" and done.cancelled_at
    output = await lines_of(api, done.output_file_id)
    errors = await lines_of(api, done.error_file_id)
    assert 2 <= len(output) < 30
    assert all(e["error"]["code"] == "batch_cancelled" for e in errors)
    assert sorted(e["custom_id"] for e in output + errors) == [f"q{i:02}" for i in range(30)]
    assert done.request_counts.completed == len(output)
    with pytest.raises(openai.APIStatusError) as e:
        await api.batches.cancel(batch.id)
    assert e.value.status_code == 409


async def test_a_restarted_router_resumes_without_repeating_a_line(make_cluster, tmp_path):
    store = tmp_path / "shared.sqlite3"
    first = await make_cluster(responses_store_path=store, batch_lines_per_worker=1)
    worker = await first.add_worker("w0", token_delay_s=0.02)
    api = first.openai()
    lines = [chat_line(f"q{i:02}", f"question {i}", max_tokens=3) for i in range(12)]
    batch = await start(api, lines)
    while (await api.batches.retrieve(batch.id)).request_counts.completed < 3:
        await first.wait_until(lambda: True)
    await first.close()  # the router goes (its lines in flight unrecorded)
    asked_before = {g.request_id.split("#")[0] for g in worker.received}

    second = await make_cluster(responses_store_path=store)
    again = await second.add_worker("w1")
    api = second.openai()
    done = await finished(api, batch.id)
    assert done.status == "completed" and done.request_counts.completed == 12
    output = await lines_of(api, done.output_file_id)
    assert sorted(e["custom_id"] for e in output) == [f"q{i:02}" for i in range(12)]
    # the second router ran only what the first had not recorded
    assert 0 < len(again.received) <= 12 - 3
    assert len(asked_before) + len(again.received) >= 12


async def test_a_batch_spreads_over_idle_workers(make_cluster):
    cluster = await make_cluster(batch_lines_per_worker=2)
    workers = [await cluster.add_worker(f"w{i}", token_delay_s=0.01) for i in range(2)]
    api = cluster.openai()
    lines = [chat_line(f"q{i:02}", f"tenant {i % 2} " * 12 + f"question {i}") for i in range(16)]
    done = await finished(api, (await start(api, lines)).id)
    assert done.request_counts.completed == 16
    assert all(w.received for w in workers), [len(w.received) for w in workers]


async def test_every_router_sharing_redis_sees_files_and_batches(make_cluster, redis_url):
    first = await make_cluster(state_url=redis_url)
    second = await make_cluster(state_url=redis_url)
    await second.add_worker("w0")
    a, b = first.openai(), second.openai()
    source = await a.files.create(file=("in.jsonl", jsonl([chat_line("x", "hi")])), purpose="batch")
    assert (await b.files.retrieve(source.id)).id == source.id
    batch = await b.batches.create(input_file_id=source.id, **WINDOW)
    done = await finished(a, batch.id)  # run by a router with a worker, seen from the other
    assert done.status == "completed"
    assert [e["custom_id"] for e in await lines_of(a, done.output_file_id)] == ["x"]


async def test_a_busy_worker_takes_a_quarter_of_the_batch_lines(make_cluster):
    """While an interactive request runs on the only worker, at most a quarter of
    batch_lines_per_worker batch lines are in flight beside it; idle, all of them (with
    batch_yield_s 0: the yield after a live request is timed in routing/test_batch_yield)."""
    cluster = await make_cluster(batch_lines_per_worker=8, batch_yield_s=0.0)
    await cluster.add_worker("w0", token_delay_s=0.01)
    api = cluster.openai()
    live = asyncio.create_task(
        api.chat.completions.create(**chat_line("live", "hi", max_tokens=120)["body"])
    )
    await cluster.wait_until(lambda: cluster.dispatcher.num_pending == 1)
    lines = [chat_line(f"q{i:02}", f"question {i}", max_tokens=8) for i in range(40)]
    batch = await start(api, lines)
    beside = []
    while not live.done():
        beside.append(cluster.dispatcher.num_pending - 1)
        await asyncio.sleep(0.01)
    alone = []
    while (await api.batches.retrieve(batch.id)).status != "completed":
        alone.append(cluster.dispatcher.num_pending)
        await asyncio.sleep(0.01)
    assert max(beside) == 2 and max(alone) == 8


@pytest.mark.parametrize(
    ("endpoint", "body", "kind"),
    [
        ("/v1/completions", {"prompt": "Once upon", "max_tokens": 4}, "text_completion"),
        ("/v1/responses", {"input": "hi", "max_output_tokens": 4}, "response"),
    ],
)
async def test_completions_and_responses_lines(make_cluster, endpoint, body, kind):
    cluster = await make_cluster()
    await cluster.add_worker("w0")
    api = cluster.openai()
    body = {"model": MODEL, "temperature": 0, **body}
    line = {"custom_id": "one", "method": "POST", "url": endpoint, "body": body}
    done = await finished(api, (await start(api, [line], endpoint=endpoint)).id)
    [entry] = await lines_of(api, done.output_file_id)
    got = entry["response"]["body"]
    live = await (await cluster.client.post(endpoint, json=body)).json()
    assert got["object"] == live["object"] == kind
    assert text_of(got) == text_of(live) and text_of(got)


def text_of(body: dict) -> str:
    if body["object"] == "text_completion":
        return body["choices"][0]["text"]
    return "".join(part["text"] for item in body["output"] for part in item["content"])


async def test_an_expired_batch_keeps_its_answered_lines(make_cluster, monkeypatch):
    from router.http import batch_runner

    cluster = await make_cluster(batch_lines_per_worker=1)
    await cluster.add_worker("w0", token_delay_s=0.02)
    api = cluster.openai()
    lines = [chat_line(f"q{i:02}", f"question {i}", max_tokens=3) for i in range(20)]
    batch = await start(api, lines)
    while (await api.batches.retrieve(batch.id)).request_counts.completed < 2:
        await asyncio.sleep(0.01)
    monkeypatch.setattr(batch_runner, "_now", lambda: batch.expires_at + 1)  # 24 h later
    done = await finished(api, batch.id)
    assert done.status == "expired" and done.expired_at == batch.expires_at + 1
    output = await lines_of(api, done.output_file_id)
    errors = await lines_of(api, done.error_file_id)
    assert 2 <= len(output) < 20 and len(output) + len(errors) == 20
    assert {e["error"]["code"] for e in errors} == {"batch_expired"}


async def test_a_batch_waits_for_a_worker(make_cluster):
    cluster = await make_cluster()
    api = cluster.openai()
    batch = await start(api, [chat_line("a", "hi"), chat_line("b", "bye")])
    await asyncio.sleep(0.5)
    assert (await api.batches.retrieve(batch.id)).status == "validating"
    await cluster.add_worker("w0")
    done = await finished(api, batch.id)
    assert done.status == "completed" and done.request_counts.completed == 2


async def test_a_worker_dying_mid_batch_loses_and_repeats_no_line(make_cluster):
    cluster = await make_cluster(batch_lines_per_worker=2)
    for i in range(2):
        await cluster.add_worker(f"w{i}", token_delay_s=0.02)
    api = cluster.openai()
    lines = [chat_line(f"q{i:02}", f"question {i}", max_tokens=4) for i in range(16)]
    batch = await start(api, lines)
    while (await api.batches.retrieve(batch.id)).request_counts.completed < 3:
        await asyncio.sleep(0.01)
    await cluster.kill_worker("w0")  # its lines in flight move to w1 (the dispatcher's resubmit)
    done = await finished(api, batch.id)
    assert done.status == "completed" and done.request_counts.completed == 16
    output = await lines_of(api, done.output_file_id)
    assert sorted(e["custom_id"] for e in output) == [f"q{i:02}" for i in range(16)]
