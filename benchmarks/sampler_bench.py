"""Sampler speed: tokens/s of prefill + while_loop decode, against a physical floor and (optionally) tunix.

    python -m benchmarks.sampler_bench --layers 2 --d-model 128 --heads 4 --kv-heads 2 \
        --vocab 1024 --batch 8 --prompt-len 16 --new-tokens 64 --mode sample [--json OUT.json]
    python -m benchmarks.sampler_bench ... --peer tunix --peer-python <venv with google-tunix>/bin/python

Random-initialised Qwen3-shaped model (q/k norm, tied embeddings, MLP 4 x d_model);
EOS is banned (no EOS ids, no stop sequences) so every row generates exactly
--new-tokens.

Floors of one decode step, both measured in this run:
  * `one_token_floor`: one jitted model forward of a single token per row
    against a cache of the same length, called back to back from Python. It
    scans the stacked layers over the whole cache, so where the sampler decodes
    layerwise over the live span (CPU, GPU) it is no floor: the bars use the
    physical floor.
  * `physical_floor`: max(bytes a step must read / measured copy bandwidth,
    step FLOPs / measured matmul peak). The bytes are the parameters plus the
    live KV slots (a step attends the prompt, the tokens before it and its own,
    `mean_attended_slots`, averaged over the decode); the copy bandwidth is
    measured on a buffer of that size (so it is the cache level the working set
    lives in), the matmul peak on square matmuls on random data (512^3 on a CPU,
    8192^3 on an accelerator; --peak-size) in the model's dtype, and on a CPU
    also in float32 (`matmul_peak_dtypes`: XLA:CPU runs bf16 matmuls several
    times slower than f32, and a bf16 peak would loosen the compute floor),
    read before and after the timed runs: the floor uses the highest reading
    (all are printed, with the dtype that gave it). The headline ratio is the
    median step over the physical floor (`step_over_physical_floor_median`);
    the best step's ratio is kept as `step_over_physical_floor_best`.
  * `step_products_*` (CPU only): what the step's weight products cost at their own
    shapes ([batch, K] x [K, N]), with XLA's dot and with numpy's BLAS: the
    part of the step no sampler on this backend can remove, and how far it is
    from the peak the physical floor assumes.

`--peer tunix` runs `../shared/bench/tunix_sampler_bench.py` (tunix's vanilla
sampler on a random Qwen3 of the same shapes) in `--peer-python`'s venv,
interleaved with this sampler's runs (`--rounds`) in the same process tree and
minute, in the same environment (XLA_FLAGS included, recorded as `xla_flags`);
google-tunix is never a project dependency. With `--peer-decode on` (default)
the peer's decode loop is also timed alone, in extra calls after its timed ones
(`benchmarks/tunix_decode_timing.py`), and the decode-only ratio (our generate
against tunix's decode program, each after its prefill) is reported beside the
end-to-end one, which also charges tunix's per-call host work
(`init_sample_state`, tokenising, device to host). The driver gets
`--max-prompt-length` = prompt + 1 (tunix prepends BOS and left-pads to that
length), so tunix pads nothing and its cache is prompt + 1 + new tokens
(`benchmarks/sampler_peer.py`, `peer_max_prompt_length`).

The table and the JSON's top level cover all rounds: the first call is round
1's (the compile), means are over every round's timed calls, bests the best
call of any round; `rounds` keeps each round's own figures. ours / peer is
the mean over rounds of our per-round tokens/s over the same for the peer.
"""

from __future__ import annotations

import argparse
import collections
import functools
import math
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from aepo_jax.agent.loop_config import LAYERWISE_DECODE
from aepo_jax.models import Decoder, KVCache, get_preset
from aepo_jax.sampling import Sampler, SamplingParams
from benchmarks.bench_json import add_json_flag, write_json
from benchmarks.sampler_peer import peer_comparison, run_peer

PEER_SCRIPT = Path(__file__).resolve().parents[2] / "shared" / "bench" / "tunix_sampler_bench.py"


