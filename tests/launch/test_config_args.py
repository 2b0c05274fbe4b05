"""The command line's `--config` arguments (`launch.config_args`): the config file's repository on
`sys.path` wherever a launch runs from, one-line errors for a missing file, an unknown key or an
`--config.algorithm` override, `--config.KEY=None` for the fields a config declares None-able, and the
checks and defaults of `launch.demo`, `launch.compare` and `launch.evaluate` (no `--config`: the run's
own config.json takes the overrides)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from absl import flags
from absl import logging as absl_logging
from ml_collections import config_flags

from launch.config_args import (
    apply_none_overrides,
    check_config_arguments,
    config_root,
    configuration_errors,
    expand_flagfiles,
    quiet_library_logs,
    take_none_overrides,
)
from tests.child_process import child_env

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(REPO, "configs", "aepo_tiny.py")
DAPO = os.path.join(REPO, "configs", "dapo_tiny.py")


def _run(module: str, *args: str, cwd: str = REPO, timeout: int = 300) -> subprocess.CompletedProcess:
    """`python -m module ARGS` in `cwd`, with only what an installed package gives on its path."""
    env = {k: v for k, v in child_env().items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def _parse(argv: list[str]):
    """The config absl and config_flags make of `argv` after the entry points' own pass over it."""
    check_config_arguments(argv[1:])
    argv, none_keys = take_none_overrides(argv)
    values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, flag_values=values, sys_argv=argv, lock_config=True)
    values(argv)
    overrides = config_flags.get_override_values(values["config"])
    apply_none_overrides(values["config"].value, none_keys, overrides)
    return values["config"].value, overrides


def test_the_config_root_is_the_directory_above_the_configs_package():
    assert config_root(TINY) == REPO
    assert config_root(os.path.join(REPO, "launch", "run_config.py")) == REPO


def test_a_launch_from_another_directory_imports_the_config_files_own_package(tmp_path):
    """`cd /tmp && python -m launch.train --config REPO/configs/aepo_tiny.py` failed with `No module named
    'configs'`: only the working directory was put on sys.path. The run reaches its own checks here."""
    out = _run("launch.train", "--config", TINY, "--workdir", str(tmp_path / "run"), "--config.deterministic=True",
               "--config.rollout.schedule=continuous", cwd=str(tmp_path))
    assert out.returncode != 0
    assert out.stderr.strip().splitlines()[-2].startswith("error: config.deterministic=True asks for rollouts"), \
        out.stderr[-2000:]


def test_demo_and_compare_check_the_overrides_of_their_default_config(tmp_path):
    """Both left the default `--config` unchecked (an unknown key was a 55-line AttributeError traceback), and
    the default, `configs/demo.py`, was a path relative to the working directory."""
    for module in ("launch.demo", "launch.compare"):
        out = _run(module, "--workdir", str(tmp_path / "w"), "--config.optim.learning_rate=1", cwd=str(tmp_path))
        assert out.returncode != 0
        assert out.stderr.strip().splitlines() == [(
            "error: unknown config key 'optim.learning_rate' in '--config.optim.learning_rate=1': optim has no "
            "'learning_rate'; its keys are ['b1', 'b2', 'eps', 'final_lr_fraction', 'grad_clip_norm', 'lr', "
            "'schedule', 'warmup_steps', 'weight_decay']")], (module, out.stderr[-2000:])
        assert not (tmp_path / "w").exists()


def test_demo_and_compare_refuse_loop_settings_before_anything_starts(tmp_path):
    """The demo and compare checked only the attention kernel up front, so loop settings that cannot run
    together (`deterministic=True` with the continuous schedule) failed after the whole SFT stage."""
    for module in ("launch.demo", "launch.compare"):
        out = _run(module, "--workdir", str(tmp_path / "w"), "--config.deterministic=True",
                   "--config.rollout.schedule=continuous", cwd=str(tmp_path))
        assert out.returncode != 0
        assert out.stderr.strip().splitlines()[0].startswith(
            "error: config.deterministic=True asks for rollouts that repeat bit for bit"), (module, out.stderr[-2000:])
        assert not (tmp_path / "w").exists()


def test_none_sets_the_fields_a_config_declares_none_able():
    """`--config.objective.dual_clip_c=None` was a flag parsing error (the dual clip could not be turned off
    from the command line), and the dapo preset's `overlong_buffer_len` was typed float."""
    cfg, overrides = _parse(["prog", "--config", DAPO, "--config.objective.dual_clip_c=None",
                             "--config.model.logits_chunk_size", "None", "--config.objective.overlong_buffer_len=16",
                             "--config.objective.clip_high=0.3"])
    assert cfg.objective.dual_clip_c is None and cfg.model.logits_chunk_size is None
    assert cfg.objective.overlong_buffer_len == 16 and isinstance(cfg.objective.overlong_buffer_len, int)
    assert cfg.objective.clip_high == 0.3
    assert overrides == {"objective.overlong_buffer_len": 16, "objective.clip_high": 0.3,
                         "objective.dual_clip_c": None, "model.logits_chunk_size": None}
    cfg, _ = _parse(["prog", "--config", DAPO, "--config.objective.overlong_buffer_len=None"])
    assert cfg.objective.overlong_buffer_len is None


