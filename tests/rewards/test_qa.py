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
        ("the", ["a"], 1.0),  # both normalise to nothing
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
