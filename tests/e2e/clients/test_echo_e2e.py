"""End to end on the default model: lm-evaluation-harness's scoring request (`echo`, `logprobs`,
`max_tokens` 0) through a real cluster, its prompt logprobs against mlx-lm's forward pass."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from tests.e2e.cluster.test_cluster_e2e import MODEL, Cluster
from tests.support.launched import PIPED, launch_cluster

pytestmark = pytest.mark.slow

CONTEXT = "Question: What is the capital of France?\nAnswer:"
CHOICES = [" Paris", " London", " a banana"]


@pytest.fixture(scope="module")
def cluster(model_cache, tmp_path_factory):
    logs = tmp_path_factory.mktemp("cluster-logs")
    with launch_cluster(["--workers", "1", "--kv-memory", "256MiB"], logs, **PIPED) as (base, proc):
        c = Cluster(base, proc)
        c.wait_healthy(1, timeout=300)
        yield c


@pytest.fixture(scope="module")
def reference():
    """mlx-lm's own forward pass: (token ids, the logprob of each token after the first)."""
    from shared.models.loading import load_model
    from shared.models.store import resolve_model

    model, tokenizer = load_model(resolve_model(None))

    def score(text: str) -> tuple[list[int], np.ndarray]:
        ids = tokenizer.encode(text)
        logits = model(mx.array(ids)[None])[0].astype(mx.float32)
        logp = np.array(logits - mx.logsumexp(logits, axis=-1, keepdims=True))
        return ids, logp[np.arange(len(ids) - 1), ids[1:]]

    return score


def test_echo_logprobs_max_tokens_zero_equal_mlx_lm(cluster, reference):
    for choice in CHOICES:
        ids, expected = reference(CONTEXT + choice)
        # twice: the second finds the prompt in the prefix cache and must compute it anyway
        for _ in range(2):
            r = cluster.client.completions.create(
                model=MODEL, prompt=[ids], echo=True, logprobs=1, max_tokens=0
            )
            c = r.choices[0]
            assert c.finish_reason == "length" and r.usage.completion_tokens == 0
            assert c.logprobs.token_logprobs[0] is None and len(c.logprobs.tokens) == len(ids)
            np.testing.assert_allclose(c.logprobs.token_logprobs[1:], expected, atol=1e-4)
            assert r.usage.prompt_tokens_details.cached_tokens == 0
        for lp, top in zip(c.logprobs.token_logprobs[1:], c.logprobs.top_logprobs[1:], strict=True):
            assert max(top.values()) >= lp - 1e-6


def test_the_likelier_answer_scores_higher(cluster):
    """The multiple-choice rule lm-eval applies: sum the continuation's logprobs."""
    scores = []
    n_context = len(
        cluster.client.completions.create(
            model=MODEL, prompt=CONTEXT, echo=True, logprobs=0, max_tokens=0
        )
        .choices[0]
        .logprobs.tokens
    )
    for choice in CHOICES:
        r = cluster.client.completions.create(
            model=MODEL, prompt=CONTEXT + choice, echo=True, logprobs=0, max_tokens=0
        )
        scores.append(sum(r.choices[0].logprobs.token_logprobs[n_context:]))
    assert scores[0] == max(scores)
