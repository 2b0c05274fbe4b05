"""The paper configs' two variants resolve to the settings of docs/fidelity.md (issue 16 part 1).

Configs are resolved the way `launch.train` resolves them (ml-collections
`config_flags` with `--config=FILE[:ARG]`), so `:release` reaches
`get_config` exactly as on the command line.
"""

from __future__ import annotations

import os
import pathlib
import re

import pytest
from absl import flags
from ml_collections import config_flags

from aepo_jax.training.build import preset_from

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = {"14b": "configs/aepo_qwen3_14b.py", "7b": "configs/aepo_qwen2_5_7b.py"}

# Mirror of the table in docs/fidelity.md: key -> (14B default, 14B release, 7B default, 7B release).
TABLE = {
    "rollout.dynamic_budget": (True, False, True, False),
    "rollout.initial_rollouts": (6, 6, 8, 8),
    "rollout.premonitor_reuse": (True, False, True, False),
    "rollout.penalty_scope": ("lineage", "prompt", "lineage", "prompt"),
    "rollout.penalty_slope": (0.05, 0.05, 0.05, 0.05),
    "rollout.counter_updates": ("every_round", "batch_branched", "every_round", "batch_branched"),
    "rollout.decision_entropy": ("after_result", "before_call", "after_result", "before_call"),
    "rollout.entropy_measure": ("exact_mean", "top10_sum", "exact_mean", "top10_sum"),
    "rollout.entropy_tokens": (20, 20, 20, 20),
    "objective.entropy_advantage": (True, False, True, False),
    "objective.surrogate": ("aepo", "aepo", "aepo", "aepo"),
    "train.total_steps": (80, 80, 156, 156),
    "reward.name": ("qa_f1", "qa_f1", "math_equiv", "qa_f1"),
    "rollout.k": (12, 12, 16, 16),
    "rollout.branch_width": (2, 2, 2, 2),
    "rollout.branch_threshold": (0.5, 0.5, 0.5, 0.5),
    "rollout.entropy_weight": (0.2, 0.2, 0.2, 0.2),
    "rollout.beta": (0.5, 0.5, 0.5, 0.5),
    "objective.kl_coef": (0.0, 0.0, 0.0, 0.0),
    "objective.clip_low": (0.2, 0.2, 0.2, 0.2),
    "objective.clip_high": (0.2, 0.2, 0.2, 0.2),
    "objective.dual_clip_c": (3.0, 3.0, 3.0, 3.0),
    "optim.lr": (1e-6, 1e-6, 1e-6, 1e-6),
    "data.prompts_per_step": (64, 64, 128, 128),
    "train.mini_batch_prompts": (8, 8, 16, 16),
    "rollout.max_prompt_len": (2000, 2000, 1536, 1536),
    "rollout.max_response_len": (6192, 6192, 4096, 4096),
    "rollout.temperature": (1.0, 1.0, 1.0, 1.0),
    "rollout.top_p": (1.0, 1.0, 1.0, 1.0),
    "rollout.max_tool_calls": (6, 6, 6, 6),
}
COLUMNS = [("14b", None), ("14b", "release"), ("7b", None), ("7b", "release")]


def resolve(model: str, variant: str | None):
    """The config `launch.train --config FILE[:variant]` would run."""
    values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "experiment config", flag_values=values, lock_config=True)
    spec = os.path.join(REPO, CONFIGS[model]) + (f":{variant}" if variant else "")
    values(["train", f"--config={spec}"])
    return values.config


def lookup(cfg, dotted: str):
    for part in dotted.split("."):
        cfg = cfg[part]
    return cfg


@pytest.fixture(scope="module")
def resolved():
    return {(model, variant): resolve(model, variant) for model, variant in COLUMNS}


@pytest.mark.parametrize("key", sorted(TABLE))
def test_every_table_row_holds_in_both_variants_of_both_models(key, resolved):
    for (model, variant), expected in zip(COLUMNS, TABLE[key], strict=True):
        got = lookup(resolved[(model, variant)], key)
        assert got == expected, f"{CONFIGS[model]}:{variant or ''} {key} = {got!r}, table says {expected!r}"


def test_the_variants_differ_only_where_the_table_says(resolved):
    """No setting outside the table changes silently between the paper and the release variant."""
    def flat(cfg, prefix=""):
        out = {}
        for k, v in cfg.items():
            if hasattr(v, "items"):
                out.update(flat(v, f"{prefix}{k}."))
            else:
                out[f"{prefix}{k}"] = v
        return out

    for model in CONFIGS:
        default, release = flat(resolved[(model, None)]), flat(resolved[(model, "release")])
        changed = {k for k in default if default[k] != release[k]} - {"name"}
        assert changed <= set(TABLE) | {"total_steps"}, changed - set(TABLE)
        assert release["name"] == default["name"] + "_release"


def test_release_objective_has_no_entropy_reshape_and_the_default_has(resolved):
    """What the trainer builds from each variant: the reshape runs in the paper's method only."""
    for model in CONFIGS:
        assert preset_from(resolved[(model, None)]).entropy_advantage
        assert not preset_from(resolved[(model, "release")]).entropy_advantage


def test_every_table_key_is_documented():
    text = pathlib.Path(REPO, "docs", "fidelity.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"`((?:rollout|objective|train|reward|optim|data)\.[a-z_]+)`", text))
    assert set(TABLE) <= documented, set(TABLE) - documented


@pytest.mark.parametrize("model", sorted(CONFIGS))
def test_unknown_variant_is_a_clear_error(model):
    """On the command line the error reaches the user through absl's flag error, message intact."""
    with pytest.raises(flags.IllegalFlagValueError, match=r"unknown variant 'relaese'.*'release'"):
        resolve(model, "relaese")


# Spec §7: training rows and epochs of each released run.
ROWS_AND_EPOCHS = {"14b": (1071, 5), "7b": (10_000, 2)}


@pytest.mark.parametrize("model", sorted(CONFIGS))
def test_steps_are_whole_epochs_of_full_batches(model, resolved):
    """The pipeline drops the last partial batch, so an epoch is rows // prompts_per_step steps: 84 steps of
    the 14B default were 5 epochs and a quarter."""
    rows, epochs = ROWS_AND_EPOCHS[model]
    for variant in (None, "release"):
        cfg = resolved[(model, variant)]
        assert cfg.train.total_steps == rows // cfg.data.prompts_per_step * epochs, (model, variant)
