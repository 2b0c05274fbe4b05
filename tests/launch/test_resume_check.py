"""A resumed run's config against the one its run saved: what may change, what is refused, what is kept."""

import json

import pytest

from launch.resume_check import check_resume_config, config_changes, may_change

SAVED = {"total_steps": 10, "optim": {"lr": 1e-3, "schedule": "constant"}, "model": {"vocab_size": 512},
         "mesh": {"shape": {"data": -1, "fsdp": 8}}, "data": {"path": "/mnt/a/train.jsonl"}}


def write_saved(run_dir):
    (run_dir / "config.json").write_text(json.dumps(SAVED))


def changed(**edits):
    """SAVED with dotted keys set."""
    out = json.loads(json.dumps(SAVED))
    for dotted, value in edits.items():
        node = out
        *parents, leaf = dotted.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def test_changes_are_listed_by_dotted_key_with_both_values():
    assert config_changes(SAVED, changed(optim__lr=0.5, mesh__shape__fsdp=4)) == [
        ("mesh.shape.fsdp", 8, 4), ("optim.lr", 1e-3, 0.5)]
    assert config_changes(SAVED, SAVED) == []


def test_where_and_how_long_may_change_but_not_what_is_trained():
    assert all(may_change(k) for k in ("total_steps", "mesh.shape.fsdp", "log.tensorboard", "data.path"))
    assert not any(may_change(k) for k in ("optim.lr", "objective.clip_low", "reward.name", "rollout.k", "seed",
                                           "logx"))


def test_a_changed_learning_rate_is_refused_naming_it(tmp_path):
    write_saved(tmp_path)
    with pytest.raises(SystemExit, match=r"optim.lr: 0.001 -> 0.5") as err:
        check_resume_config(str(tmp_path), changed(optim__lr=0.5, total_steps=20), allow_changes=False)
    assert "total_steps" not in str(err.value)  # allowed changes are not listed as refused
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]


def test_allowed_or_accepted_changes_keep_the_old_config_beside_the_new(tmp_path):
    write_saved(tmp_path)
    assert check_resume_config(str(tmp_path), changed(total_steps=20, data__path="/mnt/b/train.jsonl"),
                               allow_changes=False) == ["data.path", "total_steps"]
    assert check_resume_config(str(tmp_path), changed(optim__lr=0.5), allow_changes=True) == ["optim.lr"]
    kept = [p for p in tmp_path.iterdir() if p.name.startswith("config.before-resume-")]
    assert kept and all(json.loads(p.read_text()) == SAVED for p in kept)
    assert json.loads((tmp_path / "config.json").read_text()) == SAVED  # the run writes its own later


def test_a_vocabulary_size_the_run_fills_in_later_is_no_change(tmp_path):
    write_saved(tmp_path)
    assert check_resume_config(str(tmp_path), changed(model__vocab_size=None), allow_changes=False) == []
    with pytest.raises(SystemExit, match="model.vocab_size"):
        check_resume_config(str(tmp_path), changed(model__vocab_size=600), allow_changes=False)


def test_a_setting_newer_than_the_saved_run_is_no_change_but_is_named(tmp_path, capsys):
    """A run saved before a setting existed (its config.json lacks the key) resumes under the given value."""
    write_saved(tmp_path)
    assert check_resume_config(str(tmp_path), changed(tokenizer__agent_tags="text"), allow_changes=False) == []
    printed = capsys.readouterr().out
    assert "settings newer than" in printed and "'tokenizer.agent_tags': 'text'" in printed


def test_a_first_save_cut_short_neither_blocks_a_new_run_nor_passes_for_a_checkpoint(tmp_path):
    from aepo_jax.training.checkpoint import step_folders
    from configs.aepo_tiny import get_config
    from launch.run_setup import prepare_workdir

    (tmp_path / "checkpoints" / "5" / "state").mkdir(parents=True)  # no commit_success.txt: cut short
    assert step_folders(str(tmp_path / "checkpoints")) == ([], [5])
    with pytest.raises(SystemExit, match=r"no complete checkpoint \(steps \[5\] were cut short"):
        prepare_workdir(get_config(), str(tmp_path), resume=True)
    prepare_workdir(get_config(), str(tmp_path), resume=False)  # a new run may start over it
    (tmp_path / "checkpoints" / "5" / "commit_success.txt").write_text("done")
    with pytest.raises(SystemExit, match="already has checkpoints"):
        prepare_workdir(get_config(), str(tmp_path), resume=False)


