"""Trajectories/s, device-busy fraction and forward tokens per trajectory token of a full AEPO rollout,
per agent-loop schedule (`rounds` vs `continuous`), with real tools that can be made slow.

Tiny model (random weights, so tool calls are forced through `ToolForcingGenerator`),
real tools (search server on loopback, python sandbox), k=8, 16 prompts.
`--tool-latency-ms N` makes the search server and the sandbox answer no sooner than N ms
after a call (their own latency options, not a mock). Device-busy fraction: wall seconds
inside the sampler's jitted programs of every kind (prefill, append, reshape = grow / fork /
concat / the layer split, and decode; each call timed until its results are ready,
`Sampler.device_seconds`, kept per kind in each row's `device_seconds`) less the compiles made
inside those calls, over the rollout's wall time less the same compiles (forced tokens are
scored inside the sampler's appends, `Sampler.score_append`, so they count as append time);
`device_busy_fraction_with_compiles` keeps the compiles in. Prints a table; `--json OUT` writes
`{"schedules": {"rounds": {...}, "continuous": {...}}, "order_per_repeat": [...], "rows": [...]}`.

Order. Within a repeat every schedule runs once; the order rotates from one repeat to the next
(with rounds and continuous: repeat 1 rounds first, repeat 2 continuous first, ...), so the
programs the first run of a repeat compiles on the spot are not always free for the same
schedule. Each row records its `position_in_repeat`, and `order_per_repeat` the orders; an odd
number of repeats leaves one schedule first once more than the other.

Compiles, and which ratio is the headline. A run compiles the shapes the warm-ups did not meet.
Rounds compiles them on the spot, inside its time; a continuous run (`--background-compile auto`,
the default) runs a larger compiled variant instead and compiles the new shape after the run ends
(`held_compiles`), outside its time (`compile_drain_seconds`, waited for between runs so no run is
slowed by compiles another queued). Raw trajectories/s therefore charge rounds for its compiles and
continuous for none of its own. The headline ratio is the compile-free one, where neither side pays:
each run's seconds less its on-the-spot compiles (`compile_seconds`: tracing, lowering and XLA's
compile on the thread that runs the rollout, from jax's monitoring events). Compiles on the
sampler's background thread are `background_compile_seconds`, not subtracted: a loop run holds
them until it ends, so with `--premonitor-overlap on` (one loop run per rollout) they run in the
drain after the timed run, not during it; with it off, the pre-monitoring run's held compiles
start when that run ends and run beside the main run, inside the timed time. Also printed: the
raw ratio, and the ratio with every compile charged to the run that caused it (continuous: its
seconds plus its drain). `new_compiled_programs` counts XLA compiles (backend compile events) on
every thread.

Tool bound (`aepo_jax/rollout/critical_path.py`): each run's trees make `tool_calls` calls, of which
`serial_tool_calls` must follow one another, so with L seconds per call and N in flight no schedule
finishes that rollout sooner than max(serial * L, calls * L / N) (`tool_bound_seconds`). Rounds'
mean compile-free seconds (`seconds_without_compiles`) over the largest bound of any run (every
schedule's and branch mode's, so the ceiling is the lowest the runs allow; the JSON names that run
in `rounds.tool_bound_run`) is what hiding tool latency could gain at most (`speedup_ceiling`).

    python -m benchmarks.rollout_bench --tool-latency-ms 200 [--json OUT.json]
"""

from __future__ import annotations

import argparse
import contextlib
import threading
import time

import jax
import jax.monitoring
import numpy as np

from aepo_jax.agent.forcing import ToolForcingGenerator
from aepo_jax.agent.loop import SCHEDULES, AgentLoop, LoopConfig
from aepo_jax.agent.loop_config import BACKGROUND_COMPILE
from aepo_jax.agent.prompts import PromptConfig, render_prompts
from aepo_jax.rollout.agent_sampler import agent_sampler
from aepo_jax.rollout.strategies import RolloutConfig, rollout
from aepo_jax.sampling import SamplingParams
from aepo_jax.tools.registry import DEFAULT_MAX_WORKERS
from benchmarks.bench_json import add_json_flag, write_json
from benchmarks.cache_census import LiveCacheCensus
from benchmarks.forced_tools_world import SYSTEM, build_world, live_tools

