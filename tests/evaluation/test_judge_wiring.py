"""The LLM judge from the config to the rewards: `experiment.judge_from`, the training reward, the trainer's
check, and `launch.evaluate --judge_url ...`, against a judge served on loopback (tests/rewards/judge_server.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from aepo_jax.experiment import environment_from, judge_from, rl_trainer_from
from configs.aepo_tiny import get_config
from tests.child_process import child_env
from tests.evaluation.trained_run import REPO
from tests.rewards.judge_server import JudgeServer

KEY_VARIABLE = "AEPO_TEST_JUDGE_KEY"
GAIA = [
    {"id": "g1", "question": "What is the capital of France?", "answers": ["Paris"], "data_source": "gaia"},
    {"id": "g2", "question": "Who wrote Hamlet?", "answers": ["Shakespeare"], "data_source": "gaia"},
]


def judged_config(url: str = "", model: str = "judge-model", key_variable: str = ""):
    cfg = get_config()
    cfg.data.num_examples = 16
    cfg.rollout.max_response_len = 24
    cfg.reward.judge_url, cfg.reward.judge_model, cfg.reward.judge_api_key_env = url, model, key_variable
    return cfg


def test_judge_is_built_from_the_config_with_its_key_read_from_the_named_variable(monkeypatch):
    assert get_config().reward.judge_url == "" and judge_from(get_config()) is None
    monkeypatch.setenv(KEY_VARIABLE, "s3cret")
    with JudgeServer() as server:
        cfg = judged_config(server.url, key_variable=KEY_VARIABLE)
        judge = judge_from(cfg)
        assert judge.judge("Capital of France?", ["Paris"], "paris") is True
        assert judge.judge("Capital of France?", ["Paris"], "Lyon") is False
    headers, body = server.requests[0]
    assert headers["Authorization"] == "Bearer s3cret"
    assert body["model"] == "judge-model" and body["max_tokens"] == cfg.reward.judge_max_tokens
    assert "s3cret" not in cfg.to_json()  # a run saves its config; only the variable's name is in it


def test_judge_config_errors_name_what_is_missing(monkeypatch):
    with pytest.raises(ValueError, match="needs reward.judge_model"):
        judge_from(judged_config("http://127.0.0.1:9", model=""))
    monkeypatch.delenv(KEY_VARIABLE, raising=False)
    with pytest.raises(ValueError, match=f"environment variable {KEY_VARIABLE} .* is not set"):
        judge_from(judged_config("http://127.0.0.1:9", key_variable=KEY_VARIABLE))


def test_training_reward_asks_the_configured_judge_and_the_trainer_refuses_to_run_without_one(tmp_path):
    with JudgeServer() as server:
        cfg = judged_config(server.url)
        cfg.reward.name = "llm_judge"
        env = environment_from(cfg, str(tmp_path / "env"))
        try:
            example = env.examples[0]

            def reward(boxed: str) -> float:
                text = f"<think>x</think><answer>\\boxed{{{boxed}}}</answer>"
                return env.reward_fn(example, SimpleNamespace(response_ids=env.tokenizer.encode(text)))

            assert reward(example["answers"][0]) == 1.0
            assert reward("nowhere") == 0.0
            prompts = [body["messages"][-1]["content"] for _, body in server.requests]
            assert len(prompts) == 2 and all(example["question"] in p for p in prompts)
            env.judge = None  # the same run without a judge is refused before its mesh or model is built
            with pytest.raises(ValueError, match="no judge is configured"):
                rl_trainer_from(cfg, env, str(tmp_path / "run"))
        finally:
            env.close()


def run_evaluate(tmp_path, *args: str, **env: str) -> subprocess.CompletedProcess:
    data = tmp_path / "gaia.jsonl"
    data.write_text("".join(json.dumps(ex) + "\n" for ex in GAIA))
    command = [sys.executable, "-m", "launch.evaluate", "--config", "configs/aepo_tiny.py", "--checkpoint", "none",
               "--data_path", str(data), "--out", str(tmp_path / "eval"), "--n", "1", "--progress=false",
               "--config.data.num_examples=16", "--config.rollout.max_response_len=24", *args]
    return subprocess.run(command, check=False, cwd=REPO, env=child_env(1, **env), capture_output=True, text=True,
                          timeout=240)


def test_evaluate_refuses_judge_questions_without_a_judge_before_sampling(tmp_path):
    proc = run_evaluate(tmp_path)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "error: this evaluation scores with the llm_judge reward")
    assert "Traceback" not in proc.stderr and "evaluating" not in proc.stdout


def test_evaluate_judge_flags_set_the_config_and_the_run_goes_through(tmp_path):
    """A random tiny model never writes a valid answer, so the judge is not asked here; the judge's use
    in scoring is covered through the same `judge=` by the scoring and reward tests."""
    with JudgeServer() as server:
        proc = run_evaluate(tmp_path, "--judge_url", server.url, "--judge_model", "judge-model",
                            "--judge_api_key_env", KEY_VARIABLE, **{KEY_VARIABLE: "s3cret"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = json.loads((tmp_path / "eval" / "reports.json").read_text())
    assert [r["dataset"] for r in reports] == ["gaia"]
    saved = (tmp_path / "eval" / "eval_config.json").read_text()
    reward = json.loads(saved)["config"]["reward"]
    assert (reward["judge_url"], reward["judge_model"], reward["judge_api_key_env"]) == (
        server.url, "judge-model", KEY_VARIABLE)
    assert "s3cret" not in saved
    unset = run_evaluate(tmp_path, "--judge_url", server.url, "--judge_model", "m", "--judge_api_key_env",
                         "AEPO_TEST_UNSET_JUDGE_KEY")
    assert unset.returncode != 0 and "Traceback" not in unset.stderr
    assert "AEPO_TEST_UNSET_JUDGE_KEY" in unset.stderr.strip().splitlines()[-1]
