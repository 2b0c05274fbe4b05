"""Tag protocol (spec §4, §5): parsing, formatting, boxed answers, format validation."""

import re

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from aepo_jax.agent.protocol import (
    ToolCall,
    _boxed_content,
    extract_boxed_answer,
    format_tool_call,
    format_tool_result,
    model_text,
    parse_last_tool_call,
    validate_format,
)
from aepo_jax.agent.tags import (
    AGENT_SPECIAL_TOKENS,
    RESULT_CLOSE,
    RESULT_OPEN,
    TOOL_TAGS,
)
from tests.property_budget import examples

# Text built from tag fragments and ordinary characters, so tags really occur.
_PIECES = st.sampled_from([*AGENT_SPECIAL_TOKENS, "\\boxed{", "{", "}", "<", ">", "/", " ", "\n", "x", "42"])
tagged_text = st.one_of(st.text(), st.lists(st.one_of(_PIECES, st.text(max_size=5)), max_size=40).map("".join))


@settings(max_examples=examples(300))
@given(tagged_text)
def test_nothing_raises_on_arbitrary_text(text):
    call = parse_last_tool_call(text)
    assert call is None or call.tag in TOOL_TAGS
    answer = extract_boxed_answer(text)
    assert answer is None or isinstance(answer, str)
    ok, reason = validate_format(text)
    assert isinstance(ok, bool) and (ok == (reason == ""))


@settings(max_examples=examples(300))
@given(tagged_text, st.sampled_from(TOOL_TAGS), st.text())
def test_parse_round_trips_a_formatted_call(prefix, tag, content):
    assume(f"<{tag}>" not in content and f"</{tag}>" not in content)
    call = ToolCall(tag, content)
    assert parse_last_tool_call(prefix + format_tool_call(call)) == ToolCall(tag, content.strip())


@settings(max_examples=examples(200))
@given(st.text(alphabet=st.characters(blacklist_characters="{}"), max_size=20), st.integers(0, 3))
def test_boxed_answer_round_trips_with_nested_braces(inner, depth):
    assume("<answer>" not in inner and "</answer>" not in inner)
    value = "{" * depth + inner + "}" * depth
    assert extract_boxed_answer(f"<think>t</think><answer>so \\boxed{{{value}}}.</answer>") == value


def test_parse_takes_the_last_complete_call_and_ignores_an_unfinished_one():
    text = "<search>first</search> <result>\nr\n</result> <python> print(2) </python> <search>unfinished"
    assert parse_last_tool_call(text) == ToolCall("python", "print(2)")
    assert parse_last_tool_call("<search>no close") is None
    assert parse_last_tool_call("just text </python>") is None
    assert parse_last_tool_call("<browse>doc-7</browse>") == ToolCall("browse", "doc-7")


def test_format_tool_result_is_exactly_the_spec_string():
    assert format_tool_result("hits") == " <result>\nhits\n</result>"


def test_boxed_answer_comes_from_the_last_answer_block():
    assert extract_boxed_answer("<answer>\\boxed{1}</answer> <answer>\\boxed{\\frac{1}{2}}</answer>") == "\\frac{1}{2}"
    assert extract_boxed_answer("\\boxed{5} outside any answer") is None
    assert extract_boxed_answer("<answer>no box</answer>") is None
    assert extract_boxed_answer("<answer>\\boxed{unclosed</answer>") is None


GOOD = ("<think>plan</think><search>capital of France</search>" + format_tool_result("Doc 1 Paris <answer>")
        + "<think>so</think><answer>It is \\boxed{Paris}</answer>")


@pytest.mark.parametrize(
    "text, reason_part",
    [
        ("<think>a<answer>\\boxed{1}</answer>", "<think>"),
        ("<think>a</think></think><answer>\\boxed{1}</answer>", "<think>"),
        ("<think>a</think>", "exactly one <answer>"),
        ("<answer>\\boxed{1}</answer><answer>\\boxed{2}</answer>", "exactly one <answer>"),
        ("<think>a</think> <result>\nx\n</result><answer>\\boxed{1}</answer>", "not preceded by a tool call"),
        ("<answer>the answer is 1</answer>", "\\boxed{}"),
    ],
)
def test_validate_format_rejects_each_rule_of_spec_5(text, reason_part):
    ok, reason = validate_format(text)
    assert not ok and reason_part in reason


def test_validate_format_accepts_a_good_trajectory_and_ignores_tags_inside_results():
    assert validate_format(GOOD) == (True, "")


@settings(max_examples=examples(200))
@given(tagged_text)
def test_any_tool_output_inside_a_result_keeps_a_good_trajectory_valid(output):
    assume("</result>" not in output)
    text = ("<think>a</think><python>print(1)</python>" + format_tool_result(output)
            + "<answer>\\boxed{1}</answer>")
    assert validate_format(text) == (True, "")
    assert extract_boxed_answer(text) == "1"


def _boxed_by_rescanning(text: str) -> str | None:
    """The last closed `\\boxed{...}` found by scanning forward from each box (the quadratic reference)."""
    start = text.rfind("\\boxed{")
    while start >= 0:
        depth, i = 1, start + len("\\boxed{")
        while i < len(text):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                return text[start + len("\\boxed{") : i]
            i += 1
        start = text.rfind("\\boxed{", 0, start)
    return None


_RESULT_REGEX = re.compile(re.escape(RESULT_OPEN) + r".*?" + re.escape(RESULT_CLOSE), re.DOTALL)


@settings(max_examples=examples(500))
@given(tagged_text)
def test_the_one_pass_scans_agree_with_their_rescanning_references(text):
    """`_boxed_content` (`extract_boxed_answer`'s) pairs braces in one pass and `model_text` strips result blocks in one scan
    (both rescanned to the end of the text from every unclosed box or `<result>`: quadratic on a repetition
    loop); they answer as the rescanning versions do."""
    assert _boxed_content(text) == _boxed_by_rescanning(text)
    assert model_text(text) == _RESULT_REGEX.sub("", text)


@pytest.mark.parametrize(("text", "boxed"), [
    ("\\boxed{a} \\boxed{b", "a"),  # the last box is unclosed: the one before it
    ("} \\boxed{x{y}z}}", "x{y}z"),
    ("\\boxed{" * 50 + "1" + "}", "1"),
    ("\\boxed{\\boxed{2}}", "2"),  # the last box opened
])
def test_boxed_answers_of_unbalanced_and_nested_text(text, boxed):
    assert extract_boxed_answer("<answer>" + text + "</answer>") == boxed
