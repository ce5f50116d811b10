"""mlx-fleet worker package."""
