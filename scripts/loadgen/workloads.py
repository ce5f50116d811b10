"""Seeded prompt workloads: chat requests whose prefix sharing is known by construction.

Every workload is a pure function of (number of requests, seed, shape): the same arguments give
the same prompts, so two servers (or two runs) see exactly the same traffic. Text is drawn from
a built-in word list; nothing is downloaded. With the SmolLM2 tokenizer one word of this text is
about 1.1 tokens (measured), so `prefix_words=900` is about 1000 prompt tokens.

- multi_tenant: `tenants` long system prompts, each shared by many short questions.
- multi_turn: conversations that grow turn by turn; turn t repeats turns 1..t-1 (the
  assistant turns are fixed text, not model output, so a run is deterministic).
- few_shot: one shared block of example question/answer turns, then a new question.
- cold_mix: ongoing decodes (short questions, the run's --max-tokens) with every
  `long_every`-th request a long cold prompt (a unique ~prefix_words document, 16 output
  tokens): what disaggregated prefill is for (decodes stalled behind prefills).
- control: the same shape as multi_tenant but every system prompt is different (no sharing
  beyond the chat template's own fixed header).
- code_edit: an agent's coding tasks: `tenants` tool preambles, each shared by many requests
  to edit a file given in full ("rename X to Y, return the whole file"); the answer repeats
  the prompt's code, so prompt-lookup drafts (`--speculative ngram`) are accepted.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

_WORD_TEXT = """
    time year people way day man thing woman life child world school state family student
    group country problem hand part place case week company system program question work
    government number night point home water room mother area money story fact month lot
    right study book eye job word business issue side kind head house service friend father
    power hour game line end member law car city community name president team minute idea
    kid body information back parent face others level office door health person art war
    history party result change morning reason research girl guy moment air teacher force
    education foot boy age policy process music market sense nation plan college interest
    death experience effect use class control care field development role effort rate heart
    drug show leader light voice wife police mind price report decision son view relationship
    town road arm difference value building action model season society tax director position
    player record paper space ground form event official matter center couple site project
    activity star table need court oil situation cost industry figure street image phone data
    picture practice piece land product doctor wall patient worker news test movie north love
    support technology step baby computer type attention film tree source organization hair
    window evidence population truth song page garden river bridge mountain ocean island
    forest valley desert winter summer spring autumn bread cheese apple orange coffee tea
    quick slow bright dark warm cold quiet loud gentle brave clever careful simple strange
    green blue red yellow silver golden small large ancient modern busy calm happy honest
