"""Attention backends compiled ahead of time for a simulated TPU v5p chip: compile seconds and planned bytes.

Needs the `libtpu` wheel that matches jax (`libtpu==0.0.42.1` for jax 0.10.2, in
its own venv; ../shared/ENV_NOTES.md) and no TPU: the TPU compiler plans the
program on a CPU-only machine. Each case is one attention call on bf16
`q [B, T, H, Dh]`, `k, v [B, T, KVH, Dh]` (fwd) or the gradient of its sum
(grad); `temp` is `memory_analysis().temp_size_in_bytes`, what the chip would
need beyond the arguments. Cases: the tree kernel (tree-packed rows), splash
with a causal mask, and the dense path with the tree mask (the reference).

    ALLOW_MULTIPLE_LIBTPU_LOAD=1 JAX_PLATFORMS=cpu PYTHONPATH=. .venv-tpu/bin/python \\
        benchmarks/attention_compile.py --shape 1,2048,8,2,128 --json /tmp/attention_compile.json
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
from jax.experimental import topologies

from aepo_jax.models.attention import masked_attention
from aepo_jax.models.attention_mask import causal_mask, tree_mask

CASES = {
    "tree_kernel": lambda q, k, v, ends, valid: masked_attention(q, k, v, tree_mask(ends), implementation="splash"),
    "splash_causal": lambda q, k, v, ends, valid: masked_attention(q, k, v, causal_mask(valid), implementation="splash"),
    "dense_tree": lambda q, k, v, ends, valid: masked_attention(q, k, v, tree_mask(ends)),
}


def v5p_device():
    """One chip of a simulated v5p host (2x2x1 megacore)."""
    topology = topologies.get_topology_desc(platform="tpu", topology_name="v5:2x2x1", chip_config_name="megacore",
                                            chips_per_host_bounds=(2, 2, 1), num_slices=1, wrap=(False, False, False))
    return topology.devices[0]


def compile_case(name: str, mode: str, shape: tuple[int, ...], device) -> dict:
    batch, length, n_heads, n_kv_heads, head_dim = shape
    sharding = jax.sharding.SingleDeviceSharding(device)
    q = jax.ShapeDtypeStruct((batch, length, n_heads, head_dim), jnp.bfloat16, sharding=sharding)
    kv = jax.ShapeDtypeStruct((batch, length, n_kv_heads, head_dim), jnp.bfloat16, sharding=sharding)
    ends = jax.ShapeDtypeStruct((batch, length), jnp.int32, sharding=sharding)
    valid = jax.ShapeDtypeStruct((batch, length), jnp.bool_, sharding=sharding)
    attend = CASES[name]
    if mode == "grad":
        attend = jax.grad(lambda q, k, v, e, m: CASES[name](q, k, v, e, m).astype(jnp.float32).sum(), (0, 1, 2))
    start = time.perf_counter()
    memory = jax.jit(attend).trace(q, kv, kv, ends, valid).lower().compile().memory_analysis()
    return {"case": name, "mode": mode, "shape_BTHKD": list(shape), "compile_seconds": time.perf_counter() - start,
            "temp_bytes": int(memory.temp_size_in_bytes), "argument_bytes": int(memory.argument_size_in_bytes)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="1,2048,8,2,128", help="B,T,H,KVH,Dh")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--json", default="", help="write the rows here")
    args = parser.parse_args()
    shape = tuple(int(x) for x in args.shape.split(","))
    device = v5p_device()
    print(f"{device.device_kind}, B,T,H,KVH,Dh = {shape}")
    print(f"{'case':>14} {'mode':>4} {'compile s':>9} {'temp MiB':>9}", flush=True)
    rows = []
    for name in args.cases.split(","):
        for mode in ("fwd", "grad"):
            row = compile_case(name, mode, shape, device)
            rows.append(row)
            print(f"{name:>14} {mode:>4} {row['compile_seconds']:>9.1f} {row['temp_bytes'] / 2**20:>9.1f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device.device_kind, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
