"""Per-device memory of the real train step and scoring pass, compiled ahead of time for a TPU slice.

For each paper config this builds the programs training runs (the tree-packed
step and scorer of `make_train_step_for_pack` / `make_logprob_fn_for_pack`,
which `train.pack="tree"` runs, at the largest mini-batch the trainer can hand
them, `tree_batch_shape`; the flat step of `make_rl_train_step` and scorer of
`make_logprob_fn`, `pack="flat"`, at a whole mini-batch; all
from the config through `aepo_jax.training.build`) over abstract parameters
(`nnx.eval_shape`) and `ShapeDtypeStruct` batches that carry the mesh
shardings of the logical-axis rules, compiles them for a simulated TPU v5p
topology (`jax.experimental.topologies`, needs the `libtpu` wheel; no TPU
is touched) and prints what the TPU compiler plans per device:
`compiled.memory_analysis()` argument, temporary and total bytes against the
chip's HBM, and the compile seconds. It also plans the rollout
sampler's programs at the config's rollout shape (`build_sampler_programs`; on
weight replicas, as `parallel.host_rollout` runs them with several hosts or
fsdp > 1, on one host's rollout mesh with that host's rows) and the
per-rollout copy of the weights to the replicas (`rollout_params_copy`).

    make memory-plan        # its own venv with libtpu; writes runs/memory_plan.json
    .venv-tpu/bin/python benchmarks/memory_plan.py --json OUT [--config aepo_qwen3_14b:v5:4x4x4] [--layers 2]

`--platform cpu` compiles the same programs for this machine's (fake) CPU
devices: shapes and shardings only, the CPU compiler's byte counts are not a
TPU plan (the smoke test uses it).
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import re
import sys
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # configs/ lives at the repository root

GIB = 1024**3
V5P_HBM_BYTES = 95 * GIB  # per v5p chip
SAMPLER_PROGRAMS = ("sampler_prefill", "sampler_decode", "sampler_decode_rows", "sampler_append_rows", "sampler_grow",
                    "sampler_shrink")
# The program that copies the trainer's parameters to every host's rollout mesh (`parallel.host_rollout`);
# planned only where the rollout samples on replicas.
COPY_PROGRAM = "rollout_params_copy"
PROGRAMS = ("train_step", "tree_train_step", "score", "tree_score", *SAMPLER_PROGRAMS, COPY_PROGRAM)
# (config, topology, programs) of `make memory-plan`: every program on 32 chips, and the samplers and the
# copy on the 64-chip slice as well. On a slice of several hosts the samplers are planned per host (one
# host's rollout mesh and share of the rows: docs/scaling.md, "Rollouts per host").
DEFAULT_PLANS = (
    ("aepo_qwen3_14b", "v5:2x4x4", PROGRAMS),
    ("aepo_qwen3_14b", "v5:4x4x4", (*SAMPLER_PROGRAMS, COPY_PROGRAM)),
    ("aepo_qwen2_5_7b", "v5:2x4x4", PROGRAMS),
    ("aepo_qwen2_5_7b", "v5:4x4x4", (*SAMPLER_PROGRAMS, COPY_PROGRAM)),
)


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


def tree_batch_shape(cfg: Any, mesh: Any, hosts: int) -> tuple[int, int, int]:
    """`(M, R, B)` of the largest tree-packed mini-batch the trainer can build for `cfg` on `mesh`, `R`
    and `B` summed over the `hosts` processes (the global array's rows).

    Per process (`RLTrainer._batch` -> `pack_mini_batch`): its share of the mini-batch's prompts x `k`
    sequences, micro-batches of at most `micro_batch_rows_cap` packed rows (enforced there), a micro-batch
    per sequence at most (no sequence is cut) and every sequence in one micro-batch at most, each bucketed
    (`buckets.bucket_size`); `agree_batch_shapes` then pads every process to the largest of each, so all
    three maxima can meet in one step."""
    from aepo_jax.parallel.multihost import local_share
    from aepo_jax.training.build import (
        data_parallel_size,
        local_micro_batch_rows,
        preset_from,
        step_config_from,
    )
    from aepo_jax.training.packing.buckets import bucket_size
    from aepo_jax.training.packing.trainer_batches import micro_batch_rows_cap

    data_parallel = data_parallel_size(mesh)
    local_dp = local_share(data_parallel, hosts, "the mesh's data x fsdp devices")
    sequences = local_share(int(cfg.train.mini_batch_prompts), hosts, "train.mini_batch_prompts") * int(cfg.rollout.k)
    micro = step_config_from(cfg, preset_from(cfg), mesh).micro_batch_size
    rows_per_micro = max(local_micro_batch_rows(micro, local_dp, data_parallel), local_dp)
    length = int(cfg.train.max_seq_len)
    row_len = int(cfg.train.get("row_len") or length)
    rows = bucket_size(micro_batch_rows_cap(rows_per_micro, length, row_len, local_dp), local_dp)
    return bucket_size(sequences), rows * hosts, bucket_size(sequences, local_dp) * hosts


def build_programs(cfg: Any, mesh: Any, layers: int | None, hosts: int = 1) -> dict[str, tuple[Any, tuple[Any, ...]]]:
    """{"train_step": (jitted, abstract args), ...} for `cfg` on `mesh`, from the real builders, at the
    largest mini-batch a run hands them: "tree_train_step" and "tree_score" (the `train.pack="tree"`
    step and scorer the paper configs run) at `tree_batch_shape`, "train_step" and "score" (the
    `pack="flat"` ones) at a whole mini-batch of `mini_batch_prompts x k` rows in micro-batches of the
    step's `micro_batch_size` (so both steps run their gradient-accumulation scan)."""
    from aepo_jax.training.build import (
        abstract_model,
        data_parallel_size,
        preset_from,
        step_config_from,
    )
    from aepo_jax.training.optimizer import optimizer_from_config
    from aepo_jax.training.packing import (
        make_logprob_fn_for_pack,
        make_train_step_for_pack,
    )
    from aepo_jax.training.train_state import TrainState, train_state_shardings
    from aepo_jax.training.train_step import make_logprob_fn, make_rl_train_step

    graphdef, params = abstract_model(model_config_of(cfg, layers))
    step_config = step_config_from(cfg, preset_from(cfg), mesh)  # as the trainer builds it
    multiple = math.lcm(step_config.micro_batch_size, data_parallel_size(mesh))
    rows = -(-int(cfg.train.mini_batch_prompts) * int(cfg.rollout.k) // multiple) * multiple
    tx, schedule = optimizer_from_config(cfg, int(cfg.train.total_steps))
    state = jax.eval_shape(lambda p: TrainState.create(p, tx, seed=0), params)
    state_sharding = train_state_shardings(state, tx, mesh)
    state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state, state_sharding)
    batch = abstract_batch(cfg, rows, mesh)
    batch_sharding = {key: value.sharding for key, value in batch.items()}
    train = make_rl_train_step(graphdef, tx, step_config, schedule, state_sharding, batch_sharding)
    score_batch = {k: v for k, v in batch.items() if k in ("input_ids", "positions", "valid")}
    score = make_logprob_fn(graphdef, step_config, {k: batch_sharding[k] for k in score_batch})
    flat_meta = {"rows": rows, "micro_batch_rows": step_config.micro_batch_size, "seq_len": int(cfg.train.max_seq_len)}
    micro_batches, packed_rows, flat_rows = tree_batch_shape(cfg, mesh, hosts)
    tree_train = make_train_step_for_pack(graphdef, tx, step_config, "tree", schedule, state_sharding)
    tree_score = make_logprob_fn_for_pack(graphdef, step_config, "tree", mesh)
    tree_batch = abstract_tree_batch(cfg, micro_batches, packed_rows, flat_rows, mesh)
    tree_meta = {"rows": packed_rows, "micro_batches": micro_batches, "flat_rows": flat_rows,
                 "seq_len": int(cfg.train.max_seq_len)}
    return {"train_step": (train, (state, batch), {}, flat_meta),
            "tree_train_step": (tree_train, (state, tree_batch), {}, tree_meta),
            "score": (score, (state.params, score_batch), {}, flat_meta),
            "tree_score": (tree_score, (state.params, tree_batch), {}, tree_meta)}


def abstract_tree_batch(cfg: Any, micro_batches: int, packed_rows: int, flat_rows: int,
                        mesh: Any) -> dict[str, jax.ShapeDtypeStruct]:
    """ShapeDtypeStructs of a tree-packed mini-batch (`[M, R, T]` packed rows of `train.max_seq_len`
    slots, `[M, B, T]` flat rows), with the real batch builder's keys and the trainer's row sharding."""
    from aepo_jax.training.packing import build_train_batch
    from aepo_jax.training.packing.trainer_batches import rows_sharding

    sequence = {"tokens": [1, 2, 3, 4], "mask": [0.0, 0.0, 1.0, 1.0], "logp_old": [0.0] * 4, "advantages": 0.0}
    if float(cfg.objective.get("kl_coef", 0.0)) > 0:
        sequence["logp_ref"] = [0.0] * 4
    tiny, _ = build_train_batch([sequence, sequence], "tree", group_ids=[0, 0], length=8, bucket=False)
    length, sharding = int(cfg.train.max_seq_len), rows_sharding("tree", mesh)

    def shape(key: str) -> tuple[int, ...]:
        if key == "sequence_index":
            return (micro_batches, flat_rows)
        return (micro_batches, packed_rows if key.startswith("packed_") else flat_rows, length)

    return {key: jax.ShapeDtypeStruct(shape(key), value.dtype, sharding=sharding) for key, value in tiny.items()}


def build_sampler_programs(cfg: Any, mesh: Any, layers: int | None, hosts: int = 1,
                           replicas: bool = False) -> dict[str, tuple[Any, tuple[Any, ...], dict]]:
    """{"sampler_prefill": ..., "sampler_decode": ..., "sampler_decode_rows": ..., "sampler_append_rows": ...,
    "sampler_grow": ..., "sampler_shrink": ...} at the config's rollout batch and lengths, on `mesh` (one
    host's rollout mesh when sampling on weight `replicas`, which are in the compute dtype).

    Rows: all trajectories of one host's share of a step in one decode state
    (`data.prompts_per_step` / `hosts` x `rollout.k`, bucketed as the Sampler buckets them). Cache: the most slots the
    agent loop's sampler may grow to (`agent.loop.cache_slots`). sampler_prefill is
    the block forward every prefill, repack and append runs, one chunk of
    `MAX_BLOCK_TOKENS` (or the whole prompt block, if shorter) into that full
    cache; sampler_decode is one decode window (`DECODE_WINDOW` steps) whose attention
    reads the whole cache (the last window of the longest rows: the largest span).
    """

    from aepo_jax.agent.loop import cache_slots
    from aepo_jax.agent.tags import ANSWER_CLOSE, TOOL_CLOSE_TAGS
    from aepo_jax.experiment import loop_config_from, sampling_params_from
    from aepo_jax.parallel import state_shardings
    from aepo_jax.parallel.multihost import local_share
    from aepo_jax.sampling.buckets import bucket_batch, bucket_length
    from aepo_jax.sampling.cache_sharding import DecodeSharding, _empty_arrays
    from aepo_jax.sampling.jitted import sampler_programs
    from aepo_jax.sampling.program_runs import (
        DECODE_WINDOW,
        MAX_BLOCK_TOKENS,
        MIN_BLOCK,
        sub_batch_rows,
    )
    from aepo_jax.sampling.programs import start_progress
    from aepo_jax.sampling.stopping import build_stop_table
    from aepo_jax.training.build import abstract_model

    model_config = model_config_of(cfg, layers)
    graphdef, params = abstract_model(model_config)
    if replicas:  # each replica of the weights is in the compute dtype (`rollout_placement_from`)
        params = as_dtype(params, model_config.dtype)
    params = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), params,
                          state_shardings(params, mesh))
    layout = DecodeSharding(mesh)
    loop = loop_config_from(cfg)
    prompts = local_share(int(cfg.data.prompts_per_step), hosts, "data.prompts_per_step")
    rows = bucket_batch(prompts * int(cfg.rollout.k), layout.batch_devices)
    slots = cache_slots(loop)
    cache_dtype = jnp.dtype(model_config.dtype).name
    def decode_arrays(batch: int):
        shapes = jax.eval_shape(lambda: _empty_arrays(model_config.n_layers, batch, slots, model_config.n_kv_heads,
                                                      model_config.head_dim, model_config.vocab_size, cache_dtype))
        return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), shapes, layout.of(shapes))

    arrays = decode_arrays(rows)

    def rows_of(shape, dtype):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=layout.rows(len(shape)))

    block = min(bucket_length(int(cfg.rollout.max_prompt_len), MIN_BLOCK), MAX_BLOCK_TOKENS)
    programs = sampler_programs()
    prefill_args = (graphdef, params, arrays, rows_of((rows, block), jnp.int32), rows_of((rows, block), jnp.bool_),
                    layout, slots)
    keys = jax.eval_shape(lambda: jax.random.split(jax.random.key(0), rows))
    keys = jax.ShapeDtypeStruct(keys.shape, keys.dtype, sharding=layout.rows(1))
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    # The run's stops: tags as text are stop strings over a per-id byte table of the whole vocabulary;
    # registered tags, one-id stop sequences (a 3-token one here, to be safe) and EOS.
    if cfg.tokenizer.get("agent_tags", "special") == "text":
        closes = [*TOOL_CLOSE_TAGS, ANSWER_CLOSE]
        table = build_stop_table([], [0, 1], closes, [b""] * model_config.vocab_size, model_config.vocab_size)
    else:
        table = build_stop_table([[1, 2, 3]], [0])
    stop_table = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated), table)
    steps = DECODE_WINDOW
    budget = rows_of((rows,), jnp.int32)
    progress = jax.eval_shape(start_progress, budget, stop_table)
    progress = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=layout.rows(x.ndim) if x.ndim
                                                           else replicated), progress)
    decode_kwargs = {"max_steps": steps, "sampling": sampling_params_from(cfg), "pad_id": 0, "layout": layout,
                     "span": slots}
    decode_args = (graphdef, params, arrays, keys, budget, stop_table, progress)
    # The same window over half the rows only (`Sampler(half_batch_decode=True)`, on by default on CPU): their
    # whole-cache span taken out of the full state, decoded and put back inside the one program.
    half_rows, half_keys = rows_of((rows // 2,), jnp.int32), jax.ShapeDtypeStruct(
        (rows // 2, *keys.shape[1:]), keys.dtype, sharding=layout.rows(1))
    half_progress = jax.tree.map(lambda x: jax.ShapeDtypeStruct((rows // 2, *x.shape[1:]), x.dtype, sharding=x.sharding)
                                 if x.ndim else x, progress)
    decode_rows_args = (graphdef, params, arrays, half_rows, half_rows, half_keys, half_rows, stop_table, half_progress)
    meta = {"rows": rows, "cache_slots": slots, "hosts": hosts}
    # The rollout's two whole-cache copies (docs/scaling.md, "The rollout's caches alive at once"): a batch
    # of half the rows grown into the full one (`Sampler.reserve`: the grown state donated, the old one
    # read), and the full batch shrunk to half its rows (the loop's dense copy of the live rows).
    half_index = jax.ShapeDtypeStruct((rows // 2,), jnp.int32, sharding=replicated)
    grow_args = (arrays, half_index, decode_arrays(rows // 2), half_index, layout)
    shrink_args = (arrays, half_index, layout)
    # An append to the rows of a quarter of the batch (tool results; `sub_batch_rows`): those rows are
    # taken out, fed one chunk of block tokens over the whole cache, and put back.
    sub = sub_batch_rows(rows, layout.batch_devices)
    append_args = (graphdef, params, arrays, rows_of((sub,), jnp.int32), rows_of((sub,), jnp.int32),
                   rows_of((sub, block), jnp.int32), rows_of((sub, block), jnp.bool_), layout, None)
    return {"sampler_prefill": (programs["block"], prefill_args, {}, {**meta, "seq_len": block}),
            "sampler_decode": (programs["decode"], decode_args, decode_kwargs, {**meta, "seq_len": steps}),
            "sampler_decode_rows": (programs["rows_decode"], decode_rows_args, decode_kwargs,
                                    {**meta, "seq_len": steps}),
            "sampler_append_rows": (programs["rows_block"], append_args, {}, {**meta, "seq_len": block}),
            "sampler_grow": (programs["place"], grow_args, {}, {**meta, "seq_len": None}),
            "sampler_shrink": (programs["take"], shrink_args, {}, {**meta, "seq_len": None})}


def as_dtype(params: Any, dtype: Any) -> Any:
    """Abstract parameters with their float leaves in `dtype` (None: unchanged)."""
    if dtype is None:
        return params
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, jnp.dtype(dtype)) if jnp.issubdtype(x.dtype, jnp.floating)
                        else x, params)


def build_copy_program(cfg: Any, mesh: Any, placement: Any, layers: int | None) -> tuple[Any, tuple[Any, ...], dict, dict]:
    """The per-rollout copy of the trainer's parameters (on the run's mesh) whole to every host.

    `HostRolloutPlacement` copies with `jax.device_put`, which relabels the input's shards to the hosts
    mesh's device order and compiles one jitted reshard; this is that program. The relabelling only
    changes which device holds which shard, not any device's bytes."""
    from aepo_jax.parallel import state_shardings
    from aepo_jax.training.build import abstract_model

    model_config = model_config_of(cfg, layers)
    _, params = abstract_model(model_config)
    params = as_dtype(params, placement.dtype)  # cast on the run's shards before the copy
    relabelled = jax.sharding.Mesh(placement.hosts.devices.reshape(mesh.devices.shape), mesh.axis_names,
                                   axis_types=mesh.axis_types)
    params_in = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=jax.sharding.NamedSharding(relabelled, s.spec)),
        params, state_shardings(params, mesh))
    program = jax.jit(lambda tree: tree, out_shardings=placement.host_shardings(params))
    hosts = int(placement.hosts.shape["hosts"])
    return program, (params_in,), {}, {"rows": 0, "seq_len": None, "hosts": hosts}


def plan_rows(cfg_name: str, topology: str, platform: str, layers: int | None, programs: list[str],
              hbm_bytes: int, seq_len: int | None = None, attention: str | None = None) -> list[dict[str, Any]]:
    """Compiles every program of one config for one topology and returns its memory rows."""
    from aepo_jax.parallel import make_mesh
    from aepo_jax.parallel.host_rollout import HostRolloutPlacement, sampler_replicas

    cfg = load_config(cfg_name)
    if seq_len is not None:
        cfg.train.max_seq_len = seq_len
    if attention is not None:
        cfg.model.attention = attention
    devices = tpu_devices(topology) if platform == "tpu" else jax.devices()
    mesh = make_mesh(dict(cfg.mesh.shape), devices=devices)
    # Several hosts: each samples its own prompts on its own chips (`parallel.host_rollout`); the sampler's
    # programs are planned on the first host's rollout mesh, with that host's share of the rows.
    hosts = len({int(d.process_index) for d in devices})
    placement = HostRolloutPlacement(mesh, process_count=hosts, process_index=int(devices[0].process_index),
                                     dtype=model_config_of(cfg, layers).dtype,
                                     replicas=sampler_replicas(cfg))
    rows = []
    # Built outside set_mesh: nnx.eval_shape would apply logical names to it.
    built = {}
    if {"train_step", "tree_train_step", "score", "tree_score"} & set(programs):
        built.update(build_programs(cfg, mesh, layers, hosts))
    if set(SAMPLER_PROGRAMS) & set(programs):
        built.update(build_sampler_programs(cfg, placement.mesh, layers, hosts, replicas=placement.per_host))
    if COPY_PROGRAM in programs:
        if not placement.per_host:
            programs = [p for p in programs if p != COPY_PROGRAM]  # the rollout uses the run's mesh
        else:
            built[COPY_PROGRAM] = build_copy_program(cfg, mesh, placement, layers)
    for program in programs:
        fn, args, kwargs, meta = built[program]
        program_mesh = {COPY_PROGRAM: placement.hosts}.get(program, placement.mesh if program in SAMPLER_PROGRAMS
                                                          else mesh)
        with jax.set_mesh(program_mesh):
            start, start_cpu = time.perf_counter(), time.process_time()
            error = None
            try:
                compiled = fn.lower(*args, **kwargs).compile()
            except jax.errors.JaxRuntimeError as exc:
                # The TPU compiler refuses a program that cannot fit; keep its figure as a row.
                temp_needed = refused_temp_bytes(str(exc))
                if temp_needed is None:
                    raise
                error = str(exc).splitlines()[0]
            seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - start_cpu
            if error is None:
                memory = compiled.memory_analysis()
                argument = int(memory.argument_size_in_bytes)
                temp = int(memory.temp_size_in_bytes)
                # Outputs alias donated arguments (the train state, the KV cache); count only what does not.
                output = max(0, int(memory.output_size_in_bytes) - int(memory.alias_size_in_bytes))
            else:
                argument, temp, output = shard_bytes(args), temp_needed, 0
            rows.append({
                "config": cfg_name, "topology": topology if platform == "tpu" else f"cpu:{len(devices)}",
                "mesh": "x".join(f"{a}{n}" for a, n in program_mesh.shape.items()), "program": program,
                "n_layers": model_config_of(cfg, layers).n_layers, **meta,
                "remat": cfg.model.get("remat", "none"), "logits_chunk_size": cfg.model.get("logits_chunk_size"),
                "attention": model_config_of(cfg, layers).attention,
                "argument_bytes": argument, "output_bytes": output, "temp_bytes": temp,
                "per_device_bytes": argument + output + temp, "hbm_bytes": hbm_bytes,
                "compile_seconds": round(seconds, 1),
                "compile_cpu_seconds": round(cpu_seconds, 1),  # all threads; wall time depends on the machine's load
                "error": error,  # the compiler's refusal (temp_bytes is then the figure it names)
            })
            print_row(rows[-1])
    return rows


def refused_temp_bytes(message: str) -> int | None:
    """The temporaries a TPU out-of-memory refusal names ("... HLO temporaries (127.36G) ..."), else None."""
    found = re.search(r"HLO temporaries \(([0-9.]+)([KMGT])\)", message)
    if found is None:
        return None
    return int(float(found.group(1)) * 1024 ** "KMGT".index(found.group(2)) * 1024)


def shard_bytes(args: Any) -> int:
    """Bytes one device holds of the abstract arguments (its shard of each), from their shardings."""
    total = 0
    for leaf in jax.tree.leaves(args):
        if isinstance(leaf, jax.ShapeDtypeStruct):
            shape = leaf.sharding.shard_shape(leaf.shape) if leaf.sharding is not None else leaf.shape
            itemsize = 8 if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key) else leaf.dtype.itemsize
            total += math.prod(shape) * itemsize
    return total


def print_row(row: dict[str, Any]) -> None:
    fits = "fits" if row["per_device_bytes"] <= 0.9 * row["hbm_bytes"] and not row["error"] else "DOES NOT FIT"
    if row["error"]:
        fits += ", refused by the compiler"
    print(f"{row['config']:>16} {row['topology']:>9} {row['mesh']:>22} {row['program']:>15} L{row['n_layers']:<3} B{row['rows']:<4} T{row['seq_len'] or '-':<5}"
          f" {row['attention']:>6}"
          f" arg {row['argument_bytes'] / GIB:7.2f} GiB  out {row['output_bytes'] / GIB:6.2f} GiB"
          f"  temp {row['temp_bytes'] / GIB:7.2f} GiB"
          f"  total {row['per_device_bytes'] / GIB:7.2f} / {row['hbm_bytes'] / GIB:.0f} GiB ({fits})"
          f"  compile {row['compile_seconds']:6.1f} s ({row['compile_cpu_seconds']:.0f} s CPU)", flush=True)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", action="append", default=None,
                        help="CONFIG[:TOPOLOGY] (configs/CONFIG.py; default topology v5:2x4x4); repeatable")
    parser.add_argument("--programs", default=None,
                        help=f"comma-separated, of {','.join(PROGRAMS)} (default: all; without --config, the "
                             "default plans' own lists)")
    parser.add_argument("--layers", type=int, default=None, help="override n_layers (quick or extrapolated plans)")
    parser.add_argument("--seq-len", type=int, default=None, help="override train.max_seq_len")
    parser.add_argument("--platform", choices=("tpu", "cpu"), default="tpu")
    parser.add_argument("--attention", choices=("dense", "splash", "cudnn"), default=None,
                        help="override model.attention (default: the config's; the paper configs use splash)")
    parser.add_argument("--hbm-gib", type=float, default=95.0, help="HBM per chip (v5p: 95)")
    parser.add_argument("--json", default=None, help="write the rows here")
    args = parser.parse_args(argv)
    programs = None if args.programs is None else [p for p in args.programs.split(",") if p]
    unknown = sorted(set(programs or ()) - set(PROGRAMS))
    if unknown:
        parser.error(f"unknown programs {unknown}; known: {', '.join(PROGRAMS)}")
    if args.config:
        plans = [(*spec.partition(":")[::2], PROGRAMS) for spec in args.config]
    else:
        plans = list(DEFAULT_PLANS)
    rows = []
    for name, topology, plan_programs in plans:
        rows += plan_rows(name, topology or "v5:2x4x4", args.platform, args.layers, programs or list(plan_programs),
                          int(args.hbm_gib * GIB), args.seq_len, args.attention)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return rows


if __name__ == "__main__":
    main()
