"""Incremental detokenization and stop strings, with the tiny byte-level tokenizer."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from router.text.detokenize import StopMatcher

TEXTS = ["hello world", "é😀中文🎉 mixed ascii", "🇫🇷 flags and ZWJ 👩‍👩‍👧", "Ω≈ç√∫˜µ≤≥÷"]


def stream_text(tokenizer, ids, step=1):
    detok = tokenizer.detokenizer()
    pieces = [detok.add(ids[i : i + step]) for i in range(0, len(ids), step)]
    return pieces + [detok.flush()]


def test_incremental_decode_equals_full_decode_and_never_splits_characters(tiny_tokenizer):
    for text in TEXTS:
        ids = tiny_tokenizer.encode_prompt(text)
        for step in (1, 2, 3):
            pieces = stream_text(tiny_tokenizer, ids, step)
            assert "".join(pieces) == text
            assert not any("\ufffd" in p for p in pieces)


def test_flush_emits_an_incomplete_character_at_the_end(tiny_tokenizer):
    ids = tiny_tokenizer.encode_prompt("a😀")[:-1]  # cut inside the emoji
    detok = tiny_tokenizer.detokenizer()
    assert [detok.add([i]) for i in ids] == ["a"] + [""] * (len(ids) - 1)
    assert detok.flush().startswith("\ufffd")


def test_chat_stop_tokens_include_the_template_end_token(tiny_tokenizer):
    im_end = tiny_tokenizer.encode_chat([{"role": "user", "content": "x"}])[4]
    assert tiny_tokenizer.decode([im_end]) == ""  # special
    assert im_end in tiny_tokenizer.chat_stop_token_ids
    assert tiny_tokenizer.context_length == 256


def run_matcher(stops, chunks):
    matcher = StopMatcher(stops)
    out = "".join(matcher.feed(c) for c in chunks)
    return out + matcher.flush(), matcher.stopped


def test_stop_string_split_across_chunks_is_caught_and_held_back():
    matcher = StopMatcher(["STOP"])
    assert matcher.feed("abc ST") == "abc "
    assert matcher.feed("O") == ""
    assert matcher.feed("Pxyz") == "" and matcher.stopped


def test_false_alarm_is_released():
    assert run_matcher(["STOP"], ["ab ST", "AR"]) == ("ab STAR", False)


def test_earliest_stop_wins():
    assert run_matcher(["c", "ab"], ["xabc"]) == ("x", True)


@settings(max_examples=200, deadline=None)
@given(
    st.text("abc", max_size=30),
    st.lists(st.text("abc", min_size=1, max_size=3), max_size=4),
    st.lists(st.integers(1, 5), max_size=10),
)
def test_stream_stops_where_a_stop_string_first_completes(text, stops, cuts):
    chunks, rest = [], text
    for n in cuts:
        chunks.append(rest[:n])
        rest = rest[n:]
    chunks.append(rest)
    # Oracle: after each chunk, look for stop strings in all the text so far; the first time
    # any is there, the answer is the text before the earliest one.
    want, seen = (text, False), ""
    for chunk in chunks:
        seen += chunk
        found = [seen.find(s) for s in stops if s in seen]
        if found:
            want = (seen[: min(found)], True)
            break
    assert run_matcher(stops, chunks) == want
