"""Same environment, same SFT start, same budget: RL algorithms side by side over seeds.

    python -m launch.compare [--config configs/demo.py[:smoke]] [--workdir runs/compare]
        [--algorithms aepo,arpo,grpo,dapo,gppo,cispo] [--seeds 0,1,2] [--config.key=value]
    python -m launch.compare --merge DIR_A,DIR_B --workdir OUT   # one table from parts run in parallel

The project's small-scale version of the paper's main table and its
rollout-diversity analysis. One SFT cold start (seed `config.seed`) is shared
by every run; each (algorithm, seed) pair then trains `train.total_steps` RL
steps from it and is evaluated on the held-out questions. Writes
WORKDIR/compare.json (every run, with the objective and rollout strategy it
trained with), WORKDIR/compare.md (mean and spread over
seeds): held-out pass@1, tool calls per question, branch concentration credited
by root (top-3 share, roots that got branches, the largest root's share of its
group's branches, longest consecutive-branch run per lineage) and policy
entropy at the end of training (mean of the last 3 steps), wall time; and
WORKDIR/entropy_curves.png (policy entropy per RL step, one line per run).

`--config configs/demo.py:multihop` runs the multi-step path task instead of
the towns task (`aepo_jax.envs.multihop_task`). Each algorithm's objective and
rollout strategy come from its preset; `--config.objective.KEY=VALUE` overrides
are set again on top of every preset, and `--config.rollout.strategy` is
refused (it is part of each algorithm compared).
"""

from __future__ import annotations

import json
import logging as std_logging
import math
import os
import shutil
import time
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import numpy as np

COLUMNS = (  # (key, header, format)
    ("pass@1", "held-out pass@1", "{:.3f}"),
    ("tool_calls", "tool calls / question", "{:.2f}"),
    ("python_rate", "answers using python", "{:.2f}"),
    ("train_branch_top3", "top-3 root branch share (train, end)", "{:.3f}"),
    ("train_branch_roots", "roots with branches (train, end)", "{:.2f}"),
    ("train_max_root_share", "largest root's branch share (train, end)", "{:.3f}"),
    ("train_lineage_run", "lineage branch run (train, end)", "{:.2f}"),
    ("train_entropy", "entropy (train, end)", "{:.3f}"),
    ("wall_s", "wall time (s, compiles included)", "{:.0f}"),
)


def _tail_mean(records: list[dict], key: str, last: int = 3) -> float:
    values = [float(r[key]) for r in records if isinstance(r.get(key), (int, float)) and not math.isnan(r[key])]
    return float(np.mean(values[-last:])) if values else math.nan


def summarise(runs: list[dict[str, Any]]) -> dict[str, dict[str, tuple[float, float]]]:
    """algorithm -> key -> (mean, std over seeds); NaN entries (no branches) are skipped."""
    table: dict[str, dict[str, tuple[float, float]]] = {}
    for algorithm in dict.fromkeys(r["algorithm"] for r in runs):
        rows = [r for r in runs if r["algorithm"] == algorithm]
        table[algorithm] = {}
        for key, _, _ in COLUMNS:
            values = [float(r[key]) for r in rows if r.get(key) is not None and not math.isnan(float(r[key]))]
            table[algorithm][key] = (float(np.mean(values)), float(np.std(values))) if values else (math.nan, math.nan)
    return table


