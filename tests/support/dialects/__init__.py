"""Tiny checkpoints in each model family's dialect: its real template and tokens (families.py), and
a one-layer gpt2 whose greedy reply is chosen in advance (models.py)."""

# the one function every dialect test calls, as an OpenAI tool
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
