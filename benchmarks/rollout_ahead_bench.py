"""RL steps/s with and without `train.rollout_ahead` (the next step's rollout on a background thread while
this step trains), on the rollout benchmark's agentic setting: AEPO, k=8, 16 prompts, tiny random model
with forced tool calls (`benchmarks/forced_tools_world.py`), real search server and sandbox made slow by
`--tool-latency-ms`.

Both modes run the real `RLTrainer` (rollout, scoring, advantages, mini-batch updates, a checkpoint at the
end of each segment). Every mode first trains `--warmups` steps (compiles), then timed segments of
`--steps` steps alternate between the modes (`--repeats` each), so load drift hits both. A segment is one
`train(num_steps=...)` call: under `rollout_ahead` its first step rolls out in the foreground (nothing was
launched for it), the others took their rollout from the background thread. Per step the table shows the
rollout's own seconds, the seconds the step waited for it, and the scoring + update seconds; per segment,
the seconds spent making new programs (tracing, lowering, compiling) on any thread. The two trainers share
their jitted scoring and update functions, so a shape compiled for one is compiled for both.

    python -m benchmarks.rollout_ahead_bench --tool-latency-ms 200 [--json OUT.json]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import jax
import jax.monitoring
import numpy as np

from aepo_jax.agent.forcing import ToolForcingGenerator
from aepo_jax.agent.loop import SCHEDULES, AgentLoop, LoopConfig
from aepo_jax.agent.prompts import PromptConfig, render_prompt
from aepo_jax.data import PromptPipeline
from aepo_jax.experiment import AgentRollout
from aepo_jax.rollout.agent_sampler import agent_sampler
from aepo_jax.rollout.strategies import RolloutConfig
from aepo_jax.sampling import SamplingParams
from aepo_jax.tools.registry import DEFAULT_MAX_WORKERS
from aepo_jax.tools.timing import TimedTools
from aepo_jax.training.rl_trainer import RLTrainer
from benchmarks.bench_json import add_json_flag, write_json
from benchmarks.forced_tools_world import SYSTEM, build_world, live_tools
from benchmarks.rollout_bench import COMPILE_EVENTS
from configs.aepo_tiny import get_config as aepo_tiny_config

MODES = ("sync", "ahead")
STEP_KEYS = ("step_time_s", "rollout_s", "rollout_wait_s", "prepare_s", "train_s", "tools_s")
_COMPILE_SECONDS = [0.0]  # tracing, lowering and compiling, summed over every thread since the start


def _count_compile(event: str, seconds: float, **_) -> None:
    if event in COMPILE_EVENTS:
        _COMPILE_SECONDS[0] += seconds


def _config(args: argparse.Namespace, ahead: bool):
    c = aepo_tiny_config()
    c.data.prompts_per_step = args.prompts
    c.rollout.k = args.k
    c.rollout.max_response_len = 512
    c.train.max_seq_len = 1024
    c.train.length_bucket = 128
    c.train.mini_batch_prompts = args.mini_batch_prompts
    c.train.micro_batch_size = args.micro_batch_size
    c.train.rollout_ahead = ahead
    c.train.recompute_logp_old = False  # rollout_ahead needs it; both runs alike do the same work
    c.train.total_steps = 10**6  # segments stop by `train(num_steps=...)`
    c.checkpoint.every = 10**6  # one save per segment: its last step
    c.checkpoint.keep = 1
    c.log.progress_bar = False
    c.log.tensorboard = False
    c.log.console_every = 10**6
    return c


def _low_token_reward(example: dict, trajectory) -> float:
    """A dense reward with spread inside a group: the share of sampled ids in the vocabulary's lower half."""
    del example
    ids = np.asarray(trajectory.response_ids)
    return float(np.mean(ids < 200)) if ids.size else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--schedule", default="continuous", choices=SCHEDULES, help="the agent loop's schedule")
    parser.add_argument("--tool-latency-ms", type=float, default=200.0)
    parser.add_argument("--tool-concurrency", type=int, default=DEFAULT_MAX_WORKERS)
    parser.add_argument("--free-tokens", type=int, default=16,
                        help="real tokens each segment samples before its planned call is forced")
    parser.add_argument("--mini-batch-prompts", type=int, default=8)
    parser.add_argument("--micro-batch-size", type=int, default=16)
    parser.add_argument("--warmups", type=int, default=3, help="untimed steps per mode before the timed ones")
    parser.add_argument("--steps", type=int, default=4, help="steps per timed segment")
    parser.add_argument("--repeats", type=int, default=2, help="timed segments per mode")
    add_json_flag(parser)
    args = parser.parse_args()

    world = build_world(args.prompts, args.preset)
    tok = world.tokenizer
    examples = [{"id": f"q{i}", "question": q, "answers": ["42"], "data_source": "bench"}
                for i, q in enumerate(world.questions)]
    prompt_config = PromptConfig(system_prompt=SYSTEM)
    loop_config = LoopConfig(max_tool_calls=4, max_response_tokens=512, max_context_len=1024, schedule=args.schedule)
    sampler = agent_sampler(world.graphdef, world.params, tok, loop_config, SamplingParams(), seed=0)
    rows = []
    with live_tools(world.corpus, args.tool_latency_ms, args.tool_concurrency) as registry, \
            tempfile.TemporaryDirectory() as tmp:
        tools = TimedTools(registry)
        loop = AgentLoop(ToolForcingGenerator(sampler, world.plan, free_tokens=(args.free_tokens, args.free_tokens)),
                         tok, tools, loop_config)
        # One rollout function (one sampler, so its compiled programs) for both trainers; they never run at once.
        rollout_fn = AgentRollout(sampler, loop, RolloutConfig(strategy="aepo"), tools)
        trainers = {}
        for mode in MODES:
            config = _config(args, ahead=mode == "ahead")
            trainers[mode] = RLTrainer(
                config, f"{tmp}/{mode}", rollout_fn=rollout_fn,
                pipeline=PromptPipeline(examples, args.prompts, seed=0),
                encode_prompt=lambda ex: render_prompt(tok, ex["question"], prompt_config),
                reward_fn=_low_token_reward, graphdef=world.graphdef, params=jax.tree.map(np.copy, world.params),
                pad_id=int(tok.pad_id))
        trainers["ahead"]._train_step = trainers["sync"]._train_step  # same config but rollout_ahead:
        trainers["ahead"]._logprobs = trainers["sync"]._logprobs  # share the compiled programs
        jax.monitoring.register_event_duration_secs_listener(_count_compile)
        for mode, trainer in trainers.items():
            if args.warmups:
                trainer.train(num_steps=args.warmups, progress=False)
        for repeat in range(1, args.repeats + 1):
            for mode, trainer in trainers.items():
                compiled, start = _COMPILE_SECONDS[0], time.perf_counter()
                records = trainer.train(num_steps=args.steps, progress=False)
                seconds = time.perf_counter() - start
                rows.append({"mode": mode, "repeat": repeat, "seconds": seconds, "steps": len(records),
                             "steps_per_s": len(records) / seconds, "compile_seconds": _COMPILE_SECONDS[0] - compiled,
                             "per_step": [{key: float(r.get(key, float("nan"))) for key in STEP_KEYS}
                                          for r in records]})
        for trainer in trainers.values():
            trainer.close()

    summary = {mode: {"steps_per_s": float(np.mean([r["steps_per_s"] for r in rows if r["mode"] == mode])),
                      "seconds_per_step": float(np.mean([r["seconds"] / r["steps"] for r in rows if r["mode"] == mode]))}
               | {f"mean_{key}": float(np.mean([s[key] for r in rows if r["mode"] == mode for s in r["per_step"]]))
                  for key in STEP_KEYS}
               for mode in MODES}
    speedup = summary["ahead"]["steps_per_s"] / summary["sync"]["steps_per_s"]
    print(f"RL steps, AEPO, preset={args.preset}, k={args.k}, prompts={args.prompts}, schedule={args.schedule}, "
          f"tool latency {args.tool_latency_ms:g} ms, tool concurrency {args.tool_concurrency}, "
          f"{args.steps} steps per segment, device={jax.devices()[0].platform}")
    print(f"{'mode':>6} {'rep':>3} {'sec':>7} {'compile':>7} {'steps/s':>8}   per step: "
          f"{'rollout s':>9} {'waited s':>8} {'train s':>7} {'step s':>6}")
    for r in sorted(rows, key=lambda r: (r["mode"], r["repeat"])):
        per = r["per_step"]
        print(f"{r['mode']:>6} {r['repeat']:>3} {r['seconds']:7.2f} {r['compile_seconds']:7.2f} {r['steps_per_s']:8.3f}   "
              f"{'':>10}{np.mean([s['rollout_s'] for s in per]):9.2f} {np.mean([s['rollout_wait_s'] for s in per]):8.2f} "
              f"{np.mean([s['prepare_s'] + s['train_s'] for s in per]):7.2f} "
              f"{np.mean([s['step_time_s'] for s in per]):6.2f}")
    print(f"rollout_ahead / synchronous steps/s (mean over segments): {speedup:.2f}x")
    write_json(args.json, {"args": vars(args), "device": str(jax.devices()[0]), "modes": summary,
                           "speedup": speedup, "rows": rows})


if __name__ == "__main__":
    main()
