"""lm-evaluation-harness's own `local-completions` model scores a small multiple-choice task
against `launch-cluster --workers 1`; each loglikelihood it reports equals mlx-lm's forward pass
on the same tokens to 1e-3.

lm-eval pulls torch, so it lives in its own venv: `scripts/setup-lm-eval` makes
`.venv-lm-eval`; without it this test is skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap

import mlx.core as mx
import numpy as np
import pytest

from tests.e2e.cluster.test_cluster_e2e import MODEL, Cluster
from tests.support.launched import PIPED, launch_cluster
from tests.support.paths import ROOT

pytestmark = pytest.mark.slow

LM_EVAL = ROOT / ".venv-lm-eval" / "bin" / "lm_eval"
QUESTIONS = [
    {
        "question": "What is the capital of France?",
        "choices": ["Paris", "London", "Rome"],
        "answer": 0,
    },
    {"question": "How many legs does a cat have?", "choices": ["two", "four", "six"], "answer": 1},
    {
        "question": "What color is the sky on a clear day?",
        "choices": ["green", "red", "blue"],
        "answer": 2,
    },
    {"question": "Which animal barks?", "choices": ["a dog", "a fish", "a snake"], "answer": 0},
]
TASK = """\
task: fleet_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
target_delimiter: " "
metric_list:
  - metric: acc
"""


@pytest.fixture(scope="module")
def cluster(model_cache, tmp_path_factory):
    if not LM_EVAL.exists():
        pytest.skip("lm-eval is not installed: run scripts/setup-lm-eval")
    logs = tmp_path_factory.mktemp("cluster-logs")
    with launch_cluster(["--workers", "1", "--kv-memory", "256MiB"], logs, **PIPED) as (base, proc):
        c = Cluster(base, proc)
        c.wait_healthy(1, timeout=300)
        yield c


def encode_pair(tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-eval's own split of a (context, continuation) pair into tokens (`_encode_pair`)."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = tokenizer(context + continuation, add_special_tokens=False).input_ids
    context_ids = tokenizer(context, add_special_tokens=False).input_ids
    return context_ids, whole[len(context_ids) :]


def test_lm_eval_local_completions_loglikelihoods_equal_mlx_lm(cluster, tmp_path):
    from shared.models.loading import load_model
    from shared.models.store import resolve_model

    model_dir = resolve_model(None)
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "fleet_mc.yaml").write_text(TASK.format(data=data))
    out = tmp_path / "out"
    model_args = (
        f"model={MODEL},base_url={cluster.url}/v1/completions,tokenizer={model_dir},"
        "tokenizer_backend=huggingface,num_concurrent=1,max_retries=1"
    )
    command = [
        str(LM_EVAL),
        "--model",
        "local-completions",
        "--model_args",
        model_args,
        "--tasks",
        "fleet_mc",
        "--include_path",
        str(tasks),
        "--batch_size",
        "1",
        "--output_path",
        str(out),
        "--log_samples",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)
    done = subprocess.run(command, env=env, timeout=600, **PIPED)
    assert done.returncode == 0, textwrap.shorten(done.stdout[-4000:], 4000)

    (samples,) = out.rglob("samples_fleet_mc_*.jsonl")
    (results,) = out.rglob("results_*.json")
    accuracy = json.loads(results.read_text())["results"]["fleet_mc"]["acc,none"]
    model, tokenizer = load_model(model_dir)
    hf = tokenizer._tokenizer
    diffs = []
    for line in samples.read_text().splitlines():
        sample = json.loads(line)
        for args, resp in zip(sample["arguments"].values(), sample["resps"], strict=True):
            context_ids, continuation_ids = encode_pair(hf, args["arg_0"], args["arg_1"])
            ids = context_ids + continuation_ids
            logits = model(mx.array(ids)[None])[0].astype(mx.float32)
            logp = np.array(logits - mx.logsumexp(logits, axis=-1, keepdims=True))
            positions = np.arange(len(context_ids) - 1, len(ids) - 1)
            expected = float(logp[positions, ids[len(context_ids) :]].sum())
            diffs.append(abs(float(resp[0][0]) - expected))  # lm-eval logs it as a string
    assert len(diffs) == sum(len(q["choices"]) for q in QUESTIONS)
    print(
        f"lm-eval acc {accuracy}; vs mlx-lm: {len(diffs)} loglikelihoods, max |diff| {max(diffs):.2e}"
    )
    assert max(diffs) <= 1e-3
