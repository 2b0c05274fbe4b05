"""The training reward (`Environment.reward_fn`) on real agent-loop trajectories: the +0.1 multi-tool bonus
of spec §5 counts the tool calls the loop ran, not tags only written, and the reward records evaluation's
correctness for the `accuracy` metric."""

from __future__ import annotations

from types import SimpleNamespace

import jax
import numpy as np
import pytest

from aepo_jax.agent.loop import AgentLoop, LoopConfig
from aepo_jax.agent.prompts import PromptConfig
from aepo_jax.agent.scripted import ByteTokenizer, ScriptedGenerator, ScriptedSegment
from aepo_jax.agent.trajectory import Trajectory
from aepo_jax.evaluation import scoring
from aepo_jax.experiment import Environment
from aepo_jax.rewards import compute_reward
from aepo_jax.rewards.answer_rewards import executed_tool_calls
from aepo_jax.training.rollout_batch import rollout_metrics

TOK = ByteTokenizer()
RESULT = TOK.token_to_id("<result>")
PARIS = {"id": "p", "question": "Capital of France?", "answers": ["Paris"], "data_source": "hotpotqa"}
ANSWER = "<answer>\\boxed{Paris}</answer>"


class EchoTools:
    def run_many(self, calls):
        return [SimpleNamespace(text=f"{c.tag}:{c.content}", ok=True) for c in calls]


def loop_trajectory(texts: list[str]) -> Trajectory:
    """The trajectory the agent loop makes when the model writes texts[n] after its n-th tool result."""

    def script(ids, rng):
        tokens = TOK.encode(texts[min(ids.count(RESULT), len(texts) - 1)])
        return ScriptedSegment(tokens, [1.0] * len(tokens), "stop")

    loop = AgentLoop(ScriptedGenerator(script), TOK, EchoTools(),
                     LoopConfig(max_tool_calls=6, max_response_tokens=2000, max_context_len=4000))
    ((traj,),) = loop.run([TOK.encode("q")], 1, 1, rng=np.random.default_rng(0), key=jax.random.key(0)).groups
    return traj


def environment(reward_name: str = "auto") -> Environment:
    return Environment(tokenizer=TOK, examples=[], heldout=[], corpus_path=None, prompt=PromptConfig(),
                       max_prompt_len=100, reward_name=reward_name, tools=EchoTools())


# The reviewer's two cases (/tmp/review_stats/reward_bonus_tag_mentions.py): python written, only search run.
MENTIONED = ["<think>I could use <python> to check, but no need.</think><search>capital of France</search>", ANSWER]
ABANDONED = ["<think>x</think><python> <search>capital of France</search>", ANSWER]
BOTH_RAN = ["<think>x</think><search>capital of France</search>", "<python>print(1)</python>", ANSWER]


@pytest.mark.parametrize("texts", [MENTIONED, ABANDONED], ids=["python-in-think", "abandoned-python"])
def test_a_python_tag_that_never_ran_earns_no_bonus(texts):
    traj = loop_trajectory(texts)
    assert [s.tag for s in traj.tool_steps] == ["search"]  # what the loop ran
    text = TOK.decode(traj.response_ids)
    assert compute_reward("qa_f1", text, ["Paris"]) == pytest.approx(1.1)  # the text alone shows <python>
    assert environment().reward_fn(PARIS, traj) == 1.0
    assert environment("qa_f1").reward_fn(PARIS, traj) == 1.0


def test_search_and_python_that_ran_earn_the_bonus():
    traj = loop_trajectory(BOTH_RAN)
    assert executed_tool_calls(traj) == {"search": 1, "python": 1}
    assert environment().reward_fn(PARIS, traj) == pytest.approx(1.1)


def test_malformed_closings_are_not_executed_calls():
    traj = loop_trajectory(["<think>x</think>print(1)</python>", "<search>capital</search>", ANSWER])
    assert [s.tag for s in traj.tool_steps] == ["invalid", "search"]
    assert executed_tool_calls(traj) == {"search": 1}


def test_a_record_without_tool_steps_falls_back_to_the_text():
    text = "<search>x</search>" + " <result>\nr\n</result>" + "<python>y</python> <result>\nr\n</result>" + ANSWER
    record = SimpleNamespace(response_ids=TOK.encode(text))
    assert executed_tool_calls(record) is None
    assert environment().reward_fn(PARIS, record) == pytest.approx(1.1)


def test_reward_records_evaluation_correctness_and_accuracy_uses_it(monkeypatch):
    """F1 0.91 with the bonus reaches 1 but is not an exact match (/tmp/review_stats/accuracy_with_bonus.py)."""
    example = {"id": "c", "question": "?", "answers": ["Saint Peter and Saint Paul Cathedral"],
               "data_source": "hotpotqa"}
    calls: list[str] = []

    def counting(name, *args, **kw):
        calls.append(name)
        return compute_reward(name, *args, **kw)

    monkeypatch.setattr(scoring, "compute_reward", counting)
    env = environment()
    partial = loop_trajectory(BOTH_RAN[:2] + ["<answer>\\boxed{Saint Peter and Saint Paul}</answer>"])
    exact = loop_trajectory(BOTH_RAN[:2] + ["<answer>\\boxed{Saint Peter and Saint Paul Cathedral}</answer>"])
    rewards = [env.reward_fn(example, partial), env.reward_fn(example, exact)]
    assert rewards[0] == pytest.approx(10 / 11 + 0.1) and rewards[1] == pytest.approx(1.1)
    assert (partial.correct, exact.correct) == (False, True)
    assert calls == ["auto", "exact_match"] * 2  # QA F1: exact match is the (cheap) correctness
    assert rollout_metrics([[partial, exact]], [rewards])["accuracy"] == 0.5


def test_math_correctness_reuses_the_reward_instead_of_a_second_sympy_call(monkeypatch):
    calls: list[str] = []

    def counting(name, *args, **kw):
        calls.append(name)
        return compute_reward(name, *args, **kw)

    monkeypatch.setattr(scoring, "compute_reward", counting)
    example = {"id": "m", "question": "1/2 + 1/2?", "answers": ["1"], "data_source": "gsm8k"}
    traj = loop_trajectory(["<python>print(1/2 + 1/2)</python>", "<answer>\\boxed{\\frac{2}{2}}</answer>"])
    assert environment().reward_fn(example, traj) == 1.0 and traj.correct is True
    assert calls == ["auto"]