"""
WORDS = tuple(_WORD_TEXT.split())

Messages = list[dict[str, str]]


@dataclass(frozen=True)
class Prompt:
    messages: Messages
    group: str  # what it shares a prefix with: a tenant, a conversation, the shot block
    max_tokens: int | None = None  # None: the run's --max-tokens


@dataclass(frozen=True)
class Shape:
    """Sizes of the generated text, in words."""

    tenants: int = 4
    prefix_words: int = 900  # system prompt (multi_tenant, control); ~1000 tokens
    question_words: int = 12
    turns: int = 6  # multi_turn: turns per conversation
    answer_words: int = 40  # multi_turn, few_shot: length of each fixed assistant turn
    shots: int = 8  # few_shot: example question/answer pairs in the shared block
    long_every: int = 4  # cold_mix: one long cold prompt in this many requests


def sentence(rng: random.Random, n_words: int) -> str:
    words = [rng.choice(WORDS) for _ in range(n_words)]
    return " ".join(words).capitalize() + "."


def paragraph(rng: random.Random, n_words: int, sentence_words: int = 12) -> str:
    sentences = []
    while n_words > 0:
        take = min(sentence_words, n_words)
        sentences.append(sentence(rng, take))
        n_words -= take
    return " ".join(sentences)


def question(rng: random.Random, n_words: int) -> str:
    return "What about the " + " ".join(rng.choice(WORDS) for _ in range(n_words)) + "?"


def system_prompt(rng: random.Random, shape: Shape, who: str) -> str:
    return f"You are the assistant of {who}. " + paragraph(rng, shape.prefix_words)


def multi_tenant(n: int, seed: int, shape: Shape) -> list[Prompt]:
    rng = random.Random(seed)
    systems = [system_prompt(rng, shape, f"tenant {t}") for t in range(shape.tenants)]
    prompts = []
    for _ in range(n):
        tenant = rng.randrange(shape.tenants)
        messages = [
            {"role": "system", "content": systems[tenant]},
            {"role": "user", "content": question(rng, shape.question_words)},
        ]
        prompts.append(Prompt(messages, f"tenant-{tenant}"))
    return prompts


def multi_turn(n: int, seed: int, shape: Shape) -> list[Prompt]:
    """Round t of every conversation comes before round t+1 of any, so a conversation's
    earlier turns were (usually) served before its next one is sent."""
    rng = random.Random(seed)
    conversations = -(-n // shape.turns)
    histories: list[Messages] = [
        [{"role": "system", "content": f"You are a helpful assistant. Conversation {c}."}]
        for c in range(conversations)
    ]
    answers = [paragraph(rng, shape.answer_words) for _ in range(shape.turns)]
    prompts = []
    for turn in range(shape.turns):
        for c, history in enumerate(histories):
            if len(prompts) == n:
                return prompts
            if turn:
                history.append({"role": "assistant", "content": answers[turn - 1]})
            history.append({"role": "user", "content": question(rng, shape.question_words)})
            prompts.append(Prompt([dict(m) for m in history], f"conversation-{c}"))
    return prompts


def few_shot(n: int, seed: int, shape: Shape) -> list[Prompt]:
    rng = random.Random(seed)
    block: Messages = [{"role": "system", "content": "Answer in the style of the examples."}]
    for _ in range(shape.shots):
        block.append({"role": "user", "content": question(rng, shape.question_words)})
        block.append({"role": "assistant", "content": paragraph(rng, shape.answer_words)})
    return [
        Prompt([*block, {"role": "user", "content": question(rng, shape.question_words)}], "shots")
        for _ in range(n)
    ]


def control(n: int, seed: int, shape: Shape) -> list[Prompt]:
    rng = random.Random(seed)
    prompts = []
    for i in range(n):
        # Three random opening words: two prompts share a first word with chance 1/len(WORDS).
        opening = " ".join(rng.choice(WORDS) for _ in range(3)).capitalize()
        system = f"{opening}. " + paragraph(rng, shape.prefix_words)
        messages = [
            {"role": "system", "content": system},
            {"role": "user", "content": question(rng, shape.question_words)},
        ]
        prompts.append(Prompt(messages, f"request-{i}"))
    return prompts


def code_file(rng: random.Random, n_lines: int) -> tuple[str, list[str]]:
    """A small Python file of word-named functions, about `n_lines` lines; and its names."""
    lines: list[str] = []
    names: list[str] = []
    while len(lines) < n_lines:
        fn, a, b, c = (rng.choice(WORDS) for _ in range(4))
        names += [a, b]
        lines += [
            f"def {fn}_{c}({a}, {b}):",
            f"    {c} = {a} + {b} * {len(lines) + 1}",
            f"    return {c} - {a}",
            "",
        ]
    return "\n".join(lines), names


def code_edit(n: int, seed: int, shape: Shape) -> list[Prompt]:
    rng = random.Random(seed)
    tools = [
        f"You are coding agent {t}. Tools: read_file, write_file, run_tests. "
        + paragraph(rng, shape.prefix_words)
        for t in range(shape.tenants)
    ]
    prompts = []
    for _ in range(n):
        tenant = rng.randrange(shape.tenants)
        code, names = code_file(rng, 2 * shape.answer_words // 5)
        old = rng.choice(names)
        task = (
            f"Rename the variable `{old}` to `{old}_value` in this file and return the "
            f"whole file, unchanged otherwise:\n```python\n{code}\n```"
        )
        messages = [{"role": "system", "content": tools[tenant]}, {"role": "user", "content": task}]
        prompts.append(Prompt(messages, f"agent-{tenant}"))
    return prompts


COLD_MIX_LONG_OUTPUT = 16  # cold_mix: a long prompt's output tokens (a summary's first line)


def cold_mix(n: int, seed: int, shape: Shape) -> list[Prompt]:
    rng = random.Random(seed)
    prompts = []
    for i in range(n):
        if i % shape.long_every == shape.long_every - 1:
            opening = " ".join(rng.choice(WORDS) for _ in range(3)).capitalize()
            document = f"{opening}. " + paragraph(rng, shape.prefix_words)
            messages = [{"role": "user", "content": f"Summarise this document. {document}"}]
            prompts.append(Prompt(messages, f"cold-{i}", COLD_MIX_LONG_OUTPUT))
        else:
            opening = " ".join(rng.choice(WORDS) for _ in range(2))
            messages = [
                {
                    "role": "user",
                    "content": f"Tell a long story about {opening}. "
                    + question(rng, shape.question_words),
                }
            ]
            prompts.append(Prompt(messages, f"decode-{i}"))
    return prompts


WORKLOADS: dict[str, Callable[[int, int, Shape], list[Prompt]]] = {
    "multi_tenant": multi_tenant,
    "multi_turn": multi_turn,
    "few_shot": few_shot,
    "control": control,
    "code_edit": code_edit,
    "cold_mix": cold_mix,
}
ALIASES = {
    "chat": "multi_tenant",
    "conversation": "multi_turn",
    "fewshot": "few_shot",
    "code": "code_edit",
}


def build(name: str, n: int, seed: int, shape: Shape | None = None) -> list[Prompt]:
    """The prompts of workload `name` (or an alias such as "chat"); ValueError if unknown."""
    key = ALIASES.get(name, name)
    if key not in WORKLOADS:
        known = ", ".join([*WORKLOADS, *ALIASES])
        raise ValueError(f"unknown workload {name!r}; choose one of: {known}")
    return WORKLOADS[key](n, seed, shape or Shape())
