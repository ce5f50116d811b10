"""What Ollama's model endpoints answer (/api/tags, /api/ps, /api/show), from what the router
knows of a served model and what its directory holds (read by router/http/endpoints/ollama.py,
handed here as a ModelFiles). Nothing is invented: a value we do not know is left empty."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from router.api.ollama.render import iso_of

if TYPE_CHECKING:
    from router.text.tokenizer import ModelTokenizer


@dataclass(frozen=True)
class ModelFiles:
    """A model directory as Ollama describes it: its config.json, its weights' size, when it
    last changed (epoch seconds)."""

    config: dict
    size: int
    modified: float


@dataclass(frozen=True)
class ModelView:
    """A served model as these answers need it (plain data: no routing objects here)."""

    name: str
    tokenizer: ModelTokenizer
    embedding: bool  # an embedding model (served by /api/embed only)
    files: ModelFiles


def details(files: ModelFiles) -> dict:
    config = files.config
    family = config.get("model_type", "")
    bits = (config.get("quantization") or {}).get("bits")
    return {
        "parent_model": "",
        "format": "mlx",
        "family": family,
        "families": [family] if family else [],
        "parameter_size": "",
        "quantization_level": f"{bits}bit" if bits else "",
    }


def tag(model: ModelView) -> dict:
    """One model of /api/tags."""
    files = model.files
    return {
        "name": model.name,
        "model": model.name,
        "modified_at": iso_of(files.modified),
        "size": files.size,
        "digest": "",
        "details": details(files),
    }


def running(model: ModelView, workers: int, expires: float | None) -> dict:
    """One model of /api/ps: its workers, and when keep_alive unloads it (epoch seconds;
    None: never, or not a catalog model)."""
    return (
        tag(model)
        | {
            "size_vram": model.files.size,
            "context_length": model.tokenizer.context_length,
            "workers": workers,
        }
        | ({"expires_at": iso_of(expires)} if expires is not None else {})
    )


def capabilities(model: ModelView) -> list[str]:
    """What the model does, as Ollama names it: detected from its dialect (every chat model
    takes tools: router/chat/tools.py's fallback prompt where its template has none), its
    reasoning marker, vision tower and task."""
    if model.embedding:
        return ["embedding"]
    tokenizer = model.tokenizer
    found = ["completion"]
    dialect = tokenizer.dialect
    if dialect is not None:  # its template renders tools, or our fallback prompt does
        found.append("tools")
    if dialect is not None and (dialect.harmony or _reasoning_token(tokenizer)):
        found.append("thinking")
    if tokenizer.vision is not None:
        found.append("vision")
    return found


def show(model: ModelView) -> dict:
    tokenizer, files = model.tokenizer, model.files
    family = files.config.get("model_type", "")
    return {
        "modelfile": "",
        "template": tokenizer.template_source,
        "parameters": f"num_ctx {tokenizer.context_length}",
        "details": details(files),
        "model_info": {
            "general.architecture": family,
            f"{family or 'general'}.context_length": tokenizer.context_length,
        },
        "capabilities": capabilities(model),
        "modified_at": iso_of(files.modified),
    }


def _reasoning_token(tokenizer: ModelTokenizer) -> bool:
    """The model's reasoning marker is a token of its own (every dialect reads a bare <think>
    block, so the dialect alone does not say the model thinks)."""
    opening = tokenizer.dialect.reasoning.open
    return bool(opening) and tokenizer.token_id(opening) is not None
