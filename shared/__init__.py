"""mlx-fleet shared package."""
