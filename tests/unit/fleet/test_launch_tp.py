"""launch-cluster --tp: what a tensor-parallel fleet may combine with (--kv-bits) and not."""

from __future__ import annotations

from fleet.launch import build_parser, commands, served_models
from shared.config.fleet import load_with_flags
from tests.support.tp_group import TINY_TP_QUANT_ARGS, save_tiny_model


def served(argv: list[str]):
    args, fleet = load_with_flags(build_parser(), argv, {"cluster": {}})
    models = served_models(args, fleet)
    return models if isinstance(models, str) else commands(args, fleet, models, 5999)[1]


def test_tp_groups_take_a_quantized_kv_cache_from_flags_or_the_fleet_config(tmp_path):
    model = save_tiny_model(tmp_path / "m", args=TINY_TP_QUANT_ARGS)
    (worker,) = served(
        [
            "--model",
            str(model),
            "--workers",
            "1",
            "--tp",
            "2",
            "--kv-bits",
            "8",
            "--kv-group-size",
            "32",
        ]
    )
    assert worker[worker.index("--kv-bits") + 1] == "8"
    assert worker[worker.index("--kv-group-size") + 1] == "32"
    config = tmp_path / "fleet.toml"
    config.write_text(
        f'[model]\npath = "{model}"\n[cluster]\nworkers = 1\ntp = 2\n[worker]\nkv_bits = 4\n'
    )
    (worker,) = served(["--config", str(config)])  # each rank reads [worker] kv_bits there
    assert worker[worker.index("--config") + 1] == str(config)


def test_tp_groups_still_refuse_the_disk_tier(tmp_path):
    model = save_tiny_model(tmp_path / "m", args=TINY_TP_QUANT_ARGS)
    problem = served(["--model", str(model), "--tp", "2", "--kv-bits", "8", "--kv-disk", "1GiB"])
    assert problem == "--kv-disk is not supported with --tp (tensor-parallel groups)"
