"""A generated tool-use task: facts found by search, combined by a python calculation.

Invented towns carry numeric attributes (founding year, population). Each town
has one corpus document; questions ask for a quantity that needs two or more
facts combined arithmetically ("How many years passed between the founding of
X and of Y?"), so an agent has to search for each town and then compute. Train
and held-out questions are drawn from disjoint sets of towns, and distractor
documents (towns with similar names, unrelated notes) make retrieval imperfect.
Everything is a pure function of a seed.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr", "tr", "st")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ou")
_CODAS = ("", "n", "r", "s", "l", "th", "m")
_SUFFIXES = ("ford", "ton", "ville", "dale", "mere", "holm", "wick", "by")


@dataclasses.dataclass(frozen=True)
class Town:
    """One invented entity and its facts."""

    name: str
    founded: int
    population: int


@dataclasses.dataclass(frozen=True)
class Question:
    """A question with its gold answer and the towns it needs."""

    id: str
    question: str
    answer: str
    towns: tuple[str, ...]
    kind: str


def _town_name(rng: np.random.Generator, max_syllables: int = 2) -> str:
    syllables = rng.integers(1, max_syllables + 1)
    stem = "".join(
        str(rng.choice(_ONSETS)) + str(rng.choice(_VOWELS)) + str(rng.choice(_CODAS)) for _ in range(syllables)
    )
    return (stem + str(rng.choice(_SUFFIXES))).capitalize()


def invent_names(count: int, seed: int, max_syllables: int = 2) -> list[str]:
    """`count` invented town names, drawn independently (repeats allowed)."""
    rng = np.random.default_rng(seed)
    return [_town_name(rng, max_syllables) for _ in range(count)]


def generate_towns(n: int, seed: int, max_syllables: int = 2) -> list[Town]:
    """`n` towns with distinct names, founding years in [1100, 1990], populations in [1e3, 1e6).

    Names are 1..`max_syllables` invented syllables plus a suffix ("Kraiford"); shorter
    names are easier for a small model to copy into a search query.
    """
    capacity = (len(_ONSETS) * len(_VOWELS) * len(_CODAS)) ** max_syllables * len(_SUFFIXES)
    if n > capacity // 2:
        raise ValueError(f"{n} towns is too many distinct names for max_syllables={max_syllables}")
    rng = np.random.default_rng(seed)
    names: set[str] = set()
    towns = []
    while len(towns) < n:
        name = _town_name(rng, max_syllables)
        if name in names:
            continue
        names.add(name)
        towns.append(Town(name, int(rng.integers(1100, 1991)), int(rng.integers(1_000, 1_000_000))))
    return towns


def town_document(town: Town, doc_id: str) -> dict[str, str]:
    """The corpus document for a town; the first line of `contents` is the title."""
    text = f"{town.name}\n{town.name} was founded in {town.founded}. Population {town.population}."
    return {"id": doc_id, "contents": text}


def distractor_document(rng: np.random.Generator, towns: list[Town], doc_id: str) -> dict[str, str]:
    """A document that mentions a real town without giving its facts."""
    town = towns[int(rng.integers(len(towns)))]
    other = towns[int(rng.integers(len(towns)))]
    text = (
        f"Travel notes on {town.name}\nThe road from {town.name} to {other.name} crosses two rivers. "
        f"Markets in {town.name} open early in summer."
    )
    return {"id": doc_id, "contents": text}


def build_corpus(towns: list[Town], n_distractors: int, seed: int) -> list[dict[str, str]]:
    """One document per town plus `n_distractors` distractors, in a seeded order."""
    rng = np.random.default_rng(seed)
    docs = [town_document(t, f"town-{i}") for i, t in enumerate(towns)]
    docs += [distractor_document(rng, towns, f"note-{i}") for i in range(n_distractors)]
    order = rng.permutation(len(docs))
    return [docs[i] for i in order]


def make_question(towns: tuple[Town, ...], kind: str, qid: str) -> Question:
    """A question of `kind` over the given towns (`years_since` uses the first town only)."""
    names = tuple(t.name for t in towns)
    if kind == "years_since":
        a = towns[0]
        text = f"How many years before the year {REFERENCE_YEAR} was {a.name} founded?"
        answer = REFERENCE_YEAR - a.founded
        names = (a.name,)
    elif kind == "years_between":
        a, b = towns
        text = f"How many years passed between the founding of {a.name} and the founding of {b.name}?"
        answer = abs(a.founded - b.founded)
    elif kind == "population_difference":
        a, b = sorted(towns, key=lambda t: -t.population)
        text = f"How many more people live in {a.name} than in {b.name}?"
        answer = a.population - b.population
        names = (a.name, b.name)
    elif kind == "total_population":
        listed = ", ".join(t.name for t in towns[:-1]) + f" and {towns[-1].name}"
        text = f"What is the total population of {listed}?"
        answer = sum(t.population for t in towns)
    else:
        raise ValueError(f"unknown question kind {kind!r}; expected one of {QUESTION_KINDS}")
    return Question(qid, text, str(answer), names, kind)


QUESTION_KINDS = ("years_between", "population_difference", "total_population", "years_since")
DEFAULT_KINDS = QUESTION_KINDS[:3]  # two facts each; `years_since` (one fact) is opt-in
REFERENCE_YEAR = 2000  # `years_since` questions count back from it: one search, one subtraction


def make_questions(towns: list[Town], n: int, seed: int, hops: int = 2, prefix: str = "q",
                   kinds: tuple[str, ...] = DEFAULT_KINDS) -> list[Question]:
    """`n` questions over `towns`, each needing `hops` towns (`hops > 2` only for totals), kinds in turn."""
    if hops < 2:
        raise ValueError(f"hops must be >= 2, got {hops}")
    if len(towns) < hops:
        raise ValueError(f"need at least {hops} towns to ask {hops}-hop questions, got {len(towns)}")
    rng = np.random.default_rng(seed)
    unknown = sorted(set(kinds) - set(QUESTION_KINDS))
    if unknown or not kinds:
        raise ValueError(f"kinds must be a non-empty subset of {QUESTION_KINDS}, got {kinds}")
    kinds = kinds if hops == 2 else ("total_population",)  # years_since ignores the second town
    out = []
    for i in range(n):
        picked = tuple(towns[j] for j in rng.choice(len(towns), size=hops, replace=False))
        out.append(make_question(picked, str(kinds[i % len(kinds)]), f"{prefix}-{i}"))
    return out


@dataclasses.dataclass(frozen=True)
class FactsEnv:
    """A whole generated environment: corpus plus train and held-out questions on disjoint towns."""

    towns: tuple[Town, ...]
    corpus: tuple[dict[str, str], ...]
    train: tuple[Question, ...]
    heldout: tuple[Question, ...]

    def write(self, directory: str | Path) -> dict[str, Path]:
        """Write corpus.jsonl, train.jsonl and heldout.jsonl in the project's JSONL layouts."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        paths = {name: directory / f"{name}.jsonl" for name in ("corpus", "train", "heldout")}
        _write_jsonl(paths["corpus"], self.corpus)
        for split in ("train", "heldout"):
            rows = [
                {"id": q.id, "question": q.question, "answers": [q.answer], "data_source": "synthetic_facts",
                 "towns": list(q.towns), "kind": q.kind}
                for q in getattr(self, split)
            ]
            _write_jsonl(paths[split], rows)
        return paths


