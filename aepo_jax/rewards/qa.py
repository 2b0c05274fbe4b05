"""Question-answering scores: exact match and token F1 with SQuAD normalisation (spec §5).

The normalisation is the one the SQuAD evaluation script made standard and
the released deep-research reward uses: lower case, drop punctuation, drop
the articles "a", "an", "the", collapse whitespace. Scores take the best
match over a list of gold answers.

Two departures:
- a gold answer that SQuAD normalisation empties ("A", "The The", "." — a
  multiple-choice letter, say) is compared with articles kept
  (`comparison_tokens`). Under plain SQuAD rules every prediction that also
  normalises to "" (`\\boxed{}`, `\\boxed{the}`) would match it.
- LaTeX text markup is typesetting, not part of the answer (`latex_plain_text`):
  `\\boxed{\\text{Paris}}` is "Paris", and `New~York` or `New\\,York` two words. Plain
  SQuAD rules (the released reward's) drop the backslash and braces as
  punctuation and compare "textparis" and "newyork".
"""

from __future__ import annotations

import collections
import re
import string
from collections.abc import Sequence

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
# What `latex_plain_text` reads: a text-style command with its opening brace, a brace, or a LaTeX space
# (`\ `, `\,`, `\;`, `\:`, `\>`, `\quad`, `\qquad`, `~`).
_LATEX_TOKEN = re.compile(
    r"(?P<command>\\(?:text|textbf|textit|textrm|textsf|texttt|textup|textnormal|emph|mbox|mathrm|mathbf|"
    r"mathit|mathsf|mathtt|mathnormal|operatorname)\s*\{)|(?P<brace>[{}])|(?P<space>\\[ ,;:>]|\\q?quad\b|~)")


def latex_plain_text(text: str) -> str:
    """`text` without LaTeX text markup: text-style commands unwrapped (`\\text{Paris}` -> `Paris`, nested
    ones too) and LaTeX spaces as spaces; every other character as it was (SQuAD normalisation then
    drops the punctuation). One pass: a stack says which closing brace ends a command."""
    out, closes_command, position = [], [], 0
    for token in _LATEX_TOKEN.finditer(text):
        out.append(text[position:token.start()])
        position = token.end()
        if token.group("command"):
            closes_command.append(True)
        elif token.group("space"):
            out.append(" ")
        elif token.group() == "{":
            closes_command.append(False)
            out.append("{")
        elif not (closes_command and closes_command.pop()):
            out.append("}")
    out.append(text[position:])
    return "".join(out)


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

    SQuAD-normalised tokens of the `latex_plain_text` of each side; when the gold answer normalises to nothing, both
    sides lower-cased with punctuation dropped but articles kept (so "The The"
    matches "the the" and "(A)" matches "A", but neither matches "the" or an
    empty prediction), and when that is empty too (a gold of punctuation only),
    both sides' lower-cased raw words.
    """
    prediction, gold = latex_plain_text(prediction), latex_plain_text(gold)
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