@pytest.mark.parametrize("schedule", ["cosine", "linear"])
def test_a_longer_run_is_refused_when_the_lr_schedule_decays_over_its_length(tmp_path, schedule):
    saved = changed(optim__schedule=schedule, train__total_steps=10)
    (tmp_path / "config.json").write_text(json.dumps(saved))
    longer = json.loads(json.dumps(saved))
    longer["total_steps"] = longer["train"]["total_steps"] = 20
    with pytest.raises(SystemExit, match=rf"train.total_steps: 10 -> 20 \(optim.schedule='{schedule}' decays over "
                                         r"the run's length: the resumed run's learning rate would jump"):
        check_resume_config(str(tmp_path), longer, allow_changes=False)
    assert check_resume_config(str(tmp_path), longer, allow_changes=True) == ["total_steps", "train.total_steps"]


def test_a_longer_run_may_resume_under_a_constant_schedule_with_or_without_warmup(tmp_path):
    from aepo_jax.training.optimizer import learning_rate_schedule

    saved = changed(optim__warmup_steps=16, train__total_steps=10)
    (tmp_path / "config.json").write_text(json.dumps(saved))
    longer = json.loads(json.dumps(saved))
    longer["total_steps"] = longer["train"]["total_steps"] = 20
    assert check_resume_config(str(tmp_path), longer, allow_changes=False) == ["total_steps", "train.total_steps"]
    # why that is safe: the constant schedule, warm-up included, is the same whatever the run's length
    short, long = learning_rate_schedule(1e-3, 80, 16, "constant"), learning_rate_schedule(1e-3, 160, 16, "constant")
    assert all(float(short(u)) == float(long(u)) for u in (0, 8, 16, 79, 120))


def test_a_resume_without_the_runs_config_json_is_refused_unless_changes_are_allowed(tmp_path, capsys):
    """Nothing to check the settings against: a changed learning rate went through unnoticed (and the new
    settings became the run's config.json)."""
    with pytest.raises(SystemExit, match=r"config.json is missing, so the settings the run trained under cannot "
                                         r"be checked.*--allow_config_changes"):
        check_resume_config(str(tmp_path), changed(optim__lr=0.5), allow_changes=False)
    assert check_resume_config(str(tmp_path), changed(optim__lr=0.5), allow_changes=True) == []
    assert "continuing under the given settings unchecked" in capsys.readouterr().out


def test_a_resume_past_the_runs_length_is_refused(tmp_path):
    """A total_steps below the newest checkpoint's step trained nothing and exited 0 (and wrote the shorter
    length into config.json)."""
    from configs.aepo_tiny import get_config
    from launch.run_setup import prepare_workdir

    (tmp_path / "checkpoints" / "6").mkdir(parents=True)
    (tmp_path / "checkpoints" / "6" / "commit_success.txt").write_text("done")
    cfg = get_config()
    cfg.train.total_steps = 3
    with pytest.raises(SystemExit, match=r"newest checkpoint is step 6, past its total_steps=3: there is nothing "
                                         r"left to train; resume with a total_steps of at least 6"):
        prepare_workdir(cfg, str(tmp_path), resume=True)
    assert not (tmp_path / "config.json").exists()


@pytest.mark.parametrize("content", ['{"total_steps": ', "[1, 2]", b"\xff\xfe"])
def test_a_saved_config_that_is_no_json_object_is_one_line_naming_it(tmp_path, content):
    """A config.json cut short (a full disk) or edited by hand gave a JSONDecodeError traceback naming no file."""
    from configs.aepo_tiny import get_config
    from launch.resume_check import keep_fixed_settings

    path = tmp_path / "config.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    message = rf"^error: --resume: the run's saved config.json {path} (cannot be read as JSON|holds a JSON list)"
    with pytest.raises(SystemExit, match=message):
        check_resume_config(str(tmp_path), SAVED, allow_changes=True)
    with pytest.raises(SystemExit, match=message):
        keep_fixed_settings(get_config(), str(tmp_path))
