"""Question-answering scores: exact match and token F1 with SQuAD normalisation (spec §5).

The normalisation is the one the SQuAD evaluation script made standard and
the released deep-research reward uses: lower case, drop punctuation, drop
the articles "a", "an", "the", collapse whitespace. Scores take the best
match over a list of gold answers.

One departure: a gold answer that SQuAD normalisation empties ("A", "The The",
"." — a multiple-choice letter, say) is compared with articles kept
(`comparison_tokens`). Under plain SQuAD
rules every prediction that also normalises to "" (`\\boxed{}`, `\\boxed{the}`)
would match it.
"""

from __future__ import annotations

import collections
import re
import string
from collections.abc import Sequence

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """Lower case, strip punctuation and articles, collapse whitespace."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _without_punctuation(text: str) -> list[str]:
    """Lower-case words with punctuation dropped and articles kept."""
    return "".join(ch for ch in text.lower() if ch not in _PUNCTUATION).split()


def comparison_tokens(prediction: str, gold: str) -> tuple[list[str], list[str]]:
    """The (prediction, gold) tokens that exact match and F1 compare.

    SQuAD-normalised tokens; when the gold answer normalises to nothing, both
    sides lower-cased with punctuation dropped but articles kept (so "The The"
    matches "the the" and "(A)" matches "A", but neither matches "the" or an
    empty prediction), and when that is empty too (a gold of punctuation only),
    both sides' lower-cased raw words.
    """
    gold_tokens = normalize_answer(gold).split()
    if gold_tokens:
        return normalize_answer(prediction).split(), gold_tokens
    gold_tokens = _without_punctuation(gold)
    if gold_tokens:
        return _without_punctuation(prediction), gold_tokens
    return prediction.lower().split(), gold.lower().split()


def _as_list(answers: str | Sequence[str]) -> list[str]:
    if isinstance(answers, str):
        return [answers]
    answers = [str(a) for a in answers]
    if not answers:
        raise ValueError(
            "gold answers list is empty: cannot score a prediction against nothing"
        )
    return answers


def exact_match(prediction: str, answers: str | Sequence[str]) -> float:
    """1.0 if the prediction's tokens equal some gold answer's (`comparison_tokens`), else 0.0."""
    for gold in _as_list(answers):
        pred_tokens, gold_tokens = comparison_tokens(prediction, gold)
        if pred_tokens == gold_tokens:
            return 1.0
    return 0.0


def _token_f1(prediction: str, gold: str) -> float:
    pred_tokens, gold_tokens = comparison_tokens(prediction, gold)
    if not pred_tokens or not gold_tokens:
        # Both empty counts as a match; one empty scores zero.
        return float(pred_tokens == gold_tokens)
    common = collections.Counter(pred_tokens) & collections.Counter(gold_tokens)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(pred_tokens)
    recall = overlap / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def token_f1(prediction: str, answers: str | Sequence[str]) -> float:
    """Best token-level F1 (bag of `comparison_tokens`) over the gold answers."""
    return max(_token_f1(prediction, gold) for gold in _as_list(answers))
