"""Every request field is listed in docs/api.md, known to the code, or a 400 naming it."""

from __future__ import annotations

import re

import pytest

from router.api.anthropic.parse import MESSAGES_FIELDS
from router.api.embeddings.parse import FIELDS as EMBEDDINGS_FIELDS
from router.api.openai.fields import CHAT_FIELDS, COMPLETION_FIELDS
from router.api.responses.fields import RESPONSES_FIELDS
from router.api.tokenize import COUNT_TOKENS_FIELDS, DETOKENIZE_FIELDS, TOKENIZE_FIELDS
from tests.support.paths import ROOT

SECTIONS = {
    "## POST /v1/chat/completions": CHAT_FIELDS,
    "## POST /v1/completions": COMPLETION_FIELDS,
    "## POST /v1/messages (Anthropic)": MESSAGES_FIELDS,
    "## POST /v1/responses (OpenAI Responses)": RESPONSES_FIELDS,
    "## POST /tokenize": TOKENIZE_FIELDS,
    "## POST /detokenize": DETOKENIZE_FIELDS,
    "## POST /v1/messages/count_tokens (Anthropic)": COUNT_TOKENS_FIELDS,
    "## POST /v1/embeddings": EMBEDDINGS_FIELDS,
}
# Modules that read request bodies (render.py reads replies, not requests).
READERS = [
    "api/checks",
    "api/openai/parse",
    "api/openai/fields",
    "api/openai/sampling",
    "api/openai/extensions",
    "api/tokenize",
    "api/anthropic/parse",
    "api/embeddings/parse",
    "api/responses/parse",
    "api/responses/fields",
    "api/responses/tools",
    "chat/tools",
    "chat/prompt",
]
FIELD_READ = re.compile(r'(?:body\.get\(|body\[|\(body, |for name in \()"([a-z_]+)"')


def documented_fields(heading: str) -> set[str]:
    """The backticked names in the first column of the table under `heading`."""
    text = (ROOT / "docs" / "api.md").read_text()
    section = text.split(heading + "\n", 1)[1].split("\n## ", 1)[0]
    names = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            first_cell = line.split(" | ", 1)[0]
            names |= {m.split(".")[0] for m in re.findall(r"`([a-z_.]+)`", first_cell)}
    return names


@pytest.mark.parametrize("heading", SECTIONS)
def test_the_code_knows_exactly_the_documented_fields(heading):
    assert documented_fields(heading) == SECTIONS[heading]


def test_every_field_the_router_reads_is_known():
    known = set().union(*SECTIONS.values())
    read = set()
    for module in READERS:
        read |= set(FIELD_READ.findall((ROOT / "router" / f"{module}.py").read_text()))
    assert len(read) > 20  # the pattern still finds the reads
    assert read - known == set()


CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
BODIES = {
    "/v1/chat/completions": CHAT,
    "/v1/completions": {"model": "tiny", "prompt": "hi", "max_tokens": 2},
    "/v1/messages": CHAT,
}


@pytest.fixture
async def cluster(make_cluster):
    cluster = await make_cluster()
    await cluster.add_worker("w1")
    return cluster


@pytest.mark.parametrize("path", BODIES)
@pytest.mark.parametrize("field", ["max_token", "guided_json", "zzz"])
async def test_unknown_field_is_a_400_naming_it(cluster, path, field):
    resp = await cluster.client.post(path, json=BODIES[path] | {field: 1})
    assert resp.status == 400
    body = await resp.json()
    if path == "/v1/messages":
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        assert repr(field) in body["error"]["message"]
    else:
        assert body["error"]["param"] == field
        assert "unrecognized request argument" in body["error"]["message"]


@pytest.mark.parametrize(
    ("path", "extra"),
    [
        ("/v1/chat/completions", {"user": "u1", "store": False, "metadata": {"k": "v"}}),
        ("/v1/chat/completions", {"parallel_tool_calls": True, "service_tier": "auto"}),
        ("/v1/completions", {"user": "u1", "echo": False, "best_of": 1}),
        ("/v1/messages", {"metadata": {"user_id": "u1"}, "thinking": {"type": "disabled"}}),
    ],
)
async def test_accepted_no_ops_still_answer(cluster, path, extra):
    resp = await cluster.client.post(path, json=BODIES[path] | extra)
    assert resp.status == 200, await resp.text()


async def test_messages_metadata_must_be_an_object(cluster):
    resp = await cluster.client.post("/v1/messages", json=CHAT | {"metadata": "u1"})
    assert resp.status == 400
    assert "metadata" in (await resp.json())["error"]["message"]


NAME_TEMPLATE = (
    "{% for m in messages %}{{ m.role }}{% if m.name %}({{ m.name }}){% endif %}: "
    "{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)


async def test_message_name_reaches_the_template(make_cluster):

    cluster = await make_cluster(chat_template=NAME_TEMPLATE)
    worker = await cluster.add_worker("w1")
    messages = [{"role": "user", "content": "hi", "name": "alice"}]
    resp = await cluster.client.post("/v1/chat/completions", json=CHAT | {"messages": messages})
    assert resp.status == 200
    prompt = cluster.tokenizer.decode(worker.received[0].token_ids)
    assert "user(alice): hi" in prompt


async def test_message_name_must_be_a_string(cluster):
    messages = [{"role": "user", "content": "hi", "name": 5}]
    resp = await cluster.client.post("/v1/chat/completions", json=CHAT | {"messages": messages})
    assert resp.status == 400
    assert (await resp.json())["error"]["param"] == "messages[0].name"
