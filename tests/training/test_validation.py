"""Held-out validation during RL (spec §6: greedy): logged with the steps it follows, and equal to an
evaluation of that step's checkpoint by the same driver `launch.evaluate` uses."""

import contextlib
import io

import pytest

from aepo_jax.evaluation.driver import evaluate
from aepo_jax.evaluation.restore import locate_checkpoint, restore_policy_params
from aepo_jax.experiment import environment_from, eval_config_from, rl_trainer_from
from aepo_jax.experiment_validation import (
    report_metrics,
    validation_examples,
    validation_from,
)
from aepo_jax.training.build import model_config_from
from aepo_jax.training.metrics_log import read_metrics
from aepo_jax.training.validation import Validation
from configs.aepo_tiny import get_config
from tests.child_process import ran_in_child_process
from tests.training.param_digest import value_digest


def test_validation_runs_every_few_steps_and_after_the_last():
    validation = Validation(3, score=lambda params: {"pass@1": 0.5})
    assert [s for s in range(1, 9) if validation.due(s, last_step=7)] == [3, 6, 7]
    assert validation(None) == {"val/pass@1": 0.5}
    with pytest.raises(ValueError, match="validation.every must be >= 1"):
        Validation(0, score=lambda params: {})


def _config():
    cfg = get_config()
    cfg.total_steps = 2
    cfg.data.prompts_per_step = 2
    cfg.data.num_examples = 16
    cfg.rollout.k = 2
    cfg.rollout.initial_rollouts = 1
    cfg.rollout.max_response_len = 16
    cfg.rollout.max_tool_calls = 1
    cfg.train.mini_batch_prompts = 2
    cfg.train.micro_batch_size = 2
    cfg.train.max_seq_len = 512
    cfg.checkpoint.every = 1
    cfg.checkpoint.async_save = False
    cfg.log.progress_bar = False
    cfg.log.tensorboard = False
    cfg.validation.every = 1
    cfg.validation.questions = 3
    cfg.validation.batch_questions = 2
    return cfg


def test_logged_validation_equals_an_evaluation_of_the_steps_checkpoint(tmp_path):
    if ran_in_child_process(__file__, "test_logged_validation_equals_an_evaluation_of_the_steps_checkpoint"):
        return  # passed in its own process (tests/child_process.py says why)
    cfg = _config()
    env = environment_from(cfg, str(tmp_path / "env"))
    try:
        cfg.model.vocab_size = int(env.tokenizer.vocab_size)
        workdir = str(tmp_path / "run")
        trainer = rl_trainer_from(cfg, env, workdir)
        validation = validation_from(cfg, env, trainer.run.graphdef, trainer.rollout_fn.placement, workdir)
        validated = []  # the parameters each validation scored (their digest)

        def score(params):
            validated.append(value_digest(params))
            return validation.score(params)

        trainer.validation = Validation(validation.every, score)
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                records = trainer.train()
        finally:
            trainer.close()
        assert [r["step"] for r in records] == [1, 2]
        assert len(validated) == 2 and validated[0] != validated[1]
        for record in records:
            assert {"val/pass@1", "val/mean_f1", "val/tool_calls", "val/response_length", "val_s"} <= set(record)
        # metrics.jsonl: the step's own line first (written before validating), then its val/* line
        lines = [(r["step"], any(k.startswith("val") for k in r)) for r in read_metrics(workdir)]
        assert lines == [(1, False), (1, True), (2, False), (2, True)]
        examples = validation_examples(cfg, env, workdir)
        assert len(examples) == 3
        config = eval_config_from(cfg, n=1, greedy=True, temperature=1.0, seed=int(cfg.seed), questions_per_batch=2)
        for record in records:
            location = locate_checkpoint(f"{workdir}/checkpoints/{record['step']}")
            graphdef, params, _ = restore_policy_params(location, cfg, model_config_from(cfg))
            assert value_digest(params) == validated[record["step"] - 1]  # the step's updated parameters
            result = evaluate(examples, graphdef=graphdef, params=params, tokenizer=env.tokenizer, tools=env.tools,
                              encode_prompt=env.encode_prompt, config=config, progress=False, judge=env.judge)
            expected = report_metrics(result.reports)
            assert {k: record[f"val/{k}"] for k in expected} == pytest.approx(expected, abs=1e-9), record["step"]
    finally:
        env.close()


def test_a_run_without_held_out_questions_is_refused_naming_validation_data_path(tmp_path):
    cfg = _config()
    data = tmp_path / "train.jsonl"
    data.write_text("".join(f'{{"id": "r{i}", "question": "what is {i} plus {i}?", "answer": "{2 * i}"}}\n'
                            for i in range(4)))
    cfg.data.path = str(data)
    env = environment_from(cfg, str(tmp_path / "env"))
    try:
        with pytest.raises(ValueError, match="needs held-out questions: set validation.data_path"):
            validation_examples(cfg, env, str(tmp_path / "run"))
    finally:
        env.close()


def test_held_out_questions_sharing_an_id_are_refused_before_the_first_step(tmp_path):
    """Two files concatenated, each numbered from 0: every copy would be sampled and counted, and the
    evaluation refuses them; the run refuses them when validation is built, not at its first validation."""
    cfg = _config()
    held_out = tmp_path / "held_out.jsonl"
    held_out.write_text("".join(f'{{"id": "q{i % 2}", "question": "what is {i} plus {i}?", "answer": "{2 * i}"}}\n'
                                for i in range(4)))
    cfg.validation.every = 2
    cfg.validation.data_path = str(held_out)
    env = environment_from(cfg, str(tmp_path / "env"))
    try:
        with pytest.raises(ValueError, match=r"question id\(s\) occur more than once, e\.g\. \['q0'"):
            validation_from(cfg, env, graphdef=None, placement=None, workdir=str(tmp_path / "run"))
    finally:
        env.close()
