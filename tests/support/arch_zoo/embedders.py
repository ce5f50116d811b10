"""Tiny random embedding models saved as model directories, the form a worker loads.

- `save_qwen3_embedder`: a Qwen3 decoder as the Qwen3-Embedding family ships it: the
  sentence-transformers files (last-token pooling, Normalize) and a tokenizer that appends
  `<|endoftext|>` to every input (the token whose state is the embedding).
- `save_bert_embedder`: a BERT encoder (mlx-embeddings' model) with a WordPiece tokenizer that
  wraps inputs in [CLS] ... [SEP], no sentence-transformers files (mean pooling by default).

Their references: `decoder_reference` (mlx-lm's model, the trunk run alone, pooled by hand)
and `encoder_reference` (mlx-embeddings' own `text_embeds`)."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from tests.support.tp_group import TINY_TP_QWEN3_ARGS, save_tiny_model

BERT_ARGS = dict(
    model_type="bert",
    architectures=["BertModel"],
    num_hidden_layers=2,
    num_attention_heads=4,
    hidden_size=32,
    intermediate_size=64,
    max_position_embeddings=128,
    vocab_size=64,
    type_vocab_size=2,
    layer_norm_eps=1e-12,
)
BERT_SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def save_qwen3_embedder(directory: Path, seed: int = 0, pooling: str = "lasttoken") -> Path:
    from tokenizers import Tokenizer, processors

    save_tiny_model(directory, seed=seed, args=TINY_TP_QWEN3_ARGS)
    config = json.loads((directory / "config.json").read_text())
    config["architectures"] = ["Qwen3ForCausalLM"]  # as Qwen3-Embedding's: the ST files say it
    (directory / "config.json").write_text(json.dumps(config))
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    end = tokenizer.token_to_id("<|endoftext|>")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="$A <|endoftext|>", special_tokens=[("<|endoftext|>", end)]
    )
    tokenizer.save(str(directory / "tokenizer.json"))
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
        {
            "idx": 2,
            "name": "2",
            "path": "2_Normalize",
            "type": "sentence_transformers.models.Normalize",
        },
    ]
    (directory / "modules.json").write_text(json.dumps(modules))
    (directory / "1_Pooling").mkdir(exist_ok=True)
    (directory / "1_Pooling" / "config.json").write_text(
        json.dumps(
            {
                "word_embedding_dimension": config["hidden_size"],
                f"pooling_mode_{pooling}": True,
            }
        )
    )
    return directory


def save_bert_embedder(directory: Path, seed: int = 0) -> Path:
    from mlx_embeddings.models import bert
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    directory.mkdir(parents=True, exist_ok=True)
    mx.random.seed(seed)
    model = bert.Model(bert.ModelArgs.from_dict(BERT_ARGS))
    mx.eval(model.parameters())
    mx.save_safetensors(
        str(directory / "model.safetensors"), dict(tree_flatten(model.parameters()))
    )
    (directory / "config.json").write_text(json.dumps(BERT_ARGS))
    vocab = BERT_SPECIAL + [f"w{i}" for i in range(len(BERT_SPECIAL), BERT_ARGS["vocab_size"])]
    ids = {word: i for i, word in enumerate(vocab)}
    tokenizer = Tokenizer(models.WordPiece(ids, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.post_processor = processors.BertProcessing(
        ("[SEP]", ids["[SEP]"]), ("[CLS]", ids["[CLS]"])
    )
    tokenizer.add_special_tokens(BERT_SPECIAL)
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "unk_token": "[UNK]",
                "pad_token": "[PAD]",
                "cls_token": "[CLS]",
                "sep_token": "[SEP]",
                "mask_token": "[MASK]",
                "model_max_length": BERT_ARGS["max_position_embeddings"],
            }
        )
    )
    return directory


def decoder_reference(directory: Path, token_ids: list[int], pooling: str = "last") -> np.ndarray:
    """mlx-lm's model of the directory, its trunk run on one input, pooled, L2-normalized."""
    from mlx_lm import load

    model = load(str(directory))[0]
    hidden = model.model(mx.array([token_ids]))[0].astype(mx.float32)
    vector = hidden[-1] if pooling == "last" else hidden.mean(axis=0)
    vector = np.array(vector)
    return vector / np.linalg.norm(vector)


def encoder_reference(directory: Path, token_ids: list[int]) -> np.ndarray:
    """mlx-embeddings' own embedding of one input (its mean-pooled, normalized text_embeds)."""
    from mlx_embeddings.utils import load_model

    model = load_model(Path(directory))
    return np.array(model(mx.array([token_ids])).text_embeds[0])


def cosine(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
