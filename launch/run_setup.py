"""Shared start-up of `launch.train` and `launch.sft`: print and save the
resolved config, and refuse to mix a new run into an old workdir."""

from __future__ import annotations

import json
import os

import ml_collections


def prepare_workdir(cfg: ml_collections.ConfigDict, workdir: str, resume: bool, process_index: int = 0) -> str:
    """Create WORKDIR, print the config, write WORKDIR/config.json; returns its path.

    Without `resume`, a workdir that already holds checkpoints is an error, so
    a run never silently trains on top of (or next to) another one.
    """
    checkpoints = os.path.join(workdir, "checkpoints")
    if not resume and os.path.isdir(checkpoints) and any(name.isdigit() for name in os.listdir(checkpoints)):
        raise SystemExit(f"{workdir} already has checkpoints; pass --resume to continue that run "
                         "or choose another --workdir")
    path = os.path.join(workdir, "config.json")
    if process_index == 0:
        os.makedirs(workdir, exist_ok=True)
        print("resolved config:\n" + str(cfg), flush=True)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(json.loads(cfg.to_json_best_effort()), f, indent=2, sort_keys=True)
    return path
