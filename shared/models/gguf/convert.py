"""Convert a GGUF file into a standard mlx-lm model directory, by its `general.architecture`.

gemma3 is converted by `gemma3.py` (dequantized with the `gguf` package). For llama,
`mx.load(path, return_metadata=True)` already decodes F32, F16, Q4_0, Q4_1 and Q8_0
tensors; quantized ones come back in MLX's own affine layout (uint32 weight + scales +
biases, group size 32). We keep them quantized in the saved directory (one bits/group
setting per layer in `config.json`), so `mlx_lm.load()` reads the result unchanged.

GGUF stores Q and K rows permuted for interleaved RoPE (llama.cpp's converter does this
for the llama architecture), so the saved config says `rope_traditional: true` instead of
un-permuting the weights.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple, cast

from shared.models.gguf import gemma3
from shared.models.gguf.errors import GGUFError
from shared.models.gguf.header import GGUFHeader, check_mlx_types, read_header
from shared.models.gguf.spm_tokenizer import write_sentencepiece_tokenizer
from shared.models.gguf.tokenizer import write_tokenizer

GGUF_GROUP_SIZE = 32  # every GGUF type MLX decodes uses 32-value blocks

_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|scales|biases|bias)$")
_GLOBAL_RE = re.compile(r"^([a-z_]+)\.(weight|scales|biases|bias)$")

Progress = Callable[[str], None]


def mlx_tensor_name(gguf_name: str) -> str:
    """Map a GGUF tensor name (`blk.3.attn_q.weight`) to mlx-lm's (`model.layers.3...`)."""
    if m := _BLOCK_RE.match(gguf_name):
        layer, part, kind = m.groups()
        if part not in _LAYER_NAMES:
            raise GGUFError(f"unsupported tensor {gguf_name!r}")
        return f"model.layers.{layer}.{_LAYER_NAMES[part]}.{kind}"
    if (m := _GLOBAL_RE.match(gguf_name)) and m.group(1) in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[m.group(1)]}.{m.group(2)}"
    raise GGUFError(f"unsupported tensor {gguf_name!r}")


def read_gguf(path: Path, header: GGUFHeader | None = None) -> tuple[dict, dict]:
    """Load tensors and metadata with MLX's reader, turning every failure into a GGUFError."""
    import mlx.core as mx

    path = Path(path)
    # MLX's reader crashes the process on a bad file: check the header first
    check_mlx_types(header or read_header(path))
    try:
        loaded = mx.load(str(path), format="gguf", return_metadata=True)
    except Exception as exc:  # mlx raises ValueError/RuntimeError with terse texts
        raise GGUFError(f"cannot read {path} as GGUF ({exc})") from exc
    return cast("tuple[dict, dict]", loaded)  # return_metadata=True: (weights, metadata)


def _scalar(meta: dict, key: str, default=None):
    value = meta.get(key, default)
    if value is None:
        raise GGUFError(f"GGUF metadata lacks {key!r}")
    return value.item() if hasattr(value, "item") else value


