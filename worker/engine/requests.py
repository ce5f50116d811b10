"""A request at the engine's edge: checked against this engine's limits, then made into the
`Sequence` the scheduler runs. Validation happens here, once; inside, the data is trusted."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable
from typing import TYPE_CHECKING

from shared.models.vision import IMAGE_KEY_BASE, image_positions
from shared.sampling import InvalidRequest, SamplingParams
from worker.engine.sequence import Sequence
from worker.engine.speculative import DraftState
from worker.runner.logits_processors import LogitsState

if TYPE_CHECKING:
    from shared.protocol import CachePin, ImageInput, TokenDelta
    from worker.config import EngineConfig
    from worker.engine.caches import KVManager
    from worker.engine.step_kind import StepPlan
    from worker.runner.grammar import GrammarCompiler
    from worker.vision.encoder import PreparedImages, VisionEncoder


# cache pins one request may carry (Anthropic allows 4 cache_control breakpoints, OpenAI's
# retention is one more)
MAX_PINS = 8


class RequestIntake:
    """Checks requests (`check`, no side effects) and builds their sequences (`sequence`)."""

    def __init__(
        self,
        config: EngineConfig,
        vocab_size: int,
        max_context: int,
        kv: KVManager,
        grammars: GrammarCompiler | None,
    ) -> None:
        self.config, self.vocab_size, self.max_context = config, vocab_size, max_context
        self.kv, self.grammars = kv, grammars  # the KV manager: how much a prompt may take
        self._arrivals = itertools.count()
        # vision models with the extra: the image side (None: images are refused, saying why)
        self.vision: VisionEncoder | None = None
        self.vision_note = "this model does not take images"

    def check(
        self,
        request_id: str,
        token_ids: list[int],
        sampling: SamplingParams,
        n: int,
        is_running: Callable[[str], bool],
        images: tuple[ImageInput, ...] = (),
        pins: tuple[CachePin, ...] = (),
    ) -> None:
        """Raise InvalidRequest naming the first thing wrong with the request."""
        if not isinstance(request_id, str) or not request_id:
            raise InvalidRequest("request_id must be a non-empty string")
        if is_running(request_id):
            raise InvalidRequest(f"request {request_id!r} is already running")
        self._check_prompt(token_ids, images)
        self._check_pins(pins, len(token_ids))
        if images and sampling.prompt_logprobs is not None:
            raise InvalidRequest("prompt logprobs are not served for prompts with images")
        sampling.validate(self.vocab_size)
        if not isinstance(n, int) or not 1 <= n <= self.config.max_running:
            raise InvalidRequest(f"n must be an integer in [1, {self.config.max_running}]")

    @staticmethod
    def _check_pins(pins: tuple[CachePin, ...], prompt_len: int) -> None:
        """Raise InvalidRequest naming the first cache pin that cannot be one of this prompt's:
        at most MAX_PINS, each over 1 .. len(prompt) tokens, for a positive finite time."""
        if len(pins) > MAX_PINS:
            raise InvalidRequest(f"{len(pins)} cache pins; at most {MAX_PINS} per request")
        for i, pin in enumerate(pins):
            if not isinstance(pin.num_tokens, int) or not 1 <= pin.num_tokens <= prompt_len:
                raise InvalidRequest(
                    f"cache pin {i}: num_tokens must be in [1, {prompt_len}] (the prompt's "
                    f"length), got {pin.num_tokens!r}"
                )
            if not isinstance(pin.ttl_s, int | float) or not 0 < pin.ttl_s < math.inf:
                raise InvalidRequest(
                    f"cache pin {i}: ttl_s must be a finite number of seconds > 0, got {pin.ttl_s!r}"
                )

    def _check_prompt(self, token_ids: list[int], images: tuple[ImageInput, ...]) -> None:
        if not token_ids:
            raise InvalidRequest("the prompt is empty")
        vocab = self.vocab_size
        if any(not isinstance(t, int) or t < 0 or vocab <= t < IMAGE_KEY_BASE for t in token_ids):
            raise InvalidRequest(f"prompt token ids must be integers in [0, {vocab})")
        keys = len(image_positions(token_ids))
        if keys or images:
            if self.vision is None:
                raise InvalidRequest(self.vision_note)
            if keys != sum(image.tokens for image in images):
                raise InvalidRequest(
                    f"the prompt holds {keys} image keys for its images' "
                    f"{sum(i.tokens for i in images)} tokens"
                )
        if len(token_ids) >= self.max_context:
            raise InvalidRequest(
                f"the prompt has {len(token_ids)} tokens; this model's context is {self.max_context} "
                "tokens, and at least one must be left to generate"
            )
        usable = self.kv.max_prompt_units
        need = self.kv.prompt_units(len(token_ids) + 1)
        if need > usable:
            raise InvalidRequest(
                f"the prompt needs more KV memory than this worker has ({usable} blocks)"
            )

    def prepare(
        self, token_ids: list[int], images: tuple[ImageInput, ...]
    ) -> PreparedImages | None:
        """A prompt's images decoded, preprocessed and placed (M-RoPE), or None when there
        are none to take (`check` says why, if any were given). Host work that reads no
        engine state and no device array: safe on any thread, and meant for another than the
        engine's. InvalidRequest naming the image that is not one."""
        if not images or self.vision is None:
            return None
        return self.vision.prepare_prompt(token_ids, images)

    def sequence(
        self,
        request_id: str,
        token_ids: list[int],
        sampling: SamplingParams,
        n: int,
        images: tuple[ImageInput, ...] = (),
        prepared: PreparedImages | None = None,
        pins: tuple[CachePin, ...] = (),
    ) -> Sequence:
        """The sequence of a checked request: its seed, sampling state, drafting state and
        images (`prepared`, else prepared here, on the caller's thread: InvalidRequest if one
        is not an image)."""
        seed = sampling.seed if sampling.seed is not None else random.getrandbits(63)
        prompt_images = None
        if images and self.vision is not None:
            from worker.vision.prompt_images import PromptImages

            prepared = prepared or self.prepare(token_ids, images)
            prompt_images = PromptImages(token_ids, prepared, self.vision)
        return Sequence(
            request_id=request_id,
            prompt_len=len(token_ids),
            tokens=list(token_ids),
            sampling=sampling,
            arrival=next(self._arrivals),
            seed=seed,
            forks=n - 1,
            logits_state=LogitsState.create(sampling, token_ids, self.vocab_size, self.grammars),
            drafting=DraftState() if self._may_draft(sampling, n) and not images else None,
            images=prompt_images,
            pins=tuple(pins),
        )

    def _may_draft(self, sampling: SamplingParams, n: int) -> bool:
        """Speculative decoding keeps greedy output identical; sampled requests don't draft."""
        # nor do requests with logit processors: their state advances once per step
        return (
            self.config.speculative != "off"
            and sampling.greedy
            and n == 1
            and not sampling.processes_logits
        )

    @staticmethod
    def encode_images(plan: StepPlan, fail: Callable[..., list[TokenDelta]]) -> list[TokenDelta]:
        """Run the vision tower, one prompt at a time, for the chunks of `plan` that first
        reach their images: a prompt whose tower fails ends alone (`fail`'s deltas), before
        the forward the others share."""
        failed: list[TokenDelta] = []
        for seq, n in plan.prefill:
            if seq.images is None or not seq.images.needs_encoding(seq.num_computed, n):
                continue
            try:
                seq.images.encode()
            except Exception as exc:
                failed += fail([seq], exc, "the vision tower failed on its images")
        return failed