def _write_jsonl(path: Path, rows) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)


def build_env(
    seed: int = 0,
    n_towns: int = 120,
    heldout_fraction: float = 0.25,
    n_train: int = 2000,
    n_heldout: int = 200,
    hops: int = 2,
    n_distractors: int = 60,
    max_syllables: int = 2,
    kinds: tuple[str, ...] = DEFAULT_KINDS,
) -> FactsEnv:
    """Generate towns, split them into train and held-out sets, and ask questions on each side."""
    if not 0.0 < heldout_fraction < 1.0:
        raise ValueError(f"heldout_fraction must be in (0, 1), got {heldout_fraction}")
    towns = generate_towns(n_towns, seed, max_syllables)
    n_held = max(hops, round(n_towns * heldout_fraction))
    held_towns, train_towns = towns[:n_held], towns[n_held:]
    corpus = build_corpus(towns, n_distractors, seed + 1)
    train = make_questions(train_towns, n_train, seed + 2, hops, prefix="train", kinds=kinds)
    heldout = make_questions(held_towns, n_heldout, seed + 3, hops, prefix="heldout", kinds=kinds)
    return FactsEnv(tuple(towns), tuple(corpus), tuple(train), tuple(heldout))


def _fact_name(kind: str) -> str:
    return "founded" if kind in ("years_between", "years_since") else "population"


def scripted_segments(
    question: Question, towns_by_name: dict[str, Town], rng: np.random.Generator, skip_python_prob: float = 0.0
) -> list[str]:
    """A scripted solution as generated segments; every segment but the last ends in a tool call.

    The script searches each town, then computes the answer with python. With
    probability `skip_python_prob` it skips the calculation and answers with
    the first retrieved number instead: a deliberate flaw that SFT copies and
    RL can remove.
    """
    towns = [towns_by_name[n] for n in question.towns]
    attr = _fact_name(question.kind)
    label = "founding year" if attr == "founded" else "population"
    # The query repeats the question's wording ("of Name"), so a name is tokenised the
    # same way (after a space) in the question, the query and the retrieved passages.
    segments = [f"<search>{label} of {towns[0].name}</search>"]
    segments += [f"\n<search>{label} of {t.name}</search>" for t in towns[1:]]
    values = [getattr(t, attr) for t in towns]
    if rng.random() < skip_python_prob:
        segments.append(f"\n<answer>\\boxed{{{values[0]}}}</answer>")
        return segments
    if question.kind == "years_since":
        code = f"print({REFERENCE_YEAR} - {values[0]})"
    elif question.kind == "years_between":
        code = f"print(abs({values[0]} - {values[1]}))"
    elif question.kind == "population_difference":
        code = f"print({values[0]} - {values[1]})"
    else:
        code = "print(" + " + ".join(str(v) for v in values) + ")"
    segments.append(f"\n<python>{code}</python>")
    segments.append(f"\n<answer>\\boxed{{{question.answer}}}</answer>")
    return segments
