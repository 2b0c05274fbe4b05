"""Tree-packed versus flat RL train step: tokens computed and step time on AEPO-like trees.

Trees are synthesised with the branching structure of AEPO rollouts (the rollout
engine on 2 CPU cores is far too slow to produce thousand-token trees): per
prompt `m = k / 2` global trajectories, each a chain of (generated segment, tool
result) turns ending in an answer; after every tool result a trajectory forks one
branch (Z = 2) with probability 1/2 while the group has budget, the branch keeping
the prefix up to that tool result and continuing with fresh tokens; top-ups start
new globals until the group has `k`. Segment lengths: generated 40-120 tokens,
tool results 60-200, answers 20-60, up to 3 tool calls.

Both layouts run the real jitted step (`make_rl_train_step`, `make_train_step_for_pack(..., "tree")`,
AdamW, AEPO surrogate) on the same sequences. Micro-batches hold at most
`--tokens-per-micro-batch` slots in both layouts (packed: whole groups, so at
least one group). Row length of the packed layout: `choose_row_len` picks among
1, 1.5, 2 and 3 times the flat `T` by modelled FLOPs: longer rows need fewer
ancestor copies when a group overflows a row, but the dense masked attention
costs `L^2` per row (`attn ratio` compares the dense attention score counts,
`B T^2` flat versus `R L^2` packed; `flop ratio` the modelled forward FLOPs). Times are
the fastest of `--repeats` steps after one compile-and-warm-up step, flat and
tree steps alternating.

    python -m benchmarks.packing_bench [--json OUT.json]

(`benchmarks/packing_bench.json`, cited by docs/packing.md, is not one run of this code: it merges two
runs made at commit 0f19e36 (see its `meta`); the current code reproduces its counts and ratios
(`case_layout`, checked by tests/benchmarks/test_packing_bench_json.py), not its times.)
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from aepo_jax.models import Decoder, ModelConfig, get_preset
from aepo_jax.models.tree_attention import block_skip_fraction
from aepo_jax.training.batch import pad_sequences
from aepo_jax.training.packing import build_packed_batch, make_train_step_for_pack
from aepo_jax.training.packing.row_length import choose_row_len, forward_flops
from aepo_jax.training.train_state import TrainState
from aepo_jax.training.train_step import StepConfig, make_rl_train_step
from benchmarks.bench_json import add_json_flag, write_json

MODELS = {
    "tiny": get_preset("tiny"),
    # ~56M parameters: 8 layers of width 512, 32k vocabulary, untied head.
    "50m": ModelConfig(vocab_size=32000, d_model=512, n_layers=8, n_heads=8, n_kv_heads=4, head_dim=64,
                       mlp_dim=1408, tie_embeddings=False, max_seq_len=8192),
}


def synth_aepo_group(rng: np.random.Generator, prompt_len: int, k: int, vocab: int,
                     max_calls: int = 3) -> list[dict]:
    """`k` trajectories of one prompt with AEPO's tree shape (module doc)."""

    def fresh(lo: int, hi: int) -> tuple[list[int], int]:
        n = int(rng.integers(lo, hi + 1))
        return rng.integers(3, vocab, size=n).tolist(), n

    prompt = rng.integers(3, vocab, size=prompt_len).tolist()
    trajs: list[dict] = []

    def grow(tokens: list[int], mask: list[int], calls: int) -> None:
        """Continue a trajectory to its answer, forking at tool results."""
        while calls < max_calls and rng.random() < 0.8:
            seg, n = fresh(40, 120)
            tokens, mask = tokens + seg, mask + [1] * n
            res, n = fresh(60, 200)
            tokens, mask = tokens + res, mask + [0] * n
            calls += 1
            if len(trajs) + pending[0] < k and rng.random() < 0.5:
                pending[0] += 1
                branches.append((list(tokens), list(mask), calls))
        ans, n = fresh(20, 60)
        trajs.append({"tokens": tokens + ans, "mask": mask + [1] * n})

    pending = [0]
    branches: list[tuple[list[int], list[int], int]] = []
    m = max(1, k // 2)
    for _ in range(m):
        if len(trajs) + pending[0] < k:
            grow(list(prompt), [0] * prompt_len, 0)
        while branches:
            tokens, mask, calls = branches.pop()
            pending[0] -= 1
            grow(tokens, mask, calls)
    while len(trajs) < k:  # top-ups
        grow(list(prompt), [0] * prompt_len, 0)
        while branches:
            tokens, mask, calls = branches.pop()
            pending[0] -= 1
            grow(tokens, mask, calls)
    return trajs[:k]


def make_sequences(rng, prompts: int, prompt_len: int, k: int, vocab: int):
    sequences, group_ids = [], []
    for g in range(prompts):
        for t in synth_aepo_group(rng, prompt_len, k, vocab):
            n = len(t["tokens"])
            t["logp_old"] = rng.normal(-4.0, 0.5, size=n).astype(np.float32)
            t["advantages"] = np.float32(rng.normal())
            sequences.append(t)
            group_ids.append(g)
    return sequences, group_ids


def prepare_step(step, params, tx, batch):
    """Compile and warm up; returns a zero-argument function that runs one timed step."""
    batch = {k: jnp.asarray(v) for k, v in batch.items()}
    holder = {"state": TrainState.create(jax.tree.map(jnp.array, params), tx, seed=0)}

    def one() -> float:
        start = time.perf_counter()
        holder["state"], metrics = step(holder["state"], batch)
        jax.block_until_ready(metrics)
        return time.perf_counter() - start

    one()
    return one


def interleaved_min_times(runs: dict, repeats: int) -> dict:
    """Alternate the steps `repeats` times and keep each one's fastest run: on a shared
    machine other load only ever adds time, and alternating exposes both to the same load."""
    times = {name: [] for name in runs}
    for _ in range(repeats):
        for name, one in runs.items():
            times[name].append(one())
    return {name: min(ts) for name, ts in times.items()}


def pack_like_trainer(config: ModelConfig, sequences, group_ids, length: int, prompts: int, budget: int):
    """Packed batch of the sequences: row length chosen among 1-3x the flat `T` by modelled FLOPs,
    micro-batches of at most `budget` slots. Returns `(row_len, packed, stats, micro_batches)`."""
    candidates = [-(-int(f * length) // 128) * 128 for f in (1, 1.5, 2, 3)]
    row_len, _ = choose_row_len([s["tokens"] for s in sequences], group_ids, config, candidates, 128)
    packed, stats = build_packed_batch(sequences, row_len, group_ids, max_len=length, length_multiple=128)
    micro = max(1, min(prompts, -(-stats.packed_slots // budget)))
    if micro > 1:
        packed, stats = build_packed_batch(sequences, row_len, group_ids, max_len=length, length_multiple=128,
                                           micro_batches=micro)
    return row_len, packed, stats, micro


def case_layout(model: str, k: int, prompt_len: int, prompts: int, budget: int, seed: int) -> tuple[dict, dict, dict]:
    """The case's flat and packed batches and its counts (everything in a result but the times); no step runs."""
    config = MODELS[model]
    rng = np.random.default_rng(seed)
    sequences, group_ids = make_sequences(rng, prompts, prompt_len, k, config.vocab_size)
    longest = max(len(s["tokens"]) for s in sequences)
    flat = pad_sequences(sequences, max_len=longest + 128, length_multiple=128)
    rows, length = flat["input_ids"].shape
    micro_rows = max(1, min(rows, budget // length))
    while rows % micro_rows:
        micro_rows -= 1
    row_len, packed, stats, micro = pack_like_trainer(config, sequences, group_ids, length, prompts, budget)
    attn_ratio = rows * length**2 / (stats.rows * stats.row_len**2)
    flop_ratio = forward_flops(config, rows, length) / forward_flops(config, stats.rows, stats.row_len)
    counts = {"model": model, "k": k, "prompt_len": prompt_len, "prompts": prompts, "flat_rows": rows, "T": length,
              "flat_micro_batch_rows": micro_rows, "packed_micro_batches": micro, "attn_ratio": attn_ratio,
              "flop_ratio": flop_ratio, "row_len_chosen": row_len}
    counts.update(stats.as_dict())
    return flat, packed, counts


def run_case(model: str, k: int, prompt_len: int, prompts: int, budget: int, repeats: int, seed: int) -> dict:
    flat, packed, counts = case_layout(model, k, prompt_len, prompts, budget, seed)
    graphdef, params = nnx.split(Decoder(MODELS[model], rngs=nnx.Rngs(0)))
    tx = optax.adamw(1e-6, weight_decay=0.01)
    flat_cfg = StepConfig(micro_batch_size=counts["flat_micro_batch_rows"])
    runs = {"flat": prepare_step(make_rl_train_step(graphdef, tx, flat_cfg), params, tx, flat),
            "tree": prepare_step(make_train_step_for_pack(graphdef, tx, StepConfig(), "tree"), params, tx,
                                 packed)}
    times = interleaved_min_times(runs, repeats)
    t_flat, t_tree = times["flat"], times["tree"]
    out = dict(counts, t_flat_s=t_flat, t_tree_s=t_tree)
    out["time_ratio"] = t_flat / t_tree
    out["time_over_slot_ratio"] = out["time_ratio"] / out["slot_ratio"]
    return out


def block_skip_case(model: str, k: int, prompt_len: int, prompts: int, budget: int, seed: int,
                    block: int) -> dict:
    """The tree kernel's skipped tiles on the packed rows `run_case` builds (same trees, row length
    and micro-batches), with no step run: `models/tree_attention.block_skip_fraction` on
    `packed_subtree_end`. `kernel_attn_ratio` compares tiles a causal flash kernel visits on the
    flat rows with tiles the tree kernel visits on the packed rows (the dense `attn_ratio` analogue)."""
    config = MODELS[model]
    sequences, group_ids = make_sequences(np.random.default_rng(seed), prompts, prompt_len, k, config.vocab_size)
    flat = pad_sequences(sequences, max_len=max(len(s["tokens"]) for s in sequences) + 128, length_multiple=128)
    rows, length = flat["input_ids"].shape
    _, packed, stats, _ = pack_like_trainer(config, sequences, group_ids, length, prompts, budget)
    ends = packed["packed_subtree_end"].reshape(-1, packed["packed_subtree_end"].shape[-1])  # [M * R, L]
    tree = block_skip_fraction(ends, block, block)
    flat_causal = block_skip_fraction(np.full((rows, length), length, np.int32), block, block)["causal_tiles"]
    return {"model": model, "k": k, "prompt_len": prompt_len, "block": block, "flat_rows": rows, "T": length,
            "rows": stats.rows, "row_len": stats.row_len, "attn_ratio": rows * length**2 / (stats.rows * stats.row_len**2),
            "flat_causal_tiles": flat_causal, "kernel_attn_ratio": flat_causal / tree["visited_tiles"], **tree}


def print_block_skip(args: argparse.Namespace) -> list[dict]:
    """`--block-skip`: the tree kernel's tile counts for every case (cheap: no model is run)."""
    print(f"{'model':>5} {'k':>3} {'prompt':>6} {'block':>5} {'rows x L':>10} {'skip/all':>8} {'skip/causal':>11} "
          f"{'attn ratio':>10} {'kernel ratio':>12}", flush=True)
    results = []
    for model in args.models.split(","):
        for prompt_len in map(int, args.prompt_lens.split(",")):
            for k in map(int, args.ks.split(",")):
                for block in (64, 128, 256):
                    r = block_skip_case(model, k, prompt_len, args.prompts, args.tokens_per_micro_batch, args.seed, block)
                    results.append(r)
                    print(f"{model:>5} {k:>3} {prompt_len:>6} {block:>5} {r['rows']:>4} x {r['row_len']:<5} "
                          f"{r['skipped_of_all']:>8.3f} {r['skipped_of_causal']:>11.3f} {r['attn_ratio']:>10.2f} "
                          f"{r['kernel_attn_ratio']:>12.2f}", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="tiny,50m")
    parser.add_argument("--ks", default="8,16")
    parser.add_argument("--prompt-lens", default="64,512,2000")
    parser.add_argument("--skip", default="50m:512:8,50m:512:16,50m:2000:8,50m:2000:16",
                        help="model:prompt_len:k cases left out (CPU time)")
    parser.add_argument("--prompts", type=int, default=2, help="prompt groups per batch")
    parser.add_argument("--tokens-per-micro-batch", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--block-skip", action="store_true",
                        help="only report the tree attention kernel's skipped tiles (print_block_skip); no steps run")
    add_json_flag(parser)
    args = parser.parse_args()
    if args.block_skip:
        write_json(args.json, {"block_skip": print_block_skip(args)})
        return
    skip = set(args.skip.split(",")) if args.skip else set()
    meta = {"backend": jax.default_backend(), "devices": [str(d) for d in jax.devices()],
            "args": vars(args), "note": "AEPO-like synthetic trees (see module doc); CPU times on a shared machine"}
    results = []
    header = (f"{'model':>5} {'k':>3} {'prompt':>6} {'flat tok':>9} {'flat slots':>10} {'tree tok':>9} "
              f"{'tree slots':>10} {'copies':>7} {'slot ratio':>10} {'attn ratio':>10} {'flop ratio':>10} "
              f"{'t flat s':>9} {'t tree s':>9} {'time ratio':>10} {'time/slot':>9}")
    print(header, flush=True)
    for model in args.models.split(","):
        for prompt_len in map(int, args.prompt_lens.split(",")):
            for k in map(int, args.ks.split(",")):
                if f"{model}:{prompt_len}:{k}" in skip:
                    print(f"{model:>5} {k:>3} {prompt_len:>6}  skipped (--skip)", flush=True)
                    continue
                r = run_case(model, k, prompt_len, args.prompts, args.tokens_per_micro_batch, args.repeats, args.seed)
                results.append(r)
                print(f"{model:>5} {k:>3} {prompt_len:>6} {r['flat_tokens']:>9} {r['flat_slots']:>10} "
                      f"{r['packed_tokens']:>9} {r['packed_slots']:>10} {r['copied_tokens']:>7} "
                      f"{r['slot_ratio']:>10.2f} {r['attn_ratio']:>10.2f} {r['flop_ratio']:>10.2f} "
                      f"{r['t_flat_s']:>9.3f} {r['t_tree_s']:>9.3f} {r['time_ratio']:>10.2f} "
                      f"{r['time_over_slot_ratio']:>9.2f}", flush=True)
                if args.json:  # after every case, so a cut run keeps what it measured
                    with open(args.json, "w") as f:
                        json.dump({"meta": meta, "results": results}, f, indent=1)
    write_json(args.json, {"meta": meta, "results": results})


if __name__ == "__main__":
    main()
