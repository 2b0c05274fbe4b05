"""The SFT stage of a run, built from its config: the SFT run config, its token records, the trainer,
and the demo's whole SFT stage. Part of the composition root (`aepo_jax.experiment` builds the model,
the environment and the run files it uses)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np

from aepo_jax.experiment import (
    Environment,
    model_from,
    parameter_count,
    save_run_files,
)
from aepo_jax.experiment_checks import require_mesh_fits_model


class SFTDataError(ValueError):
    """A row of `sft.path` that cannot be trained on; the message names the file and line."""


def sft_config_from(cfg: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The run config of the SFT stage: `sft.*` values replace the RL run's steps, optimiser and lengths
    (an `sft` key left None keeps the `train` / `optim` value)."""
    out = cfg.copy_and_resolve_references()
    s = out.sft
    with out.unlocked():
        for key, (section, name) in {"steps": ("train", "total_steps"), "lr": ("optim", "lr"),
                                     "warmup_steps": ("optim", "warmup_steps"), "schedule": ("optim", "schedule"),
                                     "final_lr_fraction": ("optim", "final_lr_fraction"),
                                     "max_seq_len": ("train", "max_seq_len"),
                                     "length_bucket": ("train", "length_bucket")}.items():
            if s.get(key) is not None:
                out[section][name] = s[key]
        if "total_steps" in out:
            out.total_steps = out.train.total_steps
    return out


def sft_records_from(cfg: ml_collections.ConfigDict, env: Environment) -> list[dict]:
    """Token records (`tokens`, `mask`) for SFT from `sft.path` (JSONL of `{"question", "response"}`; a row
    that cannot be read is refused naming path:line), or scripted solutions of the generated task executed
    with the real tools (`envs.facts_sft`)."""
    if cfg.sft.path:
        return [_text_row_to_tokens(row, f"{cfg.sft.path}:{line_no}", env)
                for line_no, row in _sft_rows(cfg.sft.path)]
    if env.task is None:
        raise ValueError("set sft.path: scripted SFT data exists only for the generated tasks")
    from aepo_jax.envs.facts_sft import build_sft_sequences

    towns = {t.name: t for t in env.task.towns}
    questions = list(env.task.train)[: int(cfg.sft.num_sequences)]
    sequences = build_sft_sequences(
        questions, towns, env.tokenizer, env.tools, lambda q: env.encode_prompt({"question": q}),
        np.random.default_rng(int(cfg.seed)), float(cfg.sft.skip_python_prob),
        script=getattr(env.task, "script", None))
    return [s.as_row() for s in sequences]


def _sft_rows(path: str) -> Iterator[tuple[int, dict]]:
    """(line number from 1, row) of each row of the JSONL file `path` (`data.records.iter_rows`: a line that
    is not UTF-8, not JSON or not an object is refused naming `path:line`); a file with no rows is refused."""
    from aepo_jax.data.records import iter_rows

    count = 0
    for line_no, row in iter_rows(path):
        count += 1
        yield line_no, row
    if not count:
        raise SFTDataError(f"{path}: no SFT rows (JSONL of {{\"question\", \"response\"}} objects)")


def _sft_text(row: dict, key: str, where: str) -> str:
    """`row[key]` as a non-blank string; otherwise an error naming `where` and the row's fields (a chat
    `messages` row is not a layout SFT reads)."""
    value = row.get(key)
    if value is None:
        layout = " (a chat `messages` row is not read: write it as question + response)" if "messages" in row else ""
        raise SFTDataError(f"{where}: no {key!r} field{layout}; an SFT row is {{\"question\": str, "
                           f"\"response\": str}}, this one has {sorted(row)}")
    if not isinstance(value, str):
        raise SFTDataError(f"{where}: {key!r} must be a string, got {type(value).__name__}")
    if not value.strip():
        # a blank response trains only on EOS; a blank question is a prompt with no task
        raise SFTDataError(f"{where}: {key!r} is blank")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate: no tokenizer encodes it, and its error named no line
        raise SFTDataError(f"{where}: {key!r} holds a lone surrogate code point (U+{ord(value[exc.start]):04X} at "
                           f"character {exc.start + 1}), half of an escaped emoji pair; repair the row") from exc
    return value


def _text_row_to_tokens(row: dict, where: str, env: Environment) -> dict:
    """One `sft.path` row -> a token record; every error names `where` (path:line)."""
    from aepo_jax.agent.prompts import prompt_opens_think
    from aepo_jax.training.sft_trainer import text_record_to_tokens

    question, response = _sft_text(row, "question", where), _sft_text(row, "response", where)
    try:
        prompt_ids = env.encode_prompt({**row, "question": question})
    except ValueError as exc:
        raise SFTDataError(f"{where}: {exc}") from exc
    return text_record_to_tokens(prompt_ids, response, env.tokenizer.encode, env.tokenizer.eos_id, where=where,
                                 prompt_opens_think=prompt_opens_think(env.tokenizer))


def sft_trainer_from(cfg: ml_collections.ConfigDict, env: Environment, workdir: str, graphdef: Any = None,
                     params: Any = None, process_index: int = 0, records: Sequence[dict] | None = None):
    """An `SFTTrainer` over `sft_records_from` (every process reads the same records); `cfg` is the
    SFT run's config (`sft_config_from`)."""
    from aepo_jax.training.build import make_mesh_from
    from aepo_jax.training.sft_trainer import SequenceBatches, SFTTrainer

    mesh = make_mesh_from(cfg)  # one mesh: the weights are read onto it and the trainer runs on it
    if graphdef is None:
        require_mesh_fits_model(cfg, env, mesh)  # before any record is made or weight is read
    records = sft_records_from(cfg, env) if records is None else records
    batches = SequenceBatches(records, int(cfg.sft.batch_size), int(cfg.seed))
    if jax.process_count() > 1:  # each process made its own records (scripted ones ran the tools on its host)
        from aepo_jax.parallel.agreement import require_agreement

        require_agreement({"SFT records": batches.records_digest})
    if graphdef is None:
        graphdef, params = model_from(cfg, env, mesh)
    return SFTTrainer(cfg, workdir, batches=batches, graphdef=graphdef, params=params,
                      pad_id=int(env.tokenizer.pad_id), process_index=process_index, mesh=mesh)


def train_sft(cfg: ml_collections.ConfigDict, env: Environment, env_dir: str, run_dir: str, progress: bool = True,
              log: Callable[[str], None] = print) -> tuple[Any, Any, list[dict]]:
    """The demo's SFT stage: scripted trajectories -> `SFTTrainer` from `model_from`; returns
    (graphdef, params, records). RUN_DIR gets checkpoints, metrics and the run files; one that already
    holds checkpoints is refused before anything runs."""
    from aepo_jax.training.checkpoint import require_no_checkpoints

    require_no_checkpoints(run_dir)
    sft_cfg = sft_config_from(cfg)
    t0 = time.perf_counter()
    records = sft_records_from(sft_cfg, env)
    log(f"  {len(records)} scripted trajectories executed with the real tools in {time.perf_counter() - t0:.1f}s")
    from aepo_jax.training.build import make_mesh_from

    graphdef, params = model_from(sft_cfg, env, make_mesh_from(sft_cfg))  # on the trainer's mesh
    log(f"  model: {parameter_count(params):,} parameters, vocabulary {env.tokenizer.vocab_size}")
    save_run_files(sft_cfg, run_dir, env, env_dir)
    trainer = sft_trainer_from(sft_cfg, env, run_dir, graphdef, params, records=records)
    try:
        history = trainer.train(progress=progress)
        return graphdef, trainer.state.params, history
    finally:
        trainer.close()
