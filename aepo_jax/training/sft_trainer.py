"""Cold-start SFT (DESIGN.md, Trainer): next-token loss on the generated tokens
only (`mask == 1`; prompt and tool-result tokens are context), with the same
padded batches, sharding, micro-batching, checkpoints and metrics as RL.

A record is `{"prompt_ids": [...], "segments": [(ids, trainable), ...]}` or
the text form `{"question": str, "response": str}` where the response text
holds tool results as `<result>...</result>` blocks (mask 0) between
generated text (mask 1); `text_record_to_tokens` turns the text form into
tokens, tokenising each piece separately (token-in, token-out), so that the
sequence is the one RL's agent loop builds: each tool call's closing tag is
followed by its result block re-encoded as `format_tool_result` (or ends the
response), and under a chat template whose generation prompt opens a think
block the response's own opening `<think>` is dropped.
"""

from __future__ import annotations

import functools
import hashlib
import re
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np

from aepo_jax.agent.protocol import format_tool_result
from aepo_jax.agent.tags import (
    RESULT_CLOSE,
    RESULT_OPEN,
    THINK_OPEN,
    TOOL_CLOSE_TAGS,
    open_tag,
)
from aepo_jax.training.batch import pad_sequences
from aepo_jax.training.build import (
    RunParts,
    build_run,
    place_batch,
    row_multiple,
    step_config_from,
)
from aepo_jax.training.step_loop import CheckpointedTrainer, require_micro_batch_size
from aepo_jax.training.train_step import make_sft_train_step

_RESULT_BLOCK = re.compile(r"(\s*" + re.escape(RESULT_OPEN) + r".*?" + re.escape(RESULT_CLOSE) + r")", re.DOTALL)
# A result tag left in a trainable piece: an unclosed or mis-cased block whose tool output would be trained.
_STRAY_RESULT_TAG = re.compile(re.escape(RESULT_OPEN) + "|" + re.escape(RESULT_CLOSE), re.IGNORECASE)
# A tool's closing tag: RL stops a segment there and appends the tool's result.
_TOOL_CLOSE = re.compile("|".join(re.escape(tag) for tag in TOOL_CLOSE_TAGS))


def text_record_to_tokens(prompt_ids: Sequence[int], response: str, encode: Callable[[str], list[int]],
                          eos_id: int | None, where: str = "SFT record",
                          prompt_opens_think: bool = False) -> dict[str, np.ndarray]:
    """Prompt ids + response text -> `tokens` and `mask` (0 on prompt and `<result>` blocks), as RL builds them.

    Each result block is encoded as `format_tool_result` of its content (what RL appends after a tool call).
    Refused, naming `where`: a `<result>` / `</result>` tag (any letter case) left outside a well-formed block,
    a tool call followed by anything but its result block (except at the end of the response), or a result
    block that does not follow a tool call: tool output would be trained as model output, or the context
    would be one RL never builds. `prompt_opens_think`: the chat template's generation prompt opens a think
    block (`agent.prompts.prompt_opens_think`), so the response's own `<think>` is dropped."""
    if prompt_opens_think:
        response = _without_reopened_think(response)
    tokens, mask = list(map(int, prompt_ids)), [0] * len(prompt_ids)
    pieces = [piece for piece in _RESULT_BLOCK.split(response) if piece]
    for k, piece in enumerate(pieces):
        is_result = bool(_RESULT_BLOCK.fullmatch(piece))
        if is_result:
            _require_after_tool_call(pieces[k - 1] if k else "", piece, where)
            ids = encode(format_tool_result(_result_content(piece)))
        else:
            _require_no_result_tag(piece, where)
            _require_tool_calls_answered(piece, k == len(pieces) - 1, where)
            ids = encode(piece)
        tokens += ids
        mask += [0 if is_result else 1] * len(ids)
    if eos_id is not None and not (len(tokens) > len(prompt_ids) and tokens[-1] == int(eos_id)):
        tokens.append(int(eos_id))  # (a response whose text ends in the EOS text has it already: not twice)
        mask.append(1)
    return {"tokens": tokens, "mask": np.asarray(mask, np.float32)}


