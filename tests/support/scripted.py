"""Stand-in workers that reply with a chosen text, for router tests of reply parsing."""

from __future__ import annotations


def rotated_alphabet(reply_ids: list[int], prompt_len: int) -> tuple[int, ...]:
    """The stand-in emits alphabet[len(context) % len(alphabet)]: rotate the reply so its first
    token is the one generated right after a prompt of `prompt_len` tokens."""
    n = len(reply_ids)
    return tuple(reply_ids[(j - prompt_len) % n] for j in range(n))


async def scripted_worker(cluster, tokenizer, prompt_ids, reply: str, end_turn: bool = True):
    """A fresh stand-in (the only one) that answers `prompt_ids` with `reply`; returns
    (worker, max_tokens to ask for). With end_turn the reply ends with the chat stop token."""
    for worker_id in list(cluster.workers):
        await cluster.kill_worker(worker_id)
    ids = tokenizer.encode_text(reply) + ([tokenizer.chat_stop_token_ids[0]] if end_turn else [])
    alphabet = rotated_alphabet(ids, len(prompt_ids))
    worker = await cluster.add_worker(f"scripted-{len(ids)}", alphabet=alphabet)
    return worker, len(ids)
