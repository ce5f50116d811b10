"""Every dialect end to end: real router and worker processes (launch-cluster), one tiny
checkpoint per family carrying the family's real chat template and special tokens, whose greedy
reply is that family's real markup (tests/support/dialects/models.py), read back with the openai
and anthropic SDKs, plain and streamed, on chat, Responses and Anthropic Messages.

Each checkpoint answers two prompt lengths: at AUTO a reply with reasoning (where the family
has it), content and one call; at REQUIRED exactly one call in the format the router's grammar
for `tool_choice: "required"` writes (it is constrained to it; the greedy reply agrees).
"""

from __future__ import annotations

import json
import urllib.request
from dataclasses import dataclass

import anthropic
import openai
import pytest

from tests.support.dialects import WEATHER
from tests.support.dialects.families import FAMILIES
from tests.support.dialects.models import build_dialect_model, pad_to_length
from tests.support.launched import launch_cluster, wait_for_models

pytestmark = pytest.mark.slow

AUTO, REQUIRED = 1500, 2600
ASK = [{"role": "user", "content": "weather in paris?"}]
ARGS = '{"city": "Paris"}'
CALL = ("get_weather", {"city": "Paris"})


@dataclass(frozen=True)
class Case:
    reply: str  # AUTO's reply, its end token included
    required: str | None  # REQUIRED's reply: the call as the grammar writes it, end token
    # included; None: the format has no grammar, a required tool choice is a 400
    reasoning: str = ""  # what reasoning_content must be (stripped)
    content: str = "Let me check."  # what content must be (stripped)


def _hermes(end: str, think: bool = False) -> Case:
    call = f'<tool_call>\n{{"name": "get_weather", "arguments": {ARGS}}}\n</tool_call>'
    head = "<think>\nThe user wants the weather.\n</think>\n\n" if think else ""
    return Case(
        f"{head}Let me check.\n{call}{end}",
        call + end,
        "The user wants the weather." if think else "",
    )


_QWEN_CODER = (
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n"
    "</tool_call>"
)
_GLM = "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>"
_KIMI = (
    "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
    f"<|tool_call_argument_begin|>{ARGS}<|tool_call_end|><|tool_calls_section_end|>"
)
_MINIMAX = (
    '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n'
    "</invoke>\n</minimax:tool_call>"
)
_DS31 = (
    f"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{ARGS}"
    "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
)
_DS3 = (
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
    f"{ARGS}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
)
_HARMONY_CALL = f"<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{ARGS}"
_PYTHONIC = '<|tool_call_start|>[get_weather(city="Paris")]<|tool_call_end|>'
_GEMMA4 = '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>'
_SEED = (
    "<seed:tool_call>\n<function=get_weather>\n<parameter=city>Paris</parameter>\n</function>\n"
    "</seed:tool_call>"
)
_NEMOTRON = f'<TOOLCALL>[{{"name": "get_weather", "arguments": {ARGS}}}]</TOOLCALL>'
THOUGHT = "The user wants the weather."

