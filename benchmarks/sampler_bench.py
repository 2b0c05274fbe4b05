"""Sampler speed: tokens/s of prefill + while_loop decode, and decode step vs the one-token forward floor.

    python -m benchmarks.sampler_bench --layers 2 --d-model 128 --heads 4 --kv-heads 2 \
        --vocab 1024 --batch 8 --prompt-len 64 --new-tokens 64 --mode sample [--json OUT.json]

Random-initialised model; EOS is banned (no EOS ids, no stop sequences) so
every row generates exactly --new-tokens. The floor is one jitted model
forward of a single token per row against a cache of the same length, called
back to back from Python: a decode step cannot do less work than that.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from aepo_jax.models import Decoder, KVCache, get_preset
from aepo_jax.sampling import Sampler, SamplingParams
from benchmarks.bench_json import add_json_flag, write_json


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--mlp-dim", type=int, default=0, help="0 means 4 * d_model")
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--mode", choices=["sample", "greedy"], default="sample")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    add_json_flag(parser)
    return parser.parse_args()


def build_model(args: argparse.Namespace) -> Decoder:
    if args.d_model % args.heads:
        raise SystemExit(f"--d-model {args.d_model} is not a multiple of --heads {args.heads}")
    config = get_preset("tiny").replace(
        vocab_size=args.vocab, d_model=args.d_model, n_layers=args.layers, n_heads=args.heads,
        n_kv_heads=args.kv_heads, head_dim=args.d_model // args.heads,
        mlp_dim=args.mlp_dim or 4 * args.d_model, dtype=args.dtype, param_dtype=args.dtype,
        max_seq_len=max(1024, args.prompt_len + args.new_tokens),
    )
    return Decoder(config, rngs=nnx.Rngs(0))


def make_floor(model: Decoder, batch: int, cache_length: int, position: int) -> Callable[[int], float]:
    """Returns run(calls) -> seconds per call of a jitted one-token forward with a cache of `cache_length` slots.

    The calls run back to back from Python with the cache donated, the way an
    unfused decode loop would run; a decode step cannot do less model work.
    """
    graphdef, params = nnx.split(model)
    config = model.config

    def one_token(params, cache, tokens, positions, mask):
        return nnx.merge(graphdef, params)(tokens, positions=positions, attention_mask=mask, kv_cache=cache)

    one_token = jax.jit(one_token, donate_argnums=(1,))
    holder = {"cache": KVCache.init(config, batch=batch, length=cache_length, dtype=config.dtype)}
    tokens = jnp.ones((batch, 1), jnp.int32)
    positions = jnp.full((batch, 1), position, jnp.int32)
    mask = jnp.ones((batch, 1, cache_length), bool)

    def run(calls: int) -> float:
        start = time.perf_counter()
        for _ in range(calls):
            logits, holder["cache"] = one_token(params, holder["cache"].replace(index=jnp.asarray(position, jnp.int32)), tokens, positions, mask)
        jax.block_until_ready(logits)
        return (time.perf_counter() - start) / calls

    run(2)  # compile
    return run


def time_sampler(sampler: Sampler, model: Decoder, prompts: list[list[int]], args: argparse.Namespace) -> dict:
    """Times prefill, generate and the one-token floor, interleaved so that each decode is
    compared with a floor measured right after it (the machine's load drifts between runs)."""

    def one_run(seed: int) -> tuple[float, float, int, int]:
        start = time.perf_counter()
        state = sampler.prefill(prompts)
        jax.block_until_ready(state.arrays)
        mid = time.perf_counter()
        state, out = sampler.generate(state, args.new_tokens, rng=jax.random.key(seed))
        jax.block_until_ready(state.arrays)
        end = time.perf_counter()
        if not np.all(out.num_tokens == args.new_tokens):
            raise RuntimeError(f"rows stopped early: {out.num_tokens.tolist()}")
        return mid - start, end - mid, state.batch_size, state.cache_length

    start = time.perf_counter()
    _, _, batch, cache_length = one_run(0)
    first_call = time.perf_counter() - start
    for i in range(args.warmup):
        one_run(1 + i)
    floor = make_floor(model, batch, cache_length, args.prompt_len)
    prefill_s, decode_s, floor_s = [], [], []
    for i in range(args.iters):
        prefill, decode, _, _ = one_run(100 + i)
        prefill_s.append(prefill)
        decode_s.append(decode)
        floor_s.append(floor(args.new_tokens))
    tokens = args.batch * args.new_tokens
    total = [p + d for p, d in zip(prefill_s, decode_s, strict=True)]
    step_s = [d / args.new_tokens for d in decode_s]
    ratios = [s / f for s, f in zip(step_s, floor_s, strict=True)]
    return {
        "first_call_s": first_call,
        "prefill_ms_mean": 1e3 * statistics.mean(prefill_s),
        "prefill_ms_best": 1e3 * min(prefill_s),
        "decode_tokens_per_s_mean": tokens / statistics.mean(decode_s),
        "decode_tokens_per_s_best": tokens / min(decode_s),
        "tokens_per_s_mean": tokens / statistics.mean(total),
        "tokens_per_s_best": tokens / min(total),
        "step_ms_mean": 1e3 * statistics.mean(step_s),
        "step_ms_best": 1e3 * min(step_s),
        "floor_ms_mean": 1e3 * statistics.mean(floor_s),
        "floor_ms_best": 1e3 * min(floor_s),
        "step_over_floor_median": statistics.median(ratios),
        "step_over_floor_best": min(step_s) / min(floor_s),
        "batch_bucket": batch,
        "cache_length": cache_length,
    }


def matmul_gflops() -> float:
    """Median float32 GFLOP/s of 20 jitted 512^3 matmuls: how much CPU this run actually got."""
    a = jnp.ones((512, 512), jnp.float32)
    matmul = jax.jit(lambda x: x @ x)
    jax.block_until_ready(matmul(a))
    seconds = statistics.median(_timed(lambda: jax.block_until_ready(matmul(a))) for _ in range(20))
    return 2 * 512**3 / seconds / 1e9


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    args = parse_args()
    model = build_model(args)
    graphdef, params = nnx.split(model)
    sampling = SamplingParams(greedy=args.mode == "greedy", temperature=1.0)
    sampler = Sampler(graphdef, params, eos_ids=[], params=sampling, max_cache_len=1 << 20, seed=0)
    prompts = np.random.default_rng(0).integers(1, args.vocab, size=(args.batch, args.prompt_len)).tolist()
    load_before = os.getloadavg()[0]
    gflops_before = matmul_gflops()
    result = time_sampler(sampler, model, prompts, args)
    result.update(
        matmul_gflops=min(gflops_before, matmul_gflops()),
        load_average_1min=max(load_before, os.getloadavg()[0]),
        cpu_count=os.cpu_count(),
        config={k: v for k, v in vars(args).items() if k != "json"},
        backend=jax.default_backend(),
        devices=jax.device_count(),
        machine=platform.machine(),
        jax_version=jax.__version__,
    )
    r = result
    rows = [
        ("tokens/s (prefill+decode) mean / best", f"{r['tokens_per_s_mean']:.0f} / {r['tokens_per_s_best']:.0f}"),
        ("tokens/s (decode only) mean / best", f"{r['decode_tokens_per_s_mean']:.0f} / {r['decode_tokens_per_s_best']:.0f}"),
        ("first call (compile) s", f"{r['first_call_s']:.2f}"),
        ("prefill ms mean / best", f"{r['prefill_ms_mean']:.2f} / {r['prefill_ms_best']:.2f}"),
        ("decode step ms mean / best", f"{r['step_ms_mean']:.3f} / {r['step_ms_best']:.3f}"),
        ("one-token forward floor ms mean / best", f"{r['floor_ms_mean']:.3f} / {r['floor_ms_best']:.3f}"),
        ("step / floor median / best-vs-best", f"{r['step_over_floor_median']:.2f} / {r['step_over_floor_best']:.2f}"),
        ("matmul GFLOP/s (median, lower = busier CPU)", f"{r['matmul_gflops']:.0f}"),
        (f"load average 1 min (max of start/end, {r['cpu_count']} CPUs)", f"{r['load_average_1min']:.1f}"),
    ]
    print(f"sampler: L{args.layers} d{args.d_model} H{args.heads}/{args.kv_heads} V{args.vocab} B{args.batch} "
          f"P{args.prompt_len} N{args.new_tokens} {args.dtype} {args.mode} "
          f"(batch bucket {r['batch_bucket']}, cache {r['cache_length']}, {jax.default_backend()})")
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")
    write_json(args.json, result)


if __name__ == "__main__":
    main()
