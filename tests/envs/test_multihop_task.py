"""The multi-step path task: valid questions, and scripted trajectories that reach the goal with the real tools."""

from __future__ import annotations

import json

import numpy as np
import pytest

from aepo_jax.agent.prompts import render_prompt
from aepo_jax.envs.facts_sft import build_sft_sequences
from aepo_jax.envs.facts_task import demo_prompt_config
from aepo_jax.envs.multihop_task import (
    MULTIHOP_SYSTEM_PROMPT,
    PATH_WORDS,
    build_multihop_env,
    multihop_segments,
    write_multihop_task,
)
from aepo_jax.rewards import compute_reward
from aepo_jax.servers.process import start_search_server
from aepo_jax.tokenizers.sentencepiece_tokenizer import train_sentencepiece
from aepo_jax.tools import SearchTool, ToolRegistry


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return write_multihop_task(tmp_path_factory.mktemp("multihop"), seed=3, n_train=150, n_heldout=12,
                               early_answer_prob=0.3)


def test_questions_are_valid_paths_on_disjoint_towns(task):
    env = task.env
    assert len(env.train) == 150 and len(env.heldout) == 12
    assert not {q.town for q in env.train} & {q.town for q in env.heldout}
    steps = [q.steps for q in env.train + env.heldout]
    assert set(steps) == {2, 3, 4}
    titles = {d["contents"].partition("\n")[0]: d["contents"] for d in env.corpus}
    assert len(titles) == len(env.corpus) == sum(steps)
    for q in env.train + env.heldout:
        assert len(set(q.path)) == len(q.path) and set(q.path) <= set(PATH_WORDS)
        assert q.answer == q.path[-1] and q.town in q.question and f"start at {q.path[0]}" in q.question
        for i, word in enumerate(q.path):  # one document per step, linking to the next word
            text = titles[f"{q.town} {word}"]
            assert text.endswith("is the goal." if i == len(q.path) - 1 else f"leads to {q.path[i + 1]}.")
    rows = [json.loads(line) for line in task.heldout.read_text().splitlines()]
    assert [r["answers"] for r in rows] == [[q.answer] for q in env.heldout]
    with pytest.raises(ValueError, match="min_steps"):
        build_multihop_env(0, 5, 5, min_steps=1)
    with pytest.raises(ValueError, match="early_answer_prob"):
        multihop_segments(env.train[0], np.random.default_rng(0), 1.5)


def test_path_words_are_single_pieces_of_the_task_tokenizer(task):
    tokenizer = train_sentencepiece(task.tokenizer_texts(MULTIHOP_SYSTEM_PROMPT, seed=0), 768)
    base = len(tokenizer.encode("In"))
    for word in PATH_WORDS:
        assert len(tokenizer.encode("In " + word)) == base + 1, word  # copying the next word is one token
    words = "\n".join(task.tokenizer_texts(MULTIHOP_SYSTEM_PROMPT, seed=0)).replace(",", " ").split()
    real = {q.town for q in task.env.train + task.env.heldout}
    raw = sum(d["contents"].count(name) for d in task.env.corpus for name in {d["contents"].split()[0]})
    # Names are masked by invented ones; a one-syllable invented name is a real one by chance (~5%).
    assert sum(w in real for w in words) < 0.1 * raw


def test_scripted_trajectories_reach_the_goal_with_the_real_search_tool(task):
    tokenizer = train_sentencepiece(task.tokenizer_texts(MULTIHOP_SYSTEM_PROMPT, seed=0), 768)
    server = start_search_server(str(task.corpus))
    registry = ToolRegistry({"search": SearchTool(server.url, topk=1)})
    config = demo_prompt_config(MULTIHOP_SYSTEM_PROMPT)
    questions = list(task.env.train[:40])
    try:
        seqs = build_sft_sequences(questions, task.towns_by_name, tokenizer, registry,
                                   lambda q: render_prompt(tokenizer, q, config), np.random.default_rng(1), 0.3,
                                   script=task.env.script)
    finally:
        registry.close()
        server.stop()
    early = 0
    for q, seq in zip(questions, seqs, strict=True):
        prompt = render_prompt(tokenizer, q.question, config)
        response = tokenizer.decode(seq.tokens[len(prompt):])
        assert seq.tool_failures == 0
        results = [part.split("</result>")[0] for part in response.split("<result>")[1:]]
        searches = response.count("<search>")
        assert searches == len(results)
        # Each search found the document of the word it asked for, which names the next word.
        for i, result in enumerate(results):
            assert result.strip().startswith(f"Doc 1 (Title: {q.town} {q.path[i]})"), result
        if searches == q.steps:  # the full script: it read "is the goal" and answers the goal
            assert "is the goal" in results[-1]
            assert compute_reward("exact_match", response, [q.answer]) == 1.0
        else:  # the flaw: answered after one search with the word it leads to
            assert searches == 1
            early += 1
            assert compute_reward("exact_match", response, [q.path[1]]) == 1.0
            assert compute_reward("exact_match", response, [q.answer]) == float(q.steps == 2)
    assert 0 < early < len(questions)


def test_multihop_config_selects_the_task():
    from configs.demo import get_config

    c = get_config("multihop")
    assert c.env.task == "multihop" and c.reward.name == "exact_match"
    assert 2 <= c.env.min_steps <= c.env.max_steps <= 4 and c.rollout.max_tool_calls >= c.env.max_steps
    assert c.sft.skip_python_prob == c.env.early_answer_prob
    assert get_config().env.get("task", "towns") == "towns"
    with pytest.raises(ValueError, match="multihop"):
        get_config("multi")
