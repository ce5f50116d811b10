"""Grammar-constrained decoding on the host: one llguidance matcher per sequence.

The tokenizer bridge is built once per worker (about 0.4 s for a 49k vocabulary). Each step,
the matchers of the grammar rows fill one packed bitmask (32 tokens per int32 word), which the
sampler unpacks on the device; after the step the sampled token advances the matcher.
"""

from __future__ import annotations

import logging

import numpy as np

from shared.grammar import check_grammar, ll_tokenizer
from shared.sampling import Grammar, InvalidRequest

log = logging.getLogger(__name__)


class GrammarCompiler:
    """Grammars -> matchers over one model's vocabulary."""

    def __init__(self, ll_tokenizer):
        import llguidance

        self.ll_tokenizer = ll_tokenizer
        self.vocab_size: int = ll_tokenizer.vocab_size
        self._executor = llguidance.LLExecutor(num_threads=2)

    @classmethod
    def from_hf_tokenizer(cls, hf_tokenizer, vocab_size: int) -> GrammarCompiler:
        """`vocab_size`: the model's logits width (may exceed the tokenizer's own count)."""
        ll = ll_tokenizer(hf_tokenizer, vocab_size)
        return cls(ll)

    def compile(self, grammar: Grammar, stop_token_ids: tuple[int, ...]) -> GrammarMatcher:
        """A fresh matcher; InvalidRequest naming the problem if the grammar is bad."""
        import llguidance

        matcher = llguidance.LLMatcher(self.ll_tokenizer, check_grammar(grammar), log_level=0)
        if matcher.is_error():
            raise InvalidRequest(f"invalid grammar: {matcher.get_error()}")
        return GrammarMatcher(matcher, stop_token_ids, self)

    def fill_masks(self, matchers: list[GrammarMatcher]) -> np.ndarray:
        """(len(matchers), words) int32: bit t of row i set when matcher i allows token t."""
        words = (self.vocab_size + 31) // 32
        masks = np.zeros((len(matchers), words), dtype=np.int32)
        if len(matchers) == 1:
            row = masks[0]
            matchers[0].matcher.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)
        else:  # the executor spreads the rows over threads, without the GIL
            pairs = [(m.matcher, i) for i, m in enumerate(matchers)]
            self._executor.unsafe_compute_mask_ptr(pairs, masks.ctypes.data, words * 4, len(pairs))
        for i, m in enumerate(matchers):
            m.mark_stop_tokens(masks[i])
        return masks


class GrammarMatcher:
    """One sequence's position in its grammar."""

    def __init__(self, matcher, stop_token_ids: tuple[int, ...], compiler: GrammarCompiler):
        self.matcher = matcher
        self.stop_token_ids = stop_token_ids
        self.compiler = compiler  # fills the masks of a step's grammar rows together

    def fork(self) -> GrammarMatcher:
        return GrammarMatcher(self.matcher.deep_copy(), self.stop_token_ids, self.compiler)

    def mark_stop_tokens(self, mask_row: np.ndarray) -> None:
        """The request's stop tokens (e.g. a chat turn's end) may end output only where the
        grammar accepts; llguidance knows only the tokenizer's EOS."""
        accepting = self.matcher.is_accepting()
        bits = mask_row.view(np.uint32)
        for t in self.stop_token_ids:
            if t // 32 < len(bits):
                if accepting:
                    bits[t // 32] |= np.uint32(1 << (t % 32))
                else:
                    bits[t // 32] &= ~np.uint32(1 << (t % 32))

    def advance(self, token: int) -> bool:
        """Consume the sampled `token`; True when the grammar is complete and nothing more
        can follow (or the matcher failed, which the mask should make impossible)."""
        if token in self.stop_token_ids:
            return True
        if not self.matcher.consume_token(token):
            log.warning("grammar matcher rejected token %d: %s", token, self.matcher.get_error())
            return True
        return self.matcher.is_stopped()

    def advance_all(self, tokens: list[int]) -> None:
        """Consume earlier output (a request resumed on this worker)."""
        if tokens and not self.matcher.consume_tokens(tokens):
            raise InvalidRequest(
                f"the earlier output does not match the grammar: {self.matcher.get_error()}"
            )
