"""A step's metrics from its updates (`training.update_metrics`): token means weighted by each update's
tokens (they were plain means of the updates' values), and the updates' entropy under its own key (it
overwrote the rollouts' `entropy_mean`)."""

from __future__ import annotations

import pytest

from aepo_jax.training.update_metrics import step_update_metrics


def test_token_means_are_weighted_by_each_updates_tokens_and_per_update_values_are_plain_means():
    updates = [
        {"entropy_mean": 1.0, "clip_frac_upper": 0.5, "train_tokens": 10.0, "loss": 2.0, "grad_norm": 1.0,
         "update_norm": 0.1, "learning_rate": 0.1, "skipped_updates": 0},
        {"entropy_mean": 3.0, "clip_frac_upper": 0.1, "train_tokens": 30.0, "loss": 4.0, "grad_norm": 3.0,
         "update_norm": 0.3, "learning_rate": 0.2, "skipped_updates": 1},
    ]
    got = step_update_metrics(updates)
    # Over all 40 tokens: the entropy of 10 tokens at 1.0 and 30 at 3.0, the clip of 5 + 3 tokens.
    assert got["update_entropy_mean"] == pytest.approx((10 * 1.0 + 30 * 3.0) / 40)
    assert got["clip_frac_upper"] == pytest.approx((10 * 0.5 + 30 * 0.1) / 40)
    assert "entropy_mean" not in got  # the rollouts' value, set by the trainer, is not overwritten
    assert got["loss"] == pytest.approx(3.0) and got["grad_norm"] == pytest.approx(2.0)
    assert got["update_norm"] == pytest.approx(0.2)
    assert got["learning_rate"] == pytest.approx(0.2)  # the last update's
    assert got["train_tokens"] == 40.0 and got["skipped_updates"] == 1 and got["updates"] == 2.0


def test_updates_without_tokens_fall_back_to_plain_means():
    updates = [{"clip_frac_upper": 0.2, "train_tokens": 0.0}, {"clip_frac_upper": 0.4, "train_tokens": 0.0}]
    assert step_update_metrics(updates)["clip_frac_upper"] == pytest.approx(0.3)
    assert step_update_metrics([]) == {}
