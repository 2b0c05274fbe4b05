"""Cold-start SFT entry point (next-token loss on generated tokens only).

    python -m launch.sft --config configs/aepo_tiny.py --workdir /tmp/sft \
        [--config.train.total_steps=50 ...] [--resume]

Data: `sft.path` (JSONL of {"question", "response"} with tool results as
<result> blocks) or, for the synthetic task, scripted solutions executed with
the real tools (`aepo_jax.envs.facts_sft`). The resolved config is printed
and saved; unknown override keys are refused. The final parameters are in
WORKDIR/checkpoints (orbax); point an RL run at them with `--resume` on a copy
or load them with `aepo_jax.training.checkpoint.Checkpointer`.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
from absl import app

from launch.run_setup import define_run_flags

_CONFIG, _WORKDIR, _RESUME = define_run_flags()


def sft_records(cfg, env) -> list[dict]:
    """Token records (`tokens`, `mask`) for SFT from `sft.path` or the scripted synthetic task."""
    from aepo_jax.training.sft_trainer import text_record_to_tokens

    if cfg.sft.path:
        with open(cfg.sft.path, encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
        return [text_record_to_tokens(env.encode_prompt(row), row["response"], env.tokenizer.encode,
                                      env.tokenizer.eos_id) for row in rows]
    if env.task is None:
        raise ValueError("set sft.path: scripted SFT data exists only for the synthetic task")
    from aepo_jax.envs.facts_sft import build_sft_sequences

    towns = {t.name: t for t in env.task.towns}
    questions = list(env.task.train)[: int(cfg.sft.num_sequences)]
    sequences = build_sft_sequences(
        questions, towns, env.tokenizer, env.tools, lambda q: env.encode_prompt({"question": q}),
        np.random.default_rng(int(cfg.seed)), float(cfg.sft.skip_python_prob))
    return [s.as_row() for s in sequences]


def make_sft_trainer(cfg, env, process_index: int, process_count: int):
    """An `SFTTrainer` over `sft_records` (every process reads the same records)."""
    from aepo_jax.training.build import init_model
    from aepo_jax.training.sft_trainer import SequenceBatches, SFTTrainer

    records = sft_records(cfg, env)
    graphdef, params = init_model(cfg)
    return SFTTrainer(cfg, _WORKDIR.value, batches=SequenceBatches(records, int(cfg.sft.batch_size), int(cfg.seed)),
                      graphdef=graphdef, params=params, pad_id=int(env.tokenizer.pad_id),
                      process_index=process_index)


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from launch.run_setup import run_training

    return run_training(_CONFIG.value, _WORKDIR.value, _RESUME.value, make_sft_trainer)


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())  # config files import `configs.base`
    from launch.run_setup import check_config_arguments

    check_config_arguments(sys.argv[1:])
    app.run(main)
