"""The shipped demo files are what the generator writes, and their answers are right."""

import json
import operator
import re
from fractions import Fraction

from aepo_jax.data.demo_datasets import DEMO_DIR, write_demo_datasets
from aepo_jax.data.records import read_examples
from aepo_jax.rewards import math_equal

STEP = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}


def test_shipped_files_are_reproducible(tmp_path):
    counts = write_demo_datasets(tmp_path)
    assert all(100 <= n <= 400 for n in counts.values()), counts
    for name in counts:
        assert (tmp_path / name).read_bytes() == (DEMO_DIR / name).read_bytes(), name


def test_arithmetic_answers_match_the_worked_steps():
    for example in read_examples(DEMO_DIR / "arithmetic.jsonl"):
        assert example["data_source"] == "demo_arithmetic"
        assert re.fullmatch(r"-?\d+", example["answers"][0])
    rows = [
        json.loads(line)
        for line in (DEMO_DIR / "arithmetic.jsonl").read_text().splitlines()
    ]
    for row in rows:
        # Re-evaluate every "a op b = c" step of the worked solution with Python.
        for a, op, b, c in re.findall(r"(\d+) ([-+*/]) (\d+) = (\d+)", row["answer"]):
            assert STEP[op](int(a), int(b)) == int(c), row["id"]


def test_fraction_answers_are_the_computed_value():
    ops = {
        "+": lambda a, b: a + b,
        "-": lambda a, b: a - b,
        "\\times": lambda a, b: a * b,
        "\\div": lambda a, b: a / b,
    }

    def parse(tex):
        match = re.fullmatch(r"\\frac\{(\d+)\}\{(\d+)\}", tex)
        return Fraction(int(match[1]), int(match[2])) if match else Fraction(int(tex))

    for example in read_examples(DEMO_DIR / "fractions.jsonl"):
        left, op, right = re.search(
            r"\$(.+?) (\+|-|\\times|\\div) (.+?)\$", example["question"]
        ).groups()
        value = ops[op](parse(left), parse(right))
        assert math_equal(
            example["answers"][0], f"{value.numerator}/{value.denominator}"
        ), example


def test_multihop_answers_follow_from_the_corpus():
    docs = [
        json.loads(line)["contents"]
        for line in (DEMO_DIR / "multihop_corpus.jsonl").read_text().splitlines()
    ]
    text = "\n".join(docs)
    for example in read_examples(DEMO_DIR / "multihop_qa.jsonl"):
        guild = re.search(r"founder of the (\w+ Guild)", example["question"])
        if not guild or "country" not in example["question"]:
            continue
        founder = re.search(rf"The {guild[1]} was founded by (.+?) and has", text)[1]
        town = re.search(rf"{re.escape(founder)} was born in (\w+) in", text)[1]
        country = re.search(rf"{town} is a town in (\w+)\.", text)[1]
        assert example["answers"] == [country]
