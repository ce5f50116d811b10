"""Images in prompts: the vision tower (mlx-vlm's) in front of our paged language model."""
