"""End to end on the default model with real processes: Ollama's API through the `ollama`
client (its greedy answer is the OpenAI path's) and LangChain's ChatOllama (a tool, a JSON
schema). Few tokens each."""

from __future__ import annotations

import json

import ollama
import openai
import pytest
from langchain_core.tools import tool
from langchain_ollama import ChatOllama

from tests.e2e.clients.test_agent_api_e2e import wait_healthy
from tests.support.launched import launch_cluster

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
ASK = [{"role": "user", "content": "What is the capital of France?"}]
TOKENS = 8


@pytest.fixture(scope="module")
def url(model_cache, tmp_path_factory):
    logs = tmp_path_factory.mktemp("ollama-logs")
    with launch_cluster(["--workers", "1", "--kv-memory", "256MiB"], logs) as (base, _):
        wait_healthy(base)
        yield base


def test_greedy_chat_equals_the_openai_path(url):
    client = ollama.Client(host=url, timeout=120)
    options = {"temperature": 0, "num_predict": TOKENS}
    whole = client.chat(model=MODEL, messages=ASK, options=options)
    streamed = "".join(
        p.message.content
        for p in client.chat(model=MODEL, messages=ASK, options=options, stream=True)
    )
    api = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    resp = api.chat.completions.create(model=MODEL, messages=ASK, max_tokens=TOKENS, temperature=0)
    assert whole.message.content == streamed == resp.choices[0].message.content
    assert whole.eval_count == resp.usage.completion_tokens
    assert whole.prompt_eval_count == resp.usage.prompt_tokens
    assert whole.total_duration > whole.eval_duration > 0


def test_generate_list_ps_show(url):
    client = ollama.Client(host=url, timeout=120)
    reply = client.generate(model=MODEL, prompt="Hi", options={"temperature": 0, "num_predict": 4})
    assert reply.done and reply.eval_count <= 4
    assert MODEL in [m.model for m in client.list().models]
    assert MODEL in [m.model for m in client.ps().models]
    assert "completion" in client.show(MODEL).capabilities


def test_chat_ollama_with_a_tool_and_a_json_schema(url):
    @tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        return "sunny"

    llm = ChatOllama(model=MODEL, base_url=url, temperature=0, num_predict=40)
    message = llm.bind_tools([get_weather]).invoke("What is the weather in Paris?")
    for call in message.tool_calls:  # the small model may answer in words instead
        assert call["name"] == "get_weather" and isinstance(call["args"], dict)
    schema = {
        "type": "object",
        "properties": {"answer": {"enum": ["yes", "no"]}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    structured = ChatOllama(model=MODEL, base_url=url, temperature=0, num_predict=20, format=schema)
    answer = json.loads(structured.invoke("Is Paris in France? Answer in JSON.").content)
    assert answer["answer"] in ("yes", "no")