# jax's monitoring events of making one program: tracing it, lowering it to MLIR, XLA's compile.
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration",
                  BACKEND_COMPILE_EVENT)

SUMMARY_KEYS = ("seconds", "seconds_without_compiles", "trajectories_per_s", "trajectories_per_s_without_compiles",
                "trajectories_per_s_all_compiles_charged", "device_busy_fraction",
                "device_busy_fraction_with_compiles", "forward_tokens_per_trajectory_token", "trajectory_tokens_per_s",
                "ticks", "branches", "compile_seconds", "background_compile_seconds", "compile_drain_seconds",
                "tool_calls", "serial_tool_calls", "tool_bound_seconds")



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--repeats", type=int, default=2, help="timed runs per schedule (after the warm-ups)")
    parser.add_argument("--warmups", type=int, default=2, help="untimed runs of every schedule before the timed ones")
    parser.add_argument("--tool-latency-ms", type=float, default=0.0,
                        help="the search server and the sandbox answer no sooner than this after a call")
    parser.add_argument("--tool-concurrency", type=int, default=DEFAULT_MAX_WORKERS,
                        help="tool calls in flight at once (the registry's threads), under every schedule")
    parser.add_argument("--schedules", default=",".join(SCHEDULES), help="agent-loop schedules to compare")
    parser.add_argument("--branch-by", default="fork", help="fork (KV-cache copy) and/or prefill, comma-separated")
    parser.add_argument("--free-tokens", default="16", type=_free_tokens,
                        help="real tokens each segment samples before its planned call is forced: a count N "
                             "(every row alike) or LOW:HIGH (drawn per segment, so rows stop at different times)")
    parser.add_argument("--chunk-tokens", type=int, default=LoopConfig.chunk_tokens,
                        help="the continuous schedule's decode chunk")
    parser.add_argument("--arrival-window-ms", type=float, default=LoopConfig.arrival_window_ms,
                        help="continuous: results arriving within this of each other are folded in together")
    parser.add_argument("--background-compile", default=LoopConfig.background_compile, choices=BACKGROUND_COMPILE,
                        help="new shapes compile in the background (auto: under continuous only)")
    parser.add_argument("--premonitor-overlap", default="on", choices=("on", "off"),
                        help="continuous: each prompt's rollout starts once its own pre-monitoring sample ends")
    parser.add_argument("--cache-census", action="store_true",
                        help="also count the KV caches alive after every sampler program: each run's peak, in "
                             "largest single caches (benchmarks/cache_census.py; adds host work to every call)")
    add_json_flag(parser)
    args = parser.parse_args()
    schedules = [x for x in args.schedules.split(",") if x]
    branch_modes = [x for x in args.branch_by.split(",") if x]

    world = build_world(args.prompts, args.preset)
    tok, graphdef, params, plan = world.tokenizer, world.graphdef, world.params, world.plan
    loop_configs = {(branch_by, schedule): LoopConfig(
        max_tool_calls=4, max_response_tokens=512, max_context_len=1024, branch_by=branch_by, schedule=schedule,
        chunk_tokens=args.chunk_tokens, arrival_window_ms=args.arrival_window_ms,
        background_compile=args.background_compile) for branch_by in branch_modes for schedule in schedules}
    # Built as training builds them (one cache length per rollout; the loops share their limits). One sampler per
    # loop: whether it compiles in the background follows the loop's schedule. Compiled programs are shared.
    samplers = {key: agent_sampler(graphdef, params, tok, config, SamplingParams(), seed=0)
                for key, config in loop_configs.items()}
    prompts = render_prompts(tok, world.questions, PromptConfig(system_prompt=SYSTEM))
    rollout_config = RolloutConfig(strategy="aepo", premonitor_overlap=args.premonitor_overlap == "on")
    latency = args.tool_latency_ms
    with live_tools(world.corpus, latency, args.tool_concurrency) as registry:
        loops = {key: AgentLoop(ToolForcingGenerator(samplers[key], plan, free_tokens=args.free_tokens), tok, registry,
                                config) for key, config in loop_configs.items()}
        # Warm-ups of every schedule first (they compile the programs of the shapes they meet, which all
        # schedules share), then the timed runs interleaved, so load drift and compiles of shapes
        # still unseen fall on every schedule alike.
        for warmup in range(args.warmups):
            for key, loop in loops.items():
                _timed_rollout(loop, samplers[key], rollout_config, prompts, args.k, 1000 + warmup, census=False)
        for sampler in samplers.values():  # the warm-ups' queued compiles finish here, not inside a timed run
            sampler.wait_for_compiles()
        rows = run_repeats(args.repeats, branch_modes, schedules, lambda branch_by, schedule, repeat: _timed_rollout(
            loops[branch_by, schedule], samplers[branch_by, schedule], rollout_config, prompts, args.k, repeat,
            latency / 1000.0, args.tool_concurrency, census=args.cache_census))
    summary = _summaries(rows, schedules, branch_modes[0])
    order_per_repeat = [schedule_order(schedules, i) for i in range(args.repeats)]
    low, high = args.free_tokens
    print(f"AEPO rollout, preset={args.preset}, k={args.k}, prompts={args.prompts}, "
          f"tool latency {latency:g} ms, tool concurrency {args.tool_concurrency}, "
          f"free tokens per segment {low if low == high else f'{low}-{high}'}, "
          f"pre-monitoring overlap {args.premonitor_overlap}, device={jax.devices()[0].platform}")
    print("order per repeat:", "; ".join(" then ".join(order) for order in order_per_repeat))
    print(f"{'schedule':>10} {'branch_by':>9} {'rep':>3} {'sec':>7} {'traj/s':>7} {'busy':>5} "
          f"{'fwd/traj':>8} {'traj tok/s':>10} {'ticks':>5} {'branches':>8} {'calls':>5} {'serial':>6} "
          f"{'bound s':>7}")
    for r in sorted(rows, key=lambda r: (r["branch_by"], r["schedule"] != "rounds", r["repeat"])):
        print(f"{r['schedule']:>10} {r['branch_by']:>9} {r['repeat']:>3} {r['seconds']:7.2f} "
              f"{r['trajectories_per_s']:7.2f} {r['device_busy_fraction']:5.2f} "
              f"{r['forward_tokens_per_trajectory_token']:8.3f} "
              f"{r['trajectory_tokens_per_s']:10.1f} {r['ticks']:5d} {r['branches']:8d} {r['tool_calls']:5d} "
              f"{r['serial_tool_calls']:6d} {r['tool_bound_seconds']:7.2f}")
        print("    device seconds:", {k: round(v, 2) for k, v in r["device_seconds"].items()},
              "new compiled programs:", r["new_compiled_programs"], f"(on the spot {r['compile_seconds']:.2f} s;",
              f"background {r['background_compile_seconds']:.2f} s; busy with compiles "
              f"{r['device_busy_fraction_with_compiles']:.2f};",
              f"after the run: {r['compile_drain_seconds']:.2f} s;",
              f"{r['background_compiles']} in the background, of which {r['held_compiles']} held until the run "
              f"ended; {r['fallback_calls']} calls ran a larger variant)")
        if "peak_caches" in r:
            print(f"    KV caches alive at once, at most: {r['peak_caches']:.3f} x the largest "
                  f"({r['largest_batch']} rows)")
    if {"rounds", "continuous"} <= set(summary):
        ratios = {key: summary["continuous"][key] / summary["rounds"][key]
                  for key in ("trajectories_per_s_without_compiles", "trajectories_per_s",
                              "trajectories_per_s_all_compiles_charged")}
        summary["continuous_over_rounds"] = ratios
        print(f"continuous / rounds trajectories/s (mean over repeats, branch_by={branch_modes[0]}), compile-free "
              f"(each run's on-the-spot compiles taken out of its seconds; the headline): "
              f"{ratios['trajectories_per_s_without_compiles']:.2f}x")
        print(f"  raw (rounds pays its compiles inside its time, continuous's held compiles run after its time): "
              f"{ratios['trajectories_per_s']:.2f}x; every compile charged to the run that caused it (continuous: "
              f"plus its drain): {ratios['trajectories_per_s_all_compiles_charged']:.2f}x")
        ceiling = speedup_ceiling(rows, branch_modes[0])
        if ceiling:  # no tool latency: no tool bound
            summary["rounds"] |= ceiling
            run = ceiling["tool_bound_run"]
            print(f"at most {ceiling['speedup_ceiling']:.2f}x for any schedule: rounds' mean compile-free seconds "
                  f"({ceiling['seconds_without_compiles']:.2f} s over {ceiling['rounds_runs']} runs) over the largest "
                  f"tool bound of any run ({ceiling['tool_bound_seconds']:.2f} s: {run['schedule']}, "
                  f"branch_by={run['branch_by']}, repeat {run['repeat']}, {run['tool_calls']} calls, "
                  f"{run['serial_tool_calls']} serial)")
    write_json(args.json, {"args": vars(args), "device": str(jax.devices()[0]), "schedules": summary,
                           "order_per_repeat": order_per_repeat, "rows": rows})


