"""A tiny model directory (tokenizer + config only) for tests and benchmarks: no weights."""

from __future__ import annotations

import json
from pathlib import Path

CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "hello world, you are a helpful assistant; answer the user",
    "system user assistant: what is the capital of france? paris.",
]


def build_tiny_model(directory: Path, context_length: int = 256, vocab_size: int = 400) -> Path:
    """A byte-level BPE tokenizer with a ChatML chat template, eos <|im_end|>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_CORPUS * 4, trainer)
    tokenizer.save(str(directory / "tokenizer.json"))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "chat_template": CHATML_TEMPLATE,
        "model_max_length": context_length,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    config = {
        "model_type": "llama",
        "max_position_embeddings": context_length,
        "eos_token_id": tokenizer.token_to_id("<|im_end|>"),
    }
    (directory / "config.json").write_text(json.dumps(config))
    return directory
