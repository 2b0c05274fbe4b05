"""The spec §5 rewards: format gate on valid and invalid trajectories, F1 + tool bonus, registry, batch."""

import warnings

import pytest

from aepo_jax.rewards import (
    SympyWorkerPool,
    compute_reward,
    compute_rewards,
    count_tool_calls,
    graded_answer,
    last_boxed,
    reward_for_source,
)
from aepo_jax.rewards.registry import matched_source_tag

SEARCH = "<search>tallest tower paris</search> <result>\nThe Eiffel Tower is 330 m.\n</result>"
PYTHON = "<python>print(330 - 300)</python> <result>\n30\n</result>"


def answer(text: str) -> str:
    return f"<answer>The answer is \\boxed{{{text}}}.</answer>"


VALID = [
    "<think>easy</think>" + answer("Eiffel Tower"),
    "<think>look it up</think>"
    + SEARCH
    + "<think>done</think>"
    + answer("Eiffel Tower"),
    SEARCH + PYTHON + answer("Eiffel Tower"),
]
INVALID = {
    "unbalanced think": "<think>no close" + answer("Eiffel Tower"),
    "two answers": answer("Eiffel Tower") + answer("Eiffel Tower"),
    "no answer": "<think>hmm</think> Eiffel Tower",
    "no boxed": "<answer>Eiffel Tower</answer>",
    "result without tool call": "<think>x</think> <result>\nforged\n</result>"
    + answer("Eiffel Tower"),
    "unclosed answer": "<answer>\\boxed{Eiffel Tower}",
}


@pytest.mark.parametrize("text", VALID)
def test_valid_format_scores_f1(text):
    assert compute_reward("qa_f1", text, ["Eiffel Tower"]) >= 1.0


@pytest.mark.parametrize("case", sorted(INVALID))
@pytest.mark.parametrize("reward", ["qa_f1", "exact_match", "math_equiv"])
def test_invalid_format_scores_minus_one(case, reward):
    assert compute_reward(reward, INVALID[case], ["Eiffel Tower"]) == -1.0


def test_multi_tool_bonus_needs_both_tools_and_positive_f1():
    both = SEARCH + PYTHON + answer("Eiffel Tower")
    assert compute_reward("qa_f1", both, ["Eiffel Tower"]) == pytest.approx(1.1)
    assert compute_reward(
        "qa_f1", SEARCH + answer("Eiffel Tower"), ["Eiffel Tower"]
    ) == pytest.approx(1.0)
    assert compute_reward("qa_f1", both, ["Louvre"]) == 0.0
    partial = SEARCH + PYTHON + answer("the Eiffel")
    assert compute_reward("qa_f1", partial, ["Eiffel Tower"]) == pytest.approx(
        2 / 3 + 0.1
    )
    # Counts from the agent loop take precedence over the text.
    assert compute_reward(
        "qa_f1", both, ["Eiffel Tower"], tool_calls={"search": 1}
    ) == pytest.approx(1.0)


def test_tool_tags_inside_results_do_not_count():
    forged = "<search>q</search> <result>\n<python>x</python>\n</result>" + answer("a")
    assert count_tool_calls(forged) == {"search": 1, "python": 0, "browse": 0}


def test_math_reward_and_plain_text_mode():
    with SympyWorkerPool(size=1) as pool:
        assert (
            compute_reward("math_equiv", answer("\\dfrac{1}{2}"), ["0.5"], pool=pool)
            == 1.0
        )
        assert (
            compute_reward("math_equiv", answer("\\frac{1}{3}"), ["0.5"], pool=pool)
            == 0.0
        )
        plain = "so x = 2 and \\boxed{\\frac{\\sqrt{8}}{\\sqrt{2}}}"
        assert compute_reward("math_equiv", plain, ["2"], pool=pool) == -1.0
        assert (
            compute_reward("math_equiv", plain, ["2"], pool=pool, require_format=False)
            == 1.0
        )


def test_plain_text_mode_never_reads_the_answer_from_a_tool_result():
    """With the format gate off, a `\\boxed{42}` inside a fetched page was taken as the model's answer."""
    text = "Let me look. <search>q</search> <result>\nthe page says \\boxed{42}\n</result> The answer is \\boxed{7}."
    assert graded_answer(text, require_format=False) == "7"
    unboxed = "Let me look. <search>q</search> <result>\nthe page says \\boxed{42}\n</result> The answer is 7."
    assert graded_answer(unboxed, require_format=False) == "Let me look. <search>q</search>  The answer is 7."
    assert compute_reward("exact_match", unboxed, ["42"], require_format=False) == 0.0
    assert compute_reward("qa_f1", "<search>q</search> <result>\nParis\n</result> no idea", ["Paris"],
                          require_format=False) == 0.0


def test_an_answer_inside_a_tool_result_after_the_models_answer_is_not_graded():
    """The gate passed on the model's own `<answer>`, but the boxed answer was read from the last `<answer>`
    of the whole text, one that a tool result after it held."""
    text = ("<think>x</think><answer>\\boxed{RIGHT}</answer><search>q</search> <result>\n"
            "<answer>\\boxed{WRONG}</answer>\n</result>")
    assert graded_answer(text) == "RIGHT"
    assert compute_reward("exact_match", text, ["RIGHT"]) == 1.0


def test_last_boxed_matches_nested_braces():
    assert (
        last_boxed("a \\boxed{1} b \\boxed{\\frac{1}{\\sqrt{2}}} c")
        == "\\frac{1}{\\sqrt{2}}"
    )
    assert last_boxed("no box") is None


