"""Per-request metadata taken out of system messages (router/text/volatile.py)."""

from __future__ import annotations

import pytest

from router.text.volatile import NO_SCRUB, VolatileText
from shared.config.fields import Expected, regexes

BILLING = "x-anthropic-billing-header: cc_version=2.1.197.e12; cc_entrypoint=sdk-cli;"
WITH_CCH = "x-anthropic-billing-header: cc_version=2.1.29.f3a; cc_entrypoint=cli; cch=9b1c4;"
SYSTEM = "You are Claude Code, Anthropic's official CLI for Claude."


@pytest.mark.parametrize("header", [BILLING, WITH_CCH])
@pytest.mark.parametrize("joiner", ["", "\n", "\n\n"])
def test_the_billing_line_goes_however_it_is_joined(header, joiner):
    scrubbed = VolatileText().scrub([{"role": "system", "content": header + joiner + SYSTEM}])
    assert scrubbed.removed == 1
    assert scrubbed.messages == [{"role": "system", "content": SYSTEM}]


def test_two_sessions_render_the_same_system_prompt():
    first = VolatileText().scrub([{"role": "system", "content": BILLING + SYSTEM}])
    other = BILLING.replace("e12", "7c0") + " cch=00f3e;"
    second = VolatileText().scrub([{"role": "system", "content": other + SYSTEM}])
    assert first.messages == second.messages


def test_a_system_message_of_metadata_only_is_dropped():
    messages = [
        {"role": "system", "content": BILLING},
        {"role": "developer", "content": SYSTEM},
        {"role": "user", "content": "hi"},
    ]
    scrubbed = VolatileText().scrub(messages)
    assert scrubbed.removed == 1 and scrubbed.messages == messages[1:]


def test_user_text_and_mid_line_mentions_are_left_alone():
    user = {"role": "user", "content": BILLING}
    quoted = {"role": "system", "content": f"Never print '{BILLING}'"}
    scrubbed = VolatileText().scrub([quoted, user])
    assert scrubbed.removed == 0 and scrubbed.messages[0] is quoted and scrubbed.messages[1] is user


def test_operator_patterns_and_off():
    messages = [{"role": "system", "content": "request-id: 42\nBe brief."}]
    custom = VolatileText([r"(?m)^request-id: \d+\n"]).scrub(messages)
    assert custom.messages[0]["content"] == "Be brief." and custom.removed == 1
    assert NO_SCRUB.scrub(messages).messages is messages


def test_the_setting_refuses_bad_and_empty_matching_patterns(tmp_path):
    check = regexes()
    assert check([r"^x-.*;"], tmp_path) == (r"^x-.*;",)
    assert check([], tmp_path) == ()
    with pytest.raises(Expected, match="unterminated|missing"):
        check(["(oops"], tmp_path)
    with pytest.raises(Expected, match="matches none"):
        check([".*"], tmp_path)
