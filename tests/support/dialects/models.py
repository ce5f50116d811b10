"""Tiny checkpoints whose greedy reply is chosen in advance, in a model family's own markup.

`build_dialect_model` writes a model directory that the router (transformers' AutoTokenizer)
and the worker (`Engine.from_path`) both load: a ~400-token byte-level BPE with the family's
special and added tokens and chat template, and a one-layer gpt2 whose greedy continuation of
ANY prompt of exactly L tokens is the reply chosen for L.

How the weights choose: every block's output projections are zero, so the residual stream at
position p holding token t is wte[t] + wpe[p]. Each token id of any reply gets its own one-hot
direction in wte (every other row is zero), and wpe[L - 1 + i] is `_PULL` times the direction of
the reply's i-th id; the LM head is wte itself (gpt2 ties it), so after ln_f (mean 0, scale
1: identity up to centring and scaling) that id has the one positive logit, the other reply ids
negative ones and all other tokens 0. Positions outside the replies' ranges predict token 0.

`pad_to_length` pads a conversation to exactly L prompt tokens with a filler character that
the tokenizer never merges ("~" is in no training text), one token per character.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path

from tests.support.dialects.families import FamilySpec

CONTEXT_LENGTH = 4096  # gpt2's n_positions: the longest prompt plus reply a test may use
VOCAB_SIZE = 400  # the BPE's own tokens (256 bytes + merges), before the added ones
_PULL = 100.0  # a position's push toward its reply token, against the token's own row of 1
_N_HEAD = 2
_CORPUS = [  # no "~" anywhere, so the filler has no merges
    "the quick brown fox jumps over the lazy dog",
    "hello world, you are a helpful assistant; answer the user",
    "system user assistant: what is the capital of france? paris.",
    'call the tool get_weather with {"city": "paris", "unit": "celsius"} and think first',
]


def build_dialect_model(
    directory: Path,
    spec: FamilySpec,
    replies: dict[int, str],
    chat_template: str | None = None,
) -> Path:
    """Write the model directory; `replies` maps a prompt length L to the reply text (ending
    with its own end token) that greedy decoding yields after any prompt of L tokens.

    `chat_template` overrides the spec's (which is read from tests/data/dialects/)."""
    directory.mkdir(parents=True, exist_ok=True)
    template = spec.chat_template if chat_template is None else chat_template
    tokenizer = _write_tokenizer(directory, spec, template)
    vocab_size = tokenizer.get_vocab_size()
    end_ids = [_token_id(tokenizer, t) for t in spec.end_tokens or (spec.eos,)]
    bos_id = _token_id(tokenizer, spec.bos) if spec.bos else None
    args = _write_weights(directory, vocab_size, _reply_targets(tokenizer, replies))
    config = {
        **args,
        "architectures": ["GPT2LMHeadModel"],
        "tie_word_embeddings": True,
        "bos_token_id": bos_id,
        "eos_token_id": end_ids,
    }
    _write_json(directory / "config.json", config)
    _write_json(directory / "generation_config.json", {"eos_token_id": end_ids, "do_sample": False})
    return directory


def pad_to_length(
    count: Callable[[list[dict]], int], messages: list[dict], target: int, filler: str = "~"
) -> list[dict]:
    """A copy of `messages` whose last user message ends with enough `filler` characters that
    `count(messages) == target`; ValueError if `target` is below the unpadded count or no
    number of fillers hits it exactly."""
    base = count(messages)
    if target < base:
        raise ValueError(f"the messages already count {base} tokens, more than {target}")
    extra = target - base
    for _ in range(4):  # a filler that merges with its neighbour may cost less than a token
        padded = _with_filler(messages, filler * extra)
        got = count(padded)
        if got == target:
            return padded
        extra += target - got
        if extra < 0:
            break
    raise ValueError(f"could not pad the messages to exactly {target} tokens with {filler!r}")


def _with_filler(messages: list[dict], padding: str) -> list[dict]:
    padded = copy.deepcopy(messages)
    user = next((m for m in reversed(padded) if m.get("role") == "user"), None)
    if user is None:
        raise ValueError("no user message to pad")
    content = user.get("content")
    if isinstance(content, str):
        user["content"] = content + padding
        return padded
    texts = [p for p in content or () if p.get("type") == "text"]
    if not texts:
        raise ValueError("the last user message has no text to pad")
    texts[-1]["text"] += padding
    return padded


