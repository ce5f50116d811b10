"""Router settings at run time: the [router] section (shared/config/sections.py) plus the
served models; the command line in router/cli.py fills them."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path

from shared.config.sections import ModelSection, RouterSection


@dataclass(frozen=True)
class ModelSpec:
    """A served model as configured: where its files are and the names clients may use."""

    path: Path  # a local model directory: tokenizer files + config.json
    id: str | None = None  # the name clients use; defaults to the directory's name
    aliases: tuple[str, ...] = ()  # other names accepted for it
    # its dialect, when the operator names it ([[models]] keys; None: detected)
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    task: str | None = None  # "chat" or "embed" ([[models]] `task`; None: detected)
    # its [[models]] entry: the catalog keys placement reads (router/placement/)
    section: ModelSection = field(default_factory=ModelSection, compare=False)
    # a Hub `source` whose weights are not in `path`: their bytes by the Hub's listing
    hub_weight_bytes: int | None = None

    @property
    def served_id(self) -> str:
        return self.id or Path(self.path).name

    @property
    def names(self) -> tuple[str, ...]:
        return (self.served_id, *self.aliases)


@dataclass(frozen=True)
class RouterConfig(RouterSection):
    """The router's settings at run time: every [router] setting (declared once, with its
    default, in shared/config/sections.py RouterSection), plus what the command line resolves:
    the served models, the API keys read from `api_keys_file` and the chat template's text."""

    # the served models, the first the default; each request names one in `model`
    models: tuple[ModelSpec, ...] = field(kw_only=True)
    max_resubmits: int = 3  # times one request may move to another worker after a failure
    # budgets set on a key's line of api_keys_file ({key: {"rpm": N, "tpm": N}})
    key_budgets: dict[str, dict[str, int]] = field(default_factory=dict, kw_only=True, repr=False)

    @property
    def model_ids(self) -> tuple[str, ...]:
        return tuple(spec.served_id for spec in self.models)

    @classmethod
    def from_section(cls, section: RouterSection, **resolved) -> RouterConfig:
        """Every field of `section`, with `resolved` (models, api_keys, chat_template) over."""
        values = {f.name: getattr(section, f.name) for f in fields(RouterSection)}
        return cls(**(values | resolved))
