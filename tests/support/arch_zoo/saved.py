"""A zoo architecture saved as a model directory, the form a worker loads (`Engine.from_path`,
`cluster-worker --model DIR`): config.json, model.safetensors, and a word-level tokenizer of
exactly the zoo's vocabulary (a byte-level BPE needs 259 ids at least, more than the zoo's 128),
with a ChatML template. The weights are the built model's own, so `build(name, seed)` is the
reference for what the directory answers.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten

from . import ARCHITECTURES, build
from .base import VOCAB

SPECIAL = ["<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def word_vocabulary(size: int = VOCAB) -> dict[str, int]:
    """`size` ids: the special tokens, then the words " w4", " w5", ... (written Ġw4: the
    byte-level alphabet's space)"""
    words = SPECIAL + [f"\u0120w{i}" for i in range(len(SPECIAL), size)]
    return {word: i for i, word in enumerate(words)}


def save_tokenizer(directory: Path, context_length: int = 512, size: int = VOCAB) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel(word_vocabulary(size), unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.WhitespaceSplit(),
            pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()  # llguidance (the grammar side) needs a decoder
    tokenizer.add_special_tokens(SPECIAL)
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": None,
                "eos_token": "<|im_end|>",
                "unk_token": "<unk>",
                "pad_token": "<|endoftext|>",
                "chat_template": CHATML,
                "model_max_length": context_length,
            }
        )
    )


def save(name: str, directory: Path, seed: int = 0) -> Path:
    """The zoo's `name`, random weights from `seed`, written to `directory` (created)."""
    directory.mkdir(parents=True, exist_ok=True)
    model = build(name, seed)
    mx.save_safetensors(
        str(directory / "model.safetensors"), dict(tree_flatten(model.parameters()))
    )
    config = {**ARCHITECTURES[name], "eos_token_id": word_vocabulary()["<|im_end|>"]}
    (directory / "config.json").write_text(json.dumps(config))
    save_tokenizer(directory)
    return directory
