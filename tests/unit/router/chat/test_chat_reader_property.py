"""Property: however a reply is cut into stream pieces, ChatReader returns the same reasoning,
content and tool calls as when it reads the reply in one piece (what a non-streamed reply is).

Replies are drawn from fragments of each family's markup (whole calls, lone markers, marker
prefixes, broken JSON, think tags, prose), so the hold-back logic meets every boundary.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from router.chat.output import ChatReader

THINK = ["<think>", "</think>", "<thi", "</th"]
FRAGMENTS = {
    "hermes": [
        '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>',
        '{"name": "g", "arguments": {}}',
        "<tool_call>",
        "</tool_call>",
        "<tool",
        "<",
        "{oops",
        "text ",
        " ",
        "\n",
        *THINK,
    ],
    "llama3": [
        '{"name": "f", "parameters": {"a": 1}}',
        "<|python_tag|>",
        "<|pyth",
        "; ",
        "{",
        "}",
        '"',
        "prose ",
        " ",
        *THINK,
    ],
    "mistral": [
        '[{"name": "f", "arguments": {"a": 1}}]',
        "[TOOL_CALLS]",
        "[TOOL",
        "[",
        "]",
        "{",
        "prose ",
        " ",
        *THINK,
    ],
    "qwen3_coder": [
        "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>",
        "<tool_call>",
        "</tool_call>",
        "<function=",
        "<tool",
        "prose ",
        "\n",
        *THINK,
    ],
    "kimi_k2": [
        "<|tool_calls_section_begin|>",
        "<|tool_calls_section_end|>",
        '<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{"a": 1}<|tool_call_end|>',
        "<|tool_call_end|>",
        "<|tool_calls",
        "prose ",
        *THINK,
    ],
    "deepseek_v31": [
        "<｜tool▁calls▁begin｜>",
        "<｜tool▁calls▁end｜>",
        "<｜tool▁call▁begin｜>f<｜tool▁sep｜>",
        '{"a": 1}',
        "<｜tool▁call▁end｜>",
        "<｜tool",
        "prose ",
        *THINK,
    ],
    "seed_oss": [
        "<seed:tool_call>\n<function=f>\n<parameter=a>1</parameter>\n</function>\n</seed:tool_call>",
        "<seed:tool_call>",
        "</seed:tool_call>",
        "<function=",
        "<seed:",
        "<seed:tool",
        "prose ",
        "\n",
        *THINK,
    ],
    "nemotron_json": [
        '<TOOLCALL>[{"name": "f", "arguments": {"a": 1}}]</TOOLCALL>',
        "<TOOLCALL>",
        "</TOOLCALL>",
        "<TOOL",
        '[{"name": "g", "arguments": "{}"}]',
        "[",
        "]",
        "prose ",
        " ",
        *THINK,
    ],
    "harmony": [
        "<|channel|>analysis<|message|>",
        "<|channel|>final<|message|>",
        "<|end|>",
        "<|start|>assistant",
        "<|channel|>commentary to=functions.f <|constrain|>json<|message|>",
        '{"a": 1}',
        "<|mess",
        "<|e",
        "prose ",
    ],
}


def read(family: str, pieces: list[str], starts_in_reasoning: bool):
    reader = ChatReader(family, starts_in_reasoning)
    events = [e for piece in pieces for e in reader.feed(piece)] + reader.finish()
    text = {
        kind: "".join(e.text for e in events if e.kind == kind) for kind in ("content", "reasoning")
    }
    calls = [(e.call.name, e.call.arguments, e.call_index) for e in events if e.kind == "tool_call"]
    return text["content"].strip(), text["reasoning"], calls, reader.finish_reason("stop")


@st.composite
def split_replies(draw):
    family = draw(st.sampled_from(sorted(FRAGMENTS)))
    reply = "".join(draw(st.lists(st.sampled_from(FRAGMENTS[family]), max_size=7)))
    cuts = sorted(draw(st.lists(st.integers(0, len(reply)), max_size=8)))
    pieces = [reply[a:b] for a, b in zip([0, *cuts], [*cuts, len(reply)], strict=True)]
    return family, reply, pieces


@settings(max_examples=300, deadline=None, database=None)
@given(case=split_replies(), starts_in_reasoning=st.booleans())
def test_streamed_reading_equals_whole_reading(case, starts_in_reasoning):
    family, reply, pieces = case
    assert "".join(pieces) == reply
    whole = read(family, [reply], starts_in_reasoning)
    assert read(family, pieces, starts_in_reasoning) == whole
    one_char_at_a_time = read(family, list(reply), starts_in_reasoning)
    assert one_char_at_a_time == whole
