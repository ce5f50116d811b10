"""A three-turn tool loop through the router's own prompt building, per reasoning family: how
much of each turn's prompt the worker's prefix cache holds, and where the rendered history
first leaves what the model generated.

The loop: the user asks; the assistant reasons and calls a tool; the result; the assistant
reasons and calls again; the result; the assistant reasons and answers. Each reply is the
family's own markup (`Family.reply`), tokenized as the worker appends generated tokens, then
read back by the router's reply reader (`router.chat.output.ChatReader`) into the assistant
message an OpenAI client sends with the next turn: content, `tool_calls` and (unless
`drop_reasoning`) vLLM's `reasoning_content`. Each turn's prompt is built as /v1/chat/completions
builds it (`parse_tools`, `chat_messages`, `template_kwargs`, `build_chat_prompt`).

What the cache holds before turn k: every earlier turn's prompt and the tokens generated after
it, in whole blocks, less the last generated token (sampled, never run through the model). A
turn's hit is the longest of them it shares, cut to whole blocks and short of its own last
token (the worker computes that one for its logits: worker/engine/scheduler.py `_admit`).

The tokenizer is the dialect tests' (tests/support/dialects/models.py): a ~400-token byte-level
BPE with the family's real special and added tokens and its real chat template. Its tokens are
shorter than a real vocabulary's (a few characters each), so counts run ~3x a real model's;
shares, and where histories diverge, are the template's and hold for the real tokenizer.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from router.chat.output import ChatReader, special_stripper
from router.chat.prompt import build_chat_prompt, template_kwargs
from router.chat.tools import chat_messages, parse_tools
from router.text.tokenizer import ModelTokenizer
from tests.support.dialects import WEATHER
from tests.support.dialects.families import FAMILIES
from tests.support.dialects.models import build_dialect_model

SYSTEM = "You are a helpful assistant. Use the tools when they help, then answer in one sentence."
QUESTION = "Is it warmer in Paris or in London right now?"
EXCERPT = 40  # tokens of text shown either side of a divergence


@dataclass(frozen=True)
class Step:
    """One assistant turn: its reasoning, then a call (name, arguments) or an answer."""

    reasoning: str
    call: tuple[str, dict] | None = None
    answer: str = ""
    result: str = ""  # the tool's reply to the call


STEPS = (
    Step(
        "The user wants the current temperatures of Paris and London compared. I will look up "
        "Paris first, then London, and compare the two readings.",
        call=("get_weather", {"city": "Paris"}),
        result='{"city": "Paris", "temperature_c": 21, "sky": "sunny"}',
    ),
    Step(
        "Paris reads 21 C and sunny. I still need London's reading before I can compare.",
        call=("get_weather", {"city": "London"}),
        result='{"city": "London", "temperature_c": 15, "sky": "cloudy"}',
    ),
    Step(
        "Paris 21 C, London 15 C: Paris is warmer by 6 degrees.",
        answer="Paris is warmer: 21 C and sunny, against 15 C and cloudy in London.",
    ),
)


# ---- each family's markup for a reply --------------------------------------------------


def _qwen3(step: Step, first: bool) -> str:
    head = f"<think>\n{step.reasoning}\n</think>\n\n"
    if step.call is None:
        return f"{head}{step.answer}<|im_end|>"
    name, arguments = step.call
    call = json.dumps({"name": name, "arguments": arguments})
    return f"{head}<tool_call>\n{call}\n</tool_call><|im_end|>"


def _harmony(step: Step, first: bool) -> str:
    head = f"<|channel|>analysis<|message|>{step.reasoning}<|end|><|start|>assistant"
    if step.call is None:
        return f"{head}<|channel|>final<|message|>{step.answer}<|return|>"
    name, arguments = step.call
    return (
        f"{head}<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>"
        f"{json.dumps(arguments)}<|call|>"
    )


def _deepseek_r1(step: Step, first: bool) -> str:
    head = f"<think>\n{step.reasoning}\n</think>\n\n"
    if step.call is None:
        return f"{head}{step.answer}<｜end▁of▁sentence｜>"
    name, arguments = step.call
    return (
        f"{head}<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n"
        f"```json\n{json.dumps(arguments)}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
        "<｜end▁of▁sentence｜>"
    )


def _v31_calls(step: Step) -> str:
    if step.call is None:
        return f"{step.answer}<｜end▁of▁sentence｜>"
    name, arguments = step.call
    return (
        f"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{json.dumps(arguments)}"
        "<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>"
    )


def _deepseek_v31(step: Step, first: bool) -> str:
    """Non-thinking mode (the template's default; V3.1's card: tool calls are for it)."""
    return _v31_calls(step)


def _deepseek_v31_thinking(step: Step, first: bool) -> str:
    """Thinking mode: the template opens `<think>` after the user's message only; after a tool
    result it writes no generation prompt, so later replies carry no reasoning block."""
    return f"{step.reasoning}</think>{_v31_calls(step)}" if first else _v31_calls(step)


@dataclass(frozen=True)
class Family:
    name: str  # what the report calls it
    spec: str  # tests/support/dialects/families.py FAMILIES key
    reply: Callable[[Step, bool], str]  # (step, first turn) -> what the model writes
    kwargs: dict = field(default_factory=dict)  # chat_template_kwargs


LOOP_FAMILIES = {
    f.name: f
    for f in (
        Family("qwen3", "qwen3", _qwen3),
        Family("gpt_oss", "gpt_oss", _harmony),
        Family("deepseek_r1", "deepseek_r1", _deepseek_r1),
        Family("deepseek_v31", "deepseek_v31", _deepseek_v31),
        Family("deepseek_v31_thinking", "deepseek_v31", _deepseek_v31_thinking, {"thinking": True}),
    )
}


# ---- the loop --------------------------------------------------------------------------


@dataclass(frozen=True)
class Turn:
    """Turn k's prompt against what the cache holds before it (see the module docstring)."""

    family: str
    turn: int  # 1-based
    prompt: list[int]
    previous: list[int]  # turn k-1's prompt + its generated tokens ([] for turn 1)
    previous_prompt: int  # turn k-1's prompt length (its generated tokens follow)
    common: int  # tokens turn k's prompt shares with `previous`
    cached: int  # the whole-block hit: what a full-attention worker reads from cache
    hybrid_cached: int  # the hit cut to a recurrent-state snapshot (`snapshot_points`)
    # where the prompt leaves `previous`: `at`, the text `before` it (shared), and what follows
    # in each: `generated` (the previous prompt and reply) and `rendered` (this prompt)
    divergence: dict | None

    def record(self, block_size: int, reasoning_sent: bool) -> dict:
        n = len(self.prompt)
        return {
            "family": self.family,
            "turn": self.turn,
            "reasoning_sent": reasoning_sent,
            "block_size": block_size,
            "prompt_tokens": n,
            "previous_prompt_tokens": self.previous_prompt,
            "previous_tokens": len(self.previous),
            "common_prefix_tokens": self.common,
            "common_share": round(self.common / n, 3),
            "cached_tokens": self.cached,
            "cached_share": round(self.cached / n, 3),
            "hybrid_cached_tokens": self.hybrid_cached,
            "hybrid_cached_share": round(self.hybrid_cached / n, 3),
            "diverges_at": self.divergence["at"] if self.divergence else None,
            "diverges_from_prompt_end": (
                self.divergence["at"] - self.previous_prompt if self.divergence else None
            ),
            "divergence": self.divergence,
        }