# ---- the tokenizer ---------------------------------------------------------------------


def _write_tokenizer(directory: Path, spec: FamilySpec, template: str):
    """Train the BPE, add the spec's tokens, write tokenizer.json and tokenizer_config.json."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_CORPUS * 4, trainer)
    special = _unique([*spec.special, spec.bos, spec.eos, *spec.end_tokens])
    special = [t for t in special if t and t not in spec.added]
    tokenizer.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in special])
    added = [AddedToken(t, normalized=False, special=False) for t in spec.added]
    tokenizer.add_tokens(added)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": _added_tokens_decoder(tokenizer, set(special)),
        "bos_token": spec.bos,
        "eos_token": spec.eos or None,
        "chat_template": template,
        "model_max_length": CONTEXT_LENGTH,
        "clean_up_tokenization_spaces": False,
        **spec.tokenizer_extra,
    }
    _write_json(directory / "tokenizer_config.json", config)
    return tokenizer


def _added_tokens_decoder(tokenizer, special: set[str]) -> dict[str, dict]:
    """The flags HF writes for each added token, keyed by id as a string."""
    return {
        str(i): {
            "content": token.content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": token.content in special,
        }
        for i, token in sorted(tokenizer.get_added_tokens_decoder().items())
    }


def _token_id(tokenizer, token: str) -> int:
    token_id = tokenizer.token_to_id(token)
    if token_id is None:
        raise ValueError(f"{token!r} is not in the vocabulary")
    return token_id


def _unique(items) -> list:
    return list(dict.fromkeys(items))


# ---- the weights -----------------------------------------------------------------------


def _reply_targets(tokenizer, replies: dict[int, str]) -> dict[int, int]:
    """Absolute position -> the token id its logits must choose."""
    targets: dict[int, int] = {}
    for length, text in sorted(replies.items()):
        if length < 1:
            raise ValueError(f"a prompt has at least one token, not {length}")
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        for i, token_id in enumerate(ids):
            position = length - 1 + i
            if targets.setdefault(position, token_id) != token_id:
                raise ValueError(f"the reply for {length} overlaps another at position {position}")
    if targets and max(targets) >= CONTEXT_LENGTH:
        raise ValueError(f"replies run past the context length {CONTEXT_LENGTH}")
    return targets


def _n_embd(directions: int) -> int:
    """One dimension per reply token and a few spare, a multiple of 8 (so of the heads)."""
    return max(32, (directions + 8 + 7) // 8 * 8)


def _write_weights(directory: Path, vocab_size: int, targets: dict[int, int]) -> dict:
    """Write model.safetensors (float32, mlx-lm's own key names); return gpt2's ModelArgs."""
    import mlx.core as mx
    import numpy as np
    from mlx.utils import tree_flatten
    from mlx_lm.models import gpt2

    reply_ids = sorted(set(targets.values()))
    direction = {token_id: d for d, token_id in enumerate(reply_ids)}
    n_embd = _n_embd(len(reply_ids))
    args = dict(
        model_type="gpt2",
        n_ctx=CONTEXT_LENGTH,
        n_embd=n_embd,
        n_head=_N_HEAD,
        n_layer=1,
        n_positions=CONTEXT_LENGTH,
        layer_norm_epsilon=1e-5,
        vocab_size=vocab_size,
    )
    model = gpt2.Model(gpt2.ModelArgs(**args))
    wte = np.zeros((vocab_size, n_embd), np.float32)
    for token_id, d in direction.items():
        wte[token_id, d] = 1.0
    wpe = np.zeros((CONTEXT_LENGTH, n_embd), np.float32)
    for position, token_id in targets.items():
        wpe[position, direction[token_id]] = _PULL
    weights = {k: mx.zeros_like(v) for k, v in tree_flatten(model.parameters())}
    for key in weights:
        if key.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
            weights[key] = mx.ones_like(weights[key])
    weights["model.wte.weight"] = mx.array(wte)
    weights["model.wpe.weight"] = mx.array(wpe)
    mx.save_safetensors(str(directory / "model.safetensors"), weights, {"format": "mlx"})
    return args


def _write_json(path: Path, value: dict) -> None:
    path.write_text(json.dumps(value, indent=2))
