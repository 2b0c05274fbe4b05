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
# Share of the step's trajectories that are correct as evaluation decides (`evaluation.scoring.
# correctness_reward`), recorded by `Environment.reward_fn` as `trajectory.correct`: exact match of the boxed
# answer where the reward is QA F1 (F1 0.91 + the 0.1 multi-tool bonus is not correct), else the reward's own
# result (math equivalence, exact match, judge) reaching 1. For a reward_fn that records no `correct`: reward >= 1.
ACCURACY = "accuracy"
ENTROPY_MEAN = "entropy_mean"  # mean policy-token entropy of the rollouts (spec §1)
# Mean policy-token entropy under the parameters of each update of the step (they change from one update to
# the next), token-weighted over the step (`update_metrics`).
UPDATE_ENTROPY_MEAN = "update_entropy_mean"
# Tool steps per trajectory: the tool-result blocks in its response, i.e. what `max_tool_calls` limits. A
# branch's inherited steps count again in every branch, and malformed closings (`invalid`, no tool ran) count.
# Same value as `tool_calls_per_trajectory` (`rollout/tool_calls_per_trajectory`, spec §2.4's statistic).
TOOL_CALLS_MEAN = "tool_calls_mean"
# Tool calls made per trajectory (spec §8's tool-call use): calls a tool ran, each counted once, in the
# trajectory that made it (after its branch point), plus a last call whose result did not fit; malformed
# closings left out (`rollout.critical_path.own_calls`). Over the step's kept trajectories; `rollout/tool_calls`
# is the total of the same calls over every rollout run (also an AEPO pre-monitoring sample that is not kept,
# DAPO's dropped groups).
TOOL_CALLS_MADE = "tool_calls_made_per_trajectory"
# Malformed closings per trajectory: a tool closing tag without a complete call, answered by the loop with an
# error (tag `invalid`, no tool ran), counted in the trajectory that wrote it.
TOOL_CALLS_MALFORMED = "tool_calls_malformed_per_trajectory"
# Share of the tool calls made (as in TOOL_CALLS_MADE, less the calls whose result did not fit) whose tool
# reported a failure; also per tool: "tool_fail_rate/search". Malformed closings are not calls: not counted.
TOOL_FAIL_RATE = "tool_fail_rate"
BRANCH_TOP3 = "branch_top3_fraction"  # share of branches on each group's top-3 trajectories (spec §2.4)
KL_REF_ROLLOUT = "kl_ref_rollout"  # KL of the rollout policy to the reference (with a reference model)
GRAD_NORM = "grad_norm"
TOKEN_ACCURACY = "token_accuracy"  # SFT: share of the trained tokens the model's argmax predicts
SKIPPED_UPDATES = "skipped_updates"  # optimiser updates of the step skipped for a non-finite gradient
LEARNING_RATE = "learning_rate"
TOKENS_PER_S = "tokens_per_s"
STEP_TIME_S = "step_time_s"

# Printed on the console line when present in a record, in this order.
CONSOLE_KEYS = (LOSS, REWARD_MEAN, ACCURACY, ENTROPY_MEAN, TOOL_CALLS_MADE, TOOL_FAIL_RATE, KL_REF_ROLLOUT,
                GRAD_NORM, LEARNING_RATE, TOKENS_PER_S, STEP_TIME_S)

# Printed after `CONSOLE_KEYS` only when not zero: a warning, not a headline number.
CONSOLE_WHEN_NONZERO = (SKIPPED_UPDATES,)

# (panel title, keys drawn in it) of `launch.plot_metrics`.
PLOT_PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("reward", (REWARD_MEAN, ACCURACY)),
    ("policy entropy", (ENTROPY_MEAN,)),
    ("tool calls per trajectory", (TOOL_CALLS_MADE,)),
    ("branch concentration (top-3 share)", (BRANCH_TOP3,)),
)

# The panels of an SFT run (its records have a loss and no reward).
SFT_PLOT_PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("loss (token NLL)", (LOSS,)),
    ("token accuracy", (TOKEN_ACCURACY,)),
    ("entropy", (ENTROPY_MEAN,)),
    ("gradient norm", (GRAD_NORM,)),
)

# A panel key -> the key drawn in its place for a run that did not log it (runs from before the key existed).
PLOT_FALLBACKS: dict[str, str] = {TOOL_CALLS_MADE: TOOL_CALLS_MEAN}
