"""The demo environment: answers follow from the corpus text, splits never share towns."""

import re

import numpy as np
import pytest

from aepo_jax.envs.synthetic_facts import (
    DEFAULT_KINDS,
    QUESTION_KINDS,
    build_env,
    make_questions,
    scripted_segments,
)


def _facts_from_corpus(corpus):
    """Read every town's facts back out of the document text (independent of the generator)."""
    facts = {}
    for doc in corpus:
        m = re.search(r"^(\w+)\n\1 was founded in (\d+)\. Population (\d+)\.$", doc["contents"])
        if m:
            facts[m.group(1)] = (int(m.group(2)), int(m.group(3)))
    return facts


@pytest.mark.parametrize("kinds", [DEFAULT_KINDS, QUESTION_KINDS])
def test_answers_follow_from_the_corpus_text(kinds):
    env = build_env(seed=3, n_train=90, n_heldout=30, kinds=kinds)
    facts = _facts_from_corpus(env.corpus)
    assert len(facts) == len(env.towns)
    for q in env.train + env.heldout:
        years = [facts[n][0] for n in q.towns]
        pops = [facts[n][1] for n in q.towns]
        if q.kind == "years_between":
            expected = abs(years[0] - years[1])
        elif q.kind == "population_difference":
            expected = pops[0] - pops[1]
        elif q.kind == "total_population":
            expected = sum(pops)
        else:
            expected = 2000 - years[0]
        assert q.answer == str(expected), q
        assert all(name in q.question for name in q.towns)


def test_train_and_heldout_never_share_towns():
    env = build_env(seed=5)
    train = {n for q in env.train for n in q.towns}
    held = {n for q in env.heldout for n in q.towns}
    assert train and held and not train & held


def test_same_seed_same_env_and_other_seed_differs():
    assert build_env(seed=1, n_train=20, n_heldout=5) == build_env(seed=1, n_train=20, n_heldout=5)
    assert build_env(seed=1, n_train=20, n_heldout=5).train != build_env(seed=2, n_train=20, n_heldout=5).train


def test_scripted_segments_end_in_tool_calls_and_flawed_scripts_skip_python():
    env = build_env(seed=0, n_train=30, n_heldout=5)
    towns = {t.name: t for t in env.towns}
    q = env.train[0]
    good = scripted_segments(q, towns, np.random.default_rng(0), skip_python_prob=0.0)
    assert all(re.search(r"</(search|python)>$", s) for s in good[:-1])
    assert good[-1].endswith(f"\\boxed{{{q.answer}}}</answer>")
    flawed = scripted_segments(q, towns, np.random.default_rng(0), skip_python_prob=1.0)
    assert not any("<python>" in s for s in flawed)


def test_bad_arguments_raise_clear_errors():
    env = build_env(seed=0, n_train=5, n_heldout=2)
    with pytest.raises(ValueError, match="hops"):
        make_questions(list(env.towns), 3, seed=0, hops=1)
    with pytest.raises(ValueError, match="heldout_fraction"):
        build_env(heldout_fraction=1.5)


def test_years_since_needs_one_search_and_one_subtraction():
    env = build_env(seed=2, n_train=10, n_heldout=2, kinds=("years_since",))
    towns = {t.name: t for t in env.towns}
    q = env.train[0]
    assert q.kind == "years_since" and len(q.towns) == 1
    segments = scripted_segments(q, towns, np.random.default_rng(0))
    assert segments[1] == f"\n<python>print(2000 - {towns[q.towns[0]].founded})</python>"
    with pytest.raises(ValueError, match="kinds"):
        build_env(seed=2, n_train=2, n_heldout=2, kinds=("distance",))