def _without_reopened_think(response: str) -> str:
    """`response` without its leading `<think>` (and the whitespace after it), for a prompt that opened the
    think block already (a thinking template's `<|im_start|>assistant\\n<think>\\n`): RL's `response_text`
    reads the response with the prompt's `<think>` in front, so a second one would leave the tags unbalanced
    (format check fails, reward -1)."""
    body = response.lstrip()
    return body[len(THINK_OPEN):].lstrip() if body.startswith(THINK_OPEN) else response


def _result_content(block: str) -> str:
    """The tool output of a result block (`\\s*<result>...</result>`): its content less the one newline
    `format_tool_result` puts at each end, so a block already in RL's form keeps its exact text."""
    content = block[block.index(RESULT_OPEN) + len(RESULT_OPEN):-len(RESULT_CLOSE)]
    content = content.removeprefix("\r\n") if content.startswith("\r\n") else content.removeprefix("\n")
    return content.removesuffix("\r\n") if content.endswith("\r\n") else content.removesuffix("\n")


def _require_no_result_tag(piece: str, where: str) -> None:
    """Refuse a trainable piece holding a result tag (an unclosed or mis-cased `<result>` block)."""
    found = _STRAY_RESULT_TAG.search(piece)
    if found:
        start = max(found.start() - 20, 0)
        raise ValueError(f"{where}: the response has a {found.group()!r} tag outside a well-formed "
                         f"{RESULT_OPEN}...{RESULT_CLOSE} block (unclosed or in another letter case), near "
                         f"{piece[start:found.end() + 40]!r}; its tool output would be trained as model output")


def _require_tool_calls_answered(piece: str, last: bool, where: str) -> None:
    """Refuse a trainable piece with text after a tool's closing tag: in RL generation stops there and the
    tool's result block (mask 0) comes next, so that text (often pasted tool output) is never the model's.
    Only the response's last piece may end in a call (a trajectory that stops at its tool-call limit)."""
    for found in _TOOL_CLOSE.finditer(piece):
        after = piece[found.end():]
        if after and not (last and not after.strip()):
            raise ValueError(f"{where}: the tool call {_call_text(piece, found)!r} is followed by "
                             f"{after[:60]!r} instead of its {RESULT_OPEN}...{RESULT_CLOSE} block; RL stops "
                             f"generating at {found.group()} and appends the tool's result, so this text would "
                             f"be trained as model output")


def _require_after_tool_call(before: str, block: str, where: str) -> None:
    """Refuse a result block whose preceding piece is not generated text ending in a tool's closing tag: RL
    appends a result only after a call (the format check fails a `<result>` with no call before it)."""
    if not before.endswith(TOOL_CLOSE_TAGS):  # also a block right after another block
        raise ValueError(f"{where}: a {RESULT_OPEN} block does not directly follow a tool call "
                         f"(one of {', '.join(TOOL_CLOSE_TAGS)}): after {before[-60:]!r} comes "
                         f"{block.strip()[:60]!r}; RL appends a tool result only after a call")


def _call_text(piece: str, close: re.Match) -> str:
    """The tool call `close` ends: from its opening tag (or 60 characters back) to the closing tag."""
    opening = piece.rfind(open_tag(close.group()[2:-1]), 0, close.start())
    return piece[opening if opening >= 0 else max(close.start() - 60, 0):close.end()]


