"""score_question: correctness by data source, F1 of the boxed answer, then pass@k over the result."""

import pytest

from aepo_jax.evaluation import build_reports, score_question
from aepo_jax.rewards import SympyWorkerPool
from aepo_jax.tools import LLMJudgeClient
from tests.rewards.judge_server import JudgeServer


def answer(text):
    return f"<answer>\\boxed{{{text}}}</answer>"


def test_qa_question_counts_exact_matches_and_f1():
    example = {
        "id": "q",
        "question": "Tallest?",
        "answers": ["Eiffel Tower"],
        "data_source": "hotpotqa",
    }
    responses = [
        "<search>t</search> <result>\nx\n</result>" + answer("the Eiffel Tower"),
        answer("Eiffel"),
        "no answer at all",
    ]
    result = score_question(example, responses, [10, 20, 30])
    assert result.correct == [True, False, False]
    assert result.f1 == pytest.approx([1.0, 2 / 3, 0.0])
    assert result.tool_calls == [1, 0, 0]
    report = build_reports([result])[0]
    assert report.pass_at_k[1] == pytest.approx(1 / 3)
    assert report.pass_at_k[3] == pytest.approx(1.0)


def test_math_question_uses_equivalence():
    example = {
        "id": "m",
        "question": "1/2?",
        "answers": ["0.5"],
        "data_source": "math500",
    }
    with SympyWorkerPool(size=1) as pool:
        result = score_question(
            example,
            [answer("\\dfrac{1}{2}"), answer("\\frac{2}{4}"), answer("2")],
            [5, 5, 5],
            pool=pool,
        )
    assert result.correct == [True, True, False]


def test_mismatched_lengths_are_an_error():
    example = {"id": "q", "question": "?", "answers": ["a"], "data_source": "x"}
    with pytest.raises(ValueError, match="2 responses but 1 lengths"):
        score_question(example, ["a", "b"], [1])


def test_auto_reward_chooses_by_data_source_like_no_reward():
    example = {"id": "q", "question": "Tallest?", "answers": ["Eiffel Tower"], "data_source": "hotpotqa"}
    responses = [answer("the Eiffel Tower"), answer("Eiffel")]
    auto = score_question(example, responses, [1, 1], reward="auto")
    assert auto.correct == score_question(example, responses, [1, 1]).correct == [True, False]


def test_mixed_sources_share_one_option_set_each_reward_taking_its_own():
    """The driver passes the same `pool=` and `judge=` for every question: exact match (QA sources)
    takes neither, math equivalence takes the pool, the judge the client."""
    examples = [
        {"id": "q", "question": "Tallest?", "answers": ["Eiffel Tower"], "data_source": "hotpotqa"},
        {"id": "m", "question": "1/2?", "answers": ["0.5"], "data_source": "math500"},
        {"id": "g", "question": "Capital of France?", "answers": ["Paris"], "data_source": "gaia"},
    ]
    responses = {"q": [answer("Eiffel Tower"), answer("Louvre")], "m": [answer("\\frac{2}{4}"), answer("2")],
                 "g": [answer("paris"), answer("Lyon"), "<answer>no box</answer>"]}
    with SympyWorkerPool(size=1) as pool, JudgeServer() as server:
        judge = LLMJudgeClient(server.url, model="judge")
        results = {ex["id"]: score_question(ex, responses[ex["id"]], [1] * len(responses[ex["id"]]),
                                            pool=pool, judge=judge) for ex in examples}
    assert results["q"].correct == [True, False]
    assert results["m"].correct == [True, False]
    assert results["g"].correct == [True, False, False]
    # Only the gaia answers with a valid format reached the judge, each with its question.
    prompts = [body["messages"][-1]["content"] for _, body in server.requests]
    assert len(prompts) == 2 and all("Question: Capital of France?" in p for p in prompts)


@pytest.mark.parametrize("gold", ["A", "The The", "An"])
def test_an_empty_or_article_only_box_does_not_match_a_gold_that_normalises_to_nothing(gold):
    """SQuAD normalisation empties these golds; `\\boxed{}`, `\\boxed{the}` and `\\boxed{.}` counted as correct."""
    example = {"id": "q", "question": "Which option?", "answers": [gold], "data_source": "hotpotqa"}
    result = score_question(example, [answer(""), answer("the"), answer("."), answer("B"), answer(gold.lower())],
                            [1] * 5)
    assert result.correct == [False, False, False, False, True]
    # F1 falls back to the same raw tokens: "the" is half of "The The", none of "A".
    assert result.f1 == pytest.approx([0.0, 2 / 3 if gold == "The The" else 0.0, 0.0, 0.0, 1.0])


def test_each_result_and_report_names_the_reward_that_decided_correctness():
    qa = score_question({"id": "q", "question": "?", "answers": ["Paris"], "data_source": "hotpotqa"},
                        [answer("Paris")], [1])
    with SympyWorkerPool(size=1) as pool:
        math = score_question({"id": "m", "question": "?", "answers": ["0.5"], "data_source": "math500"},
                              [answer("\\frac{1}{2}")], [1], pool=pool)
    assert (qa.correctness, math.correctness) == ("exact_match", "math_equiv")
    reports = {r.dataset: r for r in build_reports([qa, math])}
    assert reports["hotpotqa"].correctness == "exact_match" and reports["math500"].correctness == "math_equiv"
    assert reports["all"].correctness == "exact_match,math_equiv"


def test_timed_out_math_checks_are_counted_per_question_and_per_dataset():
    """A sympy check past its limit counts as wrong; the count was kept only in `pool.timeouts`."""
    # A check that takes sympy about 10 ms: a 1e-6 s limit is 1 ms (the pool's selector waits in 1 ms steps),
    # which a check of `\\sqrt{2}/2` (under 1 ms) can meet.
    example = {"id": "m", "question": "?", "answers": ["x^{6}+6x^{5}+15x^{4}+20x^{3}+15x^{2}+6x+1"],
               "data_source": "math500"}
    with SympyWorkerPool(size=1, timeout_s=1e-6) as pool, pytest.warns(UserWarning, match="ran past its"):
        result = score_question(example, [answer("(x+1)^{6}"), answer("(x+1)^{6}"), "no answer"],
                                [1, 1, 1], pool=pool)
    assert result.correct == [False, False, False]
    assert result.math_timeouts == 2 == pool.timeouts
    assert build_reports([result])[0].math_timeouts == 2
    qa = score_question({"id": "q", "question": "?", "answers": ["Paris"], "data_source": "hotpotqa"},
                        [answer("Paris")], [1])
    assert qa.math_timeouts == 0
