"""Exact match and token F1 with SQuAD normalisation, on cases with known answers."""

import pytest

from aepo_jax.rewards import exact_match, normalize_answer, token_f1


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The Eiffel Tower!", "eiffel tower"),
        ("  An   apple, a pear.", "apple pear"),
        ("U.S.A.", "usa"),
        ("Theater", "theater"),  # "the" inside a word is not an article
    ],
)
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


@pytest.mark.parametrize(
    ("prediction", "answers", "expected"),
    [
        ("The Eiffel Tower", ["Eiffel Tower"], 1.0),
        ("an Apple", "apple", 1.0),
        ("U.S.A.", ["USA"], 1.0),
        ("Paris, France", ["Paris"], 0.0),
        ("London", ["Paris", "london"], 1.0),
        ("", ["x"], 0.0),
    ],
)
def test_exact_match(prediction, answers, expected):
    assert exact_match(prediction, answers) == expected


@pytest.mark.parametrize(
    ("prediction", "answers", "expected"),
    [
        ("Barack Obama", ["Obama"], 2 / 3),  # precision 1/2, recall 1
        (
            "the the cat cat",
            ["cat"],
            2 / 3,
        ),  # repeated tokens count once per gold occurrence
        ("new york city", ["New York"], 0.8),  # P 2/3, R 1
        ("red", ["blue", "Red!"], 1.0),  # best over several gold answers
        ("big red barn", ["small green barn", "red"], 0.5),  # max(1/3, 1/2)
        ("the", ["a"], 0.0),  # gold normalises to nothing: raw text compared
        ("the", ["cat"], 0.0),
        ("dog", ["cat"], 0.0),
    ],
)
def test_token_f1(prediction, answers, expected):
    assert token_f1(prediction, answers) == pytest.approx(expected)


def test_empty_gold_list_is_an_error():
    with pytest.raises(ValueError, match="empty"):
        token_f1("x", [])
    with pytest.raises(ValueError, match="empty"):
        exact_match("x", [])


@pytest.mark.parametrize("prediction", ["", "the", ".", "B", "  "])
def test_prediction_that_normalises_to_nothing_does_not_match_a_gold_that_does(prediction):
    """Gold "A" and "An" normalise to "" under SQuAD rules; so do `\\boxed{}`, `\\boxed{the}` and
    `\\boxed{.}`, which all counted as an exact match with F1 1."""
    for gold in ("A", "An"):
        assert exact_match(prediction, [gold]) == 0.0
        assert token_f1(prediction, [gold]) == 0.0
    assert exact_match(prediction, ["The The"]) == 0.0


@pytest.mark.parametrize(
    ("prediction", "gold", "em", "f1"),
    [
        ("a", "A", 1.0, 1.0),
        ("the  THE", "The The", 1.0, 1.0),  # lower case, whitespace collapsed
        ("the", "The The", 0.0, 2 / 3),  # articles kept: P 1, R 1/2
        ("(A)", "A", 1.0, 1.0),  # punctuation still dropped (a multiple-choice letter in brackets ...
        ("A.", "A", 1.0, 1.0),  # ... or with a full stop)
        ("A", "A.", 1.0, 1.0),
        ("an", "An", 1.0, 1.0),
        (".", ".", 1.0, 1.0),
    ],
)
def test_gold_that_normalises_to_nothing_is_compared_with_its_articles_kept(prediction, gold, em, f1):
    assert exact_match(prediction, [gold]) == em
    assert token_f1(prediction, [gold]) == pytest.approx(f1)


def test_a_normalisable_gold_still_uses_squad_normalisation():
    assert exact_match("The  Eiffel Tower.", ["eiffel tower"]) == 1.0
    assert token_f1("", ["Paris"]) == 0.0


@pytest.mark.parametrize(
    ("prediction", "gold", "em", "f1"),
    [
        (r"\text{Paris}", "Paris", 1.0, 1.0),  # plain SQuAD rules: "textparis", 0
        (r"\textbf{\text{New York}} City", "New York City", 1.0, 1.0),
        (r"New~York", "New York", 1.0, 1.0),  # plain SQuAD rules: "newyork"
        (r"\mathrm{Eiffel}\ Tower", "the Eiffel Tower", 1.0, 1.0),
        (r"\text{Paris}, \text{France}", "Paris", 0.0, 2 / 3),
        (r"\text{London}", "Paris", 0.0, 0.0),
        (r"\frac{1}{2}", "1/2", 0.0, 0.0),  # only text markup is unwrapped: maths is not read as text
    ],
)
def test_latex_text_markup_around_an_answer_is_typesetting(prediction, gold, em, f1):
    """Qwen models often box a text answer as `\\boxed{\\text{...}}`; the word inside is the answer."""
    assert exact_match(prediction, gold) == em
    assert token_f1(prediction, gold) == pytest.approx(f1)


def test_latex_plain_text_unwraps_nested_and_unbalanced_markup_in_one_pass():
    from aepo_jax.rewards.qa import latex_plain_text

    assert latex_plain_text(r"\text{a {b} c}") == "a {b} c"  # a plain brace pair inside stays
    assert latex_plain_text(r"\text{x}}") == "x}"  # a stray closing brace stays
    assert latex_plain_text(r"\emph{unclosed") == "unclosed"
    deep = "\\text{" * 20000 + "Paris" + "}" * 20000  # a repetition loop: one pass, not one per level
    assert latex_plain_text(deep) == "Paris"
