"""Every `configs/*_tiny.py` runs one real RL step (issue 7).

The same wiring as `launch.train` (`prepare_workdir`, `environment_from`,
`init_model`, `RLTrainer` over `env.make_rollout_fn`), in one process so the
families share what they can: one synthetic task, tokenizer, search server on
127.0.0.1 and python sandbox (module-scoped), and the sampler's compiled
programs (module-level jits keyed by the model's graphdef). Each family still
compiles its own train step (its surrogate differs). Sizes are cut to the
least that exercises the pipeline: 2 prompts x k=2, 16 response tokens, one
tool call, a 1-layer `tiny` decoder.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import math
import os

import pytest

from aepo_jax.agent.protocol import ToolCall
from aepo_jax.experiment import environment_from, pipeline_from, rollout_fn_from
from aepo_jax.training.build import init_model, model_config_from
from aepo_jax.training.rl_trainer import RLTrainer
from configs.base import apply_release_settings
from launch.run_setup import prepare_workdir

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = sorted(glob.glob(os.path.join(REPO, "configs", "*_tiny.py")))
FAMILIES = [os.path.basename(p)[: -len("_tiny.py")] for p in TINY]


def _load_config(family: str):
    path = os.path.join(REPO, "configs", f"{family}_tiny.py")
    spec = importlib.util.spec_from_file_location(f"{family}_tiny", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def _shrink(cfg, vocab_size: int | None = None):
    """The smallest run of `cfg` that still goes through every stage once."""
    k = 2
    # GRPO's config samples all k globally (m = k); the tree strategies start from one root and branch.
    initial = k if cfg.rollout.initial_rollouts == cfg.rollout.k else 1
    cfg.total_steps = 1
    cfg.data.prompts_per_step = 2
    cfg.data.num_examples = 16
    cfg.rollout.k = k
    cfg.rollout.initial_rollouts = initial
    cfg.rollout.max_response_len = 16
    cfg.rollout.max_tool_calls = 1
    cfg.train.mini_batch_prompts = 2
    cfg.train.micro_batch_size = 2
    cfg.train.max_seq_len = 512
    cfg.checkpoint.async_save = False
    cfg.log.progress_bar = False
    cfg.log.tensorboard = False
    if vocab_size is not None:
        cfg.model.vocab_size = vocab_size
    return cfg


@pytest.fixture(scope="module")
def agent_env(tmp_path_factory):
    """Task, tokenizer, search server and sandbox shared by all families (their
    tiny configs agree on data, tokenizer and tool settings)."""
    cfg = _shrink(_load_config("aepo"))
    env = environment_from(cfg, str(tmp_path_factory.mktemp("env")))
    yield env
    env.close()


def test_every_family_is_run():
    assert set(FAMILIES) == {"aepo", "arpo", "grpo", "dapo", "cispo", "gppo", "gigpo", "reinforce_pp", "gspo"}


def test_tiny_configs_share_the_environment_settings():
    """The module-scoped environment is only valid if no family changes what it is built from."""
    def env_view(cfg):
        return (cfg.seed, cfg.data.to_dict(), cfg.tokenizer.to_dict(), cfg.reward.to_dict(),
                cfg.rollout.max_result_chars, cfg.rollout.tool_timeout_s, cfg.rollout.max_prompt_len)

    views = {family: env_view(_shrink(_load_config(family))) for family in FAMILIES}
    assert len({repr(v) for v in views.values()}) == 1, views


def test_shared_tools_answer_on_loopback(agent_env):
    """A random policy seldom calls a tool, so check here that the shared search
    server and sandbox the rollouts are wired to really answer."""
    town = agent_env.task.towns[0]
    search, python = agent_env.tools.run_many([ToolCall("search", town.name), ToolCall("python", "print(6 * 7)")])
    assert search.ok and town.name in search.text, search
    assert python.ok and "42" in python.text, python


def _train(cfg, agent_env, tmp_path) -> tuple[list[dict], list[dict]]:
    """A real RL run of `cfg` in `tmp_path`: (the metrics.jsonl records, what `train` returned)."""
    workdir = str(tmp_path)
    prepare_workdir(cfg, workdir, resume=False)
    graphdef, params = init_model(cfg, model_config_from(cfg).replace(n_layers=1))
    trainer = RLTrainer(
        cfg, workdir, rollout_fn=rollout_fn_from(cfg, agent_env, graphdef, params),
        pipeline=pipeline_from(cfg, agent_env.examples, 0, 1), encode_prompt=agent_env.encode_prompt,
        reward_fn=agent_env.reward_fn, graphdef=graphdef, params=params, pad_id=int(agent_env.tokenizer.pad_id),
    )
    try:
        returned = trainer.train()
    finally:
        trainer.close()
    return [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()], returned


def _train_one_step(cfg, agent_env, tmp_path) -> tuple[dict, dict]:
    """One real RL step of `cfg` in `tmp_path`: (the metrics.jsonl record, what `train` returned)."""
    records, (returned,) = _train(cfg, agent_env, tmp_path)
    assert len(records) == 1
    return records[0], returned


def test_rollout_ahead_runs_the_real_agent_rollout_on_the_background_thread(agent_env, tmp_path):
    """The composition root's rollout (sampler, agent loop, real tools) as `train.rollout_ahead` runs it: the
    second step's rollout sampled, on the background thread, with the parameters step 1 started from."""
    cfg = _shrink(_load_config("aepo"), vocab_size=int(agent_env.tokenizer.vocab_size))
    cfg.total_steps = 2
    cfg.train.rollout_ahead = True
    cfg.train.recompute_logp_old = False  # the sampler's log-probs are the ratio's denominator
    # A visible step between the parameters the two rollouts sample with, even when a random policy's equal
    # rewards leave no advantage: decoupled weight decay shrinks every weight by lr * weight_decay = 5%.
    cfg.optim.lr, cfg.optim.weight_decay, cfg.optim.warmup_steps = 1e-2, 5.0, 0
    records, _ = _train(cfg, agent_env, tmp_path)
    assert [r["rollout_stale_params"] for r in records] == [0.0, 1.0]
    assert all(math.isfinite(r["loss"]) for r in records)
    # The ratio's denominator is the sampler's: step 1's rollout sampled with the parameters it trains, so the
    # update starts on-policy; step 2's sampled with step 1's, one update older, and the ratio sees that.
    assert abs(records[0]["approx_kl_old"]) < 1e-6 and records[1]["approx_kl_old"] > 1e-3, records
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["2"]
    assert os.path.isdir(tmp_path / "checkpoints" / "2" / "rollout_params")