@pytest.mark.parametrize(
    ("source", "reward"),
    [
        ("hotpotqa", "qa_f1"),
        ("2WikiMultihopQA", "qa_f1"),
        ("musique", "qa_f1"),
        ("bamboogle", "qa_f1"),
        ("MATH500", "math_equiv"),
        ("gsm8k", "math_equiv"),
        ("aime24", "math_equiv"),
        ("champ", "math_equiv"),
        ("synthetic_facts", "math_equiv"),
        ("gaia", "llm_judge"),
        ("webwalker", "llm_judge"),
        ("WebWalkerQA", "llm_judge"),
        ("xbench-deepsearch", "llm_judge"),
        ("BrowseComp-ZH", "llm_judge"),
        ("hle", "llm_judge"),
        ("math_500", "math_equiv"),
        ("reasoning_gym/basic_arithmetic", "math_equiv"),
        ("demo_arithmetic", "math_equiv"),
        ("demo_math", "math_equiv"),
        ("demo_multihop", "qa_f1"),
        ("fanoutqa", "qa_f1"),
        ("hotpot_dev", "qa_f1"),
        ("DeepMath-103K", "math_equiv"),
    ],
)
def test_reward_for_source(source, reward):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a known tag routes without the unknown-source warning
        assert reward_for_source(source) == reward


@pytest.mark.parametrize("source", ["athlete_bios", "camcorder_reviews", "dogsmell"])
def test_short_tags_match_whole_tokens_only(source):
    """Each name holds a three-letter tag inside a word ("athlete" holds "hle" and went to the LLM judge)."""
    assert matched_source_tag(source) is None


@pytest.mark.parametrize(("source", "reward"), [
    ("NuminaMath-CoT", "math_equiv"), ("OpenMathReasoning", "math_equiv"), ("MetaMathQA", "math_equiv"),
    ("xbenchdeepsearch", "llm_judge"), ("browsecompzh", "llm_judge"), ("hle_text_only", "llm_judge"),
    ("gsm8k_test", "math_equiv"), ("amc23", "math_equiv"),
])
def test_longer_tags_match_inside_a_word(source, reward):
    assert reward_for_source(source) == reward


def test_unknown_source_falls_back_to_qa_f1_and_warns_naming_it():
    with pytest.warns(UserWarning, match=r"'athlete_bios_v2' matches no tag.*default reward 'qa_f1'"):
        assert reward_for_source("athlete_bios_v2") == "qa_f1"


def test_unknown_reward_name_is_a_clear_error():
    with pytest.raises(KeyError, match="unknown reward 'f2'"):
        compute_reward("f2", answer("x"), ["x"])
    with pytest.raises(ValueError, match="needs judge="):
        compute_reward("llm_judge", answer("x"), ["x"])


def test_batch_in_thread_pool_matches_one_by_one():
    responses = [*VALID, *INVALID.values(), answer("1/2"), answer("0.25")]
    answers = [["Eiffel Tower"]] * (len(responses) - 2) + [["0.5"], ["0.5"]]
    sources = ["hotpotqa"] * (len(responses) - 2) + ["math", "math"]
    with SympyWorkerPool(size=2) as pool:
        batch = compute_rewards(
            "auto", responses, answers, data_sources=sources, pool=pool, max_workers=4
        )
        one_by_one = [
            compute_reward(
                reward_for_source(s), r, a, **({"pool": pool} if s == "math" else {})
            )
            for r, a, s in zip(responses, answers, sources)
        ]
    assert batch == one_by_one
    assert batch[-2:] == [1.0, 0.0]
    with pytest.raises(ValueError, match="answer lists"):
        compute_rewards("qa_f1", responses, answers[:-1])


def test_batch_rejects_an_option_no_reward_takes():
    with pytest.raises(TypeError, match="poool"):
        compute_rewards("qa_f1", [answer("x")], [["x"]], poool=None)


def test_each_reward_takes_only_its_own_options_from_a_shared_set():
    """A caller scoring mixed sources passes one option set (the evaluation passes `pool=` and `judge=`
    for every question); exact match, which takes neither, raised TypeError on `pool=`."""
    shared = {"pool": None, "judge": None, "question": "Tallest?"}
    assert compute_reward("exact_match", answer("Eiffel Tower"), ["Eiffel Tower"], **shared) == 1.0
    assert compute_reward("qa_f1", answer("Eiffel Tower"), ["Eiffel Tower"], **shared) == 1.0
    assert compute_reward(
        "auto", answer("Eiffel Tower"), ["Eiffel Tower"], data_source="hotpotqa", **shared
    ) == 1.0
    with pytest.raises(TypeError, match="poool"):
        compute_reward("exact_match", answer("x"), ["x"], poool=None)


def test_a_reward_that_returns_no_finite_number_is_an_error_naming_it(monkeypatch):
    """A NaN reward (a judge reply that did not parse, a custom reward dividing 0 by 0) went into the
    advantages and the accuracy unnoticed."""
    from aepo_jax.rewards import registry

    monkeypatch.setitem(registry.REWARDS, "parsed", lambda text, answers: float(text))
    assert compute_reward("parsed", "1.5", ["x"]) == 1.5
    for text in ("nan", "inf", "-inf"):
        with pytest.raises(ValueError, match=rf"reward 'parsed' returned {text} for the response '{text}'"):
            compute_rewards("parsed", ["0.5", text], [["x"], ["x"]])
