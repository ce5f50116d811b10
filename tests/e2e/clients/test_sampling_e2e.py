"""End to end on the default model: structured output, logprobs and logit_bias through a real
cluster (`launch-cluster --workers 1`), driven by the official openai client."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest

from tests.e2e.cluster.test_cluster_e2e import MODEL, Cluster
from tests.support.launched import PIPED, launch_cluster

pytestmark = pytest.mark.slow

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "role": {"enum": ["engineer", "doctor", "artist"]},
        "skills": {"type": "array", "items": {"type": "string", "maxLength": 30}, "maxItems": 4},
        "address": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 40},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "role", "skills", "address"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Describe a fictional person as JSON."}]


@pytest.fixture(scope="module")
def cluster(model_cache, tmp_path_factory):
    logs = tmp_path_factory.mktemp("cluster-logs")
    with launch_cluster(["--workers", "1", "--kv-memory", "256MiB"], logs, **PIPED) as (base, proc):
        c = Cluster(base, proc)
        c.wait_healthy(1, timeout=300)
        yield c


def test_json_schema_output_parses_and_validates(cluster):
    """Six sampled replies at once (one batch, each row its own grammar), every one valid."""
    fmt = {
        "type": "json_schema",
        "json_schema": {"name": "person", "schema": PERSON, "strict": True},
    }

    def ask(seed: int):
        return cluster.client.chat.completions.create(
            model=MODEL,
            messages=ASK,
            max_tokens=200,
            temperature=0.8,
            seed=seed,
            response_format=fmt,
        )

    with ThreadPoolExecutor(6) as pool:
        replies = list(pool.map(ask, range(6)))
    for r in replies:
        assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
        jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)


def test_json_object_output_is_an_object(cluster):
    """Greedy, the model never closes its object (it repeats one key until max_tokens, 200 or
    40): what shows the grammar at work is that the reply is an object's opening, not prose."""
    r = cluster.client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        max_tokens=40,
        temperature=0,
        response_format={"type": "json_object"},
    )
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:  # an object still open at max_tokens: a prefix of one
        assert r.choices[0].message.content.startswith("{")


def test_logprobs_whole_and_streamed(cluster):
    r = cluster.client.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=12, temperature=0, logprobs=True, top_logprobs=5
    )
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    assert "".join(c.token for c in content) == r.choices[0].message.content
    for c in content:
        assert c.logprob <= 0
        values = [t.logprob for t in c.top_logprobs]
        assert len(values) == 5 and values == sorted(values, reverse=True)
        assert c.top_logprobs[0].token == c.token  # greedy
    stream = cluster.client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        max_tokens=12,
        temperature=0,
        logprobs=True,
        top_logprobs=5,
        stream=True,
    )
    streamed = [
        e
        for ch in stream
        if ch.choices and ch.choices[0].logprobs
        for e in ch.choices[0].logprobs.content
    ]
    assert [e.token for e in streamed] == [c.token for c in content]
    assert [e.logprob for e in streamed] == pytest.approx([c.logprob for c in content], abs=1e-4)


def test_logit_bias_forces_a_token(cluster):
    r = cluster.client.completions.create(
        model=MODEL, prompt="Hello", max_tokens=5, logit_bias={"33": 100}, logprobs=1
    )
    assert r.choices[0].logprobs.tokens == ["1"] * 5  # token 33 is "1" in SmolLM2's vocabulary
