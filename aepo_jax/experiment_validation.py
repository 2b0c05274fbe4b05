"""The composition root's held-out validation for RL runs (`validation.*`, spec §6: greedy decoding): the
questions, the decoding and the scores a `training.validation.Validation` logs (`launch.train` attaches it
to the trainer `experiment.rl_trainer_from` builds)."""

from __future__ import annotations

import os
from typing import Any

import ml_collections

from aepo_jax.evaluation.metrics import DatasetReport
from aepo_jax.experiment import Environment, eval_config_from
from aepo_jax.experiment_checks import require_judge, require_prompts_fit
from aepo_jax.training.validation import Validation


def validation_examples(cfg: ml_collections.ConfigDict, env: Environment, workdir: str) -> list[dict]:
    """The first `validation.questions` held-out questions: `validation.data_path`, else the generated
    task's held-out split; a ValueError when there are none (a `data.path` run needs a file)."""
    v = cfg.validation
    if v.data_path:
        from aepo_jax.data import load_local_examples

        examples = load_local_examples(v.data_path, os.path.join(workdir, "tfds_validation"))
    else:
        examples = list(env.heldout_examples)
    if not examples:
        raise ValueError("validation.every > 0 needs held-out questions: set validation.data_path (a JSONL or "
                         "parquet file of them); only the generated tasks have a held-out split of their own")
    if int(v.questions) < 1:
        raise ValueError(f"validation.questions must be >= 1, got {v.questions}")
    return examples[: int(v.questions)]


def report_metrics(reports: list[DatasetReport]) -> dict[str, float]:
    """`pass@1`, `mean_f1`, `tool_calls`, `response_length` of the whole set (the `all` report, or the only
    one), and each data source's under `<source>/` when there are several."""
    whole = next((r for r in reports if r.dataset == "all"), reports[0])
    out: dict[str, float] = {}
    for report in reports:
        prefix = "" if report is whole else f"{report.dataset}/"
        out.update({f"{prefix}pass@1": report.pass_at_k[1], f"{prefix}mean_f1": report.mean_f1,
                    f"{prefix}tool_calls": report.tool_calls_per_question,
                    f"{prefix}response_length": report.mean_response_length})
    return out


def validation_from(cfg: ml_collections.ConfigDict, env: Environment, graphdef: Any, placement: Any,
                    workdir: str) -> Validation | None:
    """The run's validation (None when `validation.every` is 0): one greedy sample of each held-out question
    with the run's agent loop and tools, on the rollout's placement (`placement`: every process calls it),
    scored by each question's data source as `launch.evaluate` scores it. Settings that cannot run are
    refused here, before the first step."""
    from aepo_jax.evaluation.driver import check_examples, evaluate
    from aepo_jax.evaluation.scoring import correctness_reward

    every = int(cfg.validation.every)
    if every == 0:
        return None
    examples = validation_examples(cfg, env, workdir)
    check_examples(examples)  # here, not at the first validation steps later (repeated ids, missing keys)
    require_judge({correctness_reward(ex, None) for ex in examples}, env, "validation")
    require_prompts_fit(examples, env.encode_prompt, "validation")
    batch = int(cfg.validation.batch_questions) or int(cfg.data.prompts_per_step)
    config = eval_config_from(cfg, n=1, greedy=True, temperature=1.0, seed=int(cfg.seed), questions_per_batch=batch)

    def score(params: Any) -> dict[str, float]:
        result = evaluate(examples, graphdef=graphdef, params=params, tokenizer=env.tokenizer, tools=env.tools,
                          encode_prompt=env.encode_prompt, config=config, progress=False, placement=placement,
                          judge=env.judge)
        return report_metrics(result.reports)

    return Validation(every, score)
