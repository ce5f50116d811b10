"""The command line maps onto RouterConfig."""

from __future__ import annotations

from pathlib import Path

import pytest

from router.cli import parse_args
from router.config import ModelSpec


def test_parse_args_fills_the_config():
    config = parse_args(
        [
            "--model",
            "/m/SmolLM2",
            "--port",
            "9000",
            "--policy",
            "round_robin",
            "--zmq-bind",
            "tcp://0.0.0.0:6000",
            "--max-pending",
            "7",
        ]
    )
    assert config.models == (ModelSpec(Path("/m/SmolLM2"), "SmolLM2"),)
    assert (config.port, config.policy, config.zmq_bind) == (
        9000,
        "round_robin",
        "tcp://0.0.0.0:6000",
    )
    assert config.max_pending_requests == 7


def test_unknown_policy_is_a_usage_error():
    with pytest.raises(SystemExit):
        parse_args(["--model", "/m", "--policy", "random"])