def family_tokenizer(spec_name: str, directory: Path | None = None) -> ModelTokenizer:
    """The dialect tests' tokenizer (and tiny checkpoint) for a family, written to `directory`
    (a temporary one when None)."""
    root = Path(directory or tempfile.mkdtemp(prefix="history-reuse-"))
    return ModelTokenizer.load(build_dialect_model(root / spec_name, FAMILIES[spec_name], {}))


def run_loop(
    family: Family, tokenizer: ModelTokenizer, block_size: int, drop_reasoning: bool = False
) -> list[Turn]:
    """The three turns of the loop (see the module docstring)."""
    messages: list[dict] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": QUESTION},
    ]
    streams: list[list[int]] = []  # what the cache holds: each turn's prompt + reply
    turns: list[Turn] = []
    prompt_lens: list[int] = []
    for k, step in enumerate(STEPS, start=1):
        body = {"messages": messages, "tools": [WEATHER], "chat_template_kwargs": family.kwargs}
        tools = parse_tools(body)
        prompt = build_chat_prompt(chat_messages(body), tools, tokenizer, template_kwargs(body))
        ids = prompt.token_ids
        turns.append(_measure(family.name, k, ids, streams, prompt_lens, tokenizer, block_size))
        generated = tokenizer.encode_text(family.reply(step, k == 1))
        streams.append(ids + generated)
        prompt_lens.append(len(ids))
        reply = _read_reply(prompt, tokenizer, generated, drop_reasoning)
        messages = [*messages, reply]
        if step.call is not None:
            call_id = reply["tool_calls"][0]["id"]
            messages.append({"role": "tool", "tool_call_id": call_id, "content": step.result})
    return turns


