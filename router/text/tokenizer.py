"""The model's own tokenizer and chat template, loaded from a local model directory."""

from __future__ import annotations

import bisect
import functools
import json
import logging
from collections.abc import Sequence
from pathlib import Path

from router.text.detokenize import IncrementalDetokenizer
from router.text.volatile import VolatileText
from shared.models.store import DEFAULT_CONTEXT_LENGTH, config_context_length
from shared.models.vision import VisionSpec, vision_spec

log = logging.getLogger(__name__)

_PROBE = "\x00mlx-fleet-probe\x00"


class ModelTokenizer:
    """Encodes prompts and chat messages, decodes token streams, knows the stop tokens."""

    def __init__(
        self,
        hf_tokenizer,
        context_length: int,
        eos_token_ids: Sequence[int] = (),
        volatile: VolatileText | None = None,
    ):
        self._tok = hf_tokenizer
        self.context_length = context_length
        # per-request metadata taken out of system messages before templating
        self.volatile = volatile if volatile is not None else VolatileText()
        eos = set(eos_token_ids)
        if hf_tokenizer.eos_token_id is not None:
            eos.add(hf_tokenizer.eos_token_id)
        self.eos_token_ids = tuple(sorted(eos))
        self.chat_stop_token_ids = tuple(sorted(eos | self._chat_end_tokens()))
        # how the model writes calls and reasoning (router/chat/dialects): set by the router
        # at load (set_dialect), from the template and vocabulary or the operator's names
        self.dialect = None
        self._ll_tokenizer = None  # llguidance's, for token bytes
        # images: how the model's processor places them (None: it takes none; then
        # `vision_error` says why when it has a vision tower we do not serve)
        self.vision: VisionSpec | None = None
        self.vision_error: str | None = None

    @classmethod
    def load(
        cls,
        model_dir: Path,
        context_length: int | None = None,
        volatile: VolatileText | None = None,
    ) -> ModelTokenizer:
        from transformers import AutoTokenizer  # slow import: only when a model is loaded

        hf_tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        config = _read_json(model_dir / "config.json")
        generation = _read_json(model_dir / "generation_config.json")
        eos = _as_ids(config.get("eos_token_id")) + _as_ids(generation.get("eos_token_id"))
        if context_length is None:
            context_length = _context_length(config, hf_tokenizer)
        tokenizer = cls(hf_tokenizer, int(context_length), eos, volatile)
        tokenizer.load_vision(model_dir)
        return tokenizer

    def load_vision(self, model_dir: Path) -> None:
        """Read how the model places images (shared.models.vision), or why it can't take them."""
        try:
            self.vision = vision_spec(Path(model_dir), self._tok.convert_ids_to_tokens)
        except ValueError as e:  # a vision family whose images are not placed yet
            self.vision_error = str(e)
        except (KeyError, TypeError) as e:  # a config without the keys its family needs
            self.vision_error = f"its config.json does not say how images are placed ({e})"
        if self.vision_error:
            log.warning("%s: image input is off: %s", model_dir, self.vision_error)

    @property
    def vocab_size(self) -> int:
        return len(self._tok)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self._tok, "chat_template", None))

    def encode_prompt(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=True)

    @property
    def template_source(self) -> str:
        template = getattr(self._tok, "chat_template", None) or ""
        return template if isinstance(template, str) else json.dumps(template)

    def set_chat_template(self, template: str) -> None:
        """Replace the model's chat template (--chat-template)."""
        self._tok.chat_template = template
        self.chat_stop_token_ids = tuple(sorted(set(self.eos_token_ids) | self._chat_end_tokens()))

    def set_dialect(self, dialect) -> None:
        """The model's dialect (router/chat/dialects.Dialect); a dialect that names the tokens
        ending a turn (harmony: <|return|>, <|call|>) replaces what the template probe found."""
        self.dialect = dialect
        ends = [self._tok.convert_tokens_to_ids(t) for t in dialect.end_tokens]
        ends = [i for i in ends if isinstance(i, int) and i != self._tok.unk_token_id]
        if ends:
            self.chat_stop_token_ids = tuple(sorted(set(self.eos_token_ids) | set(ends)))

    @property
    def vocab(self) -> dict[str, int]:
        return self._tok.get_vocab()

    @functools.cached_property
    def special_tokens(self) -> tuple[str, ...]:
        """The strings of every special token (what skip_special_tokens drops)."""
        decoder = getattr(self._tok, "added_tokens_decoder", {})
        return tuple(
            sorted(
                set(self._tok.all_special_tokens)
                | {t.content for t in decoder.values() if t.special}
            )
        )

    @functools.cached_property
    def added_tokens(self) -> tuple[str, ...]:
        """The strings of every added token, special or not (llguidance reads them all as
        special: a grammar names them by id, `<[id]>`)."""
        decoder = getattr(self._tok, "added_tokens_decoder", {})
        return tuple(sorted({t.content for t in decoder.values()} | set(self.special_tokens)))

    def token_id(self, text: str) -> int | None:
        """The id of `text` when it is one token of the vocabulary, else None."""
        token_id = self._tok.convert_tokens_to_ids(text)
        return (
            token_id if isinstance(token_id, int) and token_id != self._tok.unk_token_id else None
        )

    def render_chat(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        template_kwargs=None,
        add_generation_prompt: bool = True,
    ) -> str:
        """The templated conversation as text, ending with the assistant's generation prompt
        (unless `add_generation_prompt` is false: /tokenize may ask for the bare history)."""
        return self._tok.apply_chat_template(
            messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            **(template_kwargs or {}),
        )

    def encode_chat(self, messages: list[dict]) -> list[int]:
        """The templated conversation, ending with the assistant's generation prompt."""
        return self.encode_text(self.render_chat(messages))

    def encode_text(self, text: str) -> list[int]:
        """Text that already holds its special tokens (a rendered template)."""
        return self._tok.encode(text, add_special_tokens=False)

    def encode_text_within(self, text: str, ends: Sequence[int]) -> tuple[list[int], list[int]]:
        """`encode_text(text)`, and for each character offset in `ends` how many of its leading
        tokens lie wholly within text[:end]: one tokenization, by the fast tokenizer's
        offsets (a slow tokenizer has none: each prefix is tokenized and compared)."""
        if not getattr(self._tok, "is_fast", False):
            ids = self.encode_text(text)
            return ids, [_common_prefix(self.encode_text(text[:end]), ids) for end in ends]
        encoded = self._tok(text, add_special_tokens=False, return_offsets_mapping=True)
        token_ends = [stop for _, stop in encoded["offset_mapping"]]
        return list(encoded["input_ids"]), [bisect.bisect_right(token_ends, end) for end in ends]

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def token_strings(self, token_ids: Sequence[int]) -> list[str]:
        """The vocabulary's own strings for the ids (vLLM's /tokenize `token_strs`)."""
        return self._tok.convert_ids_to_tokens(list(token_ids))

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (part of a character, for some): logprobs show
        each token on its own."""
        if self._ll_tokenizer is None:
            from shared.grammar import ll_tokenizer  # built on first use: ~0.4 s for 49k

            self._ll_tokenizer = ll_tokenizer(self._tok)
        return self._ll_tokenizer.decode_bytes([token_id])

    def detokenizer(self, skip_special_tokens: bool = True) -> IncrementalDetokenizer:
        if skip_special_tokens:
            return IncrementalDetokenizer(self.decode)
        return IncrementalDetokenizer(lambda ids: self.decode(ids, skip_special_tokens=False))

    def _chat_end_tokens(self) -> set[int]:
        """Special tokens the template puts right after an assistant turn (e.g. <|im_end|>)."""
        if not self.has_chat_template:
            return set()
        turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _PROBE}]
        try:
            text = self._tok.apply_chat_template(turns, tokenize=False)
        except Exception as e:  # templates are user-supplied Jinja; any failure means "unknown"
            log.warning("could not probe the chat template for its end token: %s", e)
            return set()
        after = text[text.find(_PROBE) + len(_PROBE) :]
        special = set(self._tok.all_special_ids) | {
            i for i, t in getattr(self._tok, "added_tokens_decoder", {}).items() if t.special
        }
        for token_id in self._tok.encode(after, add_special_tokens=False):
            if token_id in special:
                return {token_id}
        return set()


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def read_chat_template(file_or_text: str) -> str:
    """--chat-template: the file's text when it names a file, else the template itself."""
    path = Path(file_or_text).expanduser()
    if "{" not in file_or_text and path.is_file():
        return path.read_text()
    if "{{" not in file_or_text and "{%" not in file_or_text:
        raise ValueError(f"--chat-template {file_or_text!r}: no such file, and not a template")
    return file_or_text


def _context_length(config: dict, hf_tokenizer) -> int:
    if (declared := config_context_length(config)) is not None:
        return declared
    # Tokenizers without a limit report a huge sentinel (1e30) here.
    limit = getattr(hf_tokenizer, "model_max_length", None)
    if isinstance(limit, int) and limit < 10_000_000:
        return limit
    return DEFAULT_CONTEXT_LENGTH


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def _as_ids(value) -> list[int]:
    if isinstance(value, int):
        return [value]
    return [v for v in value or () if isinstance(v, int)]