@pytest.mark.parametrize("family", FAMILIES)
def test_tiny_config_runs_one_step(family, agent_env, tmp_path):
    cfg = _shrink(_load_config(family), vocab_size=int(agent_env.tokenizer.vocab_size))
    record, returned = _train_one_step(cfg, agent_env, tmp_path)
    assert record["step"] == 1 and returned["step"] == 1
    # tools_s is the wall time with some tool call in flight: within the rollout, and at most the calls' summed time
    assert 0.0 <= record["tools_s"] == record["rollout/tool_seconds"] <= record["rollout/tool_call_seconds"] + 1e-9
    assert record["tools_s"] <= record["rollout_s"]
    if record.get("skipped_update"):
        # DAPO dynamic sampling: a random policy never writes the answer format, so every
        # group has equal rewards; it really rolls out max_resample_rounds more batches,
        # drops every group, and skips the update rather than train on nothing.
        assert family == "dapo", record
        rounds = int(cfg.objective.max_resample_rounds)
        assert record["resample_rounds"] == rounds and record["kept_groups"] == 0
        assert record["dropped_groups"] == cfg.data.prompts_per_step * (rounds + 1)
        assert "loss" not in record
    else:
        for key in ("loss", "reward_mean", "entropy_mean"):
            assert math.isfinite(record[key]), (key, record)
        assert -1.0 <= record["reward_mean"] <= 1.1  # qa_f1 range (format failures give -1)
        assert record["entropy_mean"] > 0  # a random policy is far from deterministic
        assert record["updates"] == 1.0  # 2 prompts in one mini-batch of 2
        k = cfg.rollout.k
        assert record["trajectories"] == cfg.data.prompts_per_step * k
        assert record["rollout/trajectories_per_prompt"] == k
        # the rows built from the real rollout line up with the sampler: the training
        # forward reproduces its log-probs, and every generated token is trained on
        assert record["logp_old_abs_diff"] < 1e-4, record["logp_old_abs_diff"]
        assert record["train_tokens"] == pytest.approx(record["generated_tokens_mean"] * record["trajectories"])
    assert os.listdir(tmp_path / "checkpoints") == ["1"]
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["algorithm"] == family and saved["name"] == f"{family}_tiny"
    assert saved["rollout"]["strategy"] == cfg.rollout.strategy and saved["total_steps"] == 1


def _release_settings(cfg):
    """The `:release` variant's rollout and objective (top10_sum entropy, fixed m, per-prompt counter)."""
    return apply_release_settings(cfg, initial_rollouts=int(cfg.rollout.initial_rollouts), total_steps=1,
                                  reward=cfg.reward.name)


def _hard_attribution(cfg):
    cfg.objective.hard_attribution = True
    return cfg


@pytest.mark.parametrize("family, switch", [("aepo", _release_settings), ("arpo", _hard_attribution)],
                         ids=["aepo-release-top10_sum", "arpo-hard_attribution"])
def test_fidelity_switch_runs_one_step(family, switch, agent_env, tmp_path):
    """Issue 16: the released-code switches run through the real trainer (AEPO with the release
    settings, `top10_sum` among them, so the sampler returns top-10 log-probs; ARPO with hard
    attribution, so the trainer passes the rollout tree's shared prefixes)."""
    cfg = switch(_shrink(_load_config(family), vocab_size=int(agent_env.tokenizer.vocab_size)))
    record, _ = _train_one_step(cfg, agent_env, tmp_path)
    for metric in ("loss", "adv/advantage_mean", "entropy_mean", "rollout/mean_segment_entropy"):
        assert math.isfinite(record[metric]), (metric, record)
    assert record["updates"] == 1.0 and record["trajectories"] == cfg.data.prompts_per_step * cfg.rollout.k
    if cfg.rollout.entropy_measure == "top10_sum":
        # A random policy's exact token entropy is near ln V; the released measure is a sum of
        # top-10 partial entropies over <= 16 tokens divided by ln V, far below it. Under the exact
        # measure the two would agree.
        assert record["rollout/mean_segment_entropy"] < 0.5 * record["entropy_mean"], record


def test_data_search_url_uses_a_running_server_instead_of_starting_one(agent_env, tmp_path):
    """`data.search_url` points the search tool at an existing retrieval server (here: the shared one)."""
    from aepo_jax.agent.protocol import ToolCall

    url = agent_env.tools.tools["search"].url
    cfg = _shrink(_load_config("aepo"))
    cfg.data.search_url = url
    env = environment_from(cfg, str(tmp_path))
    try:
        assert env.tools.tools["search"].url == url
        assert len(env.closers) == len(agent_env.closers) - 1  # no server of its own to stop
        result = env.tools.run(ToolCall("search", agent_env.task.towns[0].name))
        assert result.ok and agent_env.task.towns[0].name in result.text
    finally:
        env.close()
