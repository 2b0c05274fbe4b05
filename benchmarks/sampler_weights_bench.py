"""Rollout sampling on the run's fsdp shards vs on weight replicas (`rollout.sampler_weights`), one process.

    python -m benchmarks.sampler_weights_bench [--devices 8] [--mesh fsdp=8] [--json OUT.json]

A mesh that splits the weights over `fsdp` makes the sampler's decode loop gather
every layer's weights again at every token; on replicas
(`aepo_jax/parallel/host_rollout.py`) each `data x tensor` group reads whole
weights from its own memory, after one copy per rollout. Both modes sample the
same random Qwen3-shaped model (EOS banned, so every row makes `--new-tokens`)
from the same prompts and keys, in alternating rounds of one process, so drift
hits both (their logits differ by float rounding, as the two layouts split sums
differently, so sampled tokens can part; the table shows the equal fraction). Per round and mode: the copy to the replicas (none for `run_mesh`),
then prefill + generate, timed apart. The devices are `--devices` fake CPU
devices unless the process already has accelerators (`JAX_PLATFORMS`): on a CPU
the "gathers" are memory copies between fake devices sharing the same cores, so
the CPU ratio says nothing about ICI or NVLink.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

MODES = ("run_mesh", "replicas")


def parse_args() -> argparse.Namespace:
    from benchmarks.bench_json import add_json_flag

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=8, help="fake CPU devices (ignored on accelerators)")
    parser.add_argument("--mesh", default="fsdp=8", help="the run's mesh, axis=size pairs (needs fsdp > 1)")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    add_json_flag(parser)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if os.environ.get("JAX_PLATFORMS", "cpu") == "cpu":
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                                   + f" --xla_force_host_platform_device_count={args.devices}")
    import jax
    import numpy as np
    from flax import nnx
    from tqdm.auto import tqdm

    from aepo_jax.models import Decoder, get_preset
    from aepo_jax.parallel import make_mesh
    from aepo_jax.parallel.host_rollout import HostRolloutPlacement
    from aepo_jax.parallel.mesh import parse_mesh_shape
    from aepo_jax.parallel.sharding import shard_state
    from aepo_jax.sampling import Sampler, SamplingParams
    from benchmarks.bench_json import write_json

    mesh = make_mesh(parse_mesh_shape(args.mesh))
    if mesh.shape["fsdp"] < 2:
        raise SystemExit(f"--mesh {args.mesh}: the comparison needs fsdp > 1 (with fsdp 1 both modes are the same)")
    config = get_preset("tiny", n_layers=args.layers, d_model=args.d_model, vocab_size=args.vocab)
    graphdef, state = nnx.split(Decoder(config, rngs=nnx.Rngs(0)))
    state = shard_state(state, mesh)
    rng = np.random.default_rng(0)
    prompts = rng.integers(3, args.vocab, size=(args.batch, args.prompt_len)).tolist()
    placements = {mode: HostRolloutPlacement(mesh, replicas=mode == "replicas") for mode in MODES}
    samplers = {mode: Sampler(graphdef, placements[mode](state), eos_ids=[], pad_id=0, mesh=placements[mode].mesh,
                              max_cache_len=2 * (args.prompt_len + args.new_tokens), seed=0,
                              params=SamplingParams(temperature=1.0)) for mode in MODES}

    def one_round(mode: str, key: int) -> dict[str, float]:
        start = time.perf_counter()
        weights = jax.block_until_ready(placements[mode](state))
        copied = time.perf_counter()
        sampler = samplers[mode]
        sampler.set_params(weights)
        decode_state = sampler.prefill(prompts)
        prefilled = time.perf_counter()
        _, out = sampler.generate(decode_state, args.new_tokens, rng=jax.random.key(key))
        done = time.perf_counter()
        return {"copy_ms": 1e3 * (copied - start), "prefill_ms": 1e3 * (prefilled - copied),
                "generate_s": done - prefilled, "tokens_per_s": args.batch * args.new_tokens / (done - prefilled),
                "tokens": np.asarray(out.tokens)}

    for mode in MODES:  # compile both
        one_round(mode, 0)
    rounds: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    agreement = []  # fraction of equal tokens: logits differ by float rounding (sums split differently)
    for r in tqdm(range(args.rounds), desc="rounds", unit="round"):
        outs = {mode: one_round(mode, r + 1) for mode in (MODES if r % 2 == 0 else MODES[::-1])}
        agreement.append(float(np.mean(outs["run_mesh"]["tokens"] == outs["replicas"]["tokens"])))
        for mode in MODES:
            rounds[mode].append({k: v for k, v in outs[mode].items() if k != "tokens"})
    summary = {mode: {key: statistics.median(row[key] for row in rounds[mode])
                      for key in ("tokens_per_s", "copy_ms", "prefill_ms")} for mode in MODES}
    ratio = summary["replicas"]["tokens_per_s"] / summary["run_mesh"]["tokens_per_s"]
    print(f"\nrun mesh {dict(mesh.shape)}, replicas on {dict(placements['replicas'].mesh.shape)}, "
          f"{jax.devices()[0].platform} x {len(jax.devices())}; {args.layers}L d{args.d_model} V{args.vocab}, "
          f"batch {args.batch} x {args.new_tokens} new tokens, {args.rounds} rounds")
    print(f"{'mode':10s} {'tokens/s (median)':>18s} {'per round':>40s} {'copy ms':>8s} {'prefill ms':>10s}")
    for mode in MODES:
        per_round = " ".join(f"{row['tokens_per_s']:.0f}" for row in rounds[mode])
        s = summary[mode]
        print(f"{mode:10s} {s['tokens_per_s']:18.0f} {per_round:>40s} {s['copy_ms']:8.1f} {s['prefill_ms']:10.1f}")
    print(f"replicas / run_mesh generate tokens/s (medians): {ratio:.2f}x; equal tokens per round: "
          + " ".join(f"{a:.2f}" for a in agreement))
    write_json(args.json, {"config": vars(args), "run_mesh": dict(mesh.shape),
                           "replica_mesh": dict(placements["replicas"].mesh.shape),
                           "platform": jax.devices()[0].platform, "rounds": rounds, "summary": summary,
                           "replicas_over_run_mesh": ratio, "equal_token_fraction": agreement})


if __name__ == "__main__":
    main()
