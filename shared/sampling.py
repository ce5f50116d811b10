"""Sampling parameters: built by the router from the HTTP body, carried to the worker."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

MAX_TOP_LOGPROBS = 20
GRAMMAR_KINDS = ("json_schema", "lark")


class InvalidRequest(ValueError):
    """A request a user sent that can't be served as asked; the message says why."""


@dataclass(frozen=True, slots=True)
class LogitBias:
    """Added to one token's logit before sampling (OpenAI `logit_bias`, -100..100)."""

    token_id: int
    bias: float


@dataclass(frozen=True, slots=True)
class Grammar:
    """What the output must match, enforced token by token in the worker (llguidance).

    kind "json_schema": `source` is a JSON schema as JSON text; "lark": a Lark grammar (which
    may embed `%json{...}`), for wrappers around JSON such as tool-call tags.
    """

    kind: str
    source: str


@dataclass(frozen=True, slots=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    min_p: float = 0.0  # 0 = off
    max_tokens: int = 256
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int = 0  # alternatives reported per token (with logprobs)
    logit_bias: tuple[LogitBias, ...] = field(default_factory=tuple)
    presence_penalty: float = 0.0  # OpenAI: once per token id generated so far
    frequency_penalty: float = 0.0  # OpenAI: per occurrence in the output so far
    repetition_penalty: float = 1.0  # HF: over prompt + output tokens; 1 = off
    grammar: Grammar | None = None
    # The prompt's last `prior_output_tokens` tokens are this request's own earlier output
    # (a request moved to another worker mid-generation): penalties count them as output and
    # the grammar has already consumed them.
    prior_output_tokens: int = 0
    # vLLM's `prompt_logprobs`: each prompt token's log-probability given the tokens before it,
    # with this many alternatives (None: not asked; such a request skips the prefix cache)
    prompt_logprobs: int | None = None
    # vLLM's min_tokens: no stop token can be sampled before this many output tokens (its
    # logits are masked); ignore_eos is the router leaving EOS out of stop_token_ids
    min_tokens: int = 0

    def validate(self, vocab_size: int | None = None) -> None:
        """Raise InvalidRequest naming the first bad value."""
        if not 0.0 <= self.temperature <= 100.0:
            raise InvalidRequest(f"temperature must be in [0, 100], got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequest(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise InvalidRequest(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 <= self.min_p < 1.0:
            raise InvalidRequest(f"min_p must be in [0, 1), got {self.min_p}")
        if self.max_tokens < 0:  # 0: the prompt only (scored with prompt_logprobs)
            raise InvalidRequest(f"max_tokens must be >= 0, got {self.max_tokens}")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise InvalidRequest(f"seed must be in [0, 2**63), got {self.seed}")
        self._validate_logit_processing(vocab_size)

    def _validate_logit_processing(self, vocab_size: int | None) -> None:
        if not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise InvalidRequest(
                f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {self.top_logprobs}"
            )
        if self.prompt_logprobs is not None and not 0 <= self.prompt_logprobs <= MAX_TOP_LOGPROBS:
            raise InvalidRequest(
                f"prompt_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {self.prompt_logprobs}"
            )
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise InvalidRequest(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if not 0.0 < self.repetition_penalty <= 10.0:
            raise InvalidRequest(
                f"repetition_penalty must be in (0, 10], got {self.repetition_penalty}"
            )
        for entry in self.logit_bias:
            if not -100.0 <= entry.bias <= 100.0:
                raise InvalidRequest(
                    f"logit_bias values must be in [-100, 100], got {entry.bias} "
                    f"for token {entry.token_id}"
                )
            if entry.token_id < 0 or (vocab_size is not None and entry.token_id >= vocab_size):
                raise InvalidRequest(
                    f"logit_bias token {entry.token_id} is outside the vocabulary [0, {vocab_size})"
                )
        if self.grammar is not None and self.grammar.kind not in GRAMMAR_KINDS:
            raise InvalidRequest(f"grammar kind must be one of {GRAMMAR_KINDS}")
        if self.prior_output_tokens < 0:
            raise InvalidRequest("prior_output_tokens must be >= 0")
        if not 0 <= self.min_tokens <= self.max_tokens + self.prior_output_tokens:
            raise InvalidRequest(f"min_tokens must be in [0, max_tokens], got {self.min_tokens}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        return bool(self.presence_penalty or self.frequency_penalty) or (
            self.repetition_penalty != 1.0
        )

    @property
    def processes_logits(self) -> bool:
        """Whether anything changes this request's logits before sampling."""
        return (
            bool(self.logit_bias)
            or self.has_penalties
            or self.grammar is not None
            or self.masks_stops
        )

    @property
    def masks_stops(self) -> bool:
        """Whether stop tokens are masked for a while (min_tokens not yet reached)."""
        return self.min_tokens > self.prior_output_tokens and bool(self.stop_token_ids)

    @property
    def needs_host_step(self) -> bool:
        """Whether each step needs the previous token on the host first (a grammar's matcher
        advances with it before the next mask exists): such a sequence is not pipelined."""
        return self.grammar is not None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["stop_token_ids"] = list(self.stop_token_ids)
        d["logit_bias"] = [asdict(b) for b in self.logit_bias]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> SamplingParams:
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        if "stop_token_ids" in known:
            known["stop_token_ids"] = tuple(known["stop_token_ids"])
        if "logit_bias" in known:
            known["logit_bias"] = tuple(LogitBias(**b) for b in known["logit_bias"])
        if isinstance(known.get("grammar"), dict):
            known["grammar"] = Grammar(**known["grammar"])
        return cls(**known)
