"""reasoning_content split out of <think>...</think>, whole and streamed; chat_template_kwargs."""

from __future__ import annotations

import pytest

from router.api.openai.parse import parse_chat
from router.chat.output import ChatReader
from tests.support.scripted import scripted_worker

MODEL = "tiny"
ASK = [{"role": "user", "content": "what is 2+2?"}]
THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is not defined or enable_thinking %}<think>\n{% endif %}{% endif %}"
)


def split(text: str, size: int, starts_in_reasoning: bool = False):
    reader = ChatReader(None, starts_in_reasoning)
    events = []
    for i in range(0, len(text), size):
        events += reader.feed(text[i : i + size])
    events += reader.finish()
    reasoning = "".join(e.text for e in events if e.kind == "reasoning")
    return reasoning, "".join(e.text for e in events if e.kind == "content")


@pytest.mark.parametrize("size", [1, 2, 5, 100])
def test_think_block_split_in_any_piece_sizes(size):
    assert split("<think>add them</think>\n\nIt is 4.", size) == ("add them", "It is 4.")
    assert split("  <think>x</think>y", size) == ("x", "y")
    assert split("It is 4. <think>not at the start</think>", size) == (
        "",
        "It is 4. <think>not at the start</think>",
    )
    assert split("<thin", size) == ("", "<thin")  # held back, then given back at the end
    assert split("still thinking", size, starts_in_reasoning=True) == ("still thinking", "")
    assert split("a</think>b", size, starts_in_reasoning=True) == ("a", "b")


@pytest.fixture
async def cluster(make_cluster):
    return await make_cluster(chat_template=THINKING_TEMPLATE)


async def test_reasoning_content_whole_and_streamed(cluster):
    tokenizer = cluster.tokenizer
    body = {"model": MODEL, "messages": ASK}
    req = parse_chat(body, tokenizer, MODEL)
    assert req.starts_in_reasoning  # the template opened the block
    _, n = await scripted_worker(cluster, tokenizer, req.prompt_ids, "two and two</think>It is 4.")
    api = cluster.openai()
    resp = await api.chat.completions.create(**body, max_tokens=n)
    message = resp.choices[0].message
    assert message.content == "It is 4."
    assert message.model_extra["reasoning_content"] == "two and two"
    stream = await api.chat.completions.create(**body, max_tokens=n, stream=True)
    deltas = [c.choices[0].delta async for c in stream]
    reasoning = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
    assert reasoning == "two and two"
    assert "".join(d.content or "" for d in deltas) == "It is 4."


async def test_chat_template_kwargs_reach_the_template(cluster):
    tokenizer = cluster.tokenizer
    body = {"model": MODEL, "messages": ASK, "chat_template_kwargs": {"enable_thinking": False}}
    req = parse_chat(body, tokenizer, MODEL)
    assert not req.starts_in_reasoning
    worker, n = await scripted_worker(cluster, tokenizer, req.prompt_ids, "It is 4.")
    resp = await cluster.openai().chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=n, extra_body=body
    )
    assert resp.choices[0].message.content == "It is 4."
    assert "reasoning_content" not in (resp.choices[0].message.model_extra or {})
    assert not tokenizer.decode(worker.received[0].token_ids).rstrip().endswith("<think>")
