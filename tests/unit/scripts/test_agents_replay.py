"""The coding-agent check and benchmark's pure parts: usage as each API counts it, Claude Code's
billing block edited, a recorded Messages request converted to a chat request (no servers)."""

from __future__ import annotations

import json

from scripts.bench_agents import (
    FIXTURE,
    anthropic_to_chat,
    load_recording,
    next_turn,
    scrubbed,
    session_body,
)
from scripts.check_coding_agents import billing_block, usage_of, verdict, with_billing

BILLING = "x-anthropic-billing-header: cc_version=2.1.197.e12; cc_entrypoint=sdk-cli;"


def sse(*events: dict) -> str:
    return "".join(f"event: {e.get('type', 'x')}\ndata: {json.dumps(e)}\n\n" for e in events)


def test_anthropic_prompt_is_the_sum_of_its_three_counts_in_a_stream():
    reply = sse(
        {
            "type": "message_start",
            "message": {
                "usage": {
                    "input_tokens": 100,
                    "cache_read_input_tokens": 20000,
                    "cache_creation_input_tokens": 900,
                    "output_tokens": 1,
                }
            },
        },
        {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "hi"}},
        {"type": "message_delta", "usage": {"output_tokens": 5}},
    )
    usage = usage_of("/v1/messages?beta=true", reply)
    assert (usage["prompt"], usage["cached"]) == (21000, 20000)
    assert usage["output_tokens"] == 5  # message_delta's count is the final one


def test_anthropic_plain_reply_and_missing_cache_fields():
    usage = usage_of("/v1/messages", json.dumps({"usage": {"input_tokens": 7}}))
    assert (usage["prompt"], usage["cached"], usage.share) == (7, 0, 0.0)


def test_responses_usage_comes_from_response_completed():
    reply = sse(
        {"type": "response.created", "response": {"usage": None}},
        {
            "type": "response.completed",
            "response": {
                "usage": {"input_tokens": 5851, "input_tokens_details": {"cached_tokens": 5828}}
            },
        },
    )
    usage = usage_of("/v1/responses", reply)
    assert (usage["prompt"], usage["cached"]) == (5851, 5828)


def test_chat_usage_from_the_last_chunk_and_data_done():
    reply = (
        'data: {"choices": [{"delta": {"content": "a"}}]}\n\n'
        'data: {"choices": [], "usage": {"prompt_tokens": 10, '
        '"prompt_tokens_details": {"cached_tokens": 9}}}\n\ndata: [DONE]\n\n'
    )
    usage = usage_of("/v1/chat/completions", reply)
    assert (usage["prompt"], usage["cached"]) == (10, 9)
    assert usage_of("/health", reply) is None


def body_with(system_first: str) -> dict:
    return {
        "model": "m",
        "system": [
            {"type": "text", "text": system_first},
            {
                "type": "text",
                "text": "You are Claude Code.",
                "cache_control": {"type": "ephemeral"},
            },
        ],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hello"}]}],
        "tools": [
            {
                "name": "Read",
                "description": "read a file",
                "input_schema": {"type": "object", "properties": {}},
            }
        ],
    }


def test_cch_is_added_then_replaced_and_the_rest_kept():
    body = body_with(BILLING)
    added = with_billing(body, cch="abcde")
    assert billing_block(added)["text"] == BILLING + " cch=abcde;"
    replaced = with_billing(added, cch="01234")
    assert billing_block(replaced)["text"] == BILLING + " cch=01234;"
    assert replaced["system"][1:] == body["system"][1:] and replaced["tools"] == body["tools"]
    assert billing_block(body)["text"] == BILLING  # the original is not changed


def test_version_suffix_varies_only_the_three_hex_digits():
    text = billing_block(with_billing(body_with(BILLING), version_suffix="0ff"))["text"]
    assert text == BILLING.replace("2.1.197.e12", "2.1.197.0ff")


def test_body_without_billing_block_is_left_alone():
    body = body_with("You are a helpful assistant.")
    assert billing_block(body) is None
    assert with_billing(body, cch="abcde") == body


