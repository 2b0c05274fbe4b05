"""What a resumed run may change in its config, and the check that refuses the rest.

A resumed run restores the state a config trained; a different learning rate, objective, reward or
rollout setting would silently mix two experiments in one curve (and the run's config.json, which
evaluation rebuilds the run from, would then describe neither). Settings that say where files are,
how the work is laid out or logged, or how long to run may change: they leave the maths alone. The
run's length is the exception when the lr schedule decays over it (`lr_schedule_follows_run_length`).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Mapping
from typing import Any

# The run's length: may change (run longer) only while the lr schedule does not follow it
# (`lr_schedule_follows_run_length`).
RUN_LENGTH_KEYS: tuple[str, ...] = ("total_steps", "train.total_steps")

# Dotted keys a resumed run may set differently: a trailing "." covers a whole section, a key without
# one is that key alone (`distributed` is a plain string, not a section).
RESUME_MAY_CHANGE: tuple[str, ...] = (
    *RUN_LENGTH_KEYS,  # run longer (a decaying lr schedule refuses it: `check_resume_config`)
    "log.", "checkpoint.", "verbose_logs", "validation.",  # logging, saving and held-out validation
    "distributed",  # how the processes start (auto: launch.train; on: tpu_vm.sh, gpu_multi.sh)
    "mesh.",  # the layout: orbax reshards the state, the data position is global
    "train.micro_batch_size", "train.compilation_cache_dir",  # the same update, in pieces / compiled once
    "model.attention", "model.remat", "model.logits_chunk_size",  # the same maths, other kernels or memory
    "rollout.tool_concurrency", "rollout.python_preload", "rollout.background_compile", "rollout.layerwise_decode",
    "rollout.sampler_weights",
    # Where files are: a bucket mounted elsewhere (a data file's contents name its prepared copy).
    "data.path", "data.corpus_path", "data.search_url", "tokenizer.path", "model.checkpoint_dir",
    "model.gguf_path", "sft.path",
    "sft.steps",  # an SFT run extended, as total_steps for RL
)


# Settings a run fixes when it starts (`experiment_init.pin_init_checkpoint`), each with the setting it was
# fixed for: a resumed run whose config leaves one unset takes the saved value while that other setting is
# the saved one too. `model.init_checkpoint` itself may not change either: its parameters are the run's
# reference model (with --allow_config_changes and another one, the step is chosen again).
FIXED_AT_START: dict[str, str] = {"model.init_checkpoint_step": "model.init_checkpoint"}


def read_saved_config(path: str) -> dict[str, Any]:
    """The JSON object a run saved at `path` (its config.json, sources.json); `error: ...` (SystemExit) naming
    the file when it is no JSON object (cut short by a full disk, edited by hand, a folder): a resume checks
    its settings against it, and a JSON traceback said neither which file nor what to do."""
    try:
        with open(path, encoding="utf-8") as f:
            saved = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        problem = f"cannot be read as JSON ({type(err).__name__}: {err})"
    else:
        if isinstance(saved, dict):
            return saved
        problem = f"holds a JSON {type(saved).__name__}, not an object"
    raise SystemExit(f"error: --resume: the run's saved {os.path.basename(path)} {path} {problem}. A resume checks "
                     "against it: put back a good copy (a *.before-resume-*.json beside it is the one an "
                     "earlier resume replaced), or move it away and pass --allow_config_changes to continue "
                     "under the given settings unchecked")


def keep_fixed_settings(cfg: Any, run_dir: str) -> None:
    """Give each `FIXED_AT_START` setting that `cfg` leaves unset (None) the value RUN_DIR/config.json saved."""
    path = os.path.join(run_dir, "config.json")
    if not os.path.exists(path):
        return
    saved = flatten(read_saved_config(path))
    current = flatten(json.loads(cfg.to_json_best_effort()))
    for key, fixed_for in FIXED_AT_START.items():
        if current.get(key) is not None or saved.get(key) is None or current.get(fixed_for) != saved.get(fixed_for):
            continue
        section, name = key.rsplit(".", 1)
        node = cfg
        for part in section.split("."):
            node = node[part]
        with cfg.unlocked():
            node[name] = saved[key]


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a.b": value} for every leaf of a nested mapping."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, dotted + "."))
        else:
            out[dotted] = value
    return out


def may_change(key: str) -> bool:
    return any(key == allowed or (allowed.endswith(".") and key.startswith(allowed)) for allowed in RESUME_MAY_CHANGE)


def lr_schedule_follows_run_length(config: Mapping[str, Any]) -> bool:
    """Whether the config's lr schedule changes with `train.total_steps`.

    The schedule spans `train.total_steps` x the updates of one step (`training.build.build_run`):
    `cosine` and `linear` decay to their end there, so a resumed run with another length would
    continue on another curve and its lr would jump. `constant` does not depend on it, with or
    without warm-up (the warm-up ends at `optim.warmup_steps` whatever the length;
    `training.optimizer.learning_rate_schedule`). An SFT run's config holds its resolved
    `sft.*` values in `train` / `optim` (`experiment_sft.sft_config_from`), so the same test holds.
    """
    schedule = config.get("optim", {}).get("schedule", "constant")
    return schedule != "constant"


def config_changes(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """(key, saved value, current value) for every leaf that differs. A key the saved config lacks is
    no change: the run was saved by code that had no such setting (its value is the code's default);
    a key the current config lacks is one (None)."""
    before, after = flatten(saved), flatten(current)
    return [(key, before.get(key), after.get(key)) for key in sorted(before.keys() | after.keys())
            if key in before and before.get(key) != after.get(key)]


def check_resume_config(run_dir: str, current: Mapping[str, Any], allow_changes: bool, keep_old: bool = True
                        ) -> list[str]:
    """Compare the config of a resumed run with the one RUN_DIR/config.json saved (every process runs it,
    so all stop alike).

    Differences outside `RESUME_MAY_CHANGE` stop the run (SystemExit naming each key, old -> new) unless
    `allow_changes`; so does a missing config.json (nothing to check against). A `model.vocab_size` the run
    has not filled in yet (None: the tokenizer's, set later)
    is not a difference. When anything differs and `keep_old` (the first process), the saved config is
    copied to RUN_DIR/config.before-resume-<time>.json before the run writes its own. Returns the keys
    that differ.
    """
    path = os.path.join(run_dir, "config.json")
    if not os.path.exists(path):
        if not allow_changes:
            raise SystemExit(f"--resume: {path} is missing, so the settings the run trained under cannot be "
                             "checked against these; put it back, or pass --allow_config_changes to continue "
                             "under these settings")
        if keep_old:
            print(f"--resume: {path} is missing; continuing under the given settings unchecked", flush=True)
        return []
    saved = read_saved_config(path)
    changes = [(key, old, new) for key, old, new in config_changes(saved, current)
               if not (key == "model.vocab_size" and new is None)]
    schedule_follows = lr_schedule_follows_run_length(saved)
    refused = [(key, old, new) for key, old, new in changes
               if not may_change(key) or (key in RUN_LENGTH_KEYS and schedule_follows)]
    if refused and not allow_changes:
        lines = "\n".join(f"  {key}: {old!r} -> {new!r}{_why_refused(key, saved)}" for key, old, new in refused)
        raise SystemExit(f"--resume: the config differs from the run's {path} in settings that change what "
                         f"it trains:\n{lines}\nresume with the run's settings, or pass --allow_config_changes "
                         "to continue under the new ones (the old config is kept beside it)")
    known = flatten(saved)
    newer = {key: value for key, value in flatten(current).items() if key not in known}
    if newer and keep_old:  # not a change, but not what the run was saved under either: say so
        print(f"--resume: settings newer than {path}, taken as given: {newer}", flush=True)
    if changes and keep_old:
        shutil.copy2(path, os.path.join(run_dir, f"config.before-resume-{time.strftime('%Y%m%d-%H%M%S')}.json"))
    return [key for key, _, _ in changes]


def write_run_sources(run_dir: str, cfg: Any) -> None:
    """RUN_DIR/sources.json: the fingerprints of the files the run starts from (`aepo_jax.run_sources`)."""
    from aepo_jax.atomic_write import write_json_atomically
    from aepo_jax.run_sources import SOURCES_FILE, run_source_fingerprints

    write_json_atomically(os.path.join(run_dir, SOURCES_FILE), run_source_fingerprints(cfg))


def check_run_sources(run_dir: str, cfg: Any, allow_changes: bool, keep_old: bool = True) -> list[str]:
    """Compare the files a resumed run reads its weights and data from with the fingerprints the run saved
    when it started (RUN_DIR/sources.json; `aepo_jax.run_sources`): other contents stop the run (SystemExit
    naming each source) unless `allow_changes`. Paths may differ; a source whose path is missing now is left
    to whatever reads it. With `keep_old` (the first process) a run saved without the file gets one, and
    accepted changes replace it, the old one kept as sources.before-resume-<time>.json. Returns one line per
    difference."""
    from aepo_jax.run_sources import (
        SOURCES_FILE,
        run_source_fingerprints,
        run_source_paths,
        source_differences,
    )

    path = os.path.join(run_dir, SOURCES_FILE)
    if not os.path.exists(path):  # saved by code that kept no fingerprints: nothing to check against
        if keep_old:
            write_run_sources(run_dir, cfg)
        return []
    saved = read_saved_config(path)
    missing = {key for key, source in run_source_paths(cfg).items() if not os.path.exists(source)}
    differences = source_differences({key: value for key, value in saved.items() if key not in missing},
                                     run_source_fingerprints(cfg))
    if differences and not allow_changes:
        lines = "\n".join(f"  {line}" for line in differences)
        raise SystemExit(f"--resume: the files the run started from ({path}) are not the ones these settings "
                         f"read:\n{lines}\nA resumed run reads the same weights and data (their paths may "
                         "change): point these keys at the run's files, or pass --allow_config_changes to "
                         "continue with these (the old fingerprints are kept beside them)")
    if differences and keep_old:
        print("--resume: other source files accepted: " + "; ".join(differences), flush=True)
        shutil.copy2(path, os.path.join(run_dir, f"sources.before-resume-{time.strftime('%Y%m%d-%H%M%S')}.json"))
        write_run_sources(run_dir, cfg)
    return differences


def _why_refused(key: str, saved: Mapping[str, Any]) -> str:
    """The reason a key that usually may change is refused, for the error line; "" for the rest."""
    if key not in RUN_LENGTH_KEYS:
        return ""
    return (f" (optim.schedule={saved['optim']['schedule']!r} decays over the run's length: the resumed "
            "run's learning rate would jump to another curve; only a constant schedule lets a run grow)")
