"""Cold-start SFT (DESIGN.md, Trainer): next-token loss on the generated tokens
only (`mask == 1`; prompt and tool-result tokens are context), with the same
padded batches, sharding, micro-batching, checkpoints and metrics as RL.

A record is `{"prompt_ids": [...], "segments": [(ids, trainable), ...]}` or
the text form `{"question": str, "response": str}` where the response text
holds tool results as `<result>...</result>` blocks (mask 0) between
generated text (mask 1); `text_record_to_tokens` turns the text form into
tokens, tokenising each piece separately (token-in, token-out).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np

from aepo_jax.agent.tags import RESULT_CLOSE, RESULT_OPEN
from aepo_jax.training.batch import pad_sequences
from aepo_jax.training.build import (
    RunParts,
    build_run,
    place_batch,
    row_multiple,
    step_config_from,
)
from aepo_jax.training.checkpoint import Checkpointer
from aepo_jax.training.metrics_log import MetricsLogger
from aepo_jax.training.train_step import make_sft_train_step

_RESULT_BLOCK = re.compile(r"(\s*" + re.escape(RESULT_OPEN) + r".*?" + re.escape(RESULT_CLOSE) + r")", re.DOTALL)


def text_record_to_tokens(prompt_ids: Sequence[int], response: str, encode: Callable[[str], list[int]],
                          eos_id: int | None) -> dict[str, np.ndarray]:
    """Prompt ids + response text -> `tokens` and `mask` (0 on prompt and `<result>` blocks)."""
    tokens, mask = list(map(int, prompt_ids)), [0] * len(prompt_ids)
    for piece in _RESULT_BLOCK.split(response):
        if not piece:
            continue
        ids = encode(piece)
        is_result = bool(_RESULT_BLOCK.fullmatch(piece))
        tokens += ids
        mask += [0 if is_result else 1] * len(ids)
    if eos_id is not None:
        tokens.append(int(eos_id))
        mask.append(1)
    return {"tokens": tokens, "mask": np.asarray(mask, np.float32)}


class SequenceBatches:
    """Endless shuffled batches of token records with a resumable position."""

    def __init__(self, records: Sequence[dict], batch_size: int, seed: int = 0):
        if len(records) < batch_size:
            raise ValueError(f"{len(records)} SFT records are fewer than one batch of {batch_size}")
        self.records, self.batch_size, self.seed = list(records), int(batch_size), int(seed)
        self.steps_per_epoch = len(self.records) // self.batch_size
        self.epoch, self.position = 0, 0

    def _order(self) -> np.ndarray:
        return np.random.default_rng([self.seed, self.epoch]).permutation(len(self.records))

    def __iter__(self):
        return self

    def __next__(self) -> list[dict]:
        if self.position == self.steps_per_epoch:
            self.epoch, self.position = self.epoch + 1, 0
        start = self.position * self.batch_size
        chosen = self._order()[start:start + self.batch_size]
        self.position += 1
        return [self.records[i] for i in chosen]

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "num_records": len(self.records)}

    def restore(self, state: dict[str, int]) -> None:
        if state.get("num_records") != len(self.records):
            raise ValueError(f"checkpoint was taken over {state.get('num_records')} records, now {len(self.records)}")
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


class SFTTrainer:
    """Supervised steps over `SequenceBatches`; same config layout as RL (`train`, `optim`, ...)."""

    def __init__(self, config: ml_collections.ConfigDict, workdir: str, *, batches: SequenceBatches,
                 graphdef: Any = None, params: Any = None, pad_id: int = 0, process_index: int = 0):
        from aepo_jax.training.build import preset_from

        self.config, self.batches, self.pad_id = config, batches, pad_id
        self.run: RunParts = build_run(config, graphdef, params)
        self.state = self.run.state
        self.row_multiple = row_multiple(config.train.micro_batch_size, self.run.mesh)
        step_cfg = step_config_from(config, preset_from(config))
        self._step = make_sft_train_step(self.run.graphdef, self.run.tx, step_cfg, self.run.schedule,
                                         state_sharding=self.run.state_sharding)
        self.checkpointer = Checkpointer(f"{workdir}/checkpoints", keep=int(config.checkpoint.keep),
                                         async_save=bool(config.checkpoint.async_save))
        self.logger = MetricsLogger(workdir, tensorboard=bool(config.log.tensorboard), process_index=process_index)
        self.process_index = process_index

    def restore_latest(self) -> bool:
        if self.checkpointer.latest_step() is None:
            return False
        self.state, position = self.checkpointer.restore(self.state, shardings=self.run.state_sharding)
        if position:
            self.batches.restore(position)
        return True

    def train_step(self) -> dict[str, float]:
        t0 = time.perf_counter()
        records = next(self.batches)
        batch = pad_sequences(records, max_len=int(self.config.train.max_seq_len), pad_id=self.pad_id,
                              row_multiple=self.row_multiple, length_multiple=int(self.config.train.length_bucket))
        self.state, metrics = self._step(self.state, place_batch(batch, self.run.mesh))
        metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
        self.state = self.state.replace(rounds=self.state.rounds + 1)
        elapsed = time.perf_counter() - t0
        metrics.update(step_time_s=elapsed, tokens_per_s=metrics["train_tokens"] / max(elapsed, 1e-9))
        return metrics

    def train(self, num_steps: int | None = None) -> list[dict[str, Any]]:
        total = int(self.config.train.total_steps)
        start = int(self.state.rounds)
        end = total if num_steps is None else min(total, start + num_steps)
        every = max(1, int(self.config.checkpoint.every))
        bar = None
        if bool(self.config.log.progress_bar) and self.process_index == 0:
            from tqdm import tqdm

            bar = tqdm(total=end - start, desc="sft", unit="step", dynamic_ncols=True)
        records = []
        try:
            for _ in range(start, end):
                metrics = self.train_step()
                step = int(self.state.rounds)
                records.append(self.logger.log(step, metrics))
                if step % every == 0 or step == end:
                    self.checkpointer.save(step, self.state, self.batches.state(), force=True)
                if bar is not None:
                    bar.update(1)
        finally:
            if bar is not None:
                bar.close()
            self.checkpointer.wait_until_finished()
        return records

    def close(self) -> None:
        self.checkpointer.close()
        self.logger.close()
