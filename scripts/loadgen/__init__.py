"""mlx-fleet load generator and comparison runner (docs/benchmarks.md)."""