CASES: dict[str, Case] = {
    "qwen25": _hermes("<|im_end|>"),
    "qwen3": _hermes("<|im_end|>", think=True),
    "qwen3_coder": Case(f"Let me check.\n{_QWEN_CODER}<|im_end|>", _QWEN_CODER + "<|im_end|>"),
    "glm45": Case(
        f"<think>{THOUGHT}</think>\nLet me check.\n{_GLM}<|observation|>",
        _GLM + "<|observation|>",
        THOUGHT,
    ),
    # the template opened <think>: the reply starts inside it; required closes it at once
    "glm47": Case(
        f"{THOUGHT}</think>Let me check.\n{_GLM}<|observation|>",
        f"</think>{_GLM}<|observation|>",
        THOUGHT,
    ),
    "kimi_k2": Case(f"Let me check.{_KIMI}<|im_end|>", _KIMI + "<|im_end|>"),
    "kimi_k2_thinking": Case(
        f"<think>{THOUGHT}</think>Let me check.{_KIMI}<|im_end|>", _KIMI + "<|im_end|>", THOUGHT
    ),
    "minimax_m2": Case(
        f"{THOUGHT}\n</think>\n\nLet me check.\n{_MINIMAX}[e~[", f"</think>{_MINIMAX}[e~[", THOUGHT
    ),
    "deepseek_v31": Case(
        f"Let me check.{_DS31}<｜end▁of▁sentence｜>", _DS31 + "<｜end▁of▁sentence｜>"
    ),
    "deepseek_r1": Case(
        f"<think>\n{THOUGHT}\n</think>\n\nLet me check.{_DS3}<｜end▁of▁sentence｜>",
        _DS3 + "<｜end▁of▁sentence｜>",
        THOUGHT,
    ),
    "gpt_oss": Case(
        f"<|channel|>analysis<|message|>{THOUGHT}<|end|><|start|>assistant<|channel|>commentary"
        f"<|message|>Let me check.<|end|><|start|>assistant{_HARMONY_CALL}<|call|>",
        _HARMONY_CALL + "<|call|>",
        THOUGHT,
    ),
    "lfm2": Case(f"Let me check.{_PYTHONIC}<|im_end|>", _PYTHONIC + "<|im_end|>"),
    "gemma4": Case(f"Let me check.{_GEMMA4}<turn|>", _GEMMA4 + "<turn|>"),
    "mistral_nemo": Case(
        f'[TOOL_CALLS][{{"name": "get_weather", "arguments": {ARGS}}}]</s>',
        f'[{{"name": "get_weather", "arguments": {ARGS}}}]</s>',
        content="",
    ),
    "magistral": Case(
        f"[THINK]{THOUGHT}[/THINK]Let me check.[TOOL_CALLS]get_weather[ARGS]{ARGS}</s>",
        f"[TOOL_CALLS]get_weather[ARGS]{ARGS}</s>",
        THOUGHT,
    ),
    "llama31": Case(
        f'{{"name": "get_weather", "parameters": {ARGS}}}<|eot_id|>',
        f'{{"name": "get_weather", "parameters": {ARGS}}}<|eot_id|>',
        content="",
    ),
    "laguna": Case(f"Let me check.\n{_GLM}〈|EOS|〉", _GLM + "〈|EOS|〉"),
    "lfm25": Case(f"Let me check.{_PYTHONIC}<|im_end|>", _PYTHONIC + "<|im_end|>"),
    # Kimi K3's template opens the think element; the answer is a response element
    "kimi_k3": Case(
        f"{THOUGHT}<|close|>think<|sep|><|open|>response<|sep|>Let me check.<|close|>response<|sep|>"
        '<|open|>tools<|sep|><|open|>call tool="get_weather" index="1"<|sep|>'
        '<|open|>argument key="city" type="string"<|sep|>Paris<|close|>argument<|sep|>'
        "<|close|>call<|sep|><|close|>tools<|sep|><|end_of_msg|>",
        None,
        THOUGHT,
    ),
    "minicpm5": Case(
        'Let me check.<function name="get_weather"><param name="city">Paris</param>'
        "</function><|im_end|>",
        None,
    ),
    "muse_spark": Case(
        '<atem:function_calls><atem:invoke name="get_weather"><atem:parameter name="city">Paris'
        "</atem:parameter></atem:invoke></atem:function_calls><|eom|>",
        None,
        content="",
    ),
    "seed_oss": Case(
        f"<seed:think>{THOUGHT}</seed:think>Let me check.\n{_SEED}<seed:eos>",
        _SEED + "<seed:eos>",
        THOUGHT,
    ),
    # Nemotron's template opens <think>: as GLM-4.7's, required closes it at once
    "nemotron_nano_v2": Case(
        f"{THOUGHT}</think>Let me check.\n{_NEMOTRON}<SPECIAL_12>",
        f"</think>{_NEMOTRON}<SPECIAL_12>",
        THOUGHT,
    ),
}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    work = tmp_path_factory.mktemp("dialects")
    lines = []
    for name, case in CASES.items():
        replies = {AUTO: case.reply} | ({REQUIRED: case.required} if case.required else {})
        path = build_dialect_model(work / name, FAMILIES[name], replies)
        lines.append(f'[[models]]\npath = "{path}"\nid = "{name}"\n')
    config = work / "fleet.toml"
    config.write_text("".join(lines))
    args = ["--config", str(config), "--workers", "1", "--kv-memory", "32MiB"]
    with launch_cluster(args, work) as (base, _):
        wait_for_models(base, dict.fromkeys(CASES, 1), timeout=600)
        yield base


