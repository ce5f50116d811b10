"""A model family's dialect: how it writes tool calls and reasoning, which tokens end its turn,
and whether its chat template renders tools itself.

Detected once per model from the chat template and the vocabulary (the rules mlx-lm 0.32 uses,
`tokenizer_utils._infer_tool_parser` and `_infer_thinking`, plus the families it lacks), or named
by the operator (`--tool-call-parser`, `--reasoning-parser`). The reply reader
(router/chat/output.py) and the prompt builder (router/chat/prompt.py) ask the dialect, never the
template: a new family is a new entry here and in dialects/calls.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from router.chat.dialects.calls import CALL_FORMATS, CallFormat, ParsedCall

__all__ = [
    "CALL_FORMATS",
    "REASONING_FORMATS",
    "TOOL_PARSER_NAMES",
    "CallFormat",
    "Dialect",
    "ParsedCall",
    "Reasoning",
    "detect_dialect",
]


@dataclass(frozen=True)
class Reasoning:
    name: str
    open: str  # the marker a reasoning block starts with ("" for harmony's channels)
    close: str


REASONING_FORMATS: dict[str, Reasoning] = {
    r.name: r
    for r in [
        Reasoning("think", "<think>", "</think>"),
        Reasoning("mistral", "[THINK]", "[/THINK]"),
        Reasoning("gemma4", "<|channel>thought", "<channel|>"),
        Reasoning("longcat", "<longcat_think>", "</longcat_think>"),
        Reasoning("think_colon", "<|think:start|>", "<|think:end|>"),
        Reasoning("xtml", "<|open|>think<|sep|>", "<|close|>think<|sep|>"),
        Reasoning("seed", "<seed:think>", "</seed:think>"),  # Seed-OSS
        Reasoning("harmony", "", ""),  # the analysis channel (dialects/harmony.py)
    ]
}
HARMONY = "harmony"
TOOL_PARSER_NAMES = (*CALL_FORMATS, HARMONY)


@dataclass(frozen=True)
class Dialect:
    tools: str  # a CALL_FORMATS name, or "harmony"
    reasoning: Reasoning
    native_tools: bool  # the template renders the tools (else our fallback prompt, or the
    # family's own tool prompt: `tool_prompt`)
    tool_prompt: str | None = None  # DeepSeek's: the tool system prompt its model card documents
    end_tokens: tuple[str, ...] = ()  # the tokens that end a turn, when the template's own
    # probe would get them wrong (harmony: <|return|> and <|call|>, never <|end|>)
    arguments_as_json: bool = False  # history's call arguments go to the template as JSON text
    layout: tuple[str, ...] = ()  # markers around the answer that are neither content nor
    # a call (Kimi K3's <|open|>response<|sep|> ... <|close|>response<|sep|>): dropped
    detected: bool = True  # False: the operator named it

    @property
    def harmony(self) -> bool:
        return self.tools == HARMONY

    @property
    def call_format(self) -> CallFormat | None:
        return None if self.harmony else CALL_FORMATS[self.tools]

    def describe(self) -> dict:
        """What /v1/models/{id} and /v1/cluster show."""
        source = "mlx-fleet" if self.harmony else CALL_FORMATS[self.tools].source
        return {
            "tool_call_parser": self.tools,
            "tool_call_parser_source": source,
            "reasoning_parser": self.reasoning.name,
            "template_renders_tools": self.native_tools,
            "detected": self.detected,
        }


_MENTIONS_TOOLS = re.compile(r"\btools\b")

# (a marker in the chat template, the call format): the first that matches wins (mlx-lm's order,
# with harmony and DeepSeek, which it lacks, ahead of the formats whose markers they share; Seed-OSS
# and Nemotron Nano v2, which it lacks too, have markers no other family writes)
_TEMPLATE_RULES: tuple[tuple[tuple[str, ...], str], ...] = (
    (("<|channel|>", "<|start|>", "<|message|>"), HARMONY),
    (("<seed:tool_call>",), "seed_oss"),
    (("<TOOLCALL>",), "nemotron_json"),
    (("<minimax:tool_call>",), "minimax_m2"),
    (("<|tool_call>", "<tool_call|>"), "gemma4"),
    (("<start_function_call>",), "function_gemma"),
    (("<longcat_tool_call>",), "longcat"),
    (("<arg_key>",), "glm47"),
    (("<|tool_list_start|>",), "pythonic"),
    (("<|tool_call_start|>",), "pythonic"),
    (("<tool_call>\\n<function=",), "qwen3_coder"),
    (("<tool_call>\n<function=",), "qwen3_coder"),
    (("<|tool_calls_section_begin|>",), "kimi_k2"),
    (('<function name="', '<param name="'), "minicpm5"),
    (("function<｜tool▁sep｜>",), "deepseek_v3"),  # V3 / R1: type, sep, name, ```json
    (("<｜tool▁sep｜>' + tool['function']['name']",), "deepseek_v3"),
    (("<｜tool▁calls▁begin｜>",), "deepseek_v31"),
    (("[TOOL_CALLS]",), "mistral"),
    (("<atem:function_calls>",), "muse_spark"),
    (("<|python_tag|>",), "llama3"),
    (("ipython",), "llama3"),
)
_XTML = ("<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>")
# turn ends the template probe gets wrong: harmony closes each message with <|end|> and the
# turn with <|return|> or <|call|>; XTML closes every element with <|close|>
_XTML_LAYOUT = ("<|open|>response<|sep|>", "<|close|>response<|sep|>", "<|close|>message<|sep|>")
_END_TOKENS = {HARMONY: ("<|return|>", "<|call|>"), "kimi_k3": ("<|end_of_msg|>",)}


def detect_tool_format(template: str, vocab: dict[str, int]) -> str:
    for markers, name in _TEMPLATE_RULES:
        if all(m in template for m in markers):
            return name
    if all(t in vocab for t in _XTML):
        return "kimi_k3"
    if "<|tool_call_start|>" in vocab and "<|tool_call_end|>" in vocab:
        return "pythonic"  # LFM2.5 conversions name the tokens only in the vocabulary
    return "hermes"  # what our fallback tool prompt asks for


def detect_reasoning(template: str, vocab: dict[str, int], tools: str) -> Reasoning:
    if tools == HARMONY:
        return REASONING_FORMATS["harmony"]
    for reasoning in REASONING_FORMATS.values():
        if reasoning.name == "harmony":
            continue
        head = reasoning.open.split("thought")[0] if reasoning.name == "gemma4" else reasoning.open
        if head in vocab and reasoning.close in vocab:
            return reasoning
        if reasoning.name == "xtml" and all(t in vocab for t in _XTML):
            return reasoning
    return REASONING_FORMATS["think"]  # a bare <think> block at the reply's start is read anyway


def detect_dialect(
    template: str,
    vocab: dict[str, int],
    tool_parser: str | None = None,
    reasoning_parser: str | None = None,
) -> Dialect:
    """The dialect of a model with this chat template and vocabulary; a named parser wins."""
    tools = tool_parser or detect_tool_format(template, vocab)
    if tools not in TOOL_PARSER_NAMES:
        raise ValueError(
            f"unknown tool-call parser {tools!r}: one of {', '.join(TOOL_PARSER_NAMES)}"
        )
    if reasoning_parser is not None and reasoning_parser not in REASONING_FORMATS:
        names = ", ".join(REASONING_FORMATS)
        raise ValueError(f"unknown reasoning parser {reasoning_parser!r}: one of {names}")
    reasoning = (
        REASONING_FORMATS[reasoning_parser]
        if reasoning_parser
        else detect_reasoning(template, vocab, tools)
    )
    own_prompt = tools in ("deepseek_v31", "deepseek_v3") and not _MENTIONS_TOOLS.search(template)
    tool_prompt = tools if own_prompt else None
    return Dialect(
        tools=tools,
        reasoning=reasoning,
        native_tools=bool(_MENTIONS_TOOLS.search(template)),
        tool_prompt=tool_prompt,
        end_tokens=_END_TOKENS.get(tools, ()),
        layout=_XTML_LAYOUT if reasoning.name == "xtml" else (),
        detected=tool_parser is None and reasoning_parser is None,
    )
