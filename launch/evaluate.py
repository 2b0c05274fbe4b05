"""Evaluation entry point: pass@k, F1, tool calls and length per dataset (spec §6).

    python -m launch.evaluate --config configs/aepo_tiny.py --checkpoint WORKDIR \
        [--n 4] [--greedy] [--split heldout|train] [--data_path FILE] [--out DIR] \
        [--strategy independent|arpo|aepo] [--config.key=value ...]

`--checkpoint` is a training run directory (or its `checkpoints/` folder, or
one step folder) written by `launch.train`; `--checkpoint none` evaluates the
config's initial parameters (a baseline). The run's tokenizer
(`WORKDIR/tokenizer.model`) is reused so token ids match the checkpoint. The
questions are the config's held-out split (the synthetic task's held-out
towns) or its training data (`--split train`), or any local JSONL file
(`--data_path`). Decoding is the paper's evaluation setting (temperature 0.6,
top-p 0.95) or greedy with `--n 1 --greedy`. Prints the per-dataset table and
writes OUT/reports.json, OUT/reports.csv, OUT/samples.jsonl,
OUT/eval_config.json and, for a tree strategy, OUT/tree_stats.json.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from typing import Any

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "experiment config file (configs/*.py[:arg])",
                                          lock_config=True)
_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "training run dir, its checkpoints/ dir, a step dir, or 'none'")
_N = flags.DEFINE_integer("n", 1, "samples per question (pass@k for every k <= n)")
_GREEDY = flags.DEFINE_bool("greedy", False, "greedy decoding (needs --n 1)")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.6, "sampling temperature (paper's evaluation: 0.6)")
_TOP_P = flags.DEFINE_float("top_p", 0.95, "nucleus sampling mass (paper's evaluation: 0.95)")
_SPLIT = flags.DEFINE_enum("split", "heldout", ["heldout", "train"], "which questions of the config to evaluate")
_DATA_PATH = flags.DEFINE_string("data_path", "", "evaluate this local JSONL file instead of the config's split")
_MAX_QUESTIONS = flags.DEFINE_integer("max_questions", 0, "evaluate only the first N questions (0 = all)")
_BATCH = flags.DEFINE_integer("questions_per_batch", 0, "questions per rollout call (0 = data.prompts_per_step)")
_STRATEGY = flags.DEFINE_enum("strategy", "independent", ["independent", "arpo", "aepo"],
                              "rollout strategy (tree strategies also report tree statistics)")
_REWARD = flags.DEFINE_string("reward", "auto", "reward family deciding correctness ('auto' = by data source)")
_SEED = flags.DEFINE_integer("seed", None, "PRNG seed of the evaluation (default: config seed)")
_OUT = flags.DEFINE_string("out", None, "output directory (default: RUN_DIR/eval, or ./eval_initial for 'none')")
_PROGRESS = flags.DEFINE_bool("progress", True, "progress bar over questions")
flags.mark_flags_as_required(["config", "checkpoint"])


def eval_examples(cfg: Any, env: Any, split: str, data_path: str, scratch: str) -> list[dict]:
    """The questions to evaluate: `data_path`, else the config's split (see module docstring)."""
    if data_path:
        from aepo_jax.data import load_local_examples

        return load_local_examples(data_path, os.path.join(scratch, "tfds_eval"))
    if split == "train":
        return list(env.examples)
    if cfg.data.path:
        raise SystemExit(f"config data.path={cfg.data.path!r} has no held-out split here; pass --data_path=FILE "
                         "(a JSONL of held-out questions) or --split=train")
    from aepo_jax.envs.synthetic_facts import build_env

    # The same generator call as the trainer's task (aepo_jax.training.agent_env), so towns and corpus match.
    task = build_env(seed=int(cfg.seed), n_train=int(cfg.data.get("num_examples", 256)))
    return [{"id": q.id, "question": q.question, "answers": [q.answer], "data_source": "synthetic_facts"}
            for q in task.heldout]


def eval_config_from(cfg: Any, n: int, greedy: bool, temperature: float, top_p: float, seed: int,
                     questions_per_batch: int, strategy: str, reward: str):
    """`EvalConfig` from the experiment config's rollout limits and the command-line decoding."""
    from aepo_jax.agent.loop import LoopConfig
    from aepo_jax.evaluation.driver import EvalConfig
    from aepo_jax.rollout.strategies import RolloutConfig

    r = cfg.rollout
    loop = LoopConfig(max_tool_calls=int(r.max_tool_calls), max_response_tokens=int(r.max_response_len),
                      max_context_len=int(r.max_prompt_len) + int(r.max_response_len),
                      entropy_tokens=int(r.entropy_tokens), entropy_measure=r.entropy_measure)
    rollout = RolloutConfig(
        strategy=strategy, initial_rollouts=min(int(r.initial_rollouts), n), entropy_weight=float(r.entropy_weight),
        branch_threshold=float(r.branch_threshold), branch_width=int(r.branch_width),
        entropy_tokens=int(r.entropy_tokens), entropy_measure=r.entropy_measure, dynamic_budget=bool(r.dynamic_budget),
        beta=float(r.beta), premonitor_reuse=bool(r.premonitor_reuse), penalty_slope=float(r.penalty_slope),
        penalty_scope=r.penalty_scope,
    )
    return EvalConfig(n=n, greedy=greedy, temperature=temperature, top_p=top_p, seed=seed,
                      questions_per_batch=questions_per_batch, loop=loop, rollout=rollout,
                      reward=None if reward == "auto" else reward)