def test_none_for_a_field_that_is_not_none_able_is_refused_naming_it():
    with pytest.raises(SystemExit, match=r"error: '--config.seed=None': seed cannot be None \(it is 0\).*"
                                         r"'objective.dual_clip_c'"):
        check_config_arguments(["--config", TINY, "--config.seed=None"])
    with pytest.raises(SystemExit, match=r"total_steps cannot be None"):  # a reference shared with train.total_steps
        check_config_arguments(["--config", TINY, "--config.total_steps", "None"])


def test_a_flagfile_holding_the_config_is_read_before_the_checks(tmp_path):
    """`--flagfile=F` holding `--config FILE` with `--config.*` on the command line was refused as overrides
    without a config (the checks read the command line alone)."""
    flagfile = tmp_path / "run.flags"
    flagfile.write_text(f"--config={DAPO}\n--config.objective.dual_clip_c=None\n")
    argv = expand_flagfiles(["prog", f"--flagfile={flagfile}", "--config.optim.lr=0.5"])
    cfg, _ = _parse(argv)
    assert cfg.optim.lr == 0.5 and cfg.objective.dual_clip_c is None


def test_an_algorithm_override_is_refused_pointing_to_the_family_config_files():
    """It only relabelled the run: the objective and rollout strategy came from the file's own preset."""
    with pytest.raises(SystemExit, match=r"error: '--config.algorithm=grpo' would only relabel the run: .*aepo_tiny.py "
                                         r"filled objective.\* and rollout.strategy from its own preset \('aepo'\).*"
                                         r"configs/<algorithm>_tiny.py"):
        check_config_arguments(["--config", TINY, "--config.algorithm=grpo"])


def test_a_configuration_error_is_one_line_and_its_traceback_only_with_verbose_logs(capsys):
    with pytest.raises(SystemExit, match=r"^error: train.micro_batch_size=0: bad\n  \(ValueError at .*"
                                         r"test_config_args.py:\d+; --config.verbose_logs=True prints the "
                                         r"traceback\)$"), configuration_errors():
        raise ValueError("train.micro_batch_size=0: bad")  # where it was raised: a library's own is not ours
    assert "Traceback" not in capsys.readouterr().err
    with pytest.raises(SystemExit, match=r"^error: .*no such file"), configuration_errors(verbose=True):
        raise FileNotFoundError("data.path='/x.jsonl': no such file")
    assert "Traceback" in capsys.readouterr().err
    with pytest.raises(RuntimeError), configuration_errors():  # not a configuration error: left as it is
        raise RuntimeError("a bug")


def test_an_explicit_absl_verbosity_is_kept(monkeypatch):
    """`--verbosity=0` (INFO) was pushed back to WARNING: the check read `<= INFO`, true for every default."""
    before = absl_logging.get_verbosity()
    try:
        absl_logging.set_verbosity(absl_logging.INFO)
        monkeypatch.setattr(flags.FLAGS["verbosity"], "present", 1)  # given on the command line
        quiet_library_logs(verbose=False)
        assert absl_logging.get_verbosity() == absl_logging.INFO
        monkeypatch.setattr(flags.FLAGS["verbosity"], "present", 0)
        quiet_library_logs(verbose=True)  # the config's verbose_logs
        assert absl_logging.get_verbosity() == absl_logging.INFO
        quiet_library_logs(verbose=False)
        assert absl_logging.get_verbosity() == absl_logging.WARNING
    finally:
        absl_logging.set_verbosity(before)


def _fake_run(tmp_path) -> str:
    """A run directory `launch.evaluate` accepts up to its checks: config.json and a step folder."""
    from configs.aepo_tiny import get_config

    run = tmp_path / "run"
    (run / "checkpoints" / "1").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps(json.loads(get_config().to_json_best_effort())))
    return str(run)


def test_evaluate_without_config_applies_the_overrides_to_the_runs_own_config(tmp_path):
    """`launch.evaluate --checkpoint RUN --config.rollout.max_tool_calls=1` failed with "Unknown command line
    flag". The overrides now reach the run's config.json: these two are refused together by its checks, and
    a None for a field the run saved as null is accepted."""
    out = _run("launch.evaluate", "--checkpoint", _fake_run(tmp_path), "--config.model.logits_chunk_size=None",
               "--config.deterministic=True", "--config.rollout.schedule=continuous", "--out", str(tmp_path / "out"))
    assert out.returncode != 0
    assert out.stderr.strip().splitlines()[-1].startswith("error: config.deterministic=True asks for rollouts"), \
        out.stderr[-2000:]
    baseline = _run("launch.evaluate", "--checkpoint", "none", "--config.rollout.max_tool_calls=1")
    assert baseline.returncode != 0
    assert baseline.stderr.strip().splitlines() == [(
        "error: --config.KEY=VALUE overrides need --config FILE here: without a run there is no run config to apply "
        "them to")]


