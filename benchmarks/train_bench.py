"""Train-step throughput and model-FLOPs utilisation (MFU).

Times the jitted RL train step (forward, log-probs and entropies, AEPO policy
loss, backward, AdamW) on ~10M and ~50M parameter decoders and compares the
achieved model FLOP/s with the peak of a large matmul (in the step's dtype) measured in
the same run on the same machine (timings vary 2-3x between runs here; the ratio
within one run is what counts). The peak is read before the first config and
after each one; every row's MFU, the printed peak and the JSON's `peak_flops`
are the highest reading (or `--peak-tflops`). Step time, tokens/s and model
FLOP/s are the best of `--steps` timed steps (`step_s_median` is kept too).

Model FLOPs per trained token (PaLM appendix B convention, no rematerialisation):
`6 * N_matmul + 12 * n_layers * d_attn * T`, with N_matmul the parameters used
in matmuls (embedding lookup excluded, LM head included) and d_attn =
n_heads * head_dim.

    python -m benchmarks.train_bench [--json OUT.json] [--steps 5]
    python -m benchmarks.train_bench --configs qwen2_5_0_5b --dtype bfloat16 --peak-tflops 989  # H100/H200 SXM
        # 989 TFLOP/s: NVIDIA's dense bf16 spec for both (without --peak-tflops: the peak measured in the run)
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from aepo_jax.models import Decoder, ModelConfig, get_preset
from aepo_jax.training.optimizer import make_optimizer
from aepo_jax.training.train_state import TrainState
from aepo_jax.training.train_step import StepConfig, make_rl_train_step
from benchmarks.bench_json import add_json_flag, write_json

CONFIGS = {
    # ~10M parameters
    "10m": {"vocab_size": 8192, "d_model": 256, "n_layers": 8, "n_heads": 8, "n_kv_heads": 4, "head_dim": 32, "mlp_dim": 1024,
                "tie_embeddings": True, "max_seq_len": 1024},
    # ~50M parameters
    "50m": {"vocab_size": 16384, "d_model": 512, "n_layers": 10, "n_heads": 8, "n_kv_heads": 8, "head_dim": 64, "mlp_dim": 2048,
                "tie_embeddings": True, "max_seq_len": 1024},
}


def model_config(name: str, dtype: str) -> ModelConfig:
    if name in CONFIGS:
        return ModelConfig(**CONFIGS[name], dtype=dtype, param_dtype="float32")
    return get_preset(name, dtype=dtype, param_dtype="float32")


def matmul_params(cfg: ModelConfig) -> int:
    attn = cfg.d_model * cfg.head_dim * (cfg.n_heads * 2 + cfg.n_kv_heads * 2)
    mlp = 3 * cfg.d_model * cfg.mlp_dim
    return cfg.n_layers * (attn + mlp) + cfg.d_model * cfg.vocab_size  # + LM head


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    return 6.0 * matmul_params(cfg) + 12.0 * cfg.n_layers * cfg.n_heads * cfg.head_dim * seq_len


def measure_matmul_peak(size: int, dtype, repeats: int = 5) -> float:
    """FLOP/s of a jitted [size, size] @ [size, size] matmul (best of `repeats`)."""
    a = jax.random.normal(jax.random.key(0), (size, size), dtype)
    b = jax.random.normal(jax.random.key(1), (size, size), dtype)
    f = jax.jit(lambda x, y: x @ y)
    f(a, b).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        f(a, b).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return 2.0 * size**3 / best


def synthetic_batch(batch: int, seq_len: int, vocab: int, seed: int = 0) -> dict[str, jax.Array]:
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, seq_len), np.float32)
    mask[:, : seq_len // 4] = 0.0  # a prompt quarter
    return {
        "input_ids": jnp.asarray(rng.integers(0, vocab, (batch, seq_len)), jnp.int32),
        "positions": jnp.asarray(np.broadcast_to(np.arange(seq_len), (batch, seq_len)), jnp.int32),
        "valid": jnp.ones((batch, seq_len), jnp.int32),
        "mask": jnp.asarray(mask),
        "logp_old": jnp.asarray(rng.normal(-5.0, 0.5, (batch, seq_len)), jnp.float32),
        "advantages": jnp.asarray(rng.normal(size=(batch, 1)) * np.ones((1, seq_len)), jnp.float32),
    }


def bench_config(name: str, batch: int, seq_len: int, steps: int, dtype: str) -> dict:
    cfg = model_config(name, dtype)
    graphdef, params = nnx.split(Decoder(cfg, rngs=nnx.Rngs(0)))
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
    tx, schedule = make_optimizer(1e-5, total_steps=1000)
    state = TrainState.create(params, tx, seed=0)
    step = make_rl_train_step(graphdef, tx, StepConfig(compute_dtype=dtype), schedule)
    data = synthetic_batch(batch, seq_len, cfg.vocab_size)
    t = time.perf_counter()
    state, metrics = step(state, data)
    jax.block_until_ready(metrics)
    compile_s = time.perf_counter() - t
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        state, metrics = step(state, data)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - t)
    best = min(times)
    tokens = batch * seq_len
    model_flops = flops_per_token(cfg, seq_len) * tokens
    return {"config": name, "params": n_params, "batch": batch, "seq_len": seq_len, "dtype": dtype,
            "compile_s": compile_s, "step_s_best": best, "step_s_median": float(np.median(times)),
            "tokens_per_s_best_step": tokens / best, "model_tflops_per_s_best_step": model_flops / best / 1e12,
            "loss": float(metrics["loss"])}


def apply_peak(rows: list[dict], peak_readings: list[float], peak_tflops: float | None = None) -> float:
    """The one peak (FLOP/s) every row's MFU uses: `peak_tflops` when given, else the highest reading.

    Sets each row's `peak_tflops_per_s` and `mfu` (best step's model FLOP/s over that peak) and returns it,
    for the printed table and the JSON's `peak_flops`.
    """
    peak = peak_tflops * 1e12 if peak_tflops else max(peak_readings)
    for row in rows:
        row["peak_tflops_per_s"] = peak / 1e12
        row["mfu"] = row["model_tflops_per_s_best_step"] * 1e12 / peak
    return peak


def main() -> None:
    parser = argparse.ArgumentParser(description="train-step tokens/s and MFU")
    parser.add_argument("--configs", default="10m,50m")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--matmul-size", type=int, default=2048)
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="use this peak instead of measuring (e.g. 989, NVIDIA's dense bf16 figure "
                             "for an H100 or H200 SXM)")
    add_json_flag(parser)
    args = parser.parse_args()

    peak_dtype = jnp.bfloat16 if args.dtype == "bfloat16" else jnp.float32
    measure = not args.peak_tflops
    readings = [measure_matmul_peak(args.matmul_size, peak_dtype)] if measure else []
    rows = []
    for name in args.configs.split(","):
        rows.append(bench_config(name, args.batch, args.seq_len, args.steps, args.dtype))
        if measure:
            readings.append(measure_matmul_peak(args.matmul_size, peak_dtype))
    peak = apply_peak(rows, readings, args.peak_tflops)
    source = (f"--peak-tflops {args.peak_tflops:g}" if not measure else
              f"max of {len(readings)} {args.matmul_size}^3 {args.dtype} matmul readings, GFLOP/s: "
              + " ".join(f"{x / 1e9:.1f}" for x in readings))
    print(f"backend {jax.default_backend()}, devices {jax.device_count()}, "
          f"peak for MFU {peak / 1e9:.1f} GFLOP/s ({source})")
    print(f"{'config':>14} {'params':>10} {'B x T':>9} {'compile s':>10} {'best step s':>12} "
          f"{'tokens/s best':>14} {'GFLOP/s best':>13} {'MFU best':>9}")
    for r in rows:
        print(f"{r['config']:>14} {r['params'] / 1e6:>9.1f}M {r['batch']:>4}x{r['seq_len']:<4} "
              f"{r['compile_s']:>10.1f} {r['step_s_best']:>12.3f} {r['tokens_per_s_best_step']:>14.0f} "
              f"{r['model_tflops_per_s_best_step'] * 1e3:>13.1f} {r['mfu']:>9.1%}")
    write_json(args.json, {"backend": jax.default_backend(), "peak_flops": peak,
                           "peak_source": "--peak-tflops" if not measure else "max of measured readings",
                           "peak_flops_readings": readings, "results": rows})


if __name__ == "__main__":
    main()