def _write_outputs(out: str, result: Any, meta: dict) -> None:
    from aepo_jax.evaluation import write_report_csv, write_report_json

    write_report_json(result.reports, os.path.join(out, "reports.json"))
    write_report_csv(result.reports, os.path.join(out, "reports.csv"))
    with open(os.path.join(out, "samples.jsonl"), "w", encoding="utf-8") as f:
        f.writelines(json.dumps(sample) + "\n" for sample in result.samples)
    if result.tree_stats is not None:
        with open(os.path.join(out, "tree_stats.json"), "w", encoding="utf-8") as f:
            json.dump(result.tree_stats, f, indent=2, default=str)
    with open(os.path.join(out, "eval_config.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=2, sort_keys=True)


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    logging.set_verbosity(logging.WARNING)  # orbax reports every read at INFO
    cfg = _CONFIG.value
    baseline = _CHECKPOINT.value.strip().lower() == "none"
    from aepo_jax.evaluation.restore import locate_checkpoint

    try:  # fail on a bad checkpoint path before any tool process or compilation starts
        location = None if baseline else locate_checkpoint(_CHECKPOINT.value)
    except (FileNotFoundError, NotADirectoryError) as err:
        raise SystemExit(f"error: {err}") from err
    if _GREEDY.value and _N.value != 1:
        raise SystemExit(f"error: --greedy needs --n 1 (greedy samples are identical), got --n {_N.value}")
    run_dir = location.run_dir if location else None
    out = _OUT.value or (os.path.join(run_dir, "eval") if run_dir else
                         os.path.join(os.path.dirname(location.manager_dir), "eval") if location else "eval_initial")
    env_dir = os.path.join(out, "env")
    os.makedirs(env_dir, exist_ok=True)
    if run_dir and not cfg.tokenizer.path:
        for suffix in (".model", ".vocab"):
            source = os.path.join(run_dir, "tokenizer" + suffix)
            if os.path.exists(source):
                shutil.copyfile(source, os.path.join(env_dir, "tokenizer" + suffix))
        if not os.path.exists(os.path.join(env_dir, "tokenizer.model")):
            print(f"warning: {run_dir} has no tokenizer.model; training one from the config's task text",
                  file=sys.stderr, flush=True)

    from aepo_jax.evaluation import format_report_table
    from aepo_jax.evaluation.driver import evaluate
    from aepo_jax.evaluation.restore import restore_policy_params
    from aepo_jax.training.agent_env import build_agent_environment
    from aepo_jax.training.build import init_model, model_config_from

    env = build_agent_environment(cfg, env_dir)
    try:
        if not cfg.model.checkpoint_dir:
            with cfg.unlocked():
                cfg.model.vocab_size = int(env.tokenizer.vocab_size)
        if baseline:
            graphdef, params = init_model(cfg)
            step = None
        else:
            try:
                graphdef, params, step = restore_policy_params(location, cfg, model_config_from(cfg))
            except (FileNotFoundError, ValueError) as err:
                raise SystemExit(f"error: {err}") from err
        examples = eval_examples(cfg, env, _SPLIT.value, _DATA_PATH.value, env_dir)
        if _MAX_QUESTIONS.value > 0:
            examples = examples[:_MAX_QUESTIONS.value]
        seed = int(cfg.seed) if _SEED.value is None else _SEED.value
        config = eval_config_from(cfg, _N.value, _GREEDY.value, _TEMPERATURE.value, _TOP_P.value, seed,
                                  _BATCH.value or int(cfg.data.prompts_per_step), _STRATEGY.value, _REWARD.value)
        print(f"evaluating {len(examples)} questions x {config.n} samples "
              f"({'greedy' if config.greedy else f'T={config.temperature}, top-p={config.top_p}'}, "
              f"{config.rollout.strategy}) from {'initial parameters' if baseline else f'step {step}'}", flush=True)
        result = evaluate(examples, graphdef=graphdef, params=params, tokenizer=env.tokenizer, tools=env.tools,
                          encode_prompt=env.encode_prompt, config=config, progress=_PROGRESS.value)
    finally:
        env.close()
    print(format_report_table(result.reports), flush=True)
    meta = {"checkpoint": None if baseline else _CHECKPOINT.value, "step": step, "n": config.n,
            "greedy": config.greedy, "temperature": config.temperature, "top_p": config.top_p, "seed": seed,
            "strategy": config.rollout.strategy, "split": _SPLIT.value, "data_path": _DATA_PATH.value or None,
            "num_questions": len(examples), "reward": _REWARD.value, "config": json.loads(cfg.to_json_best_effort())}
    _write_outputs(out, result, meta)
    print(f"wrote {out}/reports.json, reports.csv, samples.jsonl", flush=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())  # config files import `configs.base`
    from launch.run_setup import check_config_arguments

    check_config_arguments(sys.argv[1:])
    app.run(main)
