"""Tokens/s of a full AEPO rollout and forward tokens computed vs tokens in the trajectories.

Tiny model (random weights, so tool calls are forced through `ToolForcingGenerator`),
real tools (search server on loopback, python sandbox), k=8, 16 prompts. Runs the
same rollout with branches forked from the KV cache and with every branch
re-prefilled from scratch and prints a table (JSON with `--json OUT`).

    python -m benchmarks.rollout_bench [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from aepo_jax.agent.forcing import ToolForcingGenerator
from aepo_jax.agent.loop import AgentLoop, LoopConfig, agent_stop_sequences
from aepo_jax.agent.prompts import PromptConfig, render_prompts
from aepo_jax.agent.tags import AGENT_SPECIAL_TOKENS
from aepo_jax.models import Decoder, get_preset
from aepo_jax.rollout.strategies import RolloutConfig, rollout
from aepo_jax.sampling import Sampler
from aepo_jax.servers import start_search_server
from aepo_jax.tokenizers import train_sentencepiece
from aepo_jax.tools import (
    PythonSandbox,
    PythonTool,
    SandboxLimits,
    SearchTool,
    ToolRegistry,
)
from benchmarks.bench_json import add_json_flag, write_json


class TimedGenerator:
    """Passes every call through to `inner`, adding up wall seconds per method (results fetched to host)."""

    def __init__(self, inner):
        self.inner, self.seconds = inner, {}

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if name not in ("prefill", "generate", "append", "fork", "concat"):
            return attr

        def timed(*args, **kwargs):
            start = time.perf_counter()
            out = attr(*args, **kwargs)
            jax.block_until_ready(jax.tree.leaves(getattr(out[0] if isinstance(out, tuple) else out, "inner", out)))
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start
            return out

        return timed


TOWNS = ["Brindle", "Ostwick", "Marrow", "Kelby", "Tarn", "Dunmore", "Fallow", "Harrow"]
SYSTEM = "Think, then use <search>query</search> or <python>code</python>; answer as <answer>\\boxed{x}</answer>."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--repeats", type=int, default=2, help="timed runs per mode (after one warm-up)")
    add_json_flag(parser)
    args = parser.parse_args()

    corpus = {t.lower(): f"{t}\n{t} is a town of {1000 + 37 * i} people founded in {1800 + 7 * i}."
              for i, t in enumerate(TOWNS)}
    questions = [f"How many people live in {TOWNS[i % len(TOWNS)]} (case {i})?" for i in range(args.prompts)]
    tok = train_sentencepiece(list(corpus.values()) + questions + [SYSTEM, "print(6 * 7)"] * 3, vocab_size=400,
                              special_tokens=AGENT_SPECIAL_TOKENS)
    model = Decoder(get_preset(args.preset, vocab_size=tok.vocab_size), rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    sampler = Sampler(graphdef, params, eos_ids=[tok.eos_id], pad_id=tok.pad_id,
                      stop_sequences=agent_stop_sequences(tok), max_cache_len=8192, seed=0)
    plan = [tok.encode("<think>look</think><search>Brindle people</search>"), tok.encode("<python>print(6 * 7)</python>"),
            tok.encode("<search>Marrow founded</search>"), tok.encode("<answer>\\boxed{42}</answer>")]
    generator = TimedGenerator(ToolForcingGenerator(sampler, graphdef, params, plan, free_tokens=16))
    prompts = render_prompts(tok, questions, PromptConfig(system_prompt=SYSTEM))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "corpus.jsonl"
        path.write_text("".join(json.dumps({"id": k, "contents": v}) + "\n" for k, v in corpus.items()))
        limits = SandboxLimits(wall_seconds=5.0, cpu_seconds=2, memory_bytes=256 << 20)
        with start_search_server(str(path)) as server, PythonSandbox(limits, pool_size=4) as sandbox:
            registry = ToolRegistry({"search": SearchTool(server.url, topk=1, max_result_chars=120),
                                     "python": PythonTool(sandbox)})
            for branch_by in ("fork", "prefill"):
                loop = AgentLoop(generator, tok, registry, LoopConfig(max_tool_calls=4, max_response_tokens=512,
                                                                     max_context_len=1024, branch_by=branch_by))
                for repeat in range(args.repeats + 1):
                    generator.seconds, programs_before = {}, sampler.compiled_programs()
                    start = time.perf_counter()
                    groups, stats = rollout(prompts, args.k, loop=loop, config=RolloutConfig(strategy="aepo"),
                                            rng=np.random.default_rng(repeat), key=jax.random.key(repeat))
                    seconds = time.perf_counter() - start
                    if repeat == 0:
                        continue  # warm-up: compiles
                    generated = sum(sum(t.mask) for g in groups for t in g)
                    rows.append({"branch_by": branch_by, "repeat": repeat, "seconds": seconds,
                                 "trajectory_tokens": stats.trajectory_tokens,
                                 "trajectory_tokens_per_s": stats.trajectory_tokens / seconds,
                                 "generated_tokens_per_s": generated / seconds,
                                 "forward_tokens": stats.forward_tokens,
                                 "forward_to_trajectory_ratio": stats.forward_to_trajectory_ratio,
                                 "branches": stats.num_branch, "stats": stats.as_dict(),
                                 "generator_seconds": dict(generator.seconds),
                                 "new_compiled_programs": sampler.compiled_programs() - programs_before})
            registry.close()
    print(f"AEPO rollout, preset={args.preset}, k={args.k}, prompts={args.prompts}, device={jax.devices()[0].platform}")
    print(f"{'branch_by':>9} {'rep':>3} {'sec':>7} {'traj tok/s':>10} {'gen tok/s':>9} {'fwd tok':>8} "
          f"{'traj tok':>8} {'fwd/traj':>8} {'branches':>8}")
    for r in rows:
        print(f"{r['branch_by']:>9} {r['repeat']:>3} {r['seconds']:7.2f} {r['trajectory_tokens_per_s']:10.1f} "
              f"{r['generated_tokens_per_s']:9.1f} {r['forward_tokens']:8d} {r['trajectory_tokens']:8d} "
              f"{r['forward_to_trajectory_ratio']:8.3f} {r['branches']:8d}")
        print("    generator seconds:", {k: round(v, 2) for k, v in r["generator_seconds"].items()},
              "new compiled programs:", r["new_compiled_programs"])
    write_json(args.json, {"args": vars(args), "device": str(jax.devices()[0]), "rows": rows})


if __name__ == "__main__":
    main()
