"""Generator of the small demo datasets shipped in `aepo_jax/data/demo/` (reproducible from a seed).

Everything is invented and computed here, nothing is copied:
- `arithmetic.jsonl`: GSM8K-layout word problems (`question`, `answer` ending
  in `#### N`) whose answers are computed from the drawn numbers.
- `fractions.jsonl`: MATH-layout problems (`problem`, `solution` with the
  reduced fraction in `\\boxed{}`).
- `multihop_qa.jsonl` + `multihop_corpus.jsonl`: two-hop questions
  (`question`, `answer`, `aliases`) over an invented world whose facts are
  written as a search corpus (`{"id", "contents"}`, title on the first line).

Regenerate with `python -m aepo_jax.data.demo_datasets [OUT_DIR]`.
"""

from __future__ import annotations

import json
import random
import sys
from fractions import Fraction
from pathlib import Path

DEMO_DIR = Path(__file__).with_name("demo")
DEFAULT_SEED = 20251016

_NAMES = [
    "Ada",
    "Bela",
    "Cyrus",
    "Dara",
    "Emil",
    "Fenna",
    "Gus",
    "Hana",
    "Ivo",
    "Juno",
    "Kai",
    "Lior",
]
_ITEMS = [
    "apples",
    "pencils",
    "stickers",
    "marbles",
    "cookies",
    "stamps",
    "shells",
    "beads",
]
_SYLLABLES = [
    "ka",
    "lo",
    "mi",
    "ren",
    "sa",
    "tor",
    "vel",
    "dun",
    "esh",
    "pra",
    "quo",
    "bri",
    "zan",
    "ol",
]


def _word_problem(rng: random.Random, index: int) -> dict:
    name, other = rng.sample(_NAMES, 2)
    item = rng.choice(_ITEMS)
    kind = index % 4
    if kind == 0:
        a, b, c = rng.randint(5, 60), rng.randint(2, 30), rng.randint(1, 20)
        question = f"{name} has {a} {item}. {other} gives {name} {b} more, then {name} gives away {c}. How many {item} does {name} have now?"
        steps, result = f"{a} + {b} = {a + b}. {a + b} - {c} = {a + b - c}.", a + b - c
    elif kind == 1:
        boxes, per_box = rng.randint(2, 12), rng.randint(3, 24)
        eaten = rng.randint(1, boxes * per_box - 1)
        question = (
            f"{name} buys {boxes} boxes with {per_box} {item} in each box and then "
            f"gives {eaten} of them to {other}. How many {item} does {name} have left?"
        )
        count = boxes * per_box
        steps = f"{boxes} * {per_box} = {count}. {count} - {eaten} = {count - eaten}."
        result = count - eaten
    elif kind == 2:
        groups, total_per = rng.randint(2, 9), rng.randint(2, 15)
        total = groups * total_per
        question = f"{name} shares {total} {item} equally among {groups} friends and keeps none. {other} then gives each friend 3 more. How many {item} does each friend have?"
        steps, result = (
            f"{total} / {groups} = {total_per}. {total_per} + 3 = {total_per + 3}.",
            total_per + 3,
        )
    else:
        weeks, per_day = rng.randint(2, 8), rng.randint(2, 40)
        question = f"{name} collects {per_day} {item} every day for {weeks} weeks. How many {item} is that in total?"
        steps, result = (
            f"{weeks} * 7 = {weeks * 7} days. {weeks * 7} * {per_day} = {weeks * 7 * per_day}.",
            weeks * 7 * per_day,
        )
    return {
        "id": f"arith-{index:04d}",
        "question": question,
        "answer": f"{steps}\n#### {result}",
        "data_source": "demo_arithmetic",
    }


def _fraction_problem(rng: random.Random, index: int) -> dict:
    a, b = (
        Fraction(rng.randint(1, 12), rng.randint(2, 12)),
        Fraction(rng.randint(1, 12), rng.randint(2, 12)),
    )
    op = rng.choice(["+", "-", "\\times", "\\div"])
    result = {"+": a + b, "-": a - b, "\\times": a * b, "\\div": a / b}[op]

    def tex(x: Fraction) -> str:
        if x.denominator == 1:
            return str(x.numerator)
        sign = "-" if x < 0 else ""
        return f"{sign}\\frac{{{abs(x.numerator)}}}{{{x.denominator}}}"

    problem = (
        f"Compute ${tex(a)} {op} {tex(b)}$ and give the answer as a reduced fraction."
    )
    solution = f"We have ${tex(a)} {op} {tex(b)} = {tex(result)}$. The answer is $\\boxed{{{tex(result)}}}$."
    return {
        "id": f"frac-{index:04d}",
        "problem": problem,
        "solution": solution,
        "data_source": "demo_math",
    }


