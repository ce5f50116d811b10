"""prompt_cache_key in the fleet simulator: conversations that share a key but not a prefix,
routed by the real dispatcher with and without their keys (the same seeded traffic)."""

from __future__ import annotations

from scripts.fleetsim.scenarios import conversations, run
from scripts.fleetsim.workload import Conversations, ConversationShape
from shared.hashing import hash_blocks


def test_first_turns_are_under_a_block_and_conversations_share_no_prefix():
    shape = ConversationShape(tenants=3)
    requests = Conversations(shape, 0).requests(300, 10.0)
    firsts = [r for r in requests if len(r.token_ids) == shape.header_tokens + shape.first_tokens]
    assert firsts and all(not hash_blocks(r.token_ids, 32) for r in firsts)
    assert {r.cache_key for r in requests} == {f"tenant-{t}" for t in range(3)}
    heads = {r.token_ids[: shape.header_tokens] for r in firsts}
    assert len(heads) == len(firsts)  # each conversation's header is its own


def test_conversation_keys_do_not_lower_the_hit_rate():
    scenario = conversations(4, key_per="conversation", closed=True)
    without, bound = run(scenario, ("cache_aware",), keys=False)
    keyed, _ = run(scenario, ("cache_aware",), keys=True)
    assert (without["keys"], keyed["keys"]) == (False, True)
    assert keyed["hit_rate"] >= without["hit_rate"], (keyed, without)
    assert keyed["hit_rate"] <= bound["hit_rate"]
    assert keyed["imbalance"] >= 1.0 and keyed["req_per_s"] > 0