def test_a_runs_own_config_takes_overrides_typed_by_its_algorithms_defaults(tmp_path):
    """JSON keeps neither a None's type nor which fields may be None: a field the run saved as null took
    any literal (`logits_chunk_size=abc` became a string), and a None-able field saved with a value
    (`objective.dual_clip_c=3.0`) could not be turned off. Both now come from the run's defaults."""
    run = _fake_run(tmp_path)
    spec = f"{os.path.join(REPO, 'launch', 'run_config.py')}:{run}"
    config, _ = _parse(["prog", f"--config={spec}", "--config.objective.dual_clip_c=None",
                     "--config.model.logits_chunk_size=512"])
    assert config.objective.dual_clip_c is None
    assert config.model.logits_chunk_size == 512 and isinstance(config.model.logits_chunk_size, int)
    with pytest.raises(flags.IllegalFlagValueError, match="logits_chunk_size"):
        _parse(["prog", f"--config={spec}", "--config.model.logits_chunk_size=abc"])
    with pytest.raises(SystemExit, match="rollout.max_tool_calls cannot be None"):
        _parse(["prog", f"--config={spec}", "--config.rollout.max_tool_calls=None"])


def test_a_runs_own_config_takes_overrides_of_its_tuple_fields(tmp_path):
    """JSON saved `rollout.python_preload` (a tuple) as a list, and ml-collections refuses to override a
    list field: `--config.rollout.python_preload="('numpy',)"` on a run's config was an
    UnsupportedOperationError."""
    spec = f"{os.path.join(REPO, 'launch', 'run_config.py')}:{_fake_run(tmp_path)}"
    config, _ = _parse(["prog", f"--config={spec}", "--config.rollout.python_preload=('numpy', 'sympy')"])
    assert config.rollout.python_preload == ("numpy", "sympy")
    config, _ = _parse(["prog", f"--config={spec}"])
    assert config.rollout.python_preload == () and isinstance(config.rollout.python_preload, tuple)


def test_an_unknown_config_variant_is_one_line_with_or_without_overrides():
    """`--config configs/aepo_qwen3_14b.py:bogus` with no override was loaded only inside absl's flag parsing,
    which printed the config file's ValueError as a traceback (`check_config_arguments` returned early);
    launch.sft and launch.evaluate still did after launch.train stopped."""
    spec = os.path.join(REPO, "configs", "aepo_qwen3_14b.py") + ":bogus"
    for argv in (["--config", spec], [f"--config={spec}", "--config.seed=1"]):
        with pytest.raises(SystemExit, match=r"^error: .*aepo_qwen3_14b.py: unknown variant 'bogus'; choose from "
                                             r"\('release',\)"):
            check_config_arguments(argv)
    check_config_arguments(["--config", TINY])  # a config that loads: nothing to say
    with pytest.raises(SystemExit, match=r"^error: --config .*run_config.py: .*missing 1 required positional"):
        check_config_arguments(["--config", os.path.join(REPO, "launch", "run_config.py")])  # no RUN_DIR
    for module in ("launch.train", "launch.sft", "launch.evaluate"):  # each stops before any run
        out = _run(module, "--config", spec, "--workdir", "/nonexistent/run")
        assert out.returncode == 1 and out.stderr.startswith("error: ") and "Traceback" not in out.stderr, \
            (module, out.stderr)
        assert "unknown variant 'bogus'" in out.stderr, (module, out.stderr)


def test_train_help_lists_its_run_flags():
    """--workdir, --resume and --allow_config_changes are defined in launch.run_setup, and `--help` (the
    main module's key flags) listed none of them, nor --config."""
    out = _run("launch.train", "--help")
    for flag in ("--config:", "--workdir:", "--[no]resume:", "--[no]allow_config_changes:"):
        assert flag in out.stdout, out.stdout
    assert out.returncode == 0, out.stderr  # absl exits 1 after its help: a script's `--help &&` failed


@pytest.mark.parametrize("module", ["launch.evaluate", "launch.compare"])
def test_help_exits_0_and_a_bad_flag_still_fails(module):
    for args, code in ((["--helpfull"], 0), (["-?"], 0), (["--helpshort", "--bogus"], 0), (["--bogus"], 1)):
        out = _run(module, *args)
        assert out.returncode == code, (args, out.returncode, out.stderr[-2000:])


def test_asks_for_help_reads_absls_help_flags_before_a_double_dash():
    from launch.config_args import asks_for_help

    assert all(asks_for_help([arg]) for arg in ("--help", "-help", "--help=true", "-?", "--helpfull", "--helpxml"))
    assert not any(asks_for_help([arg]) for arg in ("--helper", "help", "--config.help=1", "--workdir=--help"))
    assert not asks_for_help(["--", "--help"])
