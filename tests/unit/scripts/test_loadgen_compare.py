"""The comparison runner with a stand-in launch-cluster (real router, stand-in workers, no
model): outputs, per-configuration failures, and no process left behind, Ctrl-C included."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from scripts.loadgen import compare
from scripts.loadgen.configs import parse_configs, service_spec
from scripts.loadgen.report import markdown_table
from tests.support.paths import ROOT
from tests.support.tiny_model import build_tiny_model

LOAD = ["--requests", "6", "--concurrency", "2", "--max-tokens", "4", "--prefix-words", "20"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    # a unique path: it appears in the command line of every process a run starts
    return build_tiny_model(tmp_path_factory.mktemp("compare") / "tiny", context_length=8192)


def fake_launch(token_delay: float = 0.0) -> str:
    return f"{sys.executable} -m scripts.loadgen.fake_cluster --token-delay {token_delay}"


def processes_mentioning(text: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if text.encode() in cmdline:
                pids.append(int(entry.name))
    return pids


def run_compare(args: list[str]) -> subprocess.CompletedProcess:
    argv = [sys.executable, "scripts/compare.py", *args]
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_config_names_are_checked():
    assert parse_configs("ours-1, ours-2-least_load,mlx_lm") == [
        "ours-1",
        "ours-2-least_load",
        "mlx_lm",
    ]
    for bad in ("ours-0", "ours-2-fastest", "vllm", "", "ours-1-specx", "ours-1-spec-round_robin"):
        with pytest.raises(ValueError):
            parse_configs(bad)


def test_spec_configurations_turn_speculative_decoding_on(tmp_path):
    assert parse_configs("ours-1,ours-1-spec") == ["ours-1", "ours-1-spec"]
    spec = service_spec("ours-2-round_robin-spec", tmp_path / "a", tmp_path / "b", launch_cmd="lc")
    assert spec.argv[1:5] == ["--workers", "2", "--policy", "round_robin"]
    assert spec.argv[-2:] == ["--speculative", "ngram"]
    plain = service_spec("ours-1", tmp_path / "a", tmp_path / "b", launch_cmd="lc")
    assert "--speculative" not in plain.argv


def test_fleet_cache_configurations(tmp_path):
    names = "ours-2-cache_aware-nopull,ours-disagg,ours-2-both,ours-2-cache_aware-kv8,ours-disagg-nopull"
    assert parse_configs(names) == names.split(",")
    for bad in ("ours-disagg2", "ours-2-kv8-nopull", "ours-2-kv3", "ours-both"):
        with pytest.raises(ValueError):
            parse_configs(bad)

    def argv(name: str) -> list[str]:
        return service_spec(name, tmp_path / "a", tmp_path / "b", launch_cmd="lc").argv

    nopull = argv("ours-2-cache_aware-nopull")
    assert nopull[nopull.index("--kv-pulls") + 1] == "false"
    assert "--kv-pulls" not in argv("ours-2-cache_aware")
    disagg = service_spec("ours-disagg", tmp_path / "a", tmp_path / "b", launch_cmd="lc")
    assert disagg.argv[1:5] == ["--prefill-workers", "1", "--workers", "1"]
    assert disagg.expected_workers == 2  # /health counts the prefill worker too
    assert argv("ours-2-both")[1:5] == ["--workers", "2", "--policy", "cache_aware"]
    kv8 = argv("ours-2-round_robin-kv8")
    assert kv8[kv8.index("--kv-bits") + 1] == "8"


def test_draft_acceptance_is_read_from_the_workers_phase_counters():
    from scripts.loadgen.stats import speculation

    def snapshot(*counts):
        workers = [
            {"id": f"w{i}", "phases": {"spec_drafted": d, "spec_accepted": a}}
            for i, (d, a) in enumerate(counts)
        ]
        return {"workers": workers}

    got = speculation(snapshot((10, 1), (0, 0)), snapshot((50, 9), (40, 10)))
    assert got == {"drafted": 80, "accepted": 18, "acceptance": 18 / 80}
    assert speculation(snapshot((5, 1)), snapshot((5, 1))) is None  # no drafts: no column
    assert speculation(None, snapshot((5, 1))) is None


def test_mlx_lm_is_started_on_localhost_and_asked_for_its_default_model(tmp_path):
    spec = service_spec("mlx_lm", tmp_path / "a", tmp_path / "b", launch_cmd="unused")
    assert spec.argv[1:5] == ["-m", "mlx_lm.server", "--model", str(tmp_path / "b")]
    assert spec.argv[spec.argv.index("--host") + 1] == "127.0.0.1"
    assert spec.model == "default_model" and spec.expected_workers is None
    ours = service_spec("ours-2-round_robin", tmp_path / "a", tmp_path / "b", launch_cmd="lc -x")
    assert ours.argv[:6] == ["lc", "-x", "--workers", "2", "--policy", "round_robin"]
    assert ours.expected_workers == 2 and ours.model is None


def test_vllm_mlx_is_refused_with_the_install_hint_until_installed(monkeypatch, tmp_path):
    monkeypatch.setenv("MLX_FLEET_VLLM_MLX", str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="scripts/setup-vllm-mlx"):
        parse_configs("ours-1,vllm_mlx")
    exe = tmp_path / "vllm-mlx"
    exe.write_text("")
    monkeypatch.setenv("MLX_FLEET_VLLM_MLX", str(exe))
    assert parse_configs("vllm_mlx") == ["vllm_mlx"]
    spec = service_spec("vllm_mlx", tmp_path / "a", tmp_path / "b", launch_cmd="unused")
    assert spec.argv[:3] == [str(exe), "serve", str(tmp_path / "b")]
    assert {"--continuous-batching", "--enable-prefix-cache", "--offline"} <= set(spec.argv)
    assert spec.argv[spec.argv.index("--host") + 1] == "127.0.0.1"


def test_a_failed_run_shows_in_the_table():
    rows = [{"config": "ours-1", "workload": "control", "failed": "exited with status 1\nlog"}]
    assert "| ours-1 | control | failed: exited with status 1 |" in markdown_table(rows)


def test_unknown_configuration_is_a_usage_error(capsys, tmp_path):
    assert compare.main(["--configs", "ours-1,nope", "--out", str(tmp_path)]) == 2
    assert "unknown configuration 'nope'" in capsys.readouterr().err


@pytest.mark.slow
def test_compare_runs_each_configuration_and_writes_json_table_and_plots(model_dir, tmp_path):
    out = tmp_path / "out"
    done = run_compare(
        ["--configs", "ours-1,ours-2-round_robin", "--model", str(model_dir)]
        + ["--launch-cmd", fake_launch(), "--workload", "multi_tenant,few_shot", "--out", str(out)]
        + LOAD
    )
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(r["config"], r["workload"]) for r in lines] == [
        ("ours-1", "multi_tenant"),
        ("ours-1", "few_shot"),
        ("ours-2-round_robin", "multi_tenant"),
        ("ours-2-round_robin", "few_shot"),
    ]
    results = json.loads((out / "results.json").read_text())
    assert results["runs"] == lines and results["machine"]["cpus"] == os.cpu_count()
    assert all(r["completed"] == 6 and r["errors"] == 0 for r in lines)
    assert lines[2]["policy"] == "round_robin"
    assert lines[2]["requests_per_worker"] == {"w0": 3, "w1": 3}
    table = (out / "results.md").read_text()
    assert "| ours-2-round_robin | few_shot | 6/0 |" in table
    assert (out / "multi_tenant.png").stat().st_size > 0 and (out / "few_shot.png").exists()
    assert "[2/2] ours-2-round_robin few_shot: 6/6 requests" in done.stderr
    assert processes_mentioning(str(model_dir)) == []


@pytest.mark.slow
def test_a_configuration_that_fails_to_start_is_reported_and_the_next_one_runs(model_dir, tmp_path):
    failing = f"{sys.executable} -c 'import sys; print(\"no such cluster\"); sys.exit(3)'"
    out = tmp_path / "out"
    done = run_compare(
        ["--configs", "ours-1,ours-2", "--model", str(model_dir), "--launch-cmd", failing]
        + ["--out", str(out), "--start-timeout", "20", *LOAD]
    )
    assert done.returncode == 1
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert [r["config"] for r in runs] == ["ours-1", "ours-2"]
    assert all(
        "exited with status 3" in r["failed"] and "no such cluster" in r["failed"] for r in runs
    )


def default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_ctrl_c_or_sigterm_stops_every_process_it_started(model_dir, tmp_path, sig):
    argv = [sys.executable, "scripts/compare.py", "--configs", "ours-2", "--model", str(model_dir)]
    argv += ["--launch-cmd", fake_launch(token_delay=0.05), "--out", str(tmp_path)]
    argv += ["--requests", "200", "--concurrency", "2", "--prefix-words", "20"]
    # As from a terminal: a suite started in the background (CI, `cmd &`) runs with SIGINT
    # ignored, which its children inherit and Python then keeps ignoring.
    proc = subprocess.Popen(
        argv, cwd=ROOT, stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint
    )
    said: list[str] = []
    try:
        for line in proc.stderr:  # wait until requests are being served
            said.append(line)
            if "requests" in line:
                break
        # keep reading: a runner that blocks writing to a full pipe could not stop
        reader = threading.Thread(target=lambda: said.extend(proc.stderr), daemon=True)
        reader.start()
        assert len(processes_mentioning(str(model_dir))) >= 3  # launcher, router, 2 workers
        proc.send_signal(sig)
        try:  # the runner stops its servers (SIGTERM, 15 s grace, SIGKILL), then exits
            assert proc.wait(timeout=60) == 130
        except subprocess.TimeoutExpired:
            logs = "".join(p.read_text()[-1500:] for p in (tmp_path / "logs").glob("*.log"))
            raise AssertionError(
                f"still running 60 s after {sig!r}:\n{''.join(said)}\n{logs}"
            ) from None
    finally:
        if proc.poll() is None:
            proc.kill()
    deadline = time.monotonic() + 5
    while processes_mentioning(str(model_dir)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_mentioning(str(model_dir)) == []
