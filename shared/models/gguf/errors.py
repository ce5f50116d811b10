"""The one error every GGUF step raises, in a module of its own.

The header reader, the tokenizer rebuild and the converter all raise it, and the converter
calls the other two: keeping it here lets them import it without importing each other.
"""


class GGUFError(ValueError):
    """The file is missing, not a GGUF, or holds something we can't convert."""
