"""Evaluation entry point: pass@k, F1, tool calls and length per dataset (spec §6).

    python -m launch.evaluate --checkpoint WORKDIR [--config configs/aepo_tiny.py] \
        [--n 4] [--greedy] [--split heldout|train] [--data_path FILE] [--out DIR] \
        [--strategy independent|arpo|aepo] [--mesh data=-1,fsdp=1,tensor=1] [--distributed auto|on|off] \
        [--sampler_weights auto|replicas|run_mesh] \
        [--judge_url URL --judge_model NAME [--judge_api_key_env VAR]] \
        [--config.key=value ...]

`--checkpoint` is a training run directory (or its `checkpoints/` folder, or
one step folder) written by `launch.train`, `launch.sft` or `launch.demo`
(`runs/demo/aepo`); `--checkpoint none` evaluates the config's initial
parameters (a baseline, needs `--config`). Only the parameters are read, onto
the config's mesh (`mesh.shape`, or `--mesh`); the sampler runs where the
training rollout does (`--sampler_weights`, default the config's
`rollout.sampler_weights`: weight replicas per tensor group when the mesh
splits the weights over fsdp or spans several hosts); on several hosts the same command runs on each (as
`launch.train` does), every host samples its share of each batch of questions
on its own devices, and the first host writes the outputs. Without `--config` the run's own
resolved config (`WORKDIR/config.json`) rebuilds everything, and `--config.key=value` overrides apply on
top of it (`launch/run_config.py`); the run's
tokenizer (`WORKDIR/tokenizer.model`) is reused so token ids match the
checkpoint. Everything is built by `aepo_jax.experiment`. The
questions are the config's held-out split (the synthetic task's held-out
towns) or its training data (`--split train`), or any local JSONL file
(`--data_path`, which replaces the split: passing both is refused). Decoding is
the paper's evaluation setting (temperature 0.6, top-p 0.95) or greedy with
`--n 1 --greedy`. Prints the per-dataset table (pass@k and F1 in percent, and
`correct_by`, the reward that decided each dataset's correctness) and writes
OUT/reports.json (fractions; per dataset also `correctness` and
`math_timeouts`, sympy checks that ran out of time and counted as wrong),
OUT/reports.csv, OUT/samples.jsonl, OUT/eval_config.json (with `split`, null
under `--data_path`, and `correctness`, the rule per data source) and, for a
tree strategy, OUT/tree_stats.json. A tree strategy's `n` samples of a
question share prefixes, so its pass@k is not that of independent samples.

Questions whose reward is the LLM judge (the gaia, hle, webwalker, ... data
sources under `--reward auto`) need a judge: an OpenAI-compatible chat server
(`--judge_url`, `--judge_model`, and `--judge_api_key_env`, the name of the
environment variable holding its API key), which set `reward.judge_*` of the
config; an evaluation that needs one and has none is refused before it starts.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from absl import app, flags
from ml_collections import config_flags

from aepo_jax.rewards.registry import REWARDS
from launch.config_args import quiet_library_logs

_CONFIG = config_flags.DEFINE_config_file("config", None, "experiment config file (configs/*.py[:arg]); "
                                          "default: the run's own WORKDIR/config.json", lock_config=True)
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
_REWARD = flags.DEFINE_enum("reward", "auto", ["auto", *sorted(REWARDS)],
                            "reward family deciding correctness ('auto' = by data source)")
_JUDGE_URL = flags.DEFINE_string("judge_url", None, "OpenAI-compatible server of the LLM judge "
                                  "(default: the config's reward.judge_url)")
_JUDGE_MODEL = flags.DEFINE_string("judge_model", None, "model the judge server serves (default: reward.judge_model)")
_JUDGE_API_KEY_ENV = flags.DEFINE_string("judge_api_key_env", None, "NAME of the environment variable holding the "
                                         "judge's API key (default: reward.judge_api_key_env)")
_SEED = flags.DEFINE_integer("seed", None, "PRNG seed of the evaluation (default: config seed)")
_OUT = flags.DEFINE_string("out", None, "output directory (default: RUN_DIR/eval, or ./eval_initial for 'none')")
_PROGRESS = flags.DEFINE_bool("progress", True, "progress bar over questions")
_MESH = flags.DEFINE_string("mesh", "", "mesh shape of the evaluation as axis=size pairs, e.g. fsdp=8,tensor=4 "
                            "(default: the config's mesh.shape, which a run's config.json fixes)")
_SAMPLER_WEIGHTS = flags.DEFINE_enum("sampler_weights", None, ["auto", "replicas", "run_mesh"],
                                     "the weights the sampler reads (default: the config's rollout.sampler_weights; "
                                     "run_mesh keeps one process on the mesh's shards when whole weights do not fit)")
_DISTRIBUTED = flags.DEFINE_enum("distributed", "auto", ["auto", "on", "off"],
                                 "multi-host start-up of this evaluation (not the training run's setting): "
                                 "auto = when the environment names several hosts")
flags.mark_flags_as_required(["checkpoint"])


def check_flags() -> None:
    """Refuse flag values that cannot run, before any checkpoint is read or tool started."""
    if _N.value < 1:
        raise SystemExit(f"error: --n must be >= 1 (samples per question), got --n {_N.value}")
    if _GREEDY.value and _N.value != 1:
        raise SystemExit(f"error: --greedy needs --n 1 (greedy samples are identical), got --n {_N.value}")
    for flag in (_BATCH, _MAX_QUESTIONS):
        if flag.value < 0:
            raise SystemExit(f"error: --{flag.name} must be >= 0 (0 = the default), got {flag.value}")
    if _DATA_PATH.value and flags.FLAGS["split"].present:
        raise SystemExit(f"error: --data_path {_DATA_PATH.value!r} replaces the config's split, so --split "
                         f"{_SPLIT.value} would be ignored: pass one of them")


def eval_examples(cfg: Any, env: Any, split: str, data_path: str, scratch: str) -> list[dict]:
    """The questions to evaluate: `data_path`, else the config's split (see module docstring)."""
    if data_path:
        from aepo_jax.data import load_local_examples

        return load_local_examples(data_path, os.path.join(scratch, "tfds_eval"))
    if split == "train":
        return list(env.examples)
    if not env.heldout_examples:
        raise SystemExit(f"config data.path={cfg.data.path!r} has no held-out split here; pass --data_path=FILE "
                         "(a JSONL of held-out questions) or --split=train")
    return list(env.heldout_examples)


