"""RL after an SFT stage: it starts from the SFT parameters (`model.init_checkpoint`), which are then both
its policy and its reference model, with a fresh step count, optimiser and data order; resuming the SFT
workdir as an RL run is refused (it kept the random reference and jumped the prompt stream to SFT's
batch position)."""

from __future__ import annotations

import contextlib
import io
import shutil
from types import SimpleNamespace

import jax
import numpy as np
import pytest

from aepo_jax.experiment import model_from
from aepo_jax.experiment_sft import sft_config_from
from aepo_jax.training.sft_trainer import SequenceBatches, SFTTrainer
from configs.reinforce_pp_tiny import get_config
from tests.training.fixtures import tiny_model
from tests.training.sampling_fixture import sampling_trainer, small_rl_config


def _flat(tree) -> np.ndarray:
    return np.concatenate([np.asarray(x, np.float32).ravel() for x in jax.tree.leaves(tree)])


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory):
    """(config, SFT workdir, flat SFT params) after 4 SFT steps from the tiny model's seeded init."""
    root = tmp_path_factory.mktemp("sft")
    cfg = small_rl_config(get_config, total_steps=3)
    rng = np.random.default_rng(0)
    records = [{"tokens": rng.integers(1, 64, 11).tolist(), "mask": np.array([0] * 5 + [1] * 6, np.float32)}
               for _ in range(16)]
    graphdef, params = tiny_model(seed=cfg.seed)
    init_params = _flat(params)  # (the trainer donates them)
    sft = SFTTrainer(sft_config_from(cfg), str(root), batches=SequenceBatches(records, batch_size=4),
                     graphdef=graphdef, params=params)
    with contextlib.redirect_stdout(io.StringIO()):
        sft.train()
    sft.close()
    sft_params = _flat(sft.state.params)
    assert not np.array_equal(sft_params, init_params)  # SFT moved the weights
    return cfg, root, sft_params


def test_resuming_an_sft_workdir_as_rl_is_refused_naming_init_checkpoint(sft_run, tmp_path):
    cfg, root, _ = sft_run
    shutil.copytree(root, tmp_path / "rl")
    rl = sampling_trainer(cfg, tmp_path / "rl")
    try:
        with pytest.raises(ValueError, match=r"written by the 'sft' stage.*model\.init_checkpoint"):
            rl.restore_latest()
        assert int(rl.state.rounds) == 0  # nothing was restored
    finally:
        rl.close()


def test_rl_from_init_checkpoint_starts_at_step_0_with_the_sft_params_as_policy_and_reference(sft_run, tmp_path):
    from aepo_jax.data import PromptPipeline
    from aepo_jax.training.rl_trainer import RLTrainer
    from tests.training.sampling_fixture import (
        digit_examples,
        encode_digits,
        low_token_reward,
        make_sampling_rollout,
    )

    cfg, root, sft_params = sft_run
    cfg = cfg.copy_and_resolve_references()
    cfg.model.init_checkpoint = str(root)
    env = SimpleNamespace(pretrained=None, tokenizer=SimpleNamespace(vocab_size=64))
    graphdef, params = model_from(cfg, env)
    np.testing.assert_array_equal(_flat(params), sft_params)
    pipeline = PromptPipeline(digit_examples(16), cfg.data.prompts_per_step, seed=cfg.seed)
    rl = RLTrainer(cfg, str(tmp_path / "rl"), rollout_fn=make_sampling_rollout(graphdef), pipeline=pipeline,
                   encode_prompt=encode_digits, reward_fn=low_token_reward, graphdef=graphdef, params=params)
    try:
        assert rl.needs_reference and not rl.restore_latest()  # a fresh run
        assert int(rl.state.rounds) == 0 and rl.pipeline.state()["position"] == 0
        np.testing.assert_array_equal(_flat(rl.reference_params), sft_params)
        with contextlib.redirect_stdout(io.StringIO()):
            rl.train(num_steps=1)
        np.testing.assert_array_equal(_flat(rl.reference_params), sft_params)  # the reference stays SFT's
    finally:
        rl.close()


def test_init_checkpoint_and_a_gguf_policy_are_refused_together(sft_run):
    cfg, root, _ = sft_run
    cfg = cfg.copy_and_resolve_references()
    cfg.model.init_checkpoint = str(root)
    with pytest.raises(ValueError, match="init_checkpoint and a GGUF policy"):
        model_from(cfg, SimpleNamespace(pretrained=tiny_model(), tokenizer=SimpleNamespace(vocab_size=64)))


