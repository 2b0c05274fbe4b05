"""How one RL step's host-side metrics combine over processes (`parallel.multihost.gather_metrics`).

Each process computes its metrics over its own rows. A mean over rows or tokens is the whole step's only
when every process's mean weighs its rows or tokens; a count is the whole step's only when summed.
Timings and anything else not named here are plain means of the processes' values. The rollout and
`pack/*` figures are combined from counts elsewhere (`process_sum_fields`).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

# Counts: summed over processes.
SUMMED_METRICS = frozenset({"dropped_groups", "kept_groups", "adv/gigpo_step_groups"})
# Means over this process's policy tokens.
TOKEN_MEANS = ("entropy_mean", "logp_old_abs_diff", "kl_ref_rollout", "adv/advantage_mean",
               "adv/entropy_adv_z_abs_mean")
# Means over this process's rows (`compute_advantages`: reward over rows with a policy token, the overlong
# penalty and the entropy statistics of AEPO's advantage over every row).
REAL_ROW_MEANS = ("adv/reward_mean",)
ROW_MEANS = ("adv/overlong_penalty_mean", "adv/entropy_adv_h_mean", "adv/entropy_adv_h_std")
# A mean over GiGPO's step groups, which never span processes (a group stays on one process).
STEP_GROUP_MEANS = ("adv/gigpo_mean_step_group_size",)


def process_metric_weights(metrics: Mapping[str, float], mask: np.ndarray) -> dict[str, float]:
    """What each of this process's mean metrics weighs (`gather_metrics`' `weights`); `mask` is `[B, T]`, the
    policy-token mask of this process's rows."""
    mask = np.asarray(mask)
    weights = dict.fromkeys(TOKEN_MEANS, float(mask.sum()))
    weights.update(dict.fromkeys(REAL_ROW_MEANS, float((mask.sum(-1) > 0).sum())))
    weights.update(dict.fromkeys(ROW_MEANS, float(mask.shape[0])))
    weights.update(dict.fromkeys(STEP_GROUP_MEANS, float(metrics.get("adv/gigpo_step_groups", 0.0))))
    return weights
