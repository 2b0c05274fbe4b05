"""Names of the logged metrics that readers depend on: the console line and the training curves.

The trainers emit these keys into `WORKDIR/metrics.jsonl`
(`aepo_jax.training.rl_trainer`, `rollout_batch.rollout_metrics`, the train
step); `metrics_log` prints `CONSOLE_KEYS` and `launch.plot_metrics` draws
`PLOT_PANELS`. A test checks that every key asked for here is emitted by a
real tiny run, so a renamed metric cannot silently leave an empty panel.
"""

from __future__ import annotations

LOSS = "loss"
REWARD_MEAN = "reward_mean"  # mean outcome reward of the step's trajectories
ACCURACY = "accuracy"  # share of trajectories with reward >= 1
ENTROPY_MEAN = "entropy_mean"  # mean policy-token entropy of the rollouts (spec §1)
TOOL_CALLS_MEAN = "tool_calls_mean"  # tool calls per trajectory
TOOL_FAIL_RATE = "tool_fail_rate"  # share of the step's tool calls that failed (also per tag: "tool_fail_rate/search")
BRANCH_TOP3 = "branch_top3_fraction"  # share of branches on each group's top-3 trajectories (spec §2.4)
KL_REF_ROLLOUT = "kl_ref_rollout"  # KL of the rollout policy to the reference (with a reference model)
GRAD_NORM = "grad_norm"
SKIPPED_UPDATES = "skipped_updates"  # optimiser updates of the step skipped for a non-finite gradient
LEARNING_RATE = "learning_rate"
TOKENS_PER_S = "tokens_per_s"
STEP_TIME_S = "step_time_s"

# Printed on the console line when present in a record, in this order.
CONSOLE_KEYS = (LOSS, REWARD_MEAN, ACCURACY, ENTROPY_MEAN, TOOL_CALLS_MEAN, TOOL_FAIL_RATE, KL_REF_ROLLOUT,
                GRAD_NORM, LEARNING_RATE, TOKENS_PER_S, STEP_TIME_S)

# Printed after `CONSOLE_KEYS` only when not zero: a warning, not a headline number.
CONSOLE_WHEN_NONZERO = (SKIPPED_UPDATES,)

# (panel title, keys drawn in it) of `launch.plot_metrics`.
PLOT_PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("reward", (REWARD_MEAN, ACCURACY)),
    ("policy entropy", (ENTROPY_MEAN,)),
    ("tool calls per trajectory", (TOOL_CALLS_MEAN,)),
    ("branch concentration (top-3 share)", (BRANCH_TOP3,)),
)
