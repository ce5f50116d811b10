"""Dialects without processes: detection of every family from its real template and tokens,
each call format read whole and a character at a time, harmony's channels, the grammar of a
required call accepted by llguidance over the family's own tokens and read back, and a
multi-turn conversation with tool results rendered as the family's template renders it."""

from __future__ import annotations

import json

import llguidance
import pytest
import transformers

from router.chat.dialects import CALL_FORMATS, detect_dialect
from router.chat.dialects.harmony import HarmonyReader
from router.chat.output import ChatReader, special_stripper
from router.chat.prompt import build_chat_prompt
from router.chat.tool_grammar import tool_call_grammar
from router.chat.tools import chat_messages, parse_tools
from router.text.tokenizer import ModelTokenizer
from shared.grammar import check_grammar, ll_tokenizer
from tests.support.dialects import WEATHER
from tests.support.dialects.families import FAMILIES
from tests.support.dialects.models import build_dialect_model

TOOLS = parse_tools({"tools": [WEATHER]})
CALL = ("get_weather", {"city": "Paris"})

# what each family's template and vocabulary must be read as: (call format, reasoning)
DETECTED = {
    "qwen25": ("hermes", "think"),
    "qwen3": ("hermes", "think"),
    "qwen3_coder": ("qwen3_coder", "think"),
    "glm45": ("glm47", "think"),
    "glm47": ("glm47", "think"),
    "kimi_k2": ("kimi_k2", "think"),
    "kimi_k2_thinking": ("kimi_k2", "think"),
    "minimax_m2": ("minimax_m2", "think"),
    "deepseek_v31": ("deepseek_v31", "think"),
    "deepseek_r1": ("deepseek_v3", "think"),
    "gpt_oss": ("harmony", "harmony"),
    "lfm2": ("pythonic", "think"),
    "lfm25": ("pythonic", "think"),
    "gemma4": ("gemma4", "gemma4"),
    "mistral_nemo": ("mistral", "think"),
    "magistral": ("mistral", "mistral"),
    "llama31": ("llama3", "think"),
    "kimi_k3": ("kimi_k3", "xtml"),
    "minicpm5": ("minicpm5", "think"),
    "laguna": ("glm47", "think"),
    "muse_spark": ("muse_spark", "think"),
    "seed_oss": ("seed_oss", "seed"),
    "nemotron_nano_v2": ("nemotron_json", "think"),
}


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {
        name: build_dialect_model(root / name, spec, {64: "a"}) for name, spec in FAMILIES.items()
    }


@pytest.fixture(scope="module")
def tokenizers(family_dirs):
    return {name: ModelTokenizer.load(path) for name, path in family_dirs.items()}


def test_every_family_is_detected_from_its_template_and_tokens(tokenizers):
    assert set(DETECTED) == set(FAMILIES)
    for name, tok in tokenizers.items():
        dialect = detect_dialect(tok.template_source, tok.vocab)
        assert (dialect.tools, dialect.reasoning.name) == DETECTED[name], name


def test_a_named_parser_wins_and_an_unknown_one_is_refused():
    dialect = detect_dialect("{{ tools }}<tool_call>", {}, "qwen3_coder", "mistral")
    assert (dialect.tools, dialect.reasoning.name, dialect.detected) == (
        "qwen3_coder",
        "mistral",
        False,
    )
    with pytest.raises(ValueError, match="unknown tool-call parser"):
        detect_dialect("", {}, "nope")


def read(dialect, text: str, pieces: int | None = None, tools=TOOLS, starts=False):
    reader = ChatReader(dialect, starts, tools)
    size = pieces or max(len(text), 1)
    events = []
    for i in range(0, len(text), size):
        events += reader.feed(text[i : i + size])
    events += reader.finish()
    content = "".join(e.text for e in events if e.kind == "content")
    reasoning = "".join(e.text for e in events if e.kind == "reasoning")
    calls = [(e.call.name, json.loads(e.call.arguments)) for e in events if e.kind == "tool_call"]
    return reasoning, content, calls, reader.finish_reason("stop")


EXAMPLES = {name: f.example for name, f in CALL_FORMATS.items() if f.example}


@pytest.mark.parametrize("fmt", sorted(EXAMPLES))
@pytest.mark.parametrize("pieces", [None, 1, 5])
def test_every_format_reads_its_call_whole_and_streamed(fmt, pieces):
    dialect = detect_dialect("{{ tools }}", {}, fmt)
    text = EXAMPLES[fmt]
    lead = "" if fmt in ("llama3",) else "Let me check. "
    reasoning, content, calls, reason = read(dialect, lead + text, pieces)
    assert calls == [CALL] and reason == "tool_calls"
    assert content.strip() == lead.strip()
    # a call to a function the request did not declare stays the model's text
    other = parse_tools({"tools": [{"type": "function", "function": {"name": "other"}}]})
    assert read(dialect, lead + text, pieces, tools=other)[2] == []