def test_conversion_keeps_billing_block_as_first_system_text_and_tools_as_functions():
    chat = anthropic_to_chat(body_with(BILLING), max_tokens=8)
    system = chat["messages"][0]
    assert system["role"] == "system"
    assert system["content"][0] == {"type": "text", "text": BILLING}
    assert system["content"][1]["text"] == "You are Claude Code."
    assert chat["messages"][1] == {"role": "user", "content": [{"type": "text", "text": "hello"}]}
    assert chat["tools"][0]["function"]["name"] == "Read"
    assert chat["tools"][0]["function"]["parameters"]["type"] == "object"
    assert chat["stream"] and chat["stream_options"] == {"include_usage": True}


def test_conversion_of_tool_use_tool_result_and_mid_conversation_system():
    body = body_with(BILLING)
    body["messages"] += [
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "x"},
                {"type": "text", "text": "Reading."},
                {"type": "tool_use", "id": "t1", "name": "Read", "input": {"path": "a"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "t1",
                    "content": [{"type": "text", "text": "file body"}],
                },
                {"type": "text", "text": "thanks"},
            ],
        },
        {"role": "system", "content": "Available agent types: ..."},
    ]
    messages = anthropic_to_chat(body, max_tokens=8)["messages"][2:]
    assert messages[0]["content"] == "Reading."
    assert messages[0]["tool_calls"][0]["function"] == {
        "name": "Read",
        "arguments": '{"path": "a"}',
    }
    assert messages[1] == {"role": "tool", "tool_call_id": "t1", "content": "file body"}
    assert messages[2]["content"] == [{"type": "text", "text": "thanks"}]
    assert messages[3]["role"] == "system"


def test_fixture_sessions_differ_only_in_billing_hex_and_first_question():
    recorded = load_recording(FIXTURE)
    a, b = session_body(recorded, 0), session_body(recorded, 1)
    assert billing_block(a)["text"] != billing_block(b)["text"]
    assert a["system"][1:] == b["system"][1:] and a["tools"] == b["tools"]
    differ = [
        i for i, (x, y) in enumerate(zip(a["messages"], b["messages"], strict=True)) if x != y
    ]
    assert len(differ) == 1 and a["messages"][differ[0]]["role"] == "user"
    assert "Session 0" in json.dumps(a["messages"][differ[0]])
    later = next_turn(a, 2)
    assert later["messages"][: len(a["messages"])] == a["messages"]
    assert [m["role"] for m in later["messages"][-2:]] == ["assistant", "user"]
    assert len(recorded["tools"]) == 24


def test_fixture_names_no_machine():
    text = FIXTURE.read_text()
    assert "/tmp/check-agents" not in text and '"device_id\\":\\"' + "0" * 64 in text


def test_scrub_replaces_paths_and_ids():
    saved = {
        "headers": {"X-Claude-Code-Session-Id": "f19a2e5f-4925-490d-95ed-c995e41d6f0b"},
        "body": {
            "system": [
                {
                    "text": "cwd: /tmp/check-agents-ab12_x/claude-code\n"
                    " - OS Version: Linux 6.18.44-fc\n"
                }
            ]
        },
    }
    out = json.dumps(scrubbed(saved))
    assert "f19a2e5f" not in out and "/home/user/project" in out and "6.18" not in out


def request(n, agent, share, turn_request=True, status=200, session=1):
    return {
        "n": n,
        "agent": agent,
        "session": session,
        "turn": n,
        "method": "POST",
        "path": "/v1/messages",
        "status": status,
        "turn_request": turn_request,
        "share": share,
        "prompt_tokens": 100,
        "cached_tokens": int(share * 100),
    }


def test_verdict_exempts_each_agents_first_and_side_requests():
    requests = [
        request(1, "claude-code", 0.0),
        request(2, "claude-code", 0.1, False),
        request(3, "claude-code", 0.99),
        request(4, "codex-cli", 0.0),
        request(5, "codex-cli", 0.95),
    ]
    assert verdict(requests) == []


def test_verdict_fails_a_new_session_missing_the_cache_and_protocol_errors():
    requests = [
        request(1, "claude-code", 0.0),
        request(2, "claude-code", 0.001, session=2),
        request(3, "codex-cli", 0.0, status=400),
    ]
    why = verdict(requests)
    assert any("request 2" in w and "< 90%" in w for w in why)
    assert any("request 3" in w and "protocol error" in w for w in why)
