"""What both the launcher and a worker check about a tensor-parallel group (no MLX here)."""

from __future__ import annotations


class GroupError(ValueError):
    """This model or group cannot be served tensor-parallel; the message says why."""


def check_divides(config: dict, size: int) -> None:
    """Raise GroupError unless `size` divides the query heads, KV heads and MLP width of a
    model config (config.json keys): mlx-lm's shard() splits each of them `size` ways."""
    heads = config.get("num_attention_heads")
    kv_heads = config.get("num_key_value_heads") or heads
    ffn = config.get("intermediate_size")
    for what, count in (("query heads", heads), ("KV heads", kv_heads), ("MLP width", ffn)):
        if count is not None and count % size:
            raise GroupError(
                f"tensor parallel over {size} ranks needs {size} to divide the model's {what}; "
                f"it has {count} (heads {heads}, KV heads {kv_heads})"
            )
