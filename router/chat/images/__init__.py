"""Images in chat prompts: the parts each API sends (parts), their bytes checked and decoded
(decode), and their place among the prompt's tokens (placement). Docs: docs/api.md, "Images"."""