def schedule_order(schedules: list[str], repeat_index: int) -> list[str]:
    """The schedules' order in repeat `repeat_index` (from 0): rotated by one each repeat, so each goes first
    in turn (two schedules alternate) and the programs the first run compiles on the spot favour none."""
    shift = repeat_index % len(schedules)
    return schedules[shift:] + schedules[:shift]


def run_repeats(repeats: int, branch_modes: list[str], schedules: list[str], run) -> list[dict]:
    """`run(branch_by, schedule, repeat)` for every repeat (from 1), branch mode and schedule, schedules in
    `schedule_order`; each row gains its schedule, branch_by and position_in_repeat."""
    rows = []
    for repeat in range(1, repeats + 1):
        for branch_by in branch_modes:
            for position, schedule in enumerate(schedule_order(schedules, repeat - 1)):
                rows.append(run(branch_by, schedule, repeat)
                            | {"schedule": schedule, "branch_by": branch_by, "position_in_repeat": position})
    return rows


def speedup_ceiling(rows: list[dict], branch_by: str) -> dict:
    """The most any schedule could gain over rounds by hiding tool latency: rounds' mean compile-free seconds
    (rows with `branch_by`) over the largest tool bound of any row (so the lowest ceiling the runs allow).
    Empty when there are no rounds rows or no tool bound (no tool latency)."""
    rounds = [r for r in rows if r["schedule"] == "rounds" and r["branch_by"] == branch_by]
    if not rounds:
        return {}
    largest = max(rows, key=lambda r: r["tool_bound_seconds"])
    if largest["tool_bound_seconds"] <= 0:
        return {}
    seconds = float(np.mean([r["seconds_without_compiles"] for r in rounds]))
    return {"speedup_ceiling": seconds / largest["tool_bound_seconds"], "seconds_without_compiles": seconds,
            "rounds_runs": len(rounds), "tool_bound_seconds": largest["tool_bound_seconds"],
            "tool_bound_run": {key: largest[key] for key in ("schedule", "branch_by", "repeat", "tool_calls",
                                                              "serial_tool_calls")}}


