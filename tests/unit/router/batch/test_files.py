"""The Files API for batches: upload, list, retrieve, content, delete; its bounds; each file
its API key's own."""

from __future__ import annotations

import openai
import pytest

from tests.unit.router.batch.conftest import chat_line, jsonl

KEY_A, KEY_B = "key-a-0123456789", "key-b-9876543210"
CONTENT = jsonl([chat_line("a", "hi"), chat_line("b", "bye")])


async def test_a_file_is_uploaded_listed_read_and_deleted(make_cluster):
    api = (await make_cluster()).openai()
    made = await api.files.create(file=("in.jsonl", CONTENT), purpose="batch")
    assert made.id.startswith("file-") and made.object == "file"
    assert (made.bytes, made.filename, made.purpose, made.status) == (
        len(CONTENT),
        "in.jsonl",
        "batch",
        "processed",
    )
    assert (await api.files.retrieve(made.id)).model_dump() == made.model_dump()
    assert [f.id for f in (await api.files.list()).data] == [made.id]
    assert [f.id for f in (await api.files.list(purpose="batch_output")).data] == []
    assert (await api.files.content(made.id)).content == CONTENT
    deleted = await api.files.delete(made.id)
    assert deleted.deleted and deleted.id == made.id
    with pytest.raises(openai.NotFoundError):
        await api.files.retrieve(made.id)
    with pytest.raises(openai.NotFoundError):
        await api.files.content(made.id)


@pytest.mark.parametrize(
    ("content", "purpose", "error", "code"),
    [
        (CONTENT, "fine-tune", openai.BadRequestError, "invalid_value"),
        (b"", "batch", openai.BadRequestError, "empty_file"),
        (b"\xff\xfe{}\n", "batch", openai.BadRequestError, "invalid_file_format"),
        (
            jsonl([chat_line(str(i), "x") for i in range(4)]),
            "batch",
            openai.BadRequestError,
            "too_many_lines",
        ),
        (CONTENT * 20, "batch", openai.APIStatusError, "file_too_large"),
    ],
)
async def test_uploads_past_the_bounds_are_refused(make_cluster, content, purpose, error, code):
    cluster = await make_cluster(batch_file_max_bytes=2000, batch_file_max_lines=3)
    api = cluster.openai()
    with pytest.raises(error) as e:
        await api.files.create(file=("in.jsonl", content), purpose=purpose)
    assert e.value.body["code"] == code
    if code == "file_too_large":
        assert e.value.status_code == 413
    assert (await api.files.list()).data == []


async def test_a_plain_json_upload_is_refused(make_cluster):
    cluster = await make_cluster()
    reply = await cluster.client.post("/v1/files", json={"purpose": "batch"})
    assert reply.status == 400
    assert "multipart/form-data" in (await reply.json())["error"]["message"]


async def test_files_and_batches_are_their_keys_own(make_cluster):
    cluster = await make_cluster(api_keys=(KEY_A, KEY_B))
    url = cluster.base_url()
    async with (
        openai.AsyncOpenAI(base_url=url, api_key=KEY_A, max_retries=0) as a,
        openai.AsyncOpenAI(base_url=url, api_key=KEY_B, max_retries=0) as b,
    ):
        made = await a.files.create(file=("in.jsonl", CONTENT), purpose="batch")
        for call in (b.files.retrieve, b.files.content, b.files.delete):
            with pytest.raises(openai.NotFoundError):
                await call(made.id)
        assert (await b.files.list()).data == []
        with pytest.raises(openai.NotFoundError):  # B cannot start a batch on A's file
            await b.batches.create(
                input_file_id=made.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
        batch = await a.batches.create(
            input_file_id=made.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        for call in (b.batches.retrieve, b.batches.cancel):
            with pytest.raises(openai.NotFoundError):
                await call(batch.id)
        assert (await b.batches.list()).data == []
        assert [x.id for x in (await a.batches.list()).data] == [batch.id]
        assert (await a.files.retrieve(made.id)).id == made.id  # B's delete did nothing