def test_a_sigterm_while_the_last_save_commits_does_not_kill_the_run(sft_run, tmp_path):
    """The step loop put the default SIGTERM handler back before waiting for its last (async) save, so a
    notice in that wait killed the process before the commit and the run lost up to `checkpoint.every`
    steps; the watch's handler must be in place until the save has committed."""
    import signal

    from aepo_jax.training.preemption import PreemptionWatch

    cfg, _, _ = sft_run
    rl = sampling_trainer(cfg, tmp_path / "rl")
    before = signal.getsignal(signal.SIGTERM)
    handlers = []
    wait = rl.checkpointer.wait_until_finished

    def wait_and_look():
        handlers.append(signal.getsignal(signal.SIGTERM))
        wait()

    rl.checkpointer.wait_until_finished = wait_and_look
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            rl.train(num_steps=1)
    finally:
        rl.close()
    assert handlers and all(isinstance(getattr(h, "__self__", None), PreemptionWatch) for h in handlers), handlers
    assert signal.getsignal(signal.SIGTERM) == before  # and the previous handler is back after it


def test_a_run_keeps_the_init_checkpoint_step_it_started_from(sft_run, tmp_path):
    """The reference model is the init checkpoint's parameters: a resumed run rebuilt it from the newest step
    of `model.init_checkpoint` at each start, so an SFT run extended meanwhile changed the reference. The
    step is fixed when the run starts and kept in its config.json; a pinned step that is gone is an error."""
    from aepo_jax.experiment_init import pin_init_checkpoint
    from aepo_jax.training.checkpoint import step_folders
    from launch.resume_check import keep_fixed_settings, may_change

    cfg, root, sft_params = sft_run
    assert step_folders(str(root / "checkpoints"))[0] == [2, 3]
    cfg = cfg.copy_and_resolve_references()
    cfg.model.init_checkpoint = str(root)
    pin_init_checkpoint(cfg)
    assert cfg.model.init_checkpoint_step == 3  # the newest, when the run starts
    (tmp_path / "config.json").write_text(cfg.to_json_best_effort())
    resumed = cfg.copy_and_resolve_references()
    resumed.model.init_checkpoint_step = None  # the resumed run's config file, as the user wrote it
    keep_fixed_settings(resumed, str(tmp_path))
    assert resumed.model.init_checkpoint_step == 3
    elsewhere = resumed.copy_and_resolve_references()  # another init run (--allow_config_changes): chosen again
    elsewhere.model.init_checkpoint, elsewhere.model.init_checkpoint_step = str(tmp_path / "other_sft"), None
    keep_fixed_settings(elsewhere, str(tmp_path))
    assert elsewhere.model.init_checkpoint_step is None
    assert not may_change("model.init_checkpoint") and not may_change("model.init_checkpoint_step")

    env = SimpleNamespace(pretrained=None, tokenizer=SimpleNamespace(vocab_size=64))
    np.testing.assert_array_equal(_flat(model_from(resumed, env)[1]), sft_params)
    older = cfg.copy_and_resolve_references()
    older.model.init_checkpoint_step = 2  # a run that started before step 3 was saved reads step 2, not the newest
    assert not np.array_equal(_flat(model_from(older, env)[1]), sft_params)
    older.model.init_checkpoint_step = 1
    with pytest.raises(FileNotFoundError, match=r"holds no complete step 1 \(it has \[2, 3\]\)"):
        model_from(older, env)


def test_a_missing_relative_init_checkpoint_names_the_key_and_the_directory_it_was_read_from(tmp_path, monkeypatch):
    """A run started elsewhere saves its relative `model.init_checkpoint` as typed; resumed from another directory
    it failed with only "checkpoint directory 'sft_tiny' does not exist"."""
    from aepo_jax.experiment_init import init_checkpoint_location, pin_init_checkpoint

    cfg = get_config()
    cfg.model.init_checkpoint = "sft_tiny"
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"model\.init_checkpoint='sft_tiny' \(a relative path, read from "
                                                  rf"the current directory {tmp_path}\): .*does not exist"):
        pin_init_checkpoint(cfg)
    cfg.model.init_checkpoint_step = 3
    with pytest.raises(FileNotFoundError, match=r"model\.init_checkpoint='sft_tiny' \(a relative path"):
        init_checkpoint_location(cfg)
