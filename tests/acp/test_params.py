"""The ACP bridge's parameter checks alone (`greenroom.acp.params`): no connection, no agent."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from greenroom.acp.params import (
    RpcError,
    check_cwd,
    check_roots,
    decode,
    offset,
    prompt_result,
    prompt_text,
)
from greenroom.actors.prompt import Answer, StopReason
from greenroom.protocol.acp import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    PARSE_ERROR,
    PromptParams,
    PromptResult,
    PromptUsage,
    ResourceLinkBlock,
    TextBlock,
)
from greenroom.protocol.model import Usage


def refused(call: object, *args: object, **kwargs: object) -> RpcError:
    with pytest.raises(RpcError) as caught:
        call(*args, **kwargs)  # type: ignore[operator]
    return caught.value


def test_decode_names_the_field_of_the_wrong_shape() -> None:
    raw = msgspec.Raw(b'{"sessionId": "s", "prompt": [{"type": "picture"}]}')
    error = refused(decode, PromptParams, raw)
    assert error.code == INVALID_PARAMS
    assert "$.prompt[0]" in error.message
    missing = refused(decode, PromptParams, msgspec.Raw(b'{"prompt": []}'))
    assert "sessionId" in missing.message


def test_decode_answers_invalid_utf8_and_deep_nesting() -> None:
    bad_utf8 = refused(decode, PromptParams, msgspec.Raw(b'{"sessionId": "\xff"}'))
    assert bad_utf8.code == PARSE_ERROR
    deep = b'{"sessionId": "s", "prompt": [' + b"[" * 5000 + b"]" * 5000 + b"]}"
    nested = refused(decode, PromptParams, msgspec.Raw(deep))
    assert nested.code == INVALID_PARAMS


def test_a_good_params_object_decodes() -> None:
    raw = msgspec.Raw(b'{"sessionId": "s", "prompt": [{"type": "text", "text": "hi"}]}')
    params = decode(PromptParams, raw)
    assert params.session_id == "s"
    assert params.prompt == [TextBlock("hi")]


def test_cwd_must_be_absolute_without_nul_and_new_sessions_need_it_to_exist(
    tmp_path: Path,
) -> None:
    check_cwd(str(tmp_path), must_exist=True)
    check_cwd(str(tmp_path / "gone"), must_exist=False)  # a stored session's, maybe moved
    assert "absolute" in refused(check_cwd, "relative/dir", must_exist=False).message
    assert "NUL" in refused(check_cwd, "/a\x00b", must_exist=False).message
    gone = refused(check_cwd, str(tmp_path / "gone"), must_exist=True)
    assert "not an existing directory" in gone.message
    assert gone.code == INVALID_PARAMS


def test_every_additional_root_is_checked_and_named(tmp_path: Path) -> None:
    check_roots([str(tmp_path)])
    error = refused(check_roots, [str(tmp_path), str(tmp_path / "missing")])
    assert error.message.startswith("invalid params: additionalDirectories")
    assert "missing" in error.message


def test_only_our_cursors_are_offsets() -> None:
    assert offset(None) == 0
    assert offset("50") == 50
    for cursor in ("-1", "abc", "1.5", ""):
        assert "is not ours" in refused(offset, cursor).message


def test_prompt_text_joins_blocks_and_refuses_blank() -> None:
    blocks = [TextBlock("look at"), ResourceLinkBlock("file:///n.md", "notes")]
    assert prompt_text(blocks) == "look at\n[notes](file:///n.md)"
    assert "no text" in refused(prompt_text, [TextBlock("  \n")]).message
    assert "no text" in refused(prompt_text, []).message


@pytest.mark.parametrize(
    ("stop", "expected"),
    [
        ("completed", "end_turn"),
        ("max-tokens", "max_tokens"),
        ("refusal", "refusal"),
        ("aborted", "cancelled"),
        ("disposed", "cancelled"),
        ("withdrawn", "cancelled"),
    ],
)
def test_each_way_a_prompt_ends_has_its_acp_stop_reason(stop: StopReason, expected: str) -> None:
    assert prompt_result(Answer(stop_reason=stop), False) == PromptResult(expected)  # type: ignore[arg-type]


def test_a_failed_turn_is_an_internal_error_with_its_message_unless_cancelled() -> None:
    failed = Answer[None](stop_reason="error", reason="the model broke")
    error = refused(prompt_result, failed, False)
    assert error.code == INTERNAL_ERROR
    assert error.message == "the turn failed: the model broke"
    assert prompt_result(failed, True) == PromptResult("cancelled")
    completed = Answer[None](stop_reason="completed")
    assert prompt_result(completed, True).stop_reason == "cancelled"


def test_the_answer_carries_the_turns_tokens() -> None:
    usage = Usage(input_tokens=10, output_tokens=5, reasoning_tokens=2, cache_read_tokens=4)
    result = prompt_result(Answer[None](stop_reason="completed", usage=usage), False)
    assert result.usage == PromptUsage(15, 10, 5, 2, 4, None)
    assert prompt_result(Answer[None](stop_reason="completed"), False).usage is None
