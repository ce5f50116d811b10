"""A catalog entry's Hub keys (`source`, `revision`, `allow_patterns`): checked when the config
is read, each mistake named with its entry; the entry's name and the fetch they describe."""

from __future__ import annotations

import re

import pytest

from shared.config.fleet import ConfigError, parse_config
from shared.models.hub import DEFAULT_PATTERNS, HubSource, source_of


def models(**keys) -> dict:
    return {"models": [{"id": "ok", "path": "/m"}, keys]}


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"source": "org/m", "path": "/m2"}, "models[1]: set path (local files) or source"),
        ({"path": "/m2", "revision": "v1"}, "models[1]: revision is only read with source"),
        ({"path": "/m2", "allow_patterns": ["*"]}, "allow_patterns is only read with source"),
        ({"source": "just-a-name"}, "source 'just-a-name' is not a Hub repo id"),
        ({"source": "org/../etc"}, "is not a Hub repo id"),
        ({"source": "org/m", "allow_patterns": []}, "allow_patterns is empty"),
        ({"source": "org/m", "revision": ""}, "revision is empty"),
        ({"source": "org/m", "allow_patterns": "*.json"}, "allow_patterns"),
        ({"source": 7}, "source"),
    ],
)
def test_bad_hub_keys_are_named(keys, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_config(models(**keys))


def test_the_model_section_is_checked_too():
    with pytest.raises(ConfigError, match=r"\[model\]: set path"):
        parse_config({"model": {"source": "org/m", "path": "/m"}})


def test_a_hub_entry_is_named_after_its_repo_and_fetches_its_files():
    config = parse_config(models(source="mlx-community/Qwen3-0.6B-4bit"))
    entry = config.models[1]
    assert entry.name == "Qwen3-0.6B-4bit"
    assert source_of(entry) == HubSource("mlx-community/Qwen3-0.6B-4bit", "main", DEFAULT_PATTERNS)
    pinned = parse_config(models(source="org/m", revision="abc", allow_patterns=["*.json"]))
    assert source_of(pinned.models[1]) == HubSource("org/m", "abc", ("*.json",))
    assert source_of(config.models[0]) is None
