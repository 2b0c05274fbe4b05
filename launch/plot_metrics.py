"""Draw a run's training curves to PNG: `python -m launch.plot_metrics WORKDIR`.

Panels (`aepo_jax.training.metric_keys.PLOT_PANELS`): reward, policy entropy,
tool calls made per trajectory, branch concentration (the share of branches on
the top-3 trajectories of each group, spec §2.4); an SFT run's (`SFT_PLOT_PANELS`):
loss, token accuracy, entropy, gradient norm. A key a run did not log is
replaced by its `PLOT_FALLBACKS` key when the run has that (an older run's
tool steps per trajectory), and a panel with neither is drawn empty with a
note, so the figure always has the same layout.
"""

from __future__ import annotations

import argparse
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from aepo_jax.training.metric_keys import (
    LOSS,
    PLOT_FALLBACKS,
    PLOT_PANELS,
    REWARD_MEAN,
    SFT_PLOT_PANELS,
)
from aepo_jax.training.metrics_log import read_metrics


def curve(records: list[dict], key: str) -> tuple[str, list[tuple[int, float]]]:
    """The (step, value) points of `key`, or of its `PLOT_FALLBACKS` key when the run logged no `key`;
    returns the key drawn with them."""
    points = _points(records, key)
    if not points and key in PLOT_FALLBACKS:
        key = PLOT_FALLBACKS[key]
        points = _points(records, key)
    return key, points


def _points(records: list[dict], key: str) -> list[tuple[int, float]]:
    return [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]


def panels_for(records: list[dict]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """`SFT_PLOT_PANELS` for an SFT run (a loss logged, no reward), else the RL run's `PLOT_PANELS`."""
    if any(REWARD_MEAN in r for r in records) or not any(LOSS in r for r in records):
        return PLOT_PANELS
    return SFT_PLOT_PANELS


def plot_run(workdir: str, out_path: str | None = None) -> str:
    """Plot `workdir/metrics.jsonl`; returns the PNG path (default WORKDIR/curves.png)."""
    records = read_metrics(workdir)
    if not records:
        raise ValueError(f"{workdir}/metrics.jsonl has no records")
    out_path = out_path or os.path.join(workdir, "curves.png")
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    for ax, (title, keys) in zip(axes.ravel(), panels_for(records)):
        drawn = False
        for wanted in keys:
            key, points = curve(records, wanted)
            if points:
                steps, values = zip(*points)
                ax.plot(steps, values, marker="." if len(points) < 50 else None, label=key)
                drawn = True
        ax.set_title(title)
        ax.set_xlabel("step")
        if drawn:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(out_path, dpi=100)
    plt.close(fig)
    return out_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir", help="run directory holding metrics.jsonl")
    parser.add_argument("--out", default=None, help="PNG path (default WORKDIR/curves.png)")
    args = parser.parse_args(argv)
    try:
        print(plot_run(args.workdir, args.out))
    except (FileNotFoundError, ValueError) as err:  # no run there, or one without records
        runs = sorted(d for d in (os.listdir(args.workdir) if os.path.isdir(args.workdir) else [])
                      if os.path.isfile(os.path.join(args.workdir, d, "metrics.jsonl")))
        hint = f"; the runs in it: {', '.join(runs)} (plot one: {os.path.join(args.workdir, runs[0])})" if runs else ""
        print(f"error: {err}{hint}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
