"""The paged-attention Metal kernel: its source (source.py), the quantized variant generated
from it (quant.py), the split-K and prefix-grouped variants (variants.py), the per-forward
choice among them (plan.py) and the launcher (kernel.py). Apple GPUs only; the MLX-ops
backend is the reference (tests/support/metal_emulator checks the sources against it)."""