class SequenceBatches:
    """Endless shuffled batches of token records with a resumable position."""

    def __init__(self, records: Sequence[dict], batch_size: int, seed: int = 0):
        if batch_size < 1:
            raise ValueError(f"SFT batch_size must be >= 1, got {batch_size}")
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

    @functools.cached_property
    def records_digest(self) -> str:
        """A hash of every record's tokens and mask, in order (computed once): a resume over other data
        with the same record count is refused."""
        digest = hashlib.blake2b(digest_size=8)
        for record in self.records:
            tokens, mask = np.asarray(record["tokens"], "<i8"), np.asarray(record["mask"], "<f4")
            digest.update(np.asarray([tokens.size, mask.size], "<i8").tobytes())
            digest.update(tokens.tobytes())
            digest.update(mask.tobytes())
        return digest.hexdigest()

    def state(self) -> dict[str, Any]:
        """JSON-able position, with what the batch order depends on (checked by `restore`)."""
        return {"epoch": self.epoch, "position": self.position, "num_records": len(self.records),
                "seed": self.seed, "batch_size": self.batch_size, "records_digest": self.records_digest}

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from a `state()`; refuses one taken over other records, seed or batch size, or a
        position this iterator never holds."""
        self._require_same_order(state)
        epoch, position = int(state["epoch"]), int(state["position"])
        # position == steps_per_epoch is the state after an epoch's last batch (`__next__` wraps it);
        # a larger one is never reached by an uninterrupted run, so it is refused rather than guessed at.
        if epoch < 0 or not 0 <= position <= self.steps_per_epoch:
            raise ValueError(f"SFT data state epoch={epoch}, position={position} is out of range "
                             f"({self.steps_per_epoch} steps per epoch of {len(self.records)} records in "
                             f"batches of {self.batch_size})")
        self.epoch, self.position = epoch, position

    def _require_same_order(self, state: dict[str, Any]) -> None:
        """Refuse a state saved over another record set, seed or batch size; warn when an older state
        lacks a key, so that it cannot be fully checked."""
        if state.get("num_records") != len(self.records):
            raise ValueError(f"checkpoint was taken over {state.get('num_records')} records, now {len(self.records)}")
        expected = {"seed": self.seed, "batch_size": self.batch_size, "records_digest": self.records_digest}
        differ = [f"{key} {state[key]!r} (now {value!r})" for key, value in expected.items()
                  if key in state and state[key] != value]
        if differ:
            raise ValueError(f"the SFT data state was saved with another batch order: {', '.join(differ)}; "
                             f"resume with the same sft.path records, seed and sft.batch_size, or start afresh "
                             f"(a records_digest also differs when this aepo_jax tokenises the records otherwise "
                             f"than the one that saved the state: since the thirty-second session's changes a "
                             f"<result> block is encoded as RL appends it)")
        missing = [key for key in expected if key not in state]
        if missing:
            warnings.warn(f"the SFT data state has no {', '.join(missing)} (saved by an older version): "
                          f"only its record count can be checked against this run", stacklevel=3)


class SFTTrainer(CheckpointedTrainer):
    """Supervised steps over `SequenceBatches`; same config layout as RL (`train`, `optim`, ...).

    `train()`, `restore_latest()`, `save()` and `close()` come from `CheckpointedTrainer`.
    """

    progress_name = "sft"

    def __init__(self, config: ml_collections.ConfigDict, workdir: str, *, batches: SequenceBatches,
                 graphdef: Any = None, params: Any = None, pad_id: int = 0, process_index: int = 0,
                 mesh: jax.sharding.Mesh | None = None):
        from aepo_jax.training.build import preset_from

        require_micro_batch_size(config)
        max_len = int(config.train.max_seq_len)
        too_long = [i for i, r in enumerate(batches.records) if len(r["tokens"]) > max_len]
        if too_long:
            longest = max(len(batches.records[i]["tokens"]) for i in too_long)
            raise ValueError(f"{len(too_long)} of {len(batches.records)} SFT records are longer than "
                             f"train.max_seq_len={max_len} (longest {longest} tokens, record {too_long[0]} first); "
                             f"raise --config.train.max_seq_len or shorten the records")
        self.config, self.batches, self.pad_id = config, batches, pad_id
        self.run: RunParts = build_run(config, graphdef, params, mesh=mesh)  # default: the config's mesh
        self.state = self.run.state
        self.row_multiple = row_multiple(config.train.micro_batch_size, self.run.mesh)
        step_cfg = step_config_from(config, preset_from(config), self.run.mesh)
        self._step = make_sft_train_step(self.run.graphdef, self.run.tx, step_cfg, self.run.schedule,
                                         state_sharding=self.run.state_sharding)
        self._open_outputs(workdir, process_index)

    def _data_position(self) -> dict:
        return self.batches.state()

    def _restore_data_position(self, position: dict) -> None:
        self.batches.restore(position)

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
