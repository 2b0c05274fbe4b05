"""Sampler speed: tokens/s of prefill + while_loop decode, and decode step vs the one-token forward floor.

    python benchmarks/sampler_bench.py --layers 2 --d-model 128 --heads 4 --kv-heads 2 \
        --vocab 1024 --batch 8 --prompt-len 64 --new-tokens 64 --mode sample --json OUT.json

Random-initialised model; EOS is banned (no EOS ids, no stop sequences) so
every row generates exactly --new-tokens. The floor is one jitted model
forward of a single token per row against a cache of the same length, called
back to back from Python: a decode step cannot do less work than that.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from aepo_jax.models import Decoder, KVCache, get_preset
from aepo_jax.sampling import Sampler, SamplingParams


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
    parser.add_argument("--floor-calls", type=int, default=50, help="one-token forwards timed for the floor")
    parser.add_argument("--json", default=None, help="write the results here")
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


def time_sampler(sampler: Sampler, prompts: list[list[int]], args: argparse.Namespace) -> dict:
    """Times prefill and generate separately; the first call (compile) is reported on its own."""

    def one_run(seed: int) -> tuple[float, float]:
        start = time.perf_counter()
        state = sampler.prefill(prompts)
        jax.block_until_ready(state.arrays)
        mid = time.perf_counter()
        state, out = sampler.generate(state, args.new_tokens, rng=jax.random.key(seed))
        jax.block_until_ready(state.arrays)
        end = time.perf_counter()
        if not np.all(out.num_tokens == args.new_tokens):
            raise RuntimeError(f"rows stopped early: {out.num_tokens.tolist()}")
        return mid - start, end - mid

    start = time.perf_counter()
    one_run(0)
    first_call = time.perf_counter() - start
    for i in range(args.warmup):
        one_run(1 + i)
    prefill_s, decode_s = zip(*(one_run(100 + i) for i in range(args.iters)), strict=True)
    tokens = args.batch * args.new_tokens
    total = [p + d for p, d in zip(prefill_s, decode_s, strict=True)]
    return {
        "first_call_s": first_call,
        "prefill_ms_mean": 1e3 * statistics.mean(prefill_s),
        "decode_tokens_per_s_mean": tokens / statistics.mean(decode_s),
        "decode_tokens_per_s_best": tokens / min(decode_s),
        "tokens_per_s_mean": tokens / statistics.mean(total),
        "tokens_per_s_best": tokens / min(total),
        "step_ms_mean": 1e3 * statistics.mean(decode_s) / args.new_tokens,
        "step_ms_best": 1e3 * min(decode_s) / args.new_tokens,
    }


def time_floor(model: Decoder, batch: int, cache_length: int, args: argparse.Namespace) -> float:
    """Milliseconds of one jitted one-token forward with a cache of `cache_length` slots (best of 3 runs)."""
    graphdef, params = nnx.split(model)
    config = model.config

    def one_token(params, cache, tokens, positions, mask):
        return nnx.merge(graphdef, params)(tokens, positions=positions, attention_mask=mask, kv_cache=cache)

    one_token = jax.jit(one_token, donate_argnums=(1,))
    cache = KVCache.init(config, batch=batch, length=cache_length, dtype=config.dtype)
    cache = cache.replace(index=jnp.asarray(args.prompt_len, jnp.int32))
    tokens = jnp.ones((batch, 1), jnp.int32)
    positions = jnp.full((batch, 1), args.prompt_len, jnp.int32)
    mask = jnp.ones((batch, 1, cache_length), bool)
    logits, cache = one_token(params, cache, tokens, positions, mask)
    jax.block_until_ready(logits)
    runs = []
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(args.floor_calls):
            logits, cache = one_token(params, cache.replace(index=jnp.asarray(args.prompt_len, jnp.int32)),
                                      tokens, positions, mask)
        jax.block_until_ready(logits)
        runs.append((time.perf_counter() - start) / args.floor_calls)
    return 1e3 * min(runs)


def main() -> None:
    args = parse_args()
    model = build_model(args)
    graphdef, params = nnx.split(model)
    sampling = SamplingParams(greedy=args.mode == "greedy", temperature=1.0)
    sampler = Sampler(graphdef, params, eos_ids=[], params=sampling, max_cache_len=1 << 20, seed=0)
    rng = np.random.default_rng(0)
    prompts = rng.integers(1, args.vocab, size=(args.batch, args.prompt_len)).tolist()
    result = time_sampler(sampler, prompts, args)
    probe = sampler.generate(sampler.prefill(prompts), args.new_tokens, rng=jax.random.key(0))[0]
    floor_ms = time_floor(model, probe.batch_size, probe.cache_length, args)
    result.update(
        floor_ms=floor_ms,
        step_over_floor_mean=result["step_ms_mean"] / floor_ms,
        step_over_floor_best=result["step_ms_best"] / floor_ms,
        cache_length=probe.cache_length,
        config={k: v for k, v in vars(args).items() if k != "json"},
        backend=jax.default_backend(),
        devices=jax.device_count(),
        machine=platform.machine(),
        jax_version=jax.__version__,
    )
    rows = [
        ("tokens/s (prefill+decode) mean / best", f"{result['tokens_per_s_mean']:.0f} / {result['tokens_per_s_best']:.0f}"),
        ("tokens/s (decode only) mean / best",
         f"{result['decode_tokens_per_s_mean']:.0f} / {result['decode_tokens_per_s_best']:.0f}"),
        ("first call (compile) s", f"{result['first_call_s']:.2f}"),
        ("prefill ms", f"{result['prefill_ms_mean']:.2f}"),
        ("decode step ms mean / best", f"{result['step_ms_mean']:.3f} / {result['step_ms_best']:.3f}"),
        ("one-token forward floor ms", f"{floor_ms:.3f}"),
        ("step / floor mean / best", f"{result['step_over_floor_mean']:.2f} / {result['step_over_floor_best']:.2f}"),
    ]
    title = (f"sampler: L{args.layers} d{args.d_model} H{args.heads}/{args.kv_heads} V{args.vocab} "
             f"B{args.batch} P{args.prompt_len} N{args.new_tokens} {args.dtype} {args.mode} "
             f"(cache {probe.cache_length}, {jax.default_backend()})")
    width = max(len(name) for name, _ in rows)
    print(title)
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