def mesh_shape(cfg: Any, spec: str) -> dict[str, int]:
    """The evaluation's mesh shape: `spec` ("data=-1,tensor=2"; unnamed axes 1) or the config's."""
    from aepo_jax.parallel.mesh import parse_mesh_shape

    if not spec.strip():
        return dict(cfg.mesh.shape)
    try:
        return parse_mesh_shape(spec)
    except ValueError as err:
        raise SystemExit(f"error: --mesh: {err}") from err


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
    check_flags()
    cfg = _CONFIG.value
    quiet_library_logs(cfg is not None and bool(cfg.get("verbose_logs", False)))  # orbax logs every read at INFO
    baseline = _CHECKPOINT.value.strip().lower() == "none"
    from aepo_jax.evaluation.restore import locate_checkpoint
    from aepo_jax.run_paths import require_local_path

    try:  # fail on a bad checkpoint path before any tool process or compilation starts
        for flag, path in (("--checkpoint", _CHECKPOINT.value), ("--out", _OUT.value or "")):
            require_local_path(path, flag)
        location = None if baseline else locate_checkpoint(_CHECKPOINT.value)
    except (FileNotFoundError, NotADirectoryError, ValueError) as err:
        raise SystemExit(f"error: {err}") from err
    if cfg is None:
        from aepo_jax.experiment import config_from_run

        if location is None or location.run_dir is None:
            raise SystemExit("error: --config is needed with --checkpoint none or a checkpoint outside a run directory")
        try:
            cfg = config_from_run(location.run_dir)
        except FileNotFoundError as err:
            raise SystemExit(f"error: {err}") from err
    shape = mesh_shape(cfg, _MESH.value)
    from aepo_jax.parallel.distributed import maybe_initialize_distributed

    process_index, process_count = maybe_initialize_distributed(_DISTRIBUTED.value)
    from aepo_jax.experiment import loop_config_from, rollout_placement_from
    from aepo_jax.parallel.mesh import make_mesh

    if _SAMPLER_WEIGHTS.value is not None:
        with cfg.unlocked():
            cfg.rollout.sampler_weights = _SAMPLER_WEIGHTS.value
    judge_flags = {"judge_url": _JUDGE_URL, "judge_model": _JUDGE_MODEL, "judge_api_key_env": _JUDGE_API_KEY_ENV}
    for key, flag in judge_flags.items():
        if flag.value is not None:
            with cfg.unlocked():
                cfg.reward[key] = flag.value
    try:  # before any weight is read or tool started
        mesh = make_mesh(shape)
    except ValueError as err:
        raise SystemExit(f"error: mesh {shape} does not fit this machine: {err}; pass --mesh, e.g. "
                         f"--mesh data=-1,fsdp=1,tensor=1") from err
    try:
        placement = rollout_placement_from(cfg, mesh)
        loop_config_from(cfg)  # the agent loop's settings, checked before any tool or model starts
    except ValueError as err:
        raise SystemExit(f"error: {err}") from err
    run_dir = location.run_dir if location else None
    out = _OUT.value or (os.path.join(run_dir, "eval") if run_dir else
                         os.path.join(os.path.dirname(location.manager_dir), "eval") if location else "eval_initial")
    # Each process starts its own tools and keeps its own copy of the tokenizer and task files.
    env_dir = os.path.join(out, "env" if process_index == 0 else f"env-process-{process_index}")
    os.makedirs(env_dir, exist_ok=True)
    if run_dir and not cfg.tokenizer.path:
        from aepo_jax.experiment_tokenizer import copy_tokenizer_files

        if not copy_tokenizer_files(run_dir, env_dir):
            print(f"warning: {run_dir} has no tokenizer.model; training one from the config's task text",
                  file=sys.stderr, flush=True)

    from aepo_jax.evaluation import correctness_reward, format_report_table
    from aepo_jax.evaluation.driver import check_examples, evaluate
    from aepo_jax.evaluation.restore import restore_policy_params
    from aepo_jax.experiment import (
        environment_from,
        eval_config_from,
        fit_model_to_tokenizer,
        model_from,
        start_runtime,
    )
    from aepo_jax.experiment_checks import require_judge, require_prompts_fit
    from aepo_jax.parallel.sharding import require_heads_split
    from aepo_jax.training.build import model_config_from

    start_runtime(cfg)
    try:
        env = environment_from(cfg, env_dir)
    except ValueError as err:  # e.g. a judge URL without a model, or its API key variable unset
        raise SystemExit(f"error: {err}") from err
    try:
        try:  # the questions first: an empty or bad file is refused before the model is built
            examples = eval_examples(cfg, env, _SPLIT.value, _DATA_PATH.value, env_dir)
            if _MAX_QUESTIONS.value > 0:
                examples = examples[:_MAX_QUESTIONS.value]
            check_examples(examples)
        except (FileNotFoundError, ValueError) as err:
            raise SystemExit(f"error: {err}") from err
        try:
            fit_model_to_tokenizer(cfg, env)  # a model.vocab_size that is not the tokenizer's is refused
            if baseline:
                graphdef, params = model_from(cfg, env, mesh)  # refuses a mesh that cannot split its heads
                step = None
            else:
                model_config = model_config_from(cfg)
                require_heads_split(model_config.n_heads, model_config.n_kv_heads, mesh.shape,
                                    f"model.preset={cfg.model.preset!r}")
                graphdef, params, step = restore_policy_params(location, cfg, model_config, mesh=mesh)
        except (FileNotFoundError, ValueError) as err:
            raise SystemExit(f"error: {err}") from err
        # The reward deciding correctness per data source (unknown sources warn: they get the default).
        correctness = {source: correctness_reward({"data_source": source}, _REWARD.value)
                       for source in sorted({ex["data_source"] for ex in examples})}
        try:
            require_judge(set(correctness.values()), env, "this evaluation")
            require_prompts_fit(examples, env.encode_prompt, "this evaluation")
        except ValueError as err:
            raise SystemExit(f"error: {err}") from err
        seed = int(cfg.seed) if _SEED.value is None else _SEED.value
        config = eval_config_from(cfg, n=_N.value, greedy=_GREEDY.value, temperature=_TEMPERATURE.value,
                                  top_p=_TOP_P.value, seed=seed,
                                  questions_per_batch=_BATCH.value or int(cfg.data.prompts_per_step),
                                  strategy=_STRATEGY.value, reward=None if _REWARD.value == "auto" else _REWARD.value)
        if process_index == 0:
            print(f"evaluating {len(examples)} questions x {config.n} samples "
                  f"({'greedy' if config.greedy else f'T={config.temperature}, top-p={config.top_p}'}, "
                  f"{config.rollout.strategy}) from {'initial parameters' if baseline else f'step {step}'} "
                  f"on mesh {dict(mesh.shape)} over {process_count} process(es)", flush=True)
        result = evaluate(examples, graphdef=graphdef, params=params, tokenizer=env.tokenizer, tools=env.tools,
                          encode_prompt=env.encode_prompt, config=config, progress=_PROGRESS.value,
                          placement=placement, judge=env.judge)
    finally:
        env.close()
    if process_index != 0:
        return 0  # every process holds the whole result; the first one reports it
    print(format_report_table(result.reports), flush=True)
    if config.tree_strategy:
        print(f"note: {config.rollout.strategy} samples of a question share prefixes (branches of one tree), so "
              "pass@k > 1 is not the pass@k of independent samples", flush=True)
    meta = {"checkpoint": None if baseline else _CHECKPOINT.value, "step": step, "n": config.n,
            "greedy": config.greedy, "temperature": config.temperature, "top_p": config.top_p, "seed": seed,
            "strategy": config.rollout.strategy, "split": None if _DATA_PATH.value else _SPLIT.value,
            "data_path": _DATA_PATH.value or None, "num_questions": len(examples), "reward": _REWARD.value,
            "correctness": correctness, "math_timeouts": result.math_timeouts, "mesh": dict(mesh.shape),
            "processes": process_count, "questions_per_batch": config.questions_per_batch,
            "config": json.loads(cfg.to_json_best_effort())}
    _write_outputs(out, result, meta)
    print(f"wrote {out}/reports.json, reports.csv, samples.jsonl", flush=True)
    return 0