def _invented_name(rng: random.Random, used: set[str], parts: int = 2) -> str:
    while True:
        name = "".join(rng.choice(_SYLLABLES) for _ in range(parts)).capitalize()
        if name not in used:
            used.add(name)
            return name


def _multihop_world(
    rng: random.Random, n_towns: int = 40, n_people: int = 80, n_guilds: int = 60
):
    used: set[str] = set()
    countries = [_invented_name(rng, used, 3) + "ia" for _ in range(8)]
    towns = [
        {
            "name": _invented_name(rng, used),
            "country": rng.choice(countries),
            "population": rng.randint(1_000, 99_000),
            "founded": rng.randint(1100, 1840),
        }
        for _ in range(n_towns)
    ]
    people = [
        {
            "name": f"{_invented_name(rng, used)} {_invented_name(rng, used, 3)}",
            "born": rng.choice(towns),
            "year": rng.randint(1850, 1990),
        }
        for _ in range(n_people)
    ]
    guilds = [
        {
            "name": f"{_invented_name(rng, used)} Guild",
            "founder": rng.choice(people),
            "members": rng.randint(10, 900),
        }
        for _ in range(n_guilds)
    ]
    corpus = []
    for t in towns:
        corpus.append(
            {
                "id": f"town-{t['name']}",
                "contents": f"{t['name']}\n{t['name']} is a town in {t['country']}. It was founded in {t['founded']} and has a population of {t['population']:,}.",
            }
        )
    for p in people:
        corpus.append(
            {
                "id": f"person-{p['name'].replace(' ', '_')}",
                "contents": f"{p['name']}\n{p['name']} was born in {p['born']['name']} in {p['year']}.",
            }
        )
    for g in guilds:
        corpus.append(
            {
                "id": f"guild-{g['name'].replace(' ', '_')}",
                "contents": f"{g['name']}\nThe {g['name']} was founded by {g['founder']['name']} and has {g['members']} members.",
            }
        )
    questions = []
    for i, g in enumerate(guilds):
        founder, town = g["founder"], g["founder"]["born"]
        questions.append(
            {
                "id": f"mh-{len(questions):04d}",
                "question": f"In which country was the founder of the {g['name']} born?",
                "answer": town["country"],
                "aliases": [],
                "data_source": "demo_multihop",
            }
        )
        questions.append(
            {
                "id": f"mh-{len(questions):04d}",
                "question": f"What is the population of the town where the founder of the {g['name']} was born?",
                "answer": f"{town['population']:,}",
                "aliases": [str(town["population"])],
                "data_source": "demo_multihop",
            }
        )
        if i % 2 == 0:
            questions.append(
                {
                    "id": f"mh-{len(questions):04d}",
                    "question": f"How many years after the founding of {town['name']} was {founder['name']} born?",
                    "answer": str(founder["year"] - town["founded"]),
                    "aliases": [],
                    "data_source": "demo_multihop",
                }
            )
    return questions, corpus


def write_demo_datasets(
    out_dir: str | Path = DEMO_DIR, seed: int = DEFAULT_SEED
) -> dict[str, int]:
    """Write the four demo files into `out_dir`; returns rows written per file name."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    questions, corpus = _multihop_world(rng)
    files = {
        "arithmetic.jsonl": [_word_problem(rng, i) for i in range(300)],
        "fractions.jsonl": [_fraction_problem(rng, i) for i in range(200)],
        "multihop_qa.jsonl": questions,
        "multihop_corpus.jsonl": corpus,
    }
    for name, rows in files.items():
        with (out_dir / name).open("w", encoding="utf-8") as handle:
            handle.writelines(json.dumps(row) + "\n" for row in rows)
    return {name: len(rows) for name, rows in files.items()}


if __name__ == "__main__":
    print(write_demo_datasets(sys.argv[1] if len(sys.argv) > 1 else DEMO_DIR))
