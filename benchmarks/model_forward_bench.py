"""Decoder speed: jitted full forward (tokens/s, GFLOP/s) and one cached decode step, per config and dtype.

    python -m benchmarks.model_forward_bench --presets tiny smollm2_135m --layers 4 \
        --batch 4 --length 128 [--json OUT.json]

Random weights (speed does not depend on them). `--layers` caps the layer
count so large presets fit a CPU; FLOPs count matmuls only (2 per
multiply-add): projections, MLP, attention scores and values, and the logits.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
from flax import nnx

from aepo_jax.models import Decoder, KVCache, ModelConfig, get_preset
from benchmarks.bench_json import add_json_flag, write_json


def forward_flops(config: ModelConfig, batch: int, queries: int, keys: int) -> float:
    """Matmul FLOPs of one forward of `queries` tokens per row attending to `keys` slots."""
    d, h, kvh, dh, f = config.d_model, config.n_heads, config.n_kv_heads, config.head_dim, config.mlp_dim
    per_token_layer = 2 * d * dh * (2 * h + 2 * kvh) + 2 * 3 * d * f  # q, o, k, v; gate, up, down
    attention = 2 * 2 * h * dh * keys  # scores and weighted values
    per_token = config.n_layers * (per_token_layer + attention) + 2 * d * config.vocab_size
    return float(batch * queries * per_token)


def time_call(fn, *args, repeats: int) -> float:
    """Median wall seconds of `fn(*args)` after one compile/warm-up call (results block)."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def bench_one(config: ModelConfig, batch: int, length: int, repeats: int) -> dict:
    graphdef, state = nnx.split(Decoder(config, rngs=nnx.Rngs(0)))
    ids = jax.random.randint(jax.random.key(0), (batch, length), 0, config.vocab_size, dtype=jnp.int32)

    @jax.jit
    def forward(state, ids):
        return nnx.merge(graphdef, state)(ids)

    @jax.jit
    def decode_step(state, cache, token):
        return nnx.merge(graphdef, state)(token, kv_cache=cache)

    full_s = time_call(forward, state, ids, repeats=repeats)
    cache = KVCache.init(config, batch=batch, length=length + 1, dtype=config.dtype)
    cache = cache.replace(index=jnp.int32(length))  # decoding the last slot: attends to a full cache
    step_s = time_call(decode_step, state, cache, ids[:, :1], repeats=repeats)
    return {
        "config": f"{config.n_layers}L d{config.d_model} h{config.n_heads}/{config.n_kv_heads} V{config.vocab_size}",
        "dtype": config.dtype,
        "forward_ms": 1e3 * full_s,
        "forward_tokens_per_s": batch * length / full_s,
        "forward_gflops": forward_flops(config, batch, length, length) / full_s / 1e9,
        "decode_step_ms": 1e3 * step_s,
        "decode_tokens_per_s": batch / step_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["tiny", "smollm2_135m"])
    parser.add_argument("--layers", type=int, default=4, help="cap on the number of layers")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    add_json_flag(parser)
    args = parser.parse_args()

    rows = []
    for preset in args.presets:
        for dtype in args.dtypes:
            base = get_preset(preset)
            config = base.replace(n_layers=min(base.n_layers, args.layers), dtype=dtype, param_dtype=dtype)
            rows.append({"preset": preset, **bench_one(config, args.batch, args.length, args.repeats)})

    header = f"{'preset':<14}{'config':<28}{'dtype':<10}{'fwd ms':>9}{'fwd tok/s':>11}{'GFLOP/s':>9}"
    header += f"{'step ms':>9}{'dec tok/s':>11}"
    print(f"backend={jax.default_backend()} devices={jax.device_count()} batch={args.batch} length={args.length}")
    print(header)
    for r in rows:
        print(
            f"{r['preset']:<14}{r['config']:<28}{r['dtype']:<10}{r['forward_ms']:>9.1f}"
            f"{r['forward_tokens_per_s']:>11.0f}{r['forward_gflops']:>9.1f}{r['decode_step_ms']:>9.2f}"
            f"{r['decode_tokens_per_s']:>11.0f}"
        )
    write_json(args.json, {"batch": args.batch, "length": args.length, "rows": rows})


if __name__ == "__main__":
    main()