def with_run_config(argv: list[str]) -> list[str]:
    """`argv` with `--config launch/run_config.py:RUN_DIR` put first when it overrides config keys
    (`--config.KEY=VALUE`) without a `--config`: the overrides then apply on top of the run's own
    config.json. Without a run directory holding one, a clear error: they need `--config FILE`."""
    from aepo_jax.evaluation.restore import locate_checkpoint
    from launch.config_args import CONFIG_PREFIX, config_spec
    from launch.run_config import CONFIG_FILE

    if config_spec(argv) is not None or not any(a.startswith(CONFIG_PREFIX) for a in argv):
        return argv
    checkpoint = next((a.split("=", 1)[1] for a in argv if a.startswith("--checkpoint=")), None)
    if checkpoint is None and "--checkpoint" in argv[:-1]:
        checkpoint = argv[argv.index("--checkpoint") + 1]
    if not checkpoint or checkpoint.strip().lower() == "none":
        raise SystemExit("error: --config.KEY=VALUE overrides need --config FILE here: without a run there is no "
                         "run config to apply them to")
    try:
        run_dir = locate_checkpoint(checkpoint).run_dir
    except (FileNotFoundError, NotADirectoryError) as err:
        raise SystemExit(f"error: {err}") from err
    if run_dir is None or not os.path.isfile(os.path.join(run_dir, "config.json")):
        raise SystemExit(f"error: --config.KEY=VALUE overrides apply to --config FILE, or to the config.json of the "
                         f"run --checkpoint names, and {checkpoint!r} is in no run directory with one: pass --config")
    return [argv[0], f"--config={CONFIG_FILE}:{run_dir}", *argv[1:]]


if __name__ == "__main__":
    from launch.config_args import run_with_config

    sys.argv = with_run_config(sys.argv)
    run_with_config(main, _CONFIG)
