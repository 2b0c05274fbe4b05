"""The embedded default (`make demo`): a tiny tool-using agent, SFT then AEPO, evaluated on held-out towns.

    python -m launch.demo [--config configs/demo.py[:smoke]] [--workdir runs/demo] [--config.key=value]
                          [--search_url http://host:port]

Stages (one line each, progress bars inside): 1 task, tokenizer, search
server; 2 SFT cold start; 3 AEPO from the SFT checkpoint; 4 held-out
evaluation of both; 5 the before/after table, WORKDIR/report.json, training
curves (PNG), server stopped. See docs/demo.md.
"""

from __future__ import annotations

import json
import logging as std_logging
import math
import os
import shutil
import time
from typing import Any

# The default --config: the repository's configs/demo.py, wherever the command runs from.
DEMO_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "demo.py")

ROWS = (  # (report key, table label, format)
    ("pass@1", "pass@1", "{:.3f}"),
    ("pass@k", "pass@k", "{:.3f}"),
    ("tool_calls", "tool calls / answer", "{:.2f}"),
    ("python_rate", "answers using python", "{:.3f}"),
    ("response_length", "generated tokens", "{:.1f}"),
    ("entropy", "segment entropy, tree rollout (nats)", "{:.3f}"),
    ("branch_top3", "top-3 branch share", "{:.3f}"),
)


def _with_pass_at_k(metrics: dict[str, float], samples: int) -> dict[str, float]:
    out = dict(metrics)
    out["pass@k"] = metrics.get(f"pass@{samples}", math.nan)
    out["k"] = float(samples)
    return out


