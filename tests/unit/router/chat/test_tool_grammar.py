"""tool_choice "required" / named: a grammar in the request that accepts exactly the calls the
model's tool parser reads, checked with llguidance over the tiny tokenizer."""

from __future__ import annotations

import json

import llguidance
import pytest
import transformers

from router.api.openai.parse import parse_chat
from router.chat.tool_grammar import tool_call_grammar
from router.chat.tool_parsers import parse_tool_calls
from router.chat.tools import parse_tools
from router.errors import ApiError
from shared.grammar import check_grammar, ll_tokenizer

MODEL = "tiny"
CONTEXT = 4096
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
ASK = [{"role": "user", "content": "weather in paris?"}]


@pytest.fixture(scope="module")
def hf_and_ll(tiny_model_dir):
    hf = transformers.AutoTokenizer.from_pretrained(str(tiny_model_dir))
    return hf, ll_tokenizer(hf)


def accepts(hf_and_ll, grammar, text: str) -> bool:
    hf, ll = hf_and_ll
    matcher = llguidance.LLMatcher(ll, check_grammar(grammar), log_level=0)
    ids = hf.encode(text, add_special_tokens=False)
    return all(matcher.consume_token(t) for t in ids) and matcher.is_accepting()


HERMES = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
CASES = {
    "hermes": (HERMES,) * 2,
    "llama3": ('{"name": "get_weather", "parameters": {"city": "Paris"}}',) * 2,
    "mistral": (
        '[{"name": "get_weather", "arguments": {"city": "Paris"}}]',
        '[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", '
        '"arguments": {}}]',
    ),
}


@pytest.mark.parametrize("family", ["hermes", "llama3", "mistral"])
def test_grammar_accepts_what_the_parser_reads_and_nothing_else(hf_and_ll, family):
    tools = parse_tools({"tools": [WEATHER, TIME], "tool_choice": "required"})
    grammar = tool_call_grammar(tools, family)
    one, several = CASES[family]
    for text in (one, several):
        assert accepts(hf_and_ll, grammar, text), text
        assert parse_tool_calls(family, text).calls
    assert not accepts(hf_and_ll, grammar, "The weather is fine.")
    wrong_args = one.replace('{"city": "Paris"}', '{"town": 5}')
    assert not accepts(hf_and_ll, grammar, wrong_args)
    named = parse_tools(
        {
            "tools": [WEATHER, TIME],
            "tool_choice": {"type": "function", "function": {"name": "get_time"}},
        }
    )
    assert not accepts(hf_and_ll, tool_call_grammar(named, family), one)


def test_required_and_named_choices_put_the_grammar_in_the_request(tiny_model_dir):
    from router.text.tokenizer import ModelTokenizer

    tok = ModelTokenizer.load(tiny_model_dir, CONTEXT)
    body = {"model": MODEL, "messages": ASK, "tools": [WEATHER]}
    assert parse_chat(body, tok, MODEL).sampling.grammar is None  # auto: the model decides
    req = parse_chat({**body, "tool_choice": "required"}, tok, MODEL)
    assert req.sampling.grammar.kind == "lark" and "<tool_call>" in req.sampling.grammar.source
    with pytest.raises(ApiError) as e:
        fmt = {"type": "json_object"}
        parse_chat({**body, "tool_choice": "required", "response_format": fmt}, tok, MODEL)
    assert e.value.status == 400 and e.value.param == "tool_choice"
    bad = json.loads(json.dumps(WEATHER))
    bad["function"]["parameters"] = {"type": "object", "properties": {"x": {"type": "wat"}}}
    with pytest.raises(ApiError) as e:
        parse_chat({**body, "tools": [bad], "tool_choice": "required"}, tok, MODEL)
    assert e.value.status == 400 and e.value.param == "tools"