def add_shape_args(parser: argparse.ArgumentParser, prompt_len: int) -> None:
    """The benchmark model's and batch's shape flags (`build_model`), shared with decode_profile."""
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--mlp-dim", type=int, default=0, help="0 means 4 * d_model")
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=prompt_len)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_shape_args(parser, prompt_len=64)
    parser.add_argument("--mode", choices=["sample", "greedy"], default="sample")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--peer", choices=["none", "tunix"], default="none",
                        help="also time a peer sampler on the same shapes in this run")
    parser.add_argument("--peer-python", default=None, help="python of a scratch venv with google-tunix")
    parser.add_argument("--peer-script", default=str(PEER_SCRIPT), help="the peer's driver script")
    parser.add_argument("--peer-decode", choices=["on", "off"], default="on",
                        help="also time the peer's decode loop alone, in extra calls after its timed ones "
                             "(benchmarks/tunix_decode_timing.py), for a decode-only ratio")
    parser.add_argument("--rounds", type=int, default=3,
                        help="with --peer: alternate ours and the peer's timed runs this many times")
    parser.add_argument("--layerwise", choices=sorted(LAYERWISE_DECODE), default="auto",
                        help="the Sampler's layerwise_decode (auto: its default for the backend)")
    parser.add_argument("--peak-size", type=int, default=0,
                        help="side of the square matmul that measures the peak, in --dtype (and float32 on a "
                             "CPU); 0 means 512 on a CPU and 8192 on an accelerator")
    add_json_flag(parser)
    return parser.parse_args()


def build_model(args: argparse.Namespace) -> Decoder:
    if args.d_model % args.heads:
        raise SystemExit(f"--d-model {args.d_model} is not a multiple of --heads {args.heads}")
    config = get_preset("tiny").replace(
        vocab_size=args.vocab, d_model=args.d_model, n_layers=args.layers, n_heads=args.heads,
        n_kv_heads=args.kv_heads, head_dim=args.d_model // args.heads,
        mlp_dim=args.mlp_dim or 4 * args.d_model, dtype=args.dtype, param_dtype=args.dtype, qk_norm=True,
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
    return summarise_calls(first_call, prefill_s, decode_s, floor_s, args.batch, args.new_tokens) | {
        "batch_bucket": batch,
        "layerwise_decode": sampler.layerwise_decode,
        "cache_length": cache_length,
    }


def summarise_calls(first_call: float, prefill_s: list[float], decode_s: list[float], floor_s: list[float],
                    batch: int, new_tokens: int) -> dict:
    """Means and bests of timed calls (seconds per call; `floor_s` per one-token forward), with the raw seconds."""
    tokens = batch * new_tokens
    total = [p + d for p, d in zip(prefill_s, decode_s, strict=True)]
    step_s = [d / new_tokens for d in decode_s]
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
        "step_ms_median": 1e3 * statistics.median(step_s),
        "step_ms_best": 1e3 * min(step_s),
        "floor_ms_mean": 1e3 * statistics.mean(floor_s),
        "floor_ms_best": 1e3 * min(floor_s),
        "step_over_floor_median": statistics.median(ratios),
        "step_over_floor_best": min(step_s) / min(floor_s),
        "prefill_s": list(prefill_s),
        "decode_s": list(decode_s),
        "floor_s": list(floor_s),
    }


def combine_rounds(rounds: list[dict], batch: int, new_tokens: int) -> dict:
    """One summary of every round's timed calls (the rounds are `time_sampler`'s results, in order).

    `first_call_s` is the first round's first call, the only one that compiles
    (later rounds' first calls reuse the compiled programs: kept per round in
    `first_call_s_per_round`); means are over all rounds' calls, bests are the
    best call of any round; `rounds` keeps each round's own summary.
    """
    if not rounds:
        raise ValueError("no rounds to combine")
    for key in ("batch_bucket", "layerwise_decode", "cache_length"):
        if len({r[key] for r in rounds}) != 1:
            raise ValueError(f"rounds disagree on {key}: {[r[key] for r in rounds]}")
    joined = summarise_calls(rounds[0]["first_call_s"], *([x for r in rounds for x in r[key]]
                                                           for key in ("prefill_s", "decode_s", "floor_s")),
                             batch, new_tokens)
    return joined | {
        "first_call_s_per_round": [r["first_call_s"] for r in rounds],
        "calls_timed": len(joined["decode_s"]),
        "batch_bucket": rounds[0]["batch_bucket"],
        "layerwise_decode": rounds[0]["layerwise_decode"],
        "cache_length": rounds[0]["cache_length"],
        "rounds": rounds,
    }


