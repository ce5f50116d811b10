"""OpenAI's /v1/embeddings: the body checked and tokenized (`parse`), the vectors written
back as floats or base64 (`render`). No I/O: router/http/endpoints/embeddings.py wires it."""