def model_config(meta: dict, weights: dict) -> dict:
    """The mlx-lm `config.json` for a llama GGUF."""
    arch = _scalar(meta, "general.architecture")
    if arch != "llama":
        raise GGUFError(f"only llama-architecture GGUF files are supported, this is {arch!r}")
    n_heads = int(_scalar(meta, "llama.attention.head_count"))
    hidden = int(_scalar(meta, "llama.embedding_length"))
    vocab = len(meta.get("tokenizer.ggml.tokens", [])) or int(_scalar(meta, "llama.vocab_size"))
    config = {
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": int(_scalar(meta, "llama.block_count")),
        "intermediate_size": int(_scalar(meta, "llama.feed_forward_length")),
        "num_attention_heads": n_heads,
        "num_key_value_heads": int(_scalar(meta, "llama.attention.head_count_kv", n_heads)),
        "head_dim": int(_scalar(meta, "llama.rope.dimension_count", hidden // n_heads)),
        "rms_norm_eps": float(_scalar(meta, "llama.attention.layer_norm_rms_epsilon")),
        "vocab_size": vocab,
        "rope_theta": float(_scalar(meta, "llama.rope.freq_base", 10000.0)),
        "rope_traditional": True,
        "max_position_embeddings": int(_scalar(meta, "llama.context_length", 2048)),
        "tie_word_embeddings": "output.weight" not in weights,
        "bos_token_id": int(_scalar(meta, "tokenizer.ggml.bos_token_id", 1)),
        "eos_token_id": int(_scalar(meta, "tokenizer.ggml.eos_token_id", 2)),
    }
    quantization = _quantization(weights)
    if quantization:
        config["quantization"] = quantization
    return config


def _quantization(weights: dict) -> dict:
    """Per-layer bits for quantized tensors; the most common setting becomes the default."""
    per_layer = {}
    for name, scales in weights.items():
        if not name.endswith(".scales"):
            continue
        base = name[: -len(".scales")]
        packed = weights[base + ".weight"]
        in_features = scales.shape[-1] * GGUF_GROUP_SIZE
        bits = packed.shape[-1] * 32 // in_features
        per_layer[base] = {"group_size": GGUF_GROUP_SIZE, "bits": bits}
    if not per_layer:
        return {}
    settings = [tuple(sorted(v.items())) for v in per_layer.values()]
    most_common = max(set(settings), key=settings.count)
    default = dict(most_common)
    quant = dict(default)
    for base, setting in per_layer.items():
        if setting != default:
            quant[mlx_tensor_name(base + ".weight")[: -len(".weight")]] = setting
    return quant


class Converted(NamedTuple):
    weights: dict  # mlx-lm parameter name -> mx.array
    config: dict  # config.json
    write_tokenizer: Callable[[Path], None]  # writes the tokenizer files into a directory


def _llama(path: Path, header: GGUFHeader) -> Converted:
    weights, meta = read_gguf(path, header)
    config = model_config(meta, weights)
    mlx_weights = {mlx_tensor_name(k): v for k, v in weights.items()}
    return Converted(mlx_weights, config, lambda out: write_tokenizer(meta, out))


def _gemma3(path: Path, header: GGUFHeader) -> Converted:
    meta = header.metadata
    config = gemma3.gemma3_config(meta, {t.name for t in header.tensors})
    weights = gemma3.gemma3_weights(path, header)

    def tokenizer(out: Path) -> None:
        write_sentencepiece_tokenizer(meta, out, gemma3.CHAT_TEMPLATE)

    return Converted(weights, config, tokenizer)


CONVERTERS: dict[str, Callable[[Path, GGUFHeader], Converted]] = {
    "llama": _llama,
    gemma3.ARCH: _gemma3,
}


def convert_gguf(gguf_path: Path, out_dir: Path, progress: Progress | None = None) -> Path:
    """Write an mlx-lm model directory for `gguf_path` into `out_dir` (created fresh)."""
    import mlx.core as mx

    say = progress or (lambda _msg: None)
    start = time.perf_counter()
    say(f"reading {gguf_path}")
    gguf_path = Path(gguf_path)
    header = read_header(gguf_path)
    arch = header.metadata.get("general.architecture")
    if arch not in CONVERTERS:
        known = ", ".join(CONVERTERS)
        raise GGUFError(f"GGUF architecture {arch!r} is not supported (supported: {known})")
    model = CONVERTERS[arch](gguf_path, header)
    say(f"mapped {len(model.weights)} tensors ({model.config['num_hidden_layers']} layers)")

    out_dir = Path(out_dir)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    say("writing weights")
    mx.save_safetensors(
        str(out_dir / "model.safetensors"), model.weights, metadata={"format": "mlx"}
    )
    (out_dir / "config.json").write_text(json.dumps(model.config, indent=2))
    say("writing tokenizer")
    model.write_tokenizer(out_dir)
    source = {
        "gguf": str(gguf_path.resolve()),
        "name": str(header.metadata.get("general.name", "")),
    }
    (out_dir / "mlx_fleet_source.json").write_text(json.dumps(source, indent=2))
    say(f"converted in {time.perf_counter() - start:.2f}s -> {out_dir}")
    return out_dir
