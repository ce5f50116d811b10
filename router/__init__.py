"""mlx-fleet router package."""
