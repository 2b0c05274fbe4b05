"""Per-device memory of the real train step and scoring pass, compiled ahead of time for a TPU slice.

For each paper config this builds the programs training runs (the flat RL
train step of `make_rl_train_step` and the scorer of `make_logprob_fn`, both
from the config through `aepo_jax.training.build`) over abstract parameters
(`nnx.eval_shape`) and `ShapeDtypeStruct` batches that carry the mesh
shardings of the logical-axis rules, compiles them for a simulated TPU v5p
topology (`jax.experimental.topologies`, needs the `libtpu` wheel; no TPU
is touched) and prints what the TPU compiler plans per device:
`compiled.memory_analysis()` argument, temporary and total bytes against the
chip's HBM, and the compile seconds. One micro-batch = one row of
`train.max_seq_len` tokens per data-parallel device.

    make memory-plan        # its own venv with libtpu; writes runs/memory_plan.json
    .venv-tpu/bin/python benchmarks/memory_plan.py --json OUT [--config aepo_qwen3_14b:v5:4x4x4] [--layers 2]

`--platform cpu` compiles the same programs for this machine's (fake) CPU
devices: shapes and shardings only, the CPU compiler's byte counts are not a
TPU plan (the smoke test uses it).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import jax

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # configs/ lives at the repository root

GIB = 1024**3
V5P_HBM_BYTES = 95 * GIB  # per v5p chip
DEFAULT_PLANS = ("aepo_qwen3_14b:v5:2x4x4", "aepo_qwen2_5_7b:v5:2x4x4")


def tpu_devices(topology: str) -> list[Any]:
    """Devices of a simulated v5p slice, e.g. "v5:2x4x4" (32 chips) or "v5:4x4x4" (64)."""
    from jax.experimental import topologies

    desc = topologies.get_topology_desc(
        platform="tpu", topology_name=topology, chip_config_name="megacore",
        chips_per_host_bounds=(2, 2, 1), num_slices=1, wrap=(False, False, False),
    )
    return list(desc.devices)


def load_config(name: str) -> Any:
    """The ConfigDict of `configs/<name>.py`."""
    return importlib.import_module(f"configs.{name}").get_config()


def model_config_of(cfg: Any, layers: int | None) -> Any:
    """The run's `ModelConfig`; `layers` overrides its depth (quick or extrapolated plans)."""
    from aepo_jax.training.build import model_config_from

    model_config = model_config_from(cfg)
    return model_config if layers is None else model_config.replace(n_layers=layers)


def abstract_batch(cfg: Any, rows: int, mesh: Any) -> dict[str, jax.ShapeDtypeStruct]:
    """ShapeDtypeStructs of a flat padded batch of `rows` full-length rows (the real batch builder's keys)."""
    from aepo_jax.parallel import batch_sharding
    from aepo_jax.training.batch import pad_sequences

    length = int(cfg.train.max_seq_len)
    sequence = {"tokens": [0] * length, "mask": [1.0] * length, "logp_old": [0.0] * length, "advantages": 0.0}
    if float(cfg.objective.get("kl_coef", 0.0)) > 0:
        sequence["logp_ref"] = [0.0] * length
    host = pad_sequences([sequence], max_len=length, row_multiple=rows)
    return {key: jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=batch_sharding(mesh, value.ndim))
            for key, value in host.items()}


def build_programs(cfg: Any, mesh: Any, layers: int | None) -> dict[str, tuple[Any, tuple[Any, ...]]]:
    """{"train_step": (jitted, abstract args), "score": ...} for `cfg` on `mesh`, from the real builders."""
    from aepo_jax.training.build import (
        abstract_model,
        data_parallel_size,
        preset_from,
        step_config_from,
    )
    from aepo_jax.training.optimizer import optimizer_from_config
    from aepo_jax.training.train_state import TrainState, train_state_shardings
    from aepo_jax.training.train_step import make_logprob_fn, make_rl_train_step

    graphdef, params = abstract_model(model_config_of(cfg, layers))
    rows = data_parallel_size(mesh)  # one sequence per data-parallel device: one micro-batch
    step_config = dataclasses.replace(step_config_from(cfg, preset_from(cfg)), micro_batch_size=rows)
    tx, schedule = optimizer_from_config(cfg, int(cfg.train.total_steps))
    state = jax.eval_shape(lambda p: TrainState.create(p, tx, seed=0), params)
    state_sharding = train_state_shardings(state, tx, mesh)
    state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state, state_sharding)
    batch = abstract_batch(cfg, rows, mesh)
    batch_sharding = {key: value.sharding for key, value in batch.items()}
    train = make_rl_train_step(graphdef, tx, step_config, schedule, state_sharding, batch_sharding)
    score_batch = {k: v for k, v in batch.items() if k in ("input_ids", "positions", "valid")}
    score = make_logprob_fn(graphdef, step_config, {k: batch_sharding[k] for k in score_batch})
    return {"train_step": (train, (state, batch)), "score": (score, (state.params, score_batch))}


