"""Tiny checkpoints in each model family's dialect: its real template and tokens (families.py), and
a one-layer gpt2 whose greedy reply is chosen in advance (models.py)."""
