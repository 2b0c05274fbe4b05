"""Per-step metrics to `WORKDIR/metrics.jsonl`, the console and (optionally)
TensorBoard (DESIGN.md, Trainer). Only process 0 writes.

Every step goes to metrics.jsonl; the console gets a plain line every
`console_every` steps, written with `tqdm.write` so that it lands above a
progress bar instead of inside it. A NaN or infinite value is kept in
metrics.jsonl (as "nan" / "inf" / "-inf") and on the console, but not sent to
TensorBoard, whose writer warns about each one and can draw no point for it
(a step without branches has NaN branch statistics).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import warnings
from collections.abc import Mapping
from typing import Any, Self

import numpy as np

from aepo_jax.training.metric_keys import CONSOLE_KEYS, CONSOLE_WHEN_NONZERO

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
DEFAULT_CONSOLE_EVERY = 10  # steps between console lines; the progress bar shows every step
# Metrics that measure wall-clock time (and rates over it): the only ones two
# runs of one seeded config may differ in.
WALL_CLOCK_METRICS = frozenset({
    "rollout_s", "rollout_wait_s", "prepare_s", "train_s", "step_time_s", "tokens_per_s", "tools_s", "rollout/tool_seconds",
    "rollout/tool_call_seconds", "val_s",
})


NONFINITE_NAMES = ("nan", "inf", "-inf")  # how metrics.jsonl writes a NaN or infinite value


def nonfinite_name(number: float) -> str:
    """The name of a non-finite float ("nan", "inf" or "-inf"): strict JSON has no such numbers,
    and a null would hide that the value was NaN (a diverged loss) rather than missing."""
    if math.isnan(number):
        return "nan"
    return "inf" if number > 0 else "-inf"


def to_python_scalar(value: Any) -> Any:
    """jax / numpy scalars -> float or int; NaN and inf -> "nan" / "inf" / "-inf" (`nonfinite_name`:
    valid JSON that still says what the value was; `float()` reads them back)."""
    if isinstance(value, (bool, str)) or value is None:
        return value
    if isinstance(value, (int, np.integer)):
        return int(value)
    array = np.asarray(value)
    if array.ndim != 0:
        raise ValueError(f"metric values must be scalars, got shape {array.shape}")
    if np.issubdtype(array.dtype, np.integer):
        return int(array)
    number = float(array)
    return number if math.isfinite(number) else nonfinite_name(number)


def set_aside_earlier_attempt(workdir: str, stamp: str | None = None) -> list[str]:
    """Move WORKDIR's metrics.jsonl and tensorboard/ to `metrics.abandoned-<stamp>.jsonl` and
    `tensorboard.abandoned-<stamp>`; returns the new paths (none when there was nothing to move).

    For a fresh start (not `--resume`) in a workdir where an earlier attempt at the run died before
    its first complete checkpoint (`launch.run_setup.prepare_workdir` allows that start). The logger
    appends, so without this the new run's steps 1, 2, ... would follow the dead attempt's records
    in one file and one curve. Moved rather than deleted (as `keep_through(0)` would): the dead
    attempt's records may be what tells why it died. `stamp` defaults to the local time.
    """
    stamp = stamp or time.strftime("%Y%m%d-%H%M%S")
    moved = []
    for name, aside in ((METRICS_FILE, "metrics.abandoned-{}.jsonl"), (TENSORBOARD_DIR, "tensorboard.abandoned-{}")):
        source = os.path.join(workdir, name)
        if not os.path.exists(source):
            continue
        target, copy = os.path.join(workdir, aside.format(stamp)), 1
        while os.path.exists(target):  # two restarts within one second
            copy += 1
            target = os.path.join(workdir, aside.format(f"{stamp}-{copy}"))
        os.replace(source, target)
        moved.append(target)
    return moved


def _open_tensorboard(logdir: str, purge_step: int | None = None) -> Any | None:
    """A SummaryWriter from tensorboardX or torch if either is importable. With `purge_step`, the
    writer first records that TensorBoard must hide the events of earlier files at that step and after
    (both writers' `purge_step`): a resumed run logs those steps again."""
    # Both writers name a file by the second it opened in and open it for writing: a second writer in
    # the same second (this purge, a quick restart) would overwrite the first's file. The nanosecond
    # suffix keeps each its own file, named in the order TensorBoard must read them.
    suffix = f".{time.time_ns()}"
    for module in ("tensorboardX", "torch.utils.tensorboard"):
        try:
            writer_module = __import__(module, fromlist=["SummaryWriter"])
            return writer_module.SummaryWriter(logdir, purge_step=purge_step, filename_suffix=suffix)
        except Exception:  # noqa: BLE001, S112 - TensorBoard is optional.
            continue
    return None


class MetricsLogger:
    """Appends one JSON object per step; a compact console line every `console_every` steps."""

    def __init__(self, workdir: str, console: bool = True, tensorboard: bool = True, process_index: int = 0,
                 console_every: int = DEFAULT_CONSOLE_EVERY):
        if console_every < 1:
            raise ValueError(f"console_every must be >= 1, got {console_every}")
        self.active = process_index == 0
        self.path = os.path.join(workdir, METRICS_FILE)
        self.console = console and self.active
        self.console_every = int(console_every)
        self._file = None
        self._tb = None
        self._tb_dir = os.path.join(workdir, TENSORBOARD_DIR)
        if self.active:
            os.makedirs(workdir, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
            if tensorboard:
                self._tb = _open_tensorboard(self._tb_dir)
                if self._tb is None:
                    warnings.warn("log.tensorboard is on but no TensorBoard writer imports (tensorboardX, or torch "
                                  "with tensorboard): metrics go to metrics.jsonl only; pip install "
                                  "'aepo-jax[tensorboard]' or set log.tensorboard=False", stacklevel=2)

    @property
    def has_tensorboard(self) -> bool:
        return self._tb is not None

    def log(self, step: int, metrics: Mapping[str, Any], console: bool | None = None) -> dict[str, Any]:
        """Record `metrics` for `step`; returns the JSON-ready record.

        `console` forces (True) or suppresses (False) the console line; None
        writes it when `step` is a multiple of `console_every`.
        """
        record = {"step": int(step)}
        record.update({k: to_python_scalar(v) for k, v in metrics.items() if k != "step"})
        if not self.active:
            return record
        self._file.write(json.dumps(record, sort_keys=False) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())  # a mounted bucket (gcsfuse) uploads on fsync or close: a preempted
        # host would otherwise lose every record since the run started
        if self._tb is not None:  # finite numbers only (module docstring); `to_python_scalar` named the others
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._tb.add_scalar(key, float(value), record["step"])
        if self.console and (step % self.console_every == 0 if console is None else console):
            write_console_line(format_console_line(record))
        return record

    def keep_through(self, step: int) -> int:
        """Drop the records after `step` (a resumed run repeats them) and a last line cut short (a
        preempted write); returns how many lines were dropped. The file is replaced whole, atomically.
        TensorBoard's writer is reopened to purge the steps after `step` from its view likewise (its
        event files are append-only: the replayed steps would otherwise show twice)."""
        if not self.active:
            return 0
        if self._tb is not None:
            self._tb.close()
            self._tb = _open_tensorboard(self._tb_dir, purge_step=int(step) + 1)
        self._file.close()
        with open(self.path, encoding="utf-8") as f:
            lines = f.read().splitlines()
        kept = []
        for number, line in enumerate(lines):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                if number == len(lines) - 1:
                    continue  # the last write was cut short
                raise ValueError(f"{self.path}: line {number + 1} is not a JSON record: {line[:80]!r}") from None
            if int(record["step"]) <= step:
                kept.append(line)
        temporary = self.path + ".tmp"
        with open(temporary, "w", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in kept))
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, self.path)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        return len(lines) - len(kept)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def format_console_line(record: Mapping[str, Any]) -> str:
    """`step 3 | loss 0.123 | reward_mean 0.5 | ...` with the headline metrics (a NaN or inf one
    as `loss nan`), then the `CONSOLE_WHEN_NONZERO` warnings that are not zero (`skipped_updates 1`)."""
    parts = [f"step {record['step']}"]
    for key in CONSOLE_KEYS:
        value = record.get(key)
        if isinstance(value, float):
            parts.append(f"{key} {value:.4g}")
        elif isinstance(value, int) or value in NONFINITE_NAMES:
            parts.append(f"{key} {value}")
    for key in CONSOLE_WHEN_NONZERO:
        value = record.get(key)
        if isinstance(value, (int, float)) and value != 0:
            parts.append(f"{key} {value:g}")
    return " | ".join(parts)


def write_console_line(line: str) -> None:
    """Print `line` to stdout above any active tqdm bar (the bar is cleared and redrawn)."""
    from tqdm import tqdm

    tqdm.write(line, file=sys.stdout)
    sys.stdout.flush()


def without_wall_clock(record: Mapping[str, Any]) -> dict[str, Any]:
    """`record` less its `WALL_CLOCK_METRICS`: what a seeded run must repeat exactly."""
    return {key: value for key, value in record.items() if key not in WALL_CLOCK_METRICS}


def read_metrics(workdir_or_file: str) -> list[dict[str, Any]]:
    """All records of a run's metrics.jsonl (a run directory's, or a .jsonl file), in order; a
    FileNotFoundError naming the metrics.jsonl path it looked for."""
    path = workdir_or_file
    if os.path.isdir(path) or not path.endswith(".jsonl"):  # a run directory, there or not
        path = os.path.join(path, METRICS_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no metrics file at {path}")
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