def plan_rows(cfg_name: str, topology: str, platform: str, layers: int | None, programs: list[str],
              hbm_bytes: int, seq_len: int | None = None, attention: str | None = None) -> list[dict[str, Any]]:
    """Compiles every program of one config for one topology and returns its memory rows."""
    from aepo_jax.parallel import make_mesh

    cfg = load_config(cfg_name)
    if seq_len is not None:
        cfg.train.max_seq_len = seq_len
    if attention is not None:
        cfg.model.attention = attention
    devices = tpu_devices(topology) if platform == "tpu" else jax.devices()
    mesh = make_mesh(dict(cfg.mesh.shape), devices=devices)
    mesh_text = "x".join(f"{axis}{size}" for axis, size in mesh.shape.items())
    rows = []
    built = build_programs(cfg, mesh, layers)  # outside set_mesh: nnx.eval_shape would apply logical names to it
    with jax.set_mesh(mesh):
        for program in programs:
            fn, args = built[program]
            start, start_cpu = time.perf_counter(), time.process_time()
            compiled = fn.lower(*args).compile()
            seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - start_cpu
            memory = compiled.memory_analysis()
            argument = int(memory.argument_size_in_bytes)
            temp = int(memory.temp_size_in_bytes)
            # Outputs alias donated arguments (the train state); count only what does not.
            output = max(0, int(memory.output_size_in_bytes) - int(memory.alias_size_in_bytes))
            rows.append({
                "config": cfg_name, "topology": topology if platform == "tpu" else f"cpu:{len(devices)}",
                "mesh": mesh_text, "program": program,
                "n_layers": model_config_of(cfg, layers).n_layers, "seq_len": int(cfg.train.max_seq_len),
                "rows": math.prod(mesh.shape[a] for a in ("data", "fsdp")),
                "remat": cfg.model.get("remat", "none"), "logits_chunk_size": cfg.model.get("logits_chunk_size"),
                "attention": model_config_of(cfg, layers).attention,
                "argument_bytes": argument, "output_bytes": output, "temp_bytes": temp,
                "per_device_bytes": argument + output + temp, "hbm_bytes": hbm_bytes,
                "compile_seconds": round(seconds, 1),
                "compile_cpu_seconds": round(cpu_seconds, 1),  # all threads; wall time depends on the machine's load
            })
            print_row(rows[-1])
    return rows


def print_row(row: dict[str, Any]) -> None:
    fits = "fits" if row["per_device_bytes"] <= 0.9 * row["hbm_bytes"] else "DOES NOT FIT"
    print(f"{row['config']:>16} {row['topology']:>9} {row['mesh']:>22} {row['program']:>10} L{row['n_layers']:<3}"
          f" {row['attention']:>6}"
          f" arg {row['argument_bytes'] / GIB:7.2f} GiB  temp {row['temp_bytes'] / GIB:7.2f} GiB"
          f"  total {row['per_device_bytes'] / GIB:7.2f} / {row['hbm_bytes'] / GIB:.0f} GiB ({fits})"
          f"  compile {row['compile_seconds']:6.1f} s ({row['compile_cpu_seconds']:.0f} s CPU)", flush=True)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", action="append", default=None,
                        help="CONFIG[:TOPOLOGY] (configs/CONFIG.py; default topology v5:2x4x4); repeatable")
    parser.add_argument("--programs", default="train_step,score")
    parser.add_argument("--layers", type=int, default=None, help="override n_layers (quick or extrapolated plans)")
    parser.add_argument("--seq-len", type=int, default=None, help="override train.max_seq_len")
    parser.add_argument("--platform", choices=("tpu", "cpu"), default="tpu")
    parser.add_argument("--attention", choices=("dense", "splash", "cudnn"), default=None,
                        help="override model.attention (default: the config's; the paper configs use splash)")
    parser.add_argument("--hbm-gib", type=float, default=95.0, help="HBM per chip (v5p: 95)")
    parser.add_argument("--json", default=None, help="write the rows here")
    args = parser.parse_args(argv)
    programs = [p for p in args.programs.split(",") if p]
    unknown = sorted(set(programs) - {"train_step", "score"})
    if unknown:
        parser.error(f"unknown programs {unknown}; known: train_step, score")
    rows = []
    for spec in args.config or list(DEFAULT_PLANS):
        name, _, topology = spec.partition(":")
        rows += plan_rows(name, topology or "v5:2x4x4", args.platform, args.layers, programs, int(args.hbm_gib * GIB),
                          args.seq_len, args.attention)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return rows


if __name__ == "__main__":
    main()
