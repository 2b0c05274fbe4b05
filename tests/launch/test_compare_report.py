"""launch.compare's table (root-credited columns, NaN where nothing branched), its entropy-curve PNG, and
the config each algorithm runs with: its preset with the command line's objective overrides on top."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from launch.compare import (
    COLUMNS,
    _tail_mean,
    _write,
    algorithm_configs,
    format_markdown,
    merge_compare,
    plot_entropy_curves,
    run_record,
    summarise,
)
from tests.child_process import child_env

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(algorithm, seed, pass1, roots, curve):
    row = {key: 0.5 for key, _, _ in COLUMNS}
    row.update({"algorithm": algorithm, "seed": seed, "pass@1": pass1, "train_branch_roots": roots,
                "entropy_curve": curve})
    return row


def test_summary_and_markdown_carry_the_root_credited_columns(tmp_path):
    runs = [run("aepo", 0, 0.2, 3.0, [1.0, 0.9]), run("aepo", 1, 0.4, 5.0, [1.1, 0.7]),
            run("grpo", 0, 0.1, math.nan, [1.2, 1.0])]
    table = summarise(runs)
    assert math.isclose(table["aepo"]["pass@1"][0], 0.3) and math.isclose(table["aepo"]["pass@1"][1], 0.1)
    assert table["aepo"]["train_branch_roots"] == (4.0, 1.0)
    assert all(math.isnan(v) for v in table["grpo"]["train_branch_roots"])  # GRPO never branches
    text = format_markdown({"pass@1": 0.0, "tool_calls": 1.0, "python_rate": 0.0}, table, [0, 1])
    assert "roots with branches (train, end)" in text and "largest root's branch share" in text
    assert "| grpo |" in text and "n/a" in text.split("| grpo |")[1]
    png = plot_entropy_curves(runs, str(tmp_path / "entropy.png"))
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_parts_run_in_parallel_merge_into_one_table(tmp_path):
    from types import SimpleNamespace

    cfg = SimpleNamespace(train=SimpleNamespace(total_steps=3))
    sft = {"pass@1": 0.04, "tool_calls": 1.0, "python_rate": 0.0}
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    for directory, seed, value in ((a, 0, 0.2), (b, 1, 0.4)):
        directory.mkdir()
        _write(str(directory), cfg, sft, [run("aepo", seed, value, 2.0, [1.0, math.nan])], [seed], 10.0)
    merged = merge_compare([str(a), str(b)], str(tmp_path / "out"))
    assert [r["seed"] for r in merged["runs"]] == [0, 1] and merged["seeds"] == [0, 1]
    assert math.isclose(merged["summary"]["aepo"]["pass@1"][0], 0.3)
    assert json.loads((tmp_path / "out" / "compare.json").read_text())["rl_steps"] == 3
    assert (tmp_path / "out" / "entropy_curves.png").exists()
    c.mkdir()
    _write(str(c), cfg, {**sft, "pass@1": 0.05}, [run("aepo", 2, 0.1, 2.0, [1.0])], [2], 10.0)
    with pytest.raises(ValueError, match="same SFT"):
        merge_compare([str(a), str(c)], str(tmp_path / "bad"))


def test_tail_means_skip_the_nonfinite_values_metrics_jsonl_writes_as_strings():
    records = [{"step": 1, "reward_mean": 1.0}, {"step": 2, "reward_mean": 2.0}, {"step": 3, "reward_mean": "nan"},
               {"step": 4, "reward_mean": 4.0}, {"step": 5, "reward_mean": "inf"}]
    assert _tail_mean(records, "reward_mean") == pytest.approx(7.0 / 3)
    assert math.isnan(_tail_mean([{"step": 1, "reward_mean": "nan"}], "reward_mean"))


def test_objective_overrides_reach_every_algorithm_and_compare_json_records_them():
    """`with_algorithm` rebuilt `objective` from each preset, silently dropping `--config.objective.*`."""
    from aepo_jax.objectives import get_preset
    from configs.demo import get_config

    overrides = {"objective.clip_high": 0.3, "objective.kl_coef": 0.01, "objective.dual_clip_c": None,
                 "optim.lr": 0.5}
    configs = algorithm_configs(get_config("smoke"), ["aepo", "arpo", "grpo"], overrides)
    for algorithm, cfg in configs.items():
        assert (cfg.algorithm, cfg.rollout.strategy) == (algorithm, get_preset(algorithm).rollout)
        assert (cfg.objective.clip_high, cfg.objective.kl_coef, cfg.objective.dual_clip_c) == (0.3, 0.01, None)
        assert cfg.objective.surrogate == get_preset(algorithm).surrogate  # the rest is the preset's
    record = run_record("grpo", 1, configs["grpo"], {"pass@1": 0.25}, [{"step": 1, "entropy_mean": 1.0}], 2.0)
    assert record["objective"]["clip_high"] == 0.3 and record["objective"]["dual_clip_c"] is None
    assert record["rollout_strategy"] == "independent" and record["pass@1"] == 0.25


def test_a_rollout_strategy_override_is_refused_before_anything_runs(tmp_path):
    from configs.demo import get_config

    with pytest.raises(ValueError, match=r"--config.rollout.strategy=independent cannot be overridden in a "
                                         r"comparison.*--algorithms"):
        algorithm_configs(get_config("smoke"), ["aepo"], {"rollout.strategy": "independent"})
    out = subprocess.run([sys.executable, "-m", "launch.compare", "--config", "configs/demo.py:smoke", "--workdir",
                          str(tmp_path / "w"), "--config.rollout.strategy=independent"], cwd=REPO, env=child_env(),
                         capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode != 0
    assert out.stderr.strip().splitlines()[-1].startswith("error: --config.rollout.strategy=independent cannot be"), \
        out.stderr[-2000:]
    assert not (tmp_path / "w").exists()  # no SFT stage started
