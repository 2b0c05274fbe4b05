"""Where a decode step's device time goes: the sampler's kernels, per step, from a profiler trace.

    python -m benchmarks.decode_profile --layers 24 --d-model 1024 --heads 16 --kv-heads 8 \
        --vocab 151936 --batch 64 --new-tokens 512 --dtype bfloat16 --variants auto,layerwise [--json OUT]
    ... --peer-script ../shared/bench/tunix_sampler_bench.py   # also profile tunix's sampler in this process

For each variant of the sampler (`auto`: its defaults; `layerwise` / `stacked`: `layerwise_decode`
on / off) it times `--iters` generates of `--new-tokens` after a warm-up, then runs one more under
`jax.profiler.trace` (the decode only; its prefill runs before the trace) and sums the device events
of that trace by kernel kind. Per decode step it reports
the wall time, the device-busy time (the kernels' summed durations) and the names that take most of
it, so a gap to the physical floor can be pinned on kernels (a copy of the cache, an unfused
scatter, the attention, the products). With `--peer-script`, tunix's vanilla sampler (driven by that
script's model and tokenizer) is traced the same way, but over its whole call, prefill included (its
sampler has no separate decode entry); tunix must be importable.

The trace files are written under `--trace-dir` (default: a temporary folder) and kept only there.
On a CPU the host is the device, so every lane of the trace is kept, the Python tracer's among them
(it ranks first, with the profiler's own stop): read the XLA thread pools' lanes.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import importlib.util
import json
import re
import statistics
import tempfile
import time
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from aepo_jax.sampling import Sampler, SamplingParams
from benchmarks.bench_json import add_json_flag, write_json
from benchmarks.sampler_bench import add_shape_args, build_model
from benchmarks.sampler_peer import peer_max_prompt_length

VARIANTS = {"auto": None, "layerwise": True, "stacked": False}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_shape_args(parser, prompt_len=16)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--variants", default="auto", help=f"comma-separated, from {sorted(VARIANTS)}")
    parser.add_argument("--top", type=int, default=12, help="names listed per trace")
    parser.add_argument("--trace-dir", default=None, help="where the traces go (default: a temporary folder)")
    parser.add_argument("--peer-script", default=None,
                        help="tunix_sampler_bench.py: also trace tunix's sampler on the same shapes")
    add_json_flag(parser)
    args = parser.parse_args()
    unknown = set(args.variants.split(",")) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown --variants {sorted(unknown)}; known: {sorted(VARIANTS)}")
    return args


def device_events(trace_dir: Path) -> list[dict]:
    """The complete ("X") events of the trace's accelerator processes (all of them on a CPU run,
    where the host is the device), each with its process and thread names added."""
    files = sorted(trace_dir.rglob("*.trace.json.gz"))
    if not files:
        raise RuntimeError(f"no *.trace.json.gz under {trace_dir}: the profiler wrote no trace")
    with gzip.open(files[-1]) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    processes, threads = {}, {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            processes[e["pid"]] = e["args"]["name"]
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            threads[(e["pid"], e["tid"])] = e["args"]["name"]
    accelerators = {p for p, name in processes.items() if "/device:" in name and "CPU" not in name}
    keep = accelerators or set(processes)
    return [dict(e, process=processes.get(e["pid"], "?"), thread=threads.get((e["pid"], e.get("tid")), "?"))
            for e in events if e.get("ph") == "X" and e["pid"] in keep]


def kernel_kind(name: str) -> str:
    """An event's name without XLA's numeric suffixes (`gemm_fusion_dot_1278` and `gemm_fusion_dot.23` are
    both `gemm_fusion_dot`), so the kernels of every layer add up under one kind."""
    return re.sub(r"([._]\d+)+$", "", name)


def summarize(events: list[dict], steps: int, top: int) -> dict:
    """Per thread (a GPU stream, or XLA's op / module lanes): events and device ms per decode step, and
    the `top` kernel kinds (`kernel_kind`) by time. Lanes overlap (a module event spans its ops), so each
    is summed alone. On a GPU an event's name is its kernel's, even inside a command buffer (CUDA graph)."""
    lanes = collections.defaultdict(list)
    for e in events:
        lanes[f"{e['process']} | {e['thread']}"].append(e)
    out = {}
    for lane, lane_events in sorted(lanes.items(), key=lambda kv: -len(kv[1])):
        by_kind = collections.Counter()
        counts = collections.Counter()
        for e in lane_events:
            kind = kernel_kind(e["name"])
            by_kind[kind] += e.get("dur", 0.0)
            counts[kind] += 1
        total_us = sum(by_kind.values())
        out[lane] = {
            "events_per_step": len(lane_events) / steps,
            "busy_ms_per_step": total_us / 1e3 / steps,
            "median_event_us": statistics.median(e.get("dur", 0.0) for e in lane_events),
            "top": [{"name": n, "ms_per_step": us / 1e3 / steps, "share": us / total_us if total_us else 0.0,
                     "calls_per_step": counts[n] / steps} for n, us in by_kind.most_common(top)],
        }
    return out


def profile_ours(args: argparse.Namespace, variant: str, trace_dir: Path) -> dict:
    model = build_model(args)
    graphdef, params = nnx.split(model)
    sampler = Sampler(graphdef, params, eos_ids=[], params=SamplingParams(temperature=1.0), seed=0,
                      max_cache_len=1 << 20, layerwise_decode=VARIANTS[variant])
    prompts = np.random.default_rng(0).integers(1, args.vocab, size=(args.batch, args.prompt_len)).tolist()

    def prefilled():
        state = sampler.prefill(prompts)
        jax.block_until_ready(state.arrays)
        return state

    def generate(state, seed: int) -> float:
        start = time.perf_counter()
        state, out = sampler.generate(state, args.new_tokens, rng=jax.random.key(seed))
        jax.block_until_ready(state.arrays)
        if not np.all(out.num_tokens == args.new_tokens):
            raise RuntimeError(f"rows stopped early: {out.num_tokens.tolist()}")
        return time.perf_counter() - start

    generate(prefilled(), 0)  # compiles
    seconds = [generate(prefilled(), 1 + i) for i in range(args.iters)]
    state = prefilled()
    with jax.profiler.trace(str(trace_dir)):  # the decode only: the prefill ran before the trace
        traced = generate(state, 99)
    return {"step_ms_median": 1e3 * statistics.median(seconds) / args.new_tokens,
            "traced_step_ms": 1e3 * traced / args.new_tokens, "spans": list(sampler.last_decode_spans),
            "layerwise_decode": sampler.layerwise_decode,
            "lanes": summarize(device_events(trace_dir), args.new_tokens, args.top)}


def profile_tunix(args: argparse.Namespace, trace_dir: Path) -> dict:
    """tunix's sampler, built by the peer driver script, traced over one call of `--new-tokens`."""
    spec = importlib.util.spec_from_file_location("peer_driver", args.peer_script)
    driver = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(driver)
    from tunix.generate import (
        sampler as sampler_lib,  # only with --peer-script; never a project dependency
    )

    peer_args = argparse.Namespace(layers=args.layers, vocab=args.vocab, d_model=args.d_model, heads=args.heads,
                                   kv_heads=args.kv_heads, dtype=args.dtype, seed=0)
    model, config = driver.build_model(peer_args)
    tokenizer = driver.ToyTokenizer(args.vocab)
    max_prompt = peer_max_prompt_length(args.prompt_len)  # no padding: tunix does the prompt's work only
    sampler = sampler_lib.Sampler(transformer=model, tokenizer=tokenizer, cache_config=sampler_lib.CacheConfig(
        cache_size=max_prompt + args.new_tokens, num_layers=config.num_layers, num_kv_heads=config.num_kv_heads,
        head_dim=config.head_dim))
    prompts = [" ".join(f"w{(r * 7 + i) % 97}" for i in range(args.prompt_len)) for r in range(args.batch)]

    def call() -> float:
        start = time.perf_counter()
        sampler(prompts, max_generation_steps=args.new_tokens, max_prompt_length=max_prompt,
                forbidden_tokens=[tokenizer.eos_id()], seed=0, temperature=1.0, top_p=1.0, top_k=None)
        return time.perf_counter() - start

    call()
    seconds = [call() for _ in range(args.iters)]
    with jax.profiler.trace(str(trace_dir)):
        traced = call()
    return {"call_ms_per_token_median": 1e3 * statistics.median(seconds) / args.new_tokens,
            "traced_call_ms_per_token": 1e3 * traced / args.new_tokens,
            "lanes": summarize(device_events(trace_dir), args.new_tokens, args.top)}


def print_profile(title: str, profile: dict, lanes: int = 3) -> None:
    head = {k: v for k, v in profile.items() if k != "lanes"}
    print(f"== {title}: " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in head.items()))
    for lane, summary in list(profile["lanes"].items())[:lanes]:
        print(f"  [{lane}] {summary['events_per_step']:.1f} events, {summary['busy_ms_per_step']:.3f} ms per step")
        for row in summary["top"]:
            print(f"    {row['ms_per_step']:8.4f} ms {100 * row['share']:5.1f}% x{row['calls_per_step']:6.1f}  "
                  f"{row['name'][:110]}")


def main() -> None:
    args = parse_args()
    root = Path(args.trace_dir or tempfile.mkdtemp(prefix="decode_profile_"))
    result = {"config": {k: v for k, v in vars(args).items() if k != "json"}, "backend": jax.default_backend(),
              "device_kind": jax.devices()[0].device_kind, "jax_version": jax.__version__, "ours": {}}
    for variant in args.variants.split(","):
        result["ours"][variant] = profile_ours(args, variant, root / f"ours_{variant}")
        print_profile(f"ours ({variant})", result["ours"][variant])
    if args.peer_script:
        result["tunix"] = profile_tunix(args, root / "tunix")
        print_profile("tunix", result["tunix"])
    print(f"traces under {root}")
    write_json(args.json, result)


if __name__ == "__main__":
    main()