@pytest.mark.parametrize("fmt", sorted(EXAMPLES))
def test_a_broken_call_stays_content(fmt):
    dialect = detect_dialect("{{ tools }}", {}, fmt)
    fmt_ = CALL_FORMATS[fmt]
    broken = f"{fmt_.start}@@@ not a call @@@{fmt_.end}" if fmt_.start else "{@@@"
    reasoning, content, calls, reason = read(dialect, "Hi. " + broken, 3)
    assert calls == [] and reason == "stop"
    assert "@@@ not a call @@@" in content or "{@@@" in content


SUM = {
    "type": "function",
    "function": {
        "name": "calculate_sum",
        "parameters": {
            "type": "object",
            "properties": {"numbers": {"type": "array", "items": {"type": "integer"}}},
        },
    },
}
# replies as the models write them (the shapes of llama.cpp's tests/test-chat.cpp for each)
SEED_REPLY = (
    "<seed:think>I need the sum and the weather</seed:think>"
    "<seed:tool_call>\n<function=calculate_sum>\n<parameter=numbers>[1, 2, 3]</parameter>\n"
    "</function>\n</seed:tool_call>"
    "<seed:tool_call>\n<function=get_weather>\n<parameter=city>Paris</parameter>\n"
    "</function>\n</seed:tool_call>"
)
# the template opened <think>: the reply starts inside it; arguments as an object or as text
NEMOTRON_REPLY = (
    "I need the sum and the weather</think>"
    '<TOOLCALL>[{"name": "calculate_sum", "arguments": {"numbers": [1, 2, 3]}}, '
    '{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}]</TOOLCALL>'
)


@pytest.mark.parametrize(
    ("name", "reply", "starts"),
    [("seed_oss", SEED_REPLY, False), ("nemotron_nano_v2", NEMOTRON_REPLY, True)],
)
@pytest.mark.parametrize("pieces", [None, 1, 6])
def test_seed_and_nemotron_read_reasoning_and_several_calls(name, reply, starts, pieces):
    spec = FAMILIES[name]
    vocab = dict.fromkeys((*spec.special, *spec.added), 0)
    dialect = detect_dialect(spec.chat_template, vocab)
    tools = parse_tools({"tools": [SUM, WEATHER]})
    reasoning, content, calls, reason = read(dialect, reply, pieces, tools, starts)
    assert reasoning == "I need the sum and the weather" and content == ""
    assert calls == [("calculate_sum", {"numbers": [1, 2, 3]}), CALL]
    assert reason == "tool_calls"


def test_two_calls_in_one_section_stream_as_each_closes():
    dialect = detect_dialect("{{ tools }}", {}, "kimi_k2")
    one = (
        "<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
        '{"city": "Paris"}<|tool_call_end|>'
    )
    reader = ChatReader(dialect, False, TOOLS)
    events = reader.feed("<|tool_calls_section_begin|>" + one)
    assert [e.kind for e in events] == ["tool_call"]  # out before the section closes
    events = reader.feed(
        one.replace("Paris", "Rome").replace(":0", ":1") + "<|tool_calls_section_end|>"
    )
    assert [json.loads(e.call.arguments)["city"] for e in events] == ["Rome"]
    assert [e.call_index for e in events] == [1]


@pytest.mark.parametrize(
    ("reasoning", "text", "starts"),
    [
        ("think", "<think>\nabout it\n</think>\n\nAnswer.", False),
        ("think", "about it\n</think>\n\nAnswer.", True),
        ("mistral", "[THINK]about it[/THINK]Answer.", False),
        ("gemma4", "<|channel>thought\nabout it<channel|>Answer.", False),
        (
            "xtml",
            "about it<|close|>think<|sep|><|open|>response<|sep|>Answer.<|close|>response<|sep|>",
            True,
        ),
        ("seed", "<seed:think>about it</seed:think>Answer.", False),
        ("seed", "about it</seed:think>\n\nAnswer.", True),
    ],
)
@pytest.mark.parametrize("pieces", [None, 1, 4])
def test_reasoning_markers_of_every_family(reasoning, text, starts, pieces):
    dialect = detect_dialect("", {}, "hermes" if reasoning != "xtml" else "kimi_k3", reasoning)
    got = read(dialect, text, pieces, tools=None, starts=starts)
    assert (got[0].strip(), got[1].strip()) == ("about it", "Answer.")


HARMONY = (
    "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary"
    "<|message|>Checking.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather "
    '<|constrain|>json<|message|>{"city": "Paris"}'
)