def matmul_gflops(dtype: str = "float32", size: int = 512) -> float:
    """Median GFLOP/s of 20 jitted `size`^3 matmuls in `dtype` on random data: the matmul peak
    this run actually got (on a CPU, lower means a busier machine)."""
    a = jax.random.normal(jax.random.key(0), (size, size), jnp.dtype(dtype))
    matmul = jax.jit(lambda x: x @ x)
    jax.block_until_ready(matmul(a))
    seconds = statistics.median(_timed(lambda: jax.block_until_ready(matmul(a))) for _ in range(20))
    return 2 * size**3 / seconds / 1e9


def matmul_peak_dtypes(dtype: str, on_cpu: bool) -> tuple[str, ...]:
    """The dtypes the matmul peak is measured in: the model's, and on a CPU float32 as well.

    XLA:CPU runs bf16 matmuls at a fraction of its f32 rate (8-18 against about
    110 GFLOP/s on the 2-core machine), so a bf16 peak would make the compute
    floor of a bf16 run several times looser than the machine allows.
    """
    return (dtype,) if not on_cpu or dtype == "float32" else (dtype, "float32")


def matmul_peak(readings: list[dict[str, float]]) -> tuple[float, str]:
    """The highest GFLOP/s of `readings` (each {dtype: GFLOP/s}, e.g. before and after the timed runs)
    and the dtype that gave it: the best the machine did, since a lower peak would raise the floor."""
    return max((gflops, dtype) for reading in readings for dtype, gflops in reading.items())