def _free_tokens(text: str) -> tuple[int, int]:
    """`N` or `LOW:HIGH` -> (low, high)."""
    try:
        low, _, high = text.partition(":")
        return int(low), int(high or low)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--free-tokens takes N or LOW:HIGH, got {text!r}") from None


# Time this process spent making programs so far (jax.monitoring, below): on the thread that runs the
# rollout (on the spot) as (start, end) intervals, whose union is the time (a jit traced inside another's
# trace reports its own event within the outer one's), and as summed event seconds on the sampler's
# background compile threads; and how many XLA compiles.
_ON_THE_SPOT: list[tuple[float, float]] = []
_COMPILE_SECONDS = {"background": 0.0}
_BACKEND_COMPILES = [0]


def _count_compile(event: str, seconds: float, **_) -> None:
    if event in COMPILE_EVENTS:
        if threading.current_thread() is threading.main_thread():
            end = time.perf_counter()
            _ON_THE_SPOT.append((end - seconds, end))
        else:
            _COMPILE_SECONDS["background"] += seconds
    if event == BACKEND_COMPILE_EVENT:
        _BACKEND_COMPILES[0] += 1


def on_the_spot_seconds(since: int = 0) -> float:
    """The union of the on-the-spot compile intervals recorded from index `since` on, in seconds."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(_ON_THE_SPOT[since:]):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


jax.monitoring.register_event_duration_secs_listener(_count_compile)


def _timed_rollout(loop, sampler, config: RolloutConfig, prompts, k: int, repeat: int, latency_s: float = 0.0,
                   concurrency: int = 1, census: bool = False) -> dict:
    """One AEPO rollout, timed: wall seconds, sampler program seconds (forced tokens are scored inside
    them), the seconds spent making programs among them (shapes the warm-ups did not meet) and the tool bound;
    with `census`, also the most KV cache alive at once (`LiveCacheCensus`)."""
    device_before = sampler.device_seconds
    counters_before = sampler.compile_counters
    compile_before, spot_before = dict(_COMPILE_SECONDS), len(_ON_THE_SPOT)
    programs_before = _BACKEND_COMPILES[0]
    counting = LiveCacheCensus(sampler) if census else contextlib.nullcontext()
    start = time.perf_counter()
    with counting:
        groups, stats = rollout(prompts, k, loop=loop, config=config,
                                rng=np.random.default_rng(repeat), key=jax.random.key(repeat))
    seconds = time.perf_counter() - start
    caches = {"peak_caches": counting.peak_caches, "largest_batch": counting.largest_batch} if census else {}
    compile_seconds = on_the_spot_seconds(spot_before)
    # Background compiles this run queued and did not finish: finished here, outside its time, so they do
    # not run during (and slow) the next timed run, which may be another schedule's.
    drain_start = time.perf_counter()
    sampler.wait_for_compiles()
    drain_seconds = time.perf_counter() - drain_start
    background_seconds = _COMPILE_SECONDS["background"] - compile_before["background"]
    device = {kind: v - device_before[kind] for kind, v in sampler.device_seconds.items()}
    device_total = sum(device.values())
    if compile_seconds > device_total + 0.05:  # the busy fraction below takes on-the-spot compiles to be in calls
        print(f"warning: {compile_seconds:.2f} s of on-the-spot compiles but only {device_total:.2f} s inside sampler "
              "calls: a program compiled outside the sampler, so the compile-free busy fraction reads low")
    trajectories = sum(len(g) for g in groups)
    return {"repeat": repeat, "seconds": seconds, "seconds_without_compiles": max(seconds - compile_seconds, 1e-9),
            "trajectories": trajectories,
            "trajectories_per_s": trajectories / seconds,
            # As if the programs compiled on the spot inside the run had been compiled before it (a long
            # training run meets each shape once; an eight-warm-up benchmark still meets a few).
            "trajectories_per_s_without_compiles": trajectories / max(seconds - compile_seconds, 1e-9),
            "trajectories_per_s_all_compiles_charged": trajectories / (seconds + drain_seconds),
            "device_seconds": device,
            "device_busy_fraction": max(device_total - compile_seconds, 0.0) / max(seconds - compile_seconds, 1e-9),
            "device_busy_fraction_with_compiles": device_total / seconds,
            "forward_tokens": stats.forward_tokens, "trajectory_tokens": stats.trajectory_tokens,
            "forward_tokens_per_trajectory_token": stats.forward_to_trajectory_ratio,
            "trajectory_tokens_per_s": stats.trajectory_tokens / seconds,
            "ticks": int(stats.as_dict().get("rounds", 0)), "branches": stats.num_branch,
            "tool_calls": stats.tool_calls, "serial_tool_calls": stats.serial_tool_calls,
            "tool_bound_seconds": latency_s * max(stats.serial_tool_calls, stats.tool_calls / concurrency),
            "stats": stats.as_dict(), "new_compiled_programs": _BACKEND_COMPILES[0] - programs_before,
            "compile_seconds": compile_seconds, "background_compile_seconds": background_seconds,
            "compile_drain_seconds": drain_seconds, **caches,
            **{name: v - counters_before[name] for name, v in sampler.compile_counters.items()}}


def _summaries(rows: list[dict], schedules: list[str], branch_by: str) -> dict:
    """Per schedule, the mean over repeats of each summary figure (rows with `branch_by`)."""
    out = {}
    for schedule in schedules:
        mine = [r for r in rows if r["schedule"] == schedule and r["branch_by"] == branch_by]
        if mine:
            out[schedule] = {key: float(np.mean([r[key] for r in mine])) for key in SUMMARY_KEYS}
            out[schedule]["repeats"] = len(mine)
    return out


if __name__ == "__main__":
    main()