def _count(base: str, model: str, tools: list[dict], choice: str):
    def count(messages: list[dict]) -> int:
        body = {"model": model, "messages": messages, "tools": tools, "tool_choice": choice}
        body = json.dumps(body).encode()
        request = urllib.request.Request(
            f"{base}/tokenize", body, {"content-type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as r:
            return json.loads(r.read())["count"]

    return count


def _padded(base: str, model: str, length: int, choice: str = "auto") -> list[dict]:
    """The question padded to `length` prompt tokens (the tool choice may change the prompt:
    DeepSeek's tool prompt says a call is required)."""
    return pad_to_length(_count(base, model, [WEATHER], choice), ASK, length)


def _check(case: Case, reasoning: str, content: str, calls: list[tuple[str, dict]]) -> None:
    assert calls == [CALL]
    assert content.strip() == case.content
    assert reasoning.strip() == case.reasoning


@pytest.fixture(params=list(CASES))
def family(request):
    return request.param


def test_chat(fleet, family):
    case = CASES[family]
    api = openai.OpenAI(base_url=f"{fleet}/v1", api_key="none", max_retries=0, timeout=60)
    messages = _padded(fleet, family, AUTO)
    reply = api.chat.completions.create(
        model=family, messages=messages, tools=[WEATHER], max_tokens=200, temperature=0
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls]
    reasoning = getattr(choice.message, "reasoning_content", None) or ""
    _check(case, reasoning, choice.message.content or "", calls)

    stream = api.chat.completions.create(
        model=family, messages=messages, tools=[WEATHER], max_tokens=200, temperature=0, stream=True
    )
    content = reasoning = ""
    streamed: dict[int, dict] = {}
    finish = None
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        reasoning += getattr(delta, "reasoning_content", None) or ""
        for call in delta.tool_calls or ():
            entry = streamed.setdefault(call.index, {"name": "", "arguments": ""})
            entry["name"] += call.function.name or ""
            entry["arguments"] += call.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    calls = [(c["name"], json.loads(c["arguments"])) for c in streamed.values()]
    _check(case, reasoning, content, calls)


def test_required_tool_choice_gives_a_call_the_dialect_reads(fleet, family):
    api = openai.OpenAI(base_url=f"{fleet}/v1", api_key="none", max_retries=0, timeout=60)
    messages = _padded(fleet, family, REQUIRED, "required")
    if CASES[family].required is None:  # no grammar for this format: said, not ignored
        with pytest.raises(openai.BadRequestError) as refused:
            api.chat.completions.create(
                model=family,
                messages=messages,
                tools=[WEATHER],
                tool_choice="required",
                max_tokens=200,
            )
        assert "cannot be constrained" in refused.value.body["message"]
        return
    reply = api.chat.completions.create(
        model=family,
        messages=messages,
        tools=[WEATHER],
        tool_choice="required",
        max_tokens=200,
        temperature=0,
    )
    choice = reply.choices[0]
    calls = [
        (c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls or ()
    ]
    assert calls == [CALL], choice.message
    assert not (choice.message.content or "").strip()


def test_responses(fleet, family):
    case = CASES[family]
    api = openai.OpenAI(base_url=f"{fleet}/v1", api_key="none", max_retries=0, timeout=60)
    messages = _padded(fleet, family, AUTO)
    tool = {"type": "function", **WEATHER["function"]}
    for stream in (False, True):
        kwargs = {
            "model": family,
            "input": messages,
            "tools": [tool],
            "max_output_tokens": 200,
            "temperature": 0,
            "store": False,
        }
        if stream:
            events = list(api.responses.create(**kwargs, stream=True))
            done = [e for e in events if e.type == "response.completed"]
            response = done[0].response
            text_deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
            assert text_deltas.strip() == case.content
        else:
            response = api.responses.create(**kwargs)
        items = response.output
        calls = [(i.name, json.loads(i.arguments)) for i in items if i.type == "function_call"]
        reasoning = "".join(
            c.text for i in items if i.type == "reasoning" for c in (i.content or ())
        )
        content = "".join(
            c.text
            for i in items
            if i.type == "message"
            for c in i.content
            if c.type == "output_text"
        )
        _check(case, reasoning, content, calls)


def test_anthropic_messages(fleet, family):
    case = CASES[family]
    client = anthropic.Anthropic(base_url=fleet, api_key="none", max_retries=0, timeout=60)
    messages = _padded(fleet, family, AUTO)
    fn = WEATHER["function"]
    tool = {"name": fn["name"], "description": fn["description"], "input_schema": fn["parameters"]}
    kwargs = {
        "model": family,
        "messages": messages,
        "tools": [tool],
        "max_tokens": 200,
        "extra_body": {"temperature": 0},
    }
    whole = client.messages.create(**kwargs)
    with client.messages.stream(**kwargs) as stream:
        text = "".join(stream.text_stream)
        streamed = stream.get_final_message()
    assert text.strip() == case.content
    for message in (whole, streamed):
        assert message.stop_reason == "tool_use"
        calls = [(b.name, b.input) for b in message.content if b.type == "tool_use"]
        reasoning = "".join(b.thinking for b in message.content if b.type == "thinking")
        content = "".join(b.text for b in message.content if b.type == "text")
        _check(case, reasoning, content, calls)


def test_each_model_shows_its_dialect(fleet):
    from tests.support.launched import get_json

    shown = get_json(f"{fleet}/v1/models/gpt_oss")["dialect"]
    assert shown["tool_call_parser"] == "harmony" and shown["reasoning_parser"] == "harmony"
    assert shown["detected"] is True
    dialects = get_json(f"{fleet}/v1/cluster")["dialects"]
    assert set(dialects) == set(CASES)
    assert dialects["qwen3_coder"]["tool_call_parser_source"] == "mlx-lm"
    assert dialects["deepseek_v31"]["template_renders_tools"] is False
    listed = {
        m["id"]: m["dialect"]["tool_call_parser"] for m in get_json(f"{fleet}/v1/models")["data"]
    }
    assert listed["magistral"] == "mistral" and listed["lfm2"] == "pythonic"