def snapshot_points(prompt_len: int, stream_len: int, bs: int) -> list[int]:
    """Where a hybrid worker keeps recurrent-state snapshots of a turn with a `prompt_len`
    prompt whose whole run (prompt + reply) is `stream_len` tokens (worker/engine/caches/states.py):
    its prompt's last whole block short of its last token, its prompt's end when that is a
    block boundary, and its reply's last whole block (its last token never runs). The branch
    point where a prompt left the cached tree is left out: in this loop it is never deeper."""
    points = [(prompt_len - 1) // bs * bs, (stream_len - 1) // bs * bs]
    if prompt_len % bs == 0:
        points.append(prompt_len)
    return points


def _measure(family, k, ids, streams, prompt_lens, tokenizer, bs) -> Turn:
    previous = streams[-1] if streams else []
    previous_prompt = prompt_lens[-1] if prompt_lens else 0
    common = common_prefix(ids, previous)
    # the tree holds every earlier stream, each less its last (never run) token
    held = max((min(common_prefix(ids, s), len(s) - 1) for s in streams), default=0)
    cached = min(held, len(ids) - 1) // bs * bs
    snapshots = [
        p
        for s, prompt_len in zip(streams, prompt_lens, strict=True)
        for p in snapshot_points(prompt_len, len(s), bs)
        if p <= common_prefix(ids, s)
    ]
    hybrid = max((p for p in snapshots if p <= cached), default=0)
    divergence = None
    if previous and common < min(len(ids), len(previous)):
        divergence = {
            "at": common,
            "before": _text(tokenizer, ids[max(0, common - EXCERPT) : common]),
            "generated": _text(tokenizer, previous[common : common + EXCERPT]),
            "rendered": _text(tokenizer, ids[common : common + EXCERPT]),
        }
    return Turn(family, k, ids, previous, previous_prompt, common, cached, hybrid, divergence)


def _read_reply(prompt, tokenizer, generated: list[int], drop_reasoning: bool) -> dict:
    """The assistant message an OpenAI client sends back, as the router returned it."""
    strip = special_stripper(tokenizer.special_tokens)
    reader = ChatReader(prompt.dialect, prompt.starts_in_reasoning, prompt.tools, strip)
    if generated and generated[-1] in tokenizer.chat_stop_token_ids:  # the router drops it
        generated = generated[:-1]
    text = tokenizer.decode(generated, skip_special_tokens=False)
    events = reader.feed(text) + reader.finish()
    reasoning = "".join(e.text for e in events if e.kind == "reasoning")
    content = "".join(e.text for e in events if e.kind == "content")
    calls = [
        {
            "id": e.call_id or f"call_{i}",
            "type": "function",
            "function": {"name": e.call.name, "arguments": e.call.arguments},
        }
        for i, e in enumerate(e for e in events if e.kind == "tool_call")
    ]
    message: dict = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = calls
    if reasoning and not drop_reasoning:
        message["reasoning_content"] = reasoning
    return message


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def _text(tokenizer: ModelTokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=False)
