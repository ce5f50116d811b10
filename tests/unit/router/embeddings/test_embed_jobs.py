"""Embedding jobs in the router (the dispatcher's, beside its generations): to the
least-loaded embed worker of their model, answered once, moved when their worker is lost,
aborted when the client leaves, never left hanging."""

from __future__ import annotations

import pytest

from router.cluster.registry import WorkerRegistry, WorkerState
from router.metrics.router_metrics import Metrics
from router.routing.dispatcher import Dispatcher, NoWorkerAvailable
from router.routing.policy import make_policy
from router.routing.prefix_index import PrefixIndex
from shared.protocol import Abort, Embed, Embeddings, Register


def worker(registry, name, task="embed", model="e"):
    info = Register(name, model, 32, 0, "host", 1, task=task)
    state = WorkerState(info, name.encode(), last_seen=0.0)
    registry.add(state)
    return state


@pytest.fixture
def setup():
    registry, sent = WorkerRegistry(), []
    jobs = Dispatcher(
        registry,
        PrefixIndex(),
        make_policy("cache_aware"),
        lambda to, msg: sent.append((to, msg)),
        Metrics("e").model("e"),
        max_pending=8,
        max_resubmits=1,
        model="e",
    )
    return registry, sent, jobs


async def test_least_loaded_embed_worker_answers_once(setup):
    registry, sent, jobs = setup
    a, b = worker(registry, "a"), worker(registry, "b")
    worker(registry, "chat", task="chat")  # never sent an Embed
    first = jobs.start_embed("r1", [[1, 2]], 4)
    second = jobs.start_embed("r2", [[3]])
    assert [(to, type(m)) for to, m in sent] == [(b"a", Embed), (b"b", Embed)]
    assert sent[0][1] == Embed("r1#0", ((1, 2),), 4)
    jobs.on_embeddings(b, Embeddings("r1#0", (b"x" * 16,), 2))  # not r1's worker: ignored
    assert not first.future.done()
    jobs.on_embeddings(a, Embeddings("r1#0", (b"x" * 16,), 2))
    assert first.future.result().prompt_tokens == 2 and a.requests_served == 1
    assert not a.inflight and jobs.num_pending == 1
    first.cancel()  # answered: nothing to abort
    second.cancel()
    assert sent[-1] == (b"b", Abort("r2#0")) and jobs.num_pending == 0


async def test_a_lost_worker_moves_its_jobs_then_fails_them(setup):
    registry, sent, jobs = setup
    a, b = worker(registry, "a"), worker(registry, "b")
    job = jobs.start_embed("r1", [[1]])
    a.healthy = False
    jobs.on_worker_lost(a)
    assert sent[-1] == (b"b", Embed("r1#1", ((1,),), 0)) and job.worker_id == "b"
    b.healthy = False
    jobs.on_worker_lost(b)  # max_resubmits 1: it fails with a reason
    assert "2 workers" in job.future.result().error


async def test_wrong_count_is_an_error_and_no_worker_raises(setup):
    registry, _, jobs = setup
    with pytest.raises(NoWorkerAvailable):
        jobs.start_embed("r0", [[1]])
    a = worker(registry, "a")
    job = jobs.start_embed("r1", [[1], [2]])
    jobs.on_embeddings(a, Embeddings("r1#0", (b"x" * 16,), 2))
    assert "wrong number" in job.future.result().error
    other = jobs.start_embed("r2", [[1]])
    jobs.fail_all("shutting down")
    assert other.future.result().error == "shutting down"
