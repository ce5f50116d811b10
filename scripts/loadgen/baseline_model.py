"""The model directory the mlx_lm.server baseline serves: the same weights our workers compute
with. Our workers dequantize to float32 on MLX's CPU backend (shared/models/loading.py: 4-bit
matmuls have no BLAS path there); mlx_lm.server would compute in the saved 4-bit, which would
measure the dtype rather than the server. So where Metal is missing, save a float32 copy.

    python -m scripts.loadgen.baseline_model SRC_DIR DEST_DIR   # prints the directory to serve
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

WEIGHT_SUFFIXES = (".safetensors",)
SKIP = {"config.json", "model.safetensors.index.json"}


def float32_copy(src: Path, dest: Path) -> Path:
    """Save `src` dequantized to float32 in `dest` (tokenizer files copied); returns `dest`."""
    from mlx_lm.utils import save_config, save_model

    from shared.models.loading import load_model

    model, _ = load_model(src, "float32")
    save_model(dest, model)
    config = json.loads((src / "config.json").read_text())
    for key in ("quantization", "quantization_config"):
        config.pop(key, None)
    save_config(config, dest / "config.json")
    for path in src.iterdir():
        if path.is_file() and path.name not in SKIP and path.suffix not in WEIGHT_SUFFIXES:
            shutil.copy2(path, dest / path.name)
    return dest


def baseline_dir(src: Path, dest: Path) -> Path:
    from shared.models.loading import resolve_compute_dtype

    if resolve_compute_dtype("auto") == "quantized":  # Metal: both serve the saved weights
        return src
    return float32_copy(src, dest)


def main(argv: list[str]) -> int:
    from shared.blas import reexec_with_blas

    reexec_with_blas()  # before mlx is imported: the conversion runs matmuls too
    src, dest = (Path(a) for a in argv)
    print(baseline_dir(src, dest))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
