"""Several models behind one router: routing by `model`, per-model indexes, listing, refusals.

Stand-in workers here; tests/e2e/cluster/test_multi_model_e2e.py serves the default model and a random
tiny model with real workers.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from router.config import ModelSpec
from router.http import app_keys
from shared.config import fleet as fleet_config
from tests.support.tiny_model import build_tiny_model


def prompt(seed: int, n: int = 40) -> list[int]:
    return [60 + (seed * 7 + i) % 200 for i in range(n)]


@pytest.fixture(scope="session")
def other_model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("model") / "other", context_length=128)


@pytest.fixture
async def two_models(make_cluster, tiny_model_dir, other_model_dir):
    models = (
        ModelSpec(tiny_model_dir, "tiny", ("t", "small")),
        ModelSpec(other_model_dir, "other", ("o",)),
    )
    return await make_cluster(models=models, worker_wait_s=0)  # a model without workers: 503


async def complete(api, model: str, token_ids, **kw):
    return await api.completions.create(model=model, prompt=token_ids, max_tokens=2, **kw)


async def test_requests_go_to_the_workers_of_the_model_they_name(two_models):
    cluster = two_models
    a1 = await cluster.add_worker("a1", model_id="tiny")
    a2 = await cluster.add_worker("a2", model_id="tiny")
    b1 = await cluster.add_worker("b1", model_id="o")  # an alias registers too
    api = cluster.openai()
    for seed in range(4):
        resp = await complete(api, "tiny", prompt(seed))
        assert resp.model == "tiny"
    for name in ("other", "o", "other", "o"):
        resp = await complete(api, name, prompt(9))
        assert resp.model == "other"  # the model's id, whichever name was sent
    await complete(api, "small", prompt(1))
    assert len(a1.received) + len(a2.received) == 5 and len(b1.received) == 4
    view = await (await cluster.client.get("/v1/cluster")).json()
    assert view["models"] == ["tiny", "other"]
    workers = {w["id"]: w["model"] for w in view["workers"]}
    assert workers == {"a1": "tiny", "a2": "tiny", "b1": "other"}


async def test_each_model_keeps_its_own_prefix_index(two_models):
    cluster = two_models
    await cluster.add_worker("a", model_id="tiny")
    await cluster.add_worker("b", model_id="other")
    api = cluster.openai()
    await complete(api, "tiny", prompt(3))
    models = cluster.app[app_keys.MODELS]
    tiny, other = models["tiny"], models["other"]
    await cluster.wait_until(lambda: tiny.index.num_blocks("a") == 10)
    # the same tokens for the other model: a miss there, and its index stays its own
    first = await complete(api, "other", prompt(3))
    second = await complete(api, "other", prompt(3))
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details.cached_tokens == 40
    await cluster.wait_until(lambda: other.index.num_blocks("b") == 10)
    assert other.index.num_blocks("a") == 0 and tiny.index.num_blocks("b") == 0
    again = await complete(api, "tiny", prompt(3))
    assert again.usage.prompt_tokens_details.cached_tokens == 40


async def test_unknown_model_is_404_naming_the_served_ones(two_models):
    cluster = two_models
    await cluster.add_worker("a", model_id="tiny")
    for path, body in (
        ("/v1/completions", {"model": "gpt-9", "prompt": "hi"}),
        (
            "/v1/chat/completions",
            {"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]},
        ),
    ):
        resp = await cluster.client.post(path, json=body)
        assert resp.status == 404
        error = (await resp.json())["error"]
        assert error["code"] == "model_not_found" and error["param"] == "model"
        assert "'gpt-9'" in error["message"]
        assert "'tiny'" in error["message"] and "'other'" in error["message"]
    resp = await cluster.client.post(
        "/v1/messages",
        json={"model": "gpt-9", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]},
    )
    assert resp.status == 404 and (await resp.json())["error"]["type"] == "not_found_error"


async def test_a_model_without_workers_is_503_while_the_other_serves(two_models):
    cluster = two_models
    await cluster.add_worker("a", model_id="tiny")
    api = cluster.openai()
    assert (await complete(api, "t", prompt(1))).choices[0].finish_reason == "length"
    resp = await cluster.client.post("/v1/completions", json={"model": "other", "prompt": "hi"})
    assert resp.status == 503
    assert "'other'" in (await resp.json())["error"]["message"]
    health = await (await cluster.client.get("/health")).json()
    assert health["models"] == {"tiny": 1, "other": 0} and health["status"] == "ok"


async def test_models_endpoint_lists_every_model_with_aliases(two_models):
    cluster = two_models
    await cluster.add_worker("b", model_id="other")
    listing = await (await cluster.client.get("/v1/models")).json()
    got = {
        m["id"]: (m["aliases"], m["healthy_workers"], m["max_model_len"]) for m in listing["data"]
    }
    assert got == {"tiny": (["t", "small"], 0, 256), "other": (["o"], 1, 128)}
    one = await cluster.client.get("/v1/models/o")
    assert one.status == 200 and (await one.json())["id"] == "other"
    missing = await cluster.client.get("/v1/models/nope")
    assert missing.status == 404 and (await missing.json())["error"]["code"] == "model_not_found"
    # and the OpenAI client reads it
    assert [m.id async for m in cluster.openai().models.list()] == ["tiny", "other"]


async def test_a_worker_of_a_model_not_served_is_refused(two_models):
    cluster = two_models
    worker = await cluster.add_worker("x", model_id="llama-70b")
    assert not worker.ack.accepted
    assert "'llama-70b'" in worker.ack.reason and "'tiny'" in worker.ack.reason
    assert cluster.app[app_keys.CLUSTER].registry.get("x") is None


async def test_a_router_of_one_model_takes_a_worker_that_names_another(make_cluster):
    """Before models were named, every worker served the router's one model: keep that."""
    cluster = await make_cluster()
    worker = await cluster.add_worker("w", model_id="SmolLM2-renamed")
    assert worker.ack.accepted
    assert cluster.app[app_keys.CLUSTER].registry.get("w").model == "tiny"
    resp = await complete(cluster.openai(), "tiny", prompt(2))
    assert resp.choices[0].finish_reason == "length"


