"""A job's token deltas -> text pieces: detokenized, stop strings applied, usage counted.

With n > 1 the worker forks the request after one prefill (`Generate.n`) and the dispatcher
hands each choice its own sub-job (`job.choices`): each choice becomes text on its own
(detokenizer, stop strings, logprobs), and a stop string ends its choice alone.

The jobs are the dispatcher's (router/routing/job.py), read here through `ReplyJob`, what this
module needs of one: its events, and `cancel()` to stop it once a stop string has matched.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from router.errors import ApiError, generation_failed
from router.text.detokenize import StopMatcher
from router.text.logprobs import LogprobEntry, entries_of, prompt_entries_of

if TYPE_CHECKING:
    from router.text.tokenizer import ModelTokenizer
    from shared.protocol import TokenDelta
    from shared.sampling import SamplingParams


class ReplyJob(Protocol):
    """A job in flight as its reader sees it (router.routing.job.Job is one)."""

    prompt_ids: tuple[int, ...]
    sampling: SamplingParams
    events: asyncio.Queue[TokenDelta]
    cached_tokens: int
    index: int  # of a choice of an n > 1 job

    @property
    def choices(self) -> Sequence[ReplyJob]: ...

    @property
    def completion_tokens(self) -> int: ...

    def cancel(self) -> None:
        """No more of it is wanted (a no-op once it finished)."""


@dataclass(frozen=True)
class Piece:
    text: str
    finish_reason: str | None = None  # set on the last piece: "stop" | "length"
    # the tokens that arrived since the last piece, when logprobs were asked for (a token's
    # text may still be held back: by a partial character or a possible stop string); the
    # first piece starts with the prompt's entries (`prompt=True`) when they were asked for
    logprobs: tuple[LogprobEntry, ...] = ()
    stop_string: str | None = None  # the stop string that ended the reply, if one did


@dataclass(frozen=True)
class UsageCount:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int

    def to_json(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }


@dataclass(frozen=True)
class TextOptions:
    """How a reply's tokens become text (vLLM's extensions; the defaults are OpenAI's)."""

    include_stop_str: bool = False
    skip_special_tokens: bool = True


def usage_of(job: ReplyJob) -> UsageCount:
    """The prompt counted once, the completions of every choice added up."""
    return UsageCount(len(job.prompt_ids), job.completion_tokens, job.cached_tokens)


def usage_of_all(jobs: Sequence[ReplyJob]) -> UsageCount:
    """Several prompts' jobs: their usages added up (as OpenAI counts a batch)."""
    usages = [usage_of(j) for j in jobs]
    if len(usages) == 1:
        return usages[0]
    return UsageCount(
        sum(u.prompt_tokens for u in usages),
        sum(u.completion_tokens for u in usages),
        sum(u.cached_tokens for u in usages),
    )


async def batch_pieces(
    jobs: Sequence[ReplyJob],
    n: int,
    tokenizer: ModelTokenizer,
    stop: tuple[str, ...],
    options: TextOptions = TextOptions(),
) -> AsyncIterator[tuple[int, Piece]]:
    """choice_pieces of several prompts' jobs, merged: prompt k's choice i is choice k x n + i
    (OpenAI's order). The first ApiError of any is raised; close it to stop them all."""
    if len(jobs) == 1:
        async for item in choice_pieces(jobs[0], tokenizer, stop, options):
            yield item
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(k: int, job: ReplyJob) -> None:
        items = choice_pieces(job, tokenizer, stop, options)
        try:
            async for index, piece in items:
                await queue.put((k * n + index, piece))
        except ApiError as e:
            await queue.put((k, e))
        finally:
            await items.aclose()
            await queue.put((k, None))

    merged = _merged(queue, [pump(k, job) for k, job in enumerate(jobs)])
    async with contextlib.aclosing(merged):  # closing us cancels the pumps now, not at GC
        async for item in merged:
            yield item


async def _merged(queue: asyncio.Queue, pumps: list) -> AsyncIterator[tuple[int, Piece]]:
    """What the pumps put in `queue` until each has put its None; an ApiError is raised."""
    tasks = [asyncio.create_task(p) for p in pumps]
    try:
        running = len(tasks)
        while running:
            index, item = await queue.get()
            if item is None:
                running -= 1
            elif isinstance(item, ApiError):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()


async def choice_pieces(
    job: ReplyJob,
    tokenizer: ModelTokenizer,
    stop: tuple[str, ...],
    options: TextOptions = TextOptions(),
) -> AsyncIterator[tuple[int, Piece]]:
    """(choice index, piece) of every choice of `job`, in the order they come; the first
    ApiError of any choice is raised. Close it (aclose) to stop the choices' readers."""
    if not job.choices:
        async for piece in pieces(job, tokenizer, stop, options):
            yield 0, piece
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(choice: ReplyJob) -> None:
        try:
            async for piece in pieces(choice, tokenizer, stop, options):
                await queue.put((choice.index, piece))
        except ApiError as e:
            await queue.put((choice.index, e))
        finally:
            await queue.put((choice.index, None))

    merged = _merged(queue, [pump(c) for c in job.choices])
    async with contextlib.aclosing(merged):  # closing us cancels the pumps now, not at GC
        async for item in merged:
            yield item


async def pieces(
    job: ReplyJob,
    tokenizer: ModelTokenizer,
    stop: tuple[str, ...],
    options: TextOptions = TextOptions(),
) -> AsyncIterator[Piece]:
    """Text as it becomes safe to show; the last piece has the finish reason.

    Raises ApiError (500) when the worker reports an error or the job could not be finished.
    """
    detokenizer = tokenizer.detokenizer(options.skip_special_tokens)
    matcher = StopMatcher(stop, options.include_stop_str)
    stop_ids = set(job.sampling.stop_token_ids)
    logprobs: list[LogprobEntry] = []
    prompt_scored = False  # once: a request moved to another worker is scored again there
    while True:
        delta = await job.events.get()
        if delta.finish_reason in ("error", "abort"):
            raise generation_failed(
                delta.error or f"the worker ended the request ({delta.finish_reason})"
            )
        if not prompt_scored and delta.prompt_logprobs is not None:
            logprobs += prompt_entries_of(delta, job.prompt_ids)
            prompt_scored = True
        logprobs += entries_of(delta, stop_ids)
        text = matcher.feed(detokenizer.add([t for t in delta.token_ids if t not in stop_ids]))
        if matcher.stopped:
            job.cancel()
            yield Piece(text, "stop", tuple(logprobs), matcher.matched)
            return
        if delta.finish_reason is None:
            if text or logprobs:
                yield Piece(text, None, tuple(logprobs))
                logprobs = []
            continue
        text += matcher.feed(detokenizer.flush())
        text += matcher.flush()
        yield Piece(
            text,
            "stop" if matcher.stopped else delta.finish_reason,
            tuple(logprobs),
            matcher.matched,
        )
        return
