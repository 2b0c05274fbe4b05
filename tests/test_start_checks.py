"""Settings and data a training run cannot finish with are refused when it is built, by name, not at the
step that first meets them (`aepo_jax.experiment_checks`, called by `rl_trainer_from`)."""

import json

import pytest

from aepo_jax.experiment import environment_from, rl_trainer_from
from configs.aepo_tiny import get_config


def _environment(tmp_path, questions: list[str]):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"id": f"row{i}", "question": q, "answer": "7"}) + "\n"
                            for i, q in enumerate(questions)))
    cfg = get_config()
    cfg.data.path = str(data)
    cfg.data.prompts_per_step = 2
    cfg.log.tensorboard = False
    return cfg, environment_from(cfg, str(tmp_path / "env"))


def test_prompts_longer_than_the_limit_are_refused_together_before_the_run_starts(tmp_path):
    questions = [f"what is {i} plus {i}?" for i in range(8)]
    questions[5] = questions[6] = " ".join(["how many towns lie north of the river"] * 80)
    cfg, env = _environment(tmp_path, questions)
    try:
        with pytest.raises(ValueError, match="example row5: prompt has"):  # what the step would have met
            env.encode_prompt(env.examples[5])
        with pytest.raises(ValueError, match=r"training: 2 prompts are longer than rollout.max_prompt_len=\d+: "
                                             r"row5 \(\d+ tokens\), row6 \(\d+ tokens\)"):
            rl_trainer_from(cfg, env, str(tmp_path / "run"))
    finally:
        env.close()


def test_an_unknown_reward_name_is_refused_before_the_run_starts(tmp_path):
    cfg, env = _environment(tmp_path, [f"what is {i} plus {i}?" for i in range(4)])
    try:
        cfg.reward.name = "math"
        with pytest.raises(ValueError, match=r"unknown rewards \['math'\] \(reward.name\); known: .*'math_equiv'"):
            rl_trainer_from(cfg, env, str(tmp_path / "run"))
    finally:
        env.close()