async def test_metrics_are_labelled_by_model(two_models):
    cluster = two_models
    await cluster.add_worker("a", model_id="tiny")
    await cluster.add_worker("b", model_id="other")
    api = cluster.openai()
    await complete(api, "tiny", prompt(1))
    await complete(api, "o", prompt(2))
    await complete(api, "o", prompt(3))
    text = await (await cluster.client.get("/metrics")).text()
    got = {
        (s.name, s.labels.get("model_name")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert got[("vllm:prompt_tokens_total", "tiny")] == 40
    assert got[("vllm:prompt_tokens_total", "other")] == 80
    assert got[("vllm:e2e_request_latency_seconds_count", "other")] == 2
    assert ("vllm:num_requests_running", "other") in got


# ------------------------------------------------------------ configuration

TWO_MODELS = """
[[models]]
path = "/m/SmolLM2-135M-Instruct"
id = "smol"
aliases = ["small", "default"]
workers = 3

[[models]]
path = "/m/Qwen3-0.6B"
aliases = ["qwen"]
"""


def config_file(tmp_path, text: str = TWO_MODELS):
    path = tmp_path / "fleet.toml"
    path.write_text(text)
    return path


def test_models_tables_are_read_and_checked():
    from shared.config.fleet import ConfigError, parse_config

    tomllib_loads = fleet_config._toml().loads

    fleet = parse_config(tomllib_loads(TWO_MODELS))
    assert [(m.name, m.aliases, m.workers) for m in fleet.served_models] == [
        ("smol", ("small", "default"), 3),
        ("Qwen3-0.6B", ("qwen",), None),
    ]
    with pytest.raises(ConfigError, match="'qwen' is already models\\[0\\]"):
        parse_config(tomllib_loads(TWO_MODELS.replace('"default"', '"qwen"')))
    with pytest.raises(ConfigError, match=r"\[model\] and \[\[models\]\]: use one"):
        parse_config(tomllib_loads('[model]\npath = "/m/x"\n' + TWO_MODELS))
    with pytest.raises(ConfigError, match=r"models\[1\].workers"):
        parse_config(tomllib_loads(TWO_MODELS + "workers = 0\n"))
    with pytest.raises(ConfigError, match="models: expected"):
        parse_config({"models": {"path": "/m/x"}})


def test_the_router_serves_every_model_of_the_file_or_of_its_flags(tmp_path):
    from router.cli import parse_args

    path = config_file(tmp_path)
    config = parse_args(["--config", str(path)])
    assert [(s.served_id, s.aliases) for s in config.models] == [
        ("smol", ("small", "default")),
        ("Qwen3-0.6B", ("qwen",)),
    ]
    flags = ["--model", "/a/One", "--model-id", "one,uno", "--model", "/b/Two", "--model-id", "two"]
    config = parse_args(["--config", str(path), *flags])  # flags replace the file's models
    assert config.models == (
        ModelSpec(Path("/a/One"), "one", ("uno",)),
        ModelSpec(Path("/b/Two"), "two"),
    )
    with pytest.raises(SystemExit, match="--model-id given 1 times for 2 models"):
        parse_args(["--model", "/a/One", "--model", "/b/Two", "--model-id", "x"])
    with pytest.raises(SystemExit, match="'One' is given to two models"):
        parse_args(["--model", "/a/One", "--model", "/b/One"])


def test_a_worker_serves_the_entry_its_model_id_names(tmp_path):
    from worker.cli import build_parser, load_settings

    path = config_file(tmp_path)
    _, _, model = load_settings(build_parser(), ["--config", str(path), "--model-id", "qwen"])
    assert (model.path, model.name) == ("/m/Qwen3-0.6B", "Qwen3-0.6B")  # its own name
    _, _, model = load_settings(build_parser(), ["--config", str(path), "--model-id", "smol"])
    assert (model.path, model.name) == ("/m/SmolLM2-135M-Instruct", "smol")
    with pytest.raises(SystemExit):
        load_settings(build_parser(), ["--config", str(path)])  # which one?
    with pytest.raises(SystemExit):
        load_settings(build_parser(), ["--config", str(path), "--model-id", "nope"])
    # --model on the command line serves that model, whatever the file lists
    _, _, model = load_settings(build_parser(), ["--config", str(path), "--model", "/x/Mine"])
    assert (model.path, model.name) == ("/x/Mine", "Mine")


def test_launch_cluster_starts_workers_per_model(tmp_path):
    from fleet.launch import Served, build_parser, commands, served_models
    from shared.config.fleet import ModelSection, load_with_flags

    a, b = build_tiny_model(tmp_path / "A"), build_tiny_model(tmp_path / "B")
    path = config_file(
        tmp_path,
        TWO_MODELS.replace("/m/SmolLM2-135M-Instruct", str(a)).replace("/m/Qwen3-0.6B", str(b)),
    )
    args, fleet = load_with_flags(build_parser(), ["--config", str(path)], {"cluster": {}})
    models = served_models(args, fleet)
    assert [(m.name, m.workers) for m in models] == [("smol", 3), ("B", 2)]
    (router,), workers = commands(args, fleet, models, 5999)
    assert router[router.index("--model") :][:4] == [
        "--model",
        str(a),
        "--model-id",
        "smol,small,default",
    ]
    served = [w[w.index("--model-id") + 1] for w in workers]
    assert served == ["smol"] * 3 + ["B"] * 2
    assert [w[w.index("--worker-id") + 1] for w in workers] == [f"worker-{i}" for i in range(5)]
    assert float(workers[0][workers[0].index("--kv-fraction") + 1]) == pytest.approx(0.05)
    # --workers N is per model, over the file's counts; --model flags replace the file's models
    args, fleet = load_with_flags(
        build_parser(), ["--model", str(a), "--model", str(b), "--workers", "1"], {"cluster": {}}
    )
    assert [(m.name, m.workers) for m in served_models(args, fleet)] == [("A", 1), ("B", 1)]
    args, fleet = load_with_flags(build_parser(), ["--model", str(a), "--model", str(a)], {})
    assert "named alike" in served_models(args, fleet)
    assert Served(ModelSection(path=str(a)), Path(a), 1).name == "A"


def test_install_service_workers_serve_the_model_they_are_told(tmp_path, capsys, monkeypatch):
    import plistlib

    from deploy import install as install_cli

    path = config_file(tmp_path, TWO_MODELS + '[worker]\nrouter = "tcp://127.0.0.1:5555"\n')
    common = ["install", "worker", "--launchd", "--config", str(path), "--dry-run"]
    assert install_cli.main(common) == 1  # which model? refused before anything is written
    assert "pass --model-id" in capsys.readouterr().err
    out = tmp_path / "agents"
    assert install_cli.main([*common, "--model-id", "qwen", "--out", str(out)]) == 0
    plist = plistlib.loads((out / "com.mlx-fleet.worker.1.plist").read_bytes())
    assert plist["EnvironmentVariables"]["MLX_FLEET_MODEL_ID"] == "qwen"
    # and the worker those services start reads it
    from worker.cli import build_parser, load_settings

    monkeypatch.setenv("MLX_FLEET_MODEL_ID", "qwen")
    _, _, model = load_settings(build_parser(), ["--config", str(path)])
    assert (model.path, model.name) == ("/m/Qwen3-0.6B", "Qwen3-0.6B")