def format_markdown(sft: dict[str, float], table: dict, seeds: list[int]) -> str:
    head = "| algorithm | " + " | ".join(h for _, h, _ in COLUMNS) + " |"
    intro = (f"Held-out results over seeds {seeds} (mean ± std); SFT start pass@1 {sft['pass@1']:.3f}, "
             f"tool calls {sft['tool_calls']:.2f}, python in {sft['python_rate']:.2f} of answers.")
    lines = [intro, "", head, "|---|" + "---:|" * len(COLUMNS)]
    for algorithm, row in table.items():
        cells = []
        for key, _, fmt in COLUMNS:
            mean, std = row[key]
            cells.append("n/a" if math.isnan(mean) else f"{fmt.format(mean)} ± {fmt.format(std)}")
        lines.append(f"| {algorithm} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def algorithm_configs(cfg, algorithms: list[str], overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """algorithm -> the run config of that algorithm (`configs.demo.with_algorithm`: its preset, with the
    command line's `objective.*` overrides on top). A ValueError, before anything runs, for an override of
    what defines an algorithm (`rollout.strategy`) or an objective value a preset refuses."""
    from aepo_jax.training.build import preset_from
    from configs.demo import with_algorithm

    configs = {algorithm: with_algorithm(cfg, algorithm, overrides) for algorithm in algorithms}
    for run_cfg in configs.values():
        preset_from(run_cfg)
    return configs


def run_record(algorithm: str, seed: int, run_cfg, metrics: dict[str, float], records: list[dict],
               wall_s: float) -> dict[str, Any]:
    """One (algorithm, seed) entry of compare.json: held-out metrics, training tails, the entropy curve,
    and the objective and rollout strategy the run trained with (preset plus overrides)."""
    return {"algorithm": algorithm, "seed": int(seed), **metrics, "wall_s": wall_s,
            "train_branch_top3": _tail_mean(records, "rollout/top3_branch_fraction"),
            "train_branch_roots": _tail_mean(records, "rollout/branch_roots"),
            "train_max_root_share": _tail_mean(records, "rollout/max_root_branch_share"),
            "train_lineage_run": _tail_mean(records, "rollout/mean_lineage_branch_run"),
            "entropy_curve": [float(r.get("entropy_mean", math.nan)) for r in records],
            "train_entropy": _tail_mean(records, "entropy_mean"),
            "train_reward_end": _tail_mean(records, "reward_mean"),
            "objective": run_cfg.objective.to_dict(), "rollout_strategy": str(run_cfg.rollout.strategy)}


def run_compare(cfg, workdir: str, algorithms: list[str], seeds: list[int], progress: bool = True,
                log=print, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """SFT once, then RL + held-out evaluation for every (algorithm, seed); writes compare.json/.md.
    `overrides` (the command line's) are set again on top of each algorithm's preset (`algorithm_configs`)."""
    from aepo_jax.experiment import evaluate_policy, train_rl
    from aepo_jax.experiment_sft import train_sft
    from launch.demo import fresh_environment

    t0 = time.perf_counter()
    cfg = cfg.copy_and_resolve_references()
    run_configs = algorithm_configs(cfg, algorithms, overrides)
    demo = fresh_environment(cfg, workdir, stages=("sft",))
    runs: list[dict[str, Any]] = []
    try:
        log(f"SFT cold start ({cfg.sft.steps} steps), shared by every run")
        graphdef, sft_params, _ = train_sft(cfg, demo, workdir, os.path.join(workdir, "sft"), progress=progress,
                                            log=log)
        heldout = demo.heldout_examples[: int(cfg.eval.questions)]
        sft = evaluate_policy(cfg, demo, graphdef, sft_params, heldout, seed=int(cfg.seed) + 1, progress=progress)
        log(f"SFT start: pass@1 {sft['pass@1']:.3f}")
        for seed in seeds:  # seed-major: a run cut short still has every algorithm at the first seeds
            for algorithm in algorithms:
                run_cfg = run_configs[algorithm].copy_and_resolve_references()
                run_cfg.seed = int(seed)
                run_dir = os.path.join(workdir, f"{algorithm}_seed{seed}")
                shutil.rmtree(run_dir, ignore_errors=True)  # a rerun replaces, never resumes, a run
                log(f"{algorithm} seed {seed}: {run_cfg.train.total_steps} RL steps")
                t = time.perf_counter()
                params, records = train_rl(run_cfg, demo, graphdef, sft_params, workdir, run_dir, progress=progress)
                metrics = evaluate_policy(run_cfg, demo, graphdef, params, heldout, seed=int(cfg.seed) + 1,
                                          progress=progress)
                run = run_record(algorithm, seed, run_cfg, metrics, records, time.perf_counter() - t)
                runs.append(run)
                log(f"  pass@1 {run['pass@1']:.3f}, tool calls {run['tool_calls']:.2f}, "
                    f"{run['wall_s']:.0f}s")
                _write(workdir, cfg, sft, runs, seeds, time.perf_counter() - t0)
    finally:
        demo.close()
    result = _write(workdir, cfg, sft, runs, seeds, time.perf_counter() - t0)
    if runs:
        log(f"wrote {plot_entropy_curves(runs, os.path.join(workdir, 'entropy_curves.png'))}")
    log(result["markdown"])
    return result


def plot_entropy_curves(runs: list[dict[str, Any]], path: str) -> str:
    """Policy entropy per RL step, one thin line per (algorithm, seed) and the mean over seeds bold."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for index, algorithm in enumerate(dict.fromkeys(r["algorithm"] for r in runs)):
        color = f"C{index}"
        curves = [[math.nan if v is None else float(v) for v in r["entropy_curve"]]  # JSON stores NaN as null
                  for r in runs if r["algorithm"] == algorithm and r.get("entropy_curve")]
        for curve in curves:
            ax.plot(range(1, len(curve) + 1), curve, color=color, alpha=0.3, linewidth=0.8)
        length = min(len(c) for c in curves) if curves else 0
        if length:
            mean = np.nanmean([c[:length] for c in curves], axis=0)
            ax.plot(range(1, length + 1), mean, color=color, linewidth=2, label=f"{algorithm} (mean of {len(curves)})")
    ax.set_xlabel("RL step")
    ax.set_ylabel("policy entropy (nats, generated tokens)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def merge_compare(workdirs: list[str], out_dir: str) -> dict[str, Any]:
    """One table from runs of the same config split over processes (e.g. one per seed, run in parallel).

    Every part must start from the same SFT checkpoint (the SFT is seeded by
    `config.seed`, not by the RL seeds); their SFT evaluations must agree.
    """
    parts = []
    for directory in workdirs:
        with open(os.path.join(directory, "compare.json"), encoding="utf-8") as f:
            parts.append(json.load(f))
    if not parts:
        raise ValueError("merge_compare needs at least one workdir")
    sft = parts[0]["sft"]
    for directory, part in zip(workdirs, parts, strict=True):
        if part["sft"].get("pass@1") != sft.get("pass@1") or part["rl_steps"] != parts[0]["rl_steps"]:
            raise ValueError(f"{directory} did not start from the same SFT checkpoint and budget as {workdirs[0]}")
    runs = [r for part in parts for r in part["runs"]]
    seeds = sorted({int(r["seed"]) for r in runs})
    os.makedirs(out_dir, exist_ok=True)
    cfg = SimpleNamespace(train=SimpleNamespace(total_steps=parts[0]["rl_steps"]))
    result = _write(out_dir, cfg, sft, runs, seeds, max(float(p["seconds"]) for p in parts))
    plot_entropy_curves(runs, os.path.join(out_dir, "entropy_curves.png"))
    return result


def _write(workdir: str, cfg, sft: dict, runs: list[dict], seeds: list[int], seconds: float) -> dict[str, Any]:
    from launch.demo import _json_safe

    table = summarise(runs)
    markdown = format_markdown(sft, table, seeds)
    result = {"sft": sft, "runs": runs, "summary": {a: {k: list(v) for k, v in row.items()} for a, row in table.items()},
              "seeds": seeds, "rl_steps": int(cfg.train.total_steps), "seconds": seconds, "markdown": markdown}
    with open(os.path.join(workdir, "compare.json"), "w", encoding="utf-8") as f:
        json.dump(_json_safe(result), f, indent=2)
    with open(os.path.join(workdir, "compare.md"), "w", encoding="utf-8") as f:
        f.write(markdown + "\n")
    return result


def main(argv: list[str]) -> int:
    from absl import app, flags
    from ml_collections import config_flags

    from launch.config_args import quiet_library_logs

    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    cfg = _CONFIG.value
    quiet_library_logs(bool(cfg.get("verbose_logs", False)))
    std_logging.getLogger("urllib3.connectionpool").setLevel(std_logging.ERROR)
    if _MERGE.value:
        print(merge_compare([d for d in _MERGE.value.split(",") if d], _WORKDIR.value)["markdown"])
        return 0
    algorithms = [a.strip() for a in _ALGORITHMS.value.split(",") if a.strip()]
    seeds = [int(s) for s in _SEEDS.value.split(",") if s.strip()]
    overrides = dict(config_flags.get_override_values(flags.FLAGS["config"]))  # `None` ones included
    try:  # a refused override fails here, not after the SFT stage
        run_configs = algorithm_configs(cfg.copy_and_resolve_references(), algorithms, overrides)
    except ValueError as err:
        raise SystemExit(f"error: {err}") from err
    from launch.run_setup import check_before_start

    for run_cfg in run_configs.values():  # the loop settings and kernel too, before the shared SFT stage
        check_before_start(run_cfg)
    run_compare(cfg, _WORKDIR.value, algorithms, seeds, overrides=overrides)
    return 0


if __name__ == "__main__":
    from absl import flags
    from ml_collections import config_flags

    from launch.config_args import run_with_config
    from launch.demo import DEMO_CONFIG

    _CONFIG = config_flags.DEFINE_config_file("config", None, "demo config (configs/demo.py[:smoke]; "
                                              "default: the repository's configs/demo.py)",
                                              lock_config=False)
    _WORKDIR = flags.DEFINE_string("workdir", "runs/compare", "output directory")
    _ALGORITHMS = flags.DEFINE_string("algorithms", "aepo,arpo,grpo,dapo,gppo,cispo", "comma-separated presets")
    _SEEDS = flags.DEFINE_string("seeds", "0,1,2", "comma-separated RL seeds")
    _MERGE = flags.DEFINE_string("merge", "", "comma-separated workdirs of finished parts: write their merged "
                                 "table to --workdir instead of running")
    run_with_config(main, _CONFIG, default_spec=DEMO_CONFIG)
