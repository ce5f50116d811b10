"""Embedding workers: a model's final hidden states, pooled into one vector per input.

`trunk` loads the model (mlx-lm's decoder, or an mlx-embeddings encoder), `embedder` batches
inputs through it and pools, `loop` serves Embed messages from the router. No KV cache: an
embedding is one forward over the prompt."""