def format_table(report: dict[str, Any]) -> str:
    """The before/after table as Markdown."""
    k = int(report["sft"].get("k", 0))
    lines = ["| held-out metric | SFT start | AEPO |", "|---|---:|---:|"]
    for key, label, fmt in ROWS:
        label = label.replace("pass@k", f"pass@{k}")
        cells = [fmt.format(report[side].get(key, math.nan)) for side in ("sft", "aepo")]
        lines.append(f"| {label} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def fresh_environment(cfg, workdir: str, search_url: str = "", stages: tuple[str, ...] = ()):
    """The demo's environment in WORKDIR, after removing what an earlier run left there (its stages,
    task files and tokenizer), so a rerun replaces, never mixes into, the previous one."""
    from aepo_jax.experiment import environment_from
    from aepo_jax.experiment_tokenizer import TOKENIZER_FILES

    os.makedirs(workdir, exist_ok=True)
    for sub in (*stages, "task"):
        shutil.rmtree(os.path.join(workdir, sub), ignore_errors=True)
    for name in TOKENIZER_FILES:
        if os.path.exists(os.path.join(workdir, name)):
            os.remove(os.path.join(workdir, name))
    if search_url:
        cfg.data.search_url = search_url
    return environment_from(cfg, workdir)


def run_demo(cfg, workdir: str, search_url: str = "", progress: bool = True, log=print) -> dict[str, Any]:
    """All five stages; returns the report (also written to WORKDIR/report.json)."""
    from aepo_jax.experiment import evaluate_policy, train_rl
    from aepo_jax.experiment_sft import train_sft
    from launch.plot_metrics import plot_run

    t0 = time.perf_counter()
    cfg = cfg.copy_and_resolve_references()
    log("[1/5] task: generating towns, corpus and questions; training the tokenizer; starting the search server")
    env = fresh_environment(cfg, workdir, search_url, stages=("sft", "aepo"))
    with open(os.path.join(workdir, "config.json"), "w", encoding="utf-8") as f:
        f.write(cfg.to_json_best_effort(indent=2))
    timings = {}
    try:
        task = env.task
        log(f"  {len(task.towns)} towns, {len(task.corpus)} documents, {len(task.train)} train / "
            f"{len(task.heldout)} held-out questions (disjoint towns); vocabulary {env.tokenizer.vocab_size}; "
            f"search at {env.search_url}")
        timings["task_s"] = time.perf_counter() - t0

        log(f"[2/5] SFT cold start: {cfg.sft.steps} steps on scripted trajectories "
            f"(skip-python flaw rate {cfg.sft.skip_python_prob})")
        t = time.perf_counter()
        graphdef, sft_params, _ = train_sft(cfg, env, workdir, os.path.join(workdir, "sft"), progress=progress,
                                            log=log)
        timings["sft_s"] = time.perf_counter() - t

        heldout = env.heldout_examples[: int(cfg.eval.questions)]
        log(f"[3/5] evaluating the SFT checkpoint on {len(heldout)} held-out questions x {cfg.eval.samples} samples")
        t = time.perf_counter()
        sft_metrics = evaluate_policy(cfg, env, graphdef, sft_params, heldout, seed=int(cfg.seed) + 1,
                                      progress=progress)
        timings["eval_sft_s"] = time.perf_counter() - t
        log(f"  SFT pass@1 {sft_metrics['pass@1']:.3f}, python in {sft_metrics['python_rate']:.0%} of answers")

        log(f"[4/5] {cfg.algorithm.upper()} from the SFT checkpoint: {cfg.train.total_steps} steps x "
            f"{cfg.data.prompts_per_step} prompts x k={cfg.rollout.k}")
        t = time.perf_counter()
        rl_params, _ = train_rl(cfg, env, graphdef, sft_params, workdir, os.path.join(workdir, "aepo"),
                                progress=progress)
        timings["rl_s"] = time.perf_counter() - t
        t = time.perf_counter()
        rl_metrics = evaluate_policy(cfg, env, graphdef, rl_params, heldout, seed=int(cfg.seed) + 1,
                                     progress=progress)
        timings["eval_rl_s"] = time.perf_counter() - t
    finally:
        env.close()

    log("[5/5] report: table, report.json, training curves; search server stopped")
    samples = int(cfg.eval.samples)
    report = {
        "sft": _with_pass_at_k(sft_metrics, samples),
        "aepo": _with_pass_at_k(rl_metrics, samples),
        "algorithm": cfg.algorithm,
        "seconds": time.perf_counter() - t0,
        "stage_seconds": timings,
        "seed": int(cfg.seed),
    }
    report["curves"] = [plot_run(os.path.join(workdir, sub), os.path.join(workdir, f"{sub}_curves.png"))
                        for sub in ("sft", "aepo")]
    with open(os.path.join(workdir, "report.json"), "w", encoding="utf-8") as f:
        json.dump(_json_safe(report), f, indent=2)
    log(format_table(report))
    log(f"wrote {os.path.join(workdir, 'report.json')} and {', '.join(report['curves'])} "
        f"in {report['seconds']:.0f}s")
    return report


def _json_safe(value: Any) -> Any:
    """NaN (no branches were made) becomes null so the file is strict JSON."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


def main(argv: list[str]) -> int:
    from absl import app

    from launch.config_args import quiet_library_logs

    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    cfg = _CONFIG.value
    quiet_library_logs(bool(cfg.get("verbose_logs", False)))  # orbax logs every checkpoint step at INFO
    std_logging.getLogger("urllib3.connectionpool").setLevel(std_logging.ERROR)  # "pool is full" notes
    print("resolved config:\n" + str(cfg), flush=True)
    from launch.run_setup import check_before_start

    check_before_start(cfg)  # before the task, the tools and the model
    run_demo(cfg, _WORKDIR.value, search_url=_SEARCH_URL.value)
    return 0


if __name__ == "__main__":
    from absl import flags
    from ml_collections import config_flags

    from launch.config_args import run_with_config

    _CONFIG = config_flags.DEFINE_config_file("config", None, "demo config (configs/demo.py[:smoke]; "
                                              "default: the repository's configs/demo.py)",
                                              lock_config=True)
    _WORKDIR = flags.DEFINE_string("workdir", "runs/demo", "output directory: report.json, curves, checkpoints")
    _SEARCH_URL = flags.DEFINE_string("search_url", "", "use this running retrieval server instead of starting one")
    run_with_config(main, _CONFIG, default_spec=DEMO_CONFIG)
