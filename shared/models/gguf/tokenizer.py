"""Rebuild a Hugging Face `tokenizer.json` from a GGUF file's BPE vocabulary.

GGUF keeps the vocab, the merges, each token's type (3 = control) and the chat template;
the pre-tokenizer is only named (`tokenizer.ggml.pre`), so we map the names we know to the
split rules llama.cpp uses for them.
"""

from __future__ import annotations

import json
from pathlib import Path

from shared.models.gguf.errors import GGUFError

CONTROL_TOKEN_TYPE = 3  # GGUF token type of control tokens (bos, eos, chat markers)

# GPT-2's split rule, as llama.cpp applies it for "gpt2"-style pre-tokenizers.
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _pre_tokenizer(pre: str):
    from tokenizers import Regex, pre_tokenizers

    split: list[pre_tokenizers.PreTokenizer]
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if pre in ("default", "gpt2", "gpt-2"):
        split = [pre_tokenizers.Split(Regex(_GPT2_SPLIT), behavior="isolated")]
    elif pre == "smollm":  # each digit alone, then GPT-2's rule
        split = [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.Split(Regex(_GPT2_SPLIT), behavior="isolated"),
        ]
    elif pre in ("llama-bpe", "llama3"):
        split = [pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated")]
    else:
        raise GGUFError(f"unsupported GGUF pre-tokenizer {pre!r} (known: gpt2, smollm, llama-bpe)")
    return pre_tokenizers.Sequence([*split, byte_level])


def build_tokenizer(meta: dict):
    """A `tokenizers.Tokenizer` equivalent to the GGUF's BPE tokenizer."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, processors

    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise GGUFError(f"only byte-level BPE ('gpt2') GGUF tokenizers are supported, not {kind!r}")
    tokens = list(meta["tokenizer.ggml.tokens"])
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    tokenizer.pre_tokenizer = _pre_tokenizer(str(meta.get("tokenizer.ggml.pre", "default")))
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    tokenizer.add_special_tokens(
        [AddedToken(tokens[i], special=True, normalized=False) for i in control_token_ids(meta)]
    )
    return tokenizer


def control_token_ids(meta: dict) -> list[int]:
    types = meta.get("tokenizer.ggml.token_type")
    if types is None:
        return []
    return [i for i, t in enumerate(types.tolist()) if t == CONTROL_TOKEN_TYPE]


def _token(meta: dict, key: str) -> str | None:
    value = meta.get(f"tokenizer.ggml.{key}_token_id")
    if value is None:
        return None
    return meta["tokenizer.ggml.tokens"][int(value.item())]


def write_tokenizer(meta: dict, out_dir: Path) -> None:
    """Write tokenizer.json and tokenizer_config.json (chat template, special tokens)."""
    tokenizer = build_tokenizer(meta)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    tokens = meta["tokenizer.ggml.tokens"]
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": _token(meta, "bos"),
        "eos_token": _token(meta, "eos"),
        "unk_token": _token(meta, "unknown"),
        "pad_token": _token(meta, "padding"),
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(meta.get("llama.context_length", 2048)),
        "additional_special_tokens": [tokens[i] for i in control_token_ids(meta)],
    }
    if template := meta.get("tokenizer.chat_template"):
        config["chat_template"] = str(template)
    config = {k: v for k, v in config.items() if v is not None}
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    special = {
        k: config[k] for k in ("bos_token", "eos_token", "unk_token", "pad_token") if k in config
    }
    (out_dir / "special_tokens_map.json").write_text(json.dumps(special, indent=2))