@pytest.mark.parametrize("pieces", [None, 1, 3, 7])
def test_harmony_channels(pieces):
    dialect = detect_dialect("", {}, "harmony")
    assert read(dialect, HARMONY, pieces) == (
        "Need the weather.",
        "Checking.",
        [CALL],
        "tool_calls",
    )
    final = "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>Paris."
    assert read(dialect, final, pieces, tools=None) == ("Easy.", "Paris.", [], "stop")
    # without tools the call's body is the model's text, not a call
    assert read(dialect, HARMONY, pieces, tools=None)[2] == []
    reader = HarmonyReader(None)
    assert reader.feed("plain text, no channel") + reader.finish() == [
        ("content", "plain text, no channel")
    ]


def test_special_tokens_are_cut_from_what_the_client_reads():
    strip = special_stripper(("<|im_end|>", "<s>"))
    reader = ChatReader(detect_dialect("", {}), False, None, strip)
    events = reader.feed("<s>Hello<|im_end|> there") + reader.finish()
    assert "".join(e.text for e in events) == "Hello there"


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_a_required_call_is_written_in_the_family_format_and_read_back(
    name, family_dirs, tokenizers
):
    tok = tokenizers[name]
    dialect = detect_dialect(tok.template_source, tok.vocab)
    required = parse_tools({"tools": [WEATHER], "tool_choice": "required"})
    fmt = CALL_FORMATS.get(dialect.tools)
    if fmt is not None and fmt.grammar is None:
        with pytest.raises(Exception, match="cannot be constrained"):
            tool_call_grammar(required, dialect.tools, tok)
        return
    grammar = tool_call_grammar(required, dialect.tools, tok)
    hf = transformers.AutoTokenizer.from_pretrained(str(family_dirs[name]))
    matcher = llguidance.LLMatcher(ll_tokenizer(hf), check_grammar(grammar), log_level=0)
    # walk the grammar: at each step the first allowed of the tokens of a model that wants
    # to write the call text as the family's own example spells it
    text = _call_text(dialect.tools, tok.token_id("[ARGS]") is not None)
    ids = hf.encode(text, add_special_tokens=False)
    for token in ids:
        assert matcher.consume_token(token), (name, hf.decode([token], skip_special_tokens=False))
    assert matcher.is_accepting() or matcher.is_stopped()
    written = hf.decode(ids, skip_special_tokens=False)
    assert read(dialect, written)[2] == [CALL]


def _call_text(fmt: str, has_args_token: bool) -> str:
    if fmt == "harmony":
        return '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}'
    if fmt == "mistral" and not has_args_token:  # v3 (Nemo): the JSON array of calls
        return '[{"name": "get_weather", "arguments": {"city": "Paris"}}]'
    return CALL_FORMATS[fmt].example


# ---- history: the family's own rendering of a conversation with a tool result


def _conversation(spec, router_form: bool) -> list[dict]:
    """system, user, assistant (reasoning + a call), tool result, [answer], user; in the
    router's (OpenAI) form, or as the template expects it (Hugging Face's convention)."""
    arguments = {"city": "Paris"}
    if router_form or spec.tool_arguments == "string":
        arguments = json.dumps(arguments)
    call = {
        "id": "abc123def",
        "type": "function",
        "function": {"name": "get_weather", "arguments": arguments},
    }
    assistant = {
        "role": "assistant",
        "content": "",
        "tool_calls": [call],
        "reasoning_content": "Need the weather.",
    }
    result = {"role": "tool", "tool_call_id": "abc123def", "content": '{"temp": 21}'}
    if not router_form:
        result["name"] = "get_weather"
        assistant["thinking"] = "Need the weather."
    turns = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        assistant,
        result,
    ]
    if spec.answer_after_tools:
        turns.append({"role": "assistant", "content": "It is 21 degrees."})
    return [*turns, {"role": "user", "content": "And tomorrow?"}]


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_a_multi_turn_history_renders_as_the_template_renders_it(name, family_dirs, tokenizers):
    spec, tok = FAMILIES[name], tokenizers[name]
    body = {"messages": _conversation(spec, router_form=True), "tools": [WEATHER]}
    dialect = detect_dialect(tok.template_source, tok.vocab)
    tools = parse_tools(body) if dialect.native_tools else None
    prompt = build_chat_prompt(chat_messages(body), tools, tok, {})
    hf = transformers.AutoTokenizer.from_pretrained(str(family_dirs[name]))
    expected = hf.apply_chat_template(
        _conversation(spec, router_form=False),
        tools=[WEATHER] if dialect.native_tools else None,
        add_generation_prompt=True,
        tokenize=False,
    )
    assert prompt.token_ids == hf.encode(expected, add_special_tokens=False), name
