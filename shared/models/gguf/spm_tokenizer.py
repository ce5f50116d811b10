"""A fast tokenizer from a GGUF's SentencePiece vocabulary (`tokenizer.ggml.model` "llama"),
built by transformers' own GGUF tokenizer converter.

Gemma's files need care we don't want to repeat: no merges are stored, so they are rebuilt
from the token order (not the scores), and tokens of several spaces are respelled with
"▁". transformers does both in `convert_gguf_tokenizer`. We call that builder rather than
`AutoTokenizer.from_pretrained(dir, gguf_file=...)` because, in transformers 5.24, that
entry point goes through a GGUF reader that imports torch, which we don't install; the
builder needs only `tokenizers`. We feed it the metadata our own header reader decoded.
"""

from __future__ import annotations

import json
from pathlib import Path

from shared.models.gguf.errors import GGUFError

_SPECIAL = {"bos_token": "bos", "eos_token": "eos", "unk_token": "unknown", "pad_token": "padding"}


def _builder():
    try:
        from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer
    except ImportError as exc:
        import transformers

        raise GGUFError(
            "this transformers has no GGUF tokenizer builder "
            f"(transformers.integrations.gguf, found {transformers.__version__}); "
            "SentencePiece GGUF vocabularies need transformers >= 5.24"
        ) from exc
    return convert_gguf_tokenizer


def build_sentencepiece_tokenizer(meta: dict):
    """A `tokenizers.Tokenizer` for the GGUF's SentencePiece vocabulary, BOS prepended when
    the file says so (`tokenizer.ggml.add_bos_token`)."""
    from tokenizers import processors

    tokens = list(meta["tokenizer.ggml.tokens"])
    tokenizer_dict = {
        "tokenizer_type": meta["tokenizer.ggml.model"],
        "pre_tokenizer_type": meta.get("tokenizer.ggml.pre"),
        "tokens": tokens,
        "scores": [float(s) for s in meta.get("tokenizer.ggml.scores", [0.0] * len(tokens))],
        "token_type": [int(t) for t in meta.get("tokenizer.ggml.token_type", [])],
        "add_prefix_space": bool(meta.get("tokenizer.ggml.add_space_prefix", False)),
    }
    tokenizer, _ = _builder()(str(meta["general.architecture"]), tokenizer_dict)
    bos = special_token(meta, "bos")
    if bos is not None and meta.get("tokenizer.ggml.add_bos_token", True):
        bos_id = tokens.index(bos)
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B:1", special_tokens=[(bos, bos_id)]
        )
    return tokenizer


def special_token(meta: dict, key: str) -> str | None:
    value = meta.get(f"tokenizer.ggml.{key}_token_id")
    return None if value is None else meta["tokenizer.ggml.tokens"][int(value)]


def write_sentencepiece_tokenizer(meta: dict, out_dir: Path, chat_template: str) -> None:
    """tokenizer.json, tokenizer_config.json and special_tokens_map.json into `out_dir`.

    `chat_template` is used when the file carries none (`tokenizer.chat_template`)."""
    build_sentencepiece_tokenizer(meta).save(str(out_dir / "tokenizer.json"))
    arch = meta["general.architecture"]
    special = {name: special_token(meta, key) for name, key in _SPECIAL.items()}
    special = {k: v for k, v in special.items() if v is not None}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special,
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", True)),
        "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(meta.get(f"{arch}.context_length", 2048)),
        "chat_template": str(meta.get("tokenizer.chat_template") or chat_template),
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (out_dir / "special_tokens_map.json").write_text(json.dumps(special, indent=2))