def copy_bandwidth(n_bytes: int, repeats: int = 64) -> float:
    """Bytes/s of a jitted in-loop copy (x -> x * c, read + write) of a float32 buffer of `n_bytes`.

    The loop runs on device, so the figure is the memory level a working set of
    that size lives in, without per-call dispatch.
    """
    x = jnp.ones((max(n_bytes // 4, 1024),), jnp.float32)
    scale = jax.jit(lambda x: jax.lax.fori_loop(0, repeats, lambda _, y: y * jnp.float32(1.0000001), x))
    jax.block_until_ready(scale(x))
    seconds = statistics.median(_timed(lambda: jax.block_until_ready(scale(x))) for _ in range(7))
    return 2 * x.size * 4 * repeats / seconds


def parameter_axes(model: Decoder) -> list[tuple[tuple, tuple[int, ...], int]]:
    """(logical axes, shape, item size) of every parameter; axes are None where a parameter names none."""
    variables = jax.tree.leaves(nnx.state(model, nnx.Param), is_leaf=lambda x: isinstance(x, nnx.Variable))
    return [(tuple(v.get_metadata().get("out_sharding") or (None,) * v[...].ndim), v[...].shape,
             v[...].dtype.itemsize) for v in variables]


def _is_matrix(axes: tuple) -> bool:
    """A weight matrix: two or more axes per layer (the scanned layers add a leading "layers" axis)."""
    return sum(1 for a in axes if a != "layers") >= 2


def physical_floor(model: Decoder, batch: int, prompt_len: int, new_tokens: int, matmul_flops: float) -> dict:
    """max(bytes read per decode step / copy bandwidth, step FLOPs / matmul peak), averaged over the decode.

    Bytes: every parameter once plus the K and V of the live slots (prompt and
    tokens generated so far). FLOPs: 2 per weight-matrix entry per row (the
    embedding counted once, as the tied LM head) plus the attention scores and
    weighted sum over the live slots.
    """
    c = model.config
    params = parameter_axes(model)
    param_bytes = sum(math.prod(shape) * itemsize for _, shape, itemsize in params)
    matrix_entries = sum(math.prod(shape) for axes, shape, _ in params if _is_matrix(axes))
    live = mean_attended_slots(prompt_len, new_tokens)
    itemsize = jnp.dtype(c.dtype).itemsize
    kv_bytes = 2 * c.n_layers * batch * live * c.n_kv_heads * c.head_dim * itemsize
    flops = 2 * batch * matrix_entries + 4 * batch * c.n_layers * c.n_heads * c.head_dim * live
    bandwidth = copy_bandwidth(int(param_bytes + kv_bytes))
    memory_s, compute_s = (param_bytes + kv_bytes) / bandwidth, flops / matmul_flops
    return {"physical_floor_ms": 1e3 * max(memory_s, compute_s), "floor_memory_ms": 1e3 * memory_s,
            "floor_compute_ms": 1e3 * compute_s, "bytes_per_step": int(param_bytes + kv_bytes),
            "flops_per_step": int(flops), "copy_gb_per_s": bandwidth / 1e9}


def mean_attended_slots(prompt_len: int, new_tokens: int) -> float:
    """Cache slots one decode step attends, averaged over the `new_tokens` steps after a `prompt_len` prefill.

    Each step samples from the last logits, then feeds its token through the
    model, written at its own slot (`programs.decode_loop`): step s (from 0)
    attends the prompt, the s tokens before it and its own, P + s + 1 slots;
    the mean over s = 0 .. N-1 is P + (N + 1) / 2.
    """
    return prompt_len + (new_tokens + 1) / 2


def physical_floor_ratios(result: dict) -> dict:
    """The decode step over the physical floor: the median step's (headline) and the best step's."""
    return {"step_over_physical_floor_median": result["step_ms_median"] / result["physical_floor_ms"],
            "step_over_physical_floor_best": result["step_ms_best"] / result["physical_floor_ms"]}


def weight_products(model: Decoder, batch: int) -> list[tuple[int, int, int]]:
    """(rows, K, N) of every weight product one decode step runs, contracted as the model does.

    Each layer's q / k / v and gate / up matrices read the residual stream
    (their `embed` axis first), o and down write it (`embed` last), and the
    tied embedding is the LM head (contracts `embed`, yields `vocab`).
    """
    products = []
    for axes, shape, _ in parameter_axes(model):
        if not _is_matrix(axes):
            continue
        sizes = dict(zip(axes, shape, strict=True))
        per_layer = [(a, n) for a, n in zip(axes, shape, strict=True) if a != "layers"]
        if "embed" not in sizes:
            raise ValueError(f"a weight matrix without an embed axis: {axes}")
        rest = math.prod(n for a, n in per_layer if a != "embed")
        if "vocab" in sizes or per_layer[0][0] == "embed":
            k, n = sizes["embed"], rest
        else:
            k, n = rest, sizes["embed"]
        products += [(batch, k, n)] * sizes.get("layers", 1)
    return products


def xla_product_seconds(rows: int, k: int, n: int, repeats: int = 32, dtype: str = "float32") -> float:
    """Seconds of one `[rows, k] x [k, n]` product in `dtype` with XLA's dot: the median of 7 runs of a
    jitted loop of `repeats` dependent products, each followed by a `[rows, k]` add (so an upper bound)."""
    x = jnp.ones((rows, k), jnp.dtype(dtype))
    w = jnp.full((k, n), 1e-3, jnp.dtype(dtype))

    @jax.jit
    def chain(x, w):  # w is an argument, not a constant XLA could fold into the product
        def body(_, x):
            (y,) = jax.lax.optimization_barrier((x @ w,))  # keeps the slice below out of the product
            return x + y[:, :1]

        return jax.lax.fori_loop(0, repeats, body, x)

    jax.block_until_ready(chain(x, w))
    return statistics.median(_timed(lambda: jax.block_until_ready(chain(x, w))) for _ in range(7)) / repeats


def numpy_product_seconds(rows: int, k: int, n: int, repeats: int = 32) -> float:
    """Seconds of one `[rows, k] x [k, n]` product with numpy's BLAS: the median of 7 runs of
    `repeats` products called back to back."""
    x, w = np.ones((rows, k), np.float32), np.full((k, n), 1e-3, np.float32)

    def loop() -> None:
        for _ in range(repeats):
            x @ w

    loop()
    return statistics.median(_timed(loop) for _ in range(7)) / repeats


ProductTimer = Callable[[int, int, int], float]


def step_products_time(products: list[tuple[int, int, int]], xla: ProductTimer = xla_product_seconds,
                       numpy: ProductTimer = numpy_product_seconds) -> dict:
    """What one step's weight products take at their own shapes, with XLA's dot and numpy's BLAS.

    The physical floor's compute term assumes the square-matmul peak; a decode
    step's products are [B, K] x [K, N] with B the batch, which neither
    library runs at that rate on a CPU. Each distinct shape is timed once and
    counted as often as the step runs it. CPU only: on an accelerator each
    timed product is a kernel launch inside a device loop, whose overhead the
    fused step does not pay (an H200 timed the products of a 0.5B step longer
    than the whole step), and the host's BLAS says nothing about the device.
    """
    counts = collections.Counter(products)
    xla_s = sum(count * xla(*shape) for shape, count in counts.items())
    numpy_s = sum(count * numpy(*shape) for shape, count in counts.items())
    flops = sum(2 * r * k * n for r, k, n in products)
    return {"step_products_xla_ms": 1e3 * xla_s, "step_products_numpy_ms": 1e3 * numpy_s,
            "step_products_xla_gflops": flops / xla_s / 1e9, "step_products_numpy_gflops": flops / numpy_s / 1e9}


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    args = parse_args()
    if args.peer == "tunix" and args.mlp_dim not in (0, 4 * args.d_model):
        raise SystemExit("--peer tunix builds its MLP at 4 x d_model; leave --mlp-dim at 0")
    model = build_model(args)
    graphdef, params = nnx.split(model)
    sampling = SamplingParams(greedy=args.mode == "greedy", temperature=1.0)
    sampler = Sampler(graphdef, params, eos_ids=[], params=sampling, max_cache_len=1 << 20, seed=0,
                      layerwise_decode=LAYERWISE_DECODE[args.layerwise])
    prompts = np.random.default_rng(0).integers(1, args.vocab, size=(args.batch, args.prompt_len)).tolist()
    on_cpu = jax.default_backend() == "cpu"
    xla_flags = os.environ.get("XLA_FLAGS")
    if xla_flags and args.peer != "none":
        print(f"note: XLA_FLAGS={xla_flags!r} applies to both samplers (the peer runs in this environment)")
    peak_size = args.peak_size or (512 if on_cpu else 8192)
    peak_dtypes = matmul_peak_dtypes(args.dtype, on_cpu)
    load_before = os.getloadavg()[0]
    gflops_readings = [{dtype: matmul_gflops(dtype, peak_size) for dtype in peak_dtypes}]
    ours, peers = [], []
    for _ in range(args.rounds if args.peer != "none" else 1):  # alternate, so drifting load hits both sides
        ours.append(time_sampler(sampler, model, prompts, args))
        if args.peer != "none":
            peers.append(run_peer(args))
    gflops_readings.append({dtype: matmul_gflops(dtype, peak_size) for dtype in peak_dtypes})
    gflops, gflops_dtype = matmul_peak(gflops_readings)
    result = combine_rounds(ours, args.batch, args.new_tokens)
    result.update(physical_floor(model, args.batch, args.prompt_len, args.new_tokens, gflops * 1e9))
    result.update(physical_floor_ratios(result))
    if on_cpu:
        xla_timer = functools.partial(xla_product_seconds, dtype=args.dtype)
        result.update(step_products_time(weight_products(model, args.batch), xla=xla_timer))
        result["step_over_xla_products"] = result["step_ms_best"] / result["step_products_xla_ms"]
    else:
        result.update(dict.fromkeys(("step_products_xla_ms", "step_products_xla_gflops", "step_products_numpy_ms",
                                     "step_products_numpy_gflops", "step_over_xla_products")))
    if peers:
        result["peer"] = peer_comparison(args.peer, ours, peers, args.prompt_len, args.new_tokens)
    result.update(
        matmul_gflops=gflops,
        matmul_gflops_dtype=gflops_dtype,  # the dtype of the reading the floor uses
        matmul_gflops_readings=gflops_readings,  # [before, after], each {dtype: GFLOP/s}
        matmul_peak_shape=f"{peak_size}^3 {'/'.join(peak_dtypes)}",
        device_kind=jax.devices()[0].device_kind,
        load_average_1min=max(load_before, os.getloadavg()[0]),
        xla_flags=xla_flags,
        cpu_count=os.cpu_count(),
        config={k: v for k, v in vars(args).items() if k != "json"},
        backend=jax.default_backend(),
        devices=jax.device_count(),
        machine=platform.machine(),
        jax_version=jax.__version__,
    )
    r = result
    over = f"{len(ours)} round{'s' if len(ours) > 1 else ''} x {args.iters} calls"
    rows = [
        (f"tokens/s (prefill+decode) mean / best call, {over}",
         f"{r['tokens_per_s_mean']:.0f} / {r['tokens_per_s_best']:.0f}"),
        ("tokens/s (decode only) mean / best call",
         f"{r['decode_tokens_per_s_mean']:.0f} / {r['decode_tokens_per_s_best']:.0f}"),
        ("first call of round 1 (compile) s", f"{r['first_call_s']:.2f}"),
        ("prefill ms mean / best", f"{r['prefill_ms_mean']:.2f} / {r['prefill_ms_best']:.2f}"),
        ("decode step ms mean / median / best",
         f"{r['step_ms_mean']:.3f} / {r['step_ms_median']:.3f} / {r['step_ms_best']:.3f}"),
        ("one-token forward floor ms mean / best", f"{r['floor_ms_mean']:.3f} / {r['floor_ms_best']:.3f}"),
        ("step / one-token floor median / best-vs-best", f"{r['step_over_floor_median']:.2f} / {r['step_over_floor_best']:.2f}"),
        ("physical floor ms (memory / compute)",
         f"{r['physical_floor_ms']:.4f} ({r['floor_memory_ms']:.4f} / {r['floor_compute_ms']:.4f})"),
        ("  bytes per step, copy GB/s at that size", f"{r['bytes_per_step'] / 1e6:.2f} MB, {r['copy_gb_per_s']:.1f}"),
        ("median step / physical floor (best step's)",
         f"{r['step_over_physical_floor_median']:.1f} ({r['step_over_physical_floor_best']:.1f})"),
        (f"matmul GFLOP/s, {r['matmul_peak_shape']}, before / after (median each; the floor uses the max, "
         + f"{r['matmul_gflops_dtype']})",
         " / ".join(", ".join(f"{d} {x:.0f}" for d, x in reading.items()) for reading in r["matmul_gflops_readings"])),
    ]
    if on_cpu:
        rows += [
            ("step's weight products, XLA ms (GFLOP/s)",
             f"{r['step_products_xla_ms']:.4f} ({r['step_products_xla_gflops']:.0f})"),
            ("same products, numpy BLAS ms (GFLOP/s)",
             f"{r['step_products_numpy_ms']:.4f} ({r['step_products_numpy_gflops']:.0f})"),
            ("best step / XLA's weight products", f"{r['step_over_xla_products']:.1f}"),
        ]
    rows += [
        (f"load average 1 min (max of start/end, {r['cpu_count']} CPUs)", f"{r['load_average_1min']:.1f}"),
    ]
    if peers:
        peer = r["peer"]
        rows += [
            (f"{args.peer} max_prompt_length (prompt + BOS), cache",
             f"{peer['max_prompt_length']}, {peer['cache_size']} (ours: cache {r['cache_length']})"),
            ("ours tokens/s per round (mean of its calls)", " ".join(f"{x:.0f}" for x in peer["ours_tokens_per_s"])),
            (f"{args.peer} tokens/s per round", " ".join(f"{x:.0f}" for x in peer["tokens_per_s"])),
            (f"ours / {args.peer} (ratio of the per-round means' means; per round)",
             f"{peer['speedup_of_means']:.2f}x; " + " ".join(f"{x:.2f}" for x in peer["speedup_per_round"])),
        ]
        if "decode_speedup_of_means" in peer:
            rows += [
                (f"decode only: ours / {args.peer} tokens/s (means' ratio; per round)",
                 f"{peer['decode_speedup_of_means']:.2f}x; "
                 + " ".join(f"{x:.2f}" for x in peer["decode_speedup_per_round"])),
            ]
    print(f"sampler: L{args.layers} d{args.d_model} H{args.heads}/{args.kv_heads} V{args.vocab} B{args.batch} "
          f"P{args.prompt_len} N{args.new_tokens} {args.dtype} {args.mode} "
          f"(batch bucket {r['batch_bucket']}, cache {r['cache_length']}, layerwise {r['layerwise_decode']}, "
          f"{jax.default_backend()}: "
          f"{r['device_kind']})")
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")
    write_json(args.json, result)


if __name__ == "__main__":
    main()
