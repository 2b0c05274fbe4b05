"""XLA CPU compile settings: seconds to compile one tiny-decoder train step vs the time to run it.

    python -m benchmarks.compile_flags_bench [--json OUT] [--steps 20]

Why: the test suite's time is mostly compiling small programs once, so the
suite compiles with the settings in `tests/child_process.py`. Each setting
runs in its own process (XLA reads `XLA_FLAGS` once, at start-up) with the
persistent compilation cache off. The program is the `tiny` decoder (vocab
64, batch 4 x 64 tokens) with a log-softmax loss, its gradient and an AdamW
update. Compile time is the CPU time (user + system) of `compile()`, which a
busy machine inflates less than wall time; run time is the mean wall time
of `--steps` steps after one warm-up step. Every setting must give the same
loss within float32 rounding.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from benchmarks.bench_json import add_json_flag, write_json

SETTINGS = {
    "xla default": "",
    "llvm opt 0": "--xla_backend_optimization_level=0",
    "llvm opt 0, loop emitters": "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false",
    "llvm opt 0, loop emitters, no expensive llvm passes (tests)":
        "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false "
        "--xla_llvm_disable_expensive_passes=true",
}

_CHILD = r'''
import json, resource, sys, time
import jax, jax.numpy as jnp, optax
from flax import nnx
from aepo_jax.models import Decoder, get_preset

steps = int(sys.argv[1])
graphdef, params = nnx.split(Decoder(get_preset("tiny", vocab_size=64), rngs=nnx.Rngs(0)))
ids = jnp.ones((4, 64), jnp.int32)
optimizer = optax.adamw(1e-3)

def train_step(params, state, ids):
    def loss(p):
        logits = nnx.merge(graphdef, p)(ids).astype(jnp.float32)
        return jax.nn.log_softmax(logits)[..., 0].mean()
    value, grads = jax.value_and_grad(loss)(params)
    updates, state = optimizer.update(grads, state, params)
    return optax.apply_updates(params, updates), state, value

def cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime

state = optimizer.init(params)
lowered = jax.jit(train_step).lower(params, state, ids)
cpu0, wall0 = cpu_seconds(), time.perf_counter()
compiled = lowered.compile()
compile_cpu, compile_wall = cpu_seconds() - cpu0, time.perf_counter() - wall0
out = jax.block_until_ready(compiled(params, state, ids))
wall0 = time.perf_counter()
for _ in range(steps):
    out = compiled(out[0], out[1], ids)
jax.block_until_ready(out)
print(json.dumps({"compile_cpu_s": compile_cpu, "compile_wall_s": compile_wall,
                  "step_ms": 1000 * (time.perf_counter() - wall0) / steps, "loss": float(out[2])}))
'''


def measure(flags: str, steps: int) -> dict:
    """One setting in a fresh process: compile CPU/wall seconds, ms per step, final loss."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=flags, JAX_ENABLE_COMPILATION_CACHE="false")
    out = subprocess.run([sys.executable, "-c", _CHILD, str(steps)], env=env, capture_output=True, text=True,
                         timeout=600, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"XLA_FLAGS={flags!r} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="timed train steps per setting")
    add_json_flag(parser)
    args = parser.parse_args()
    rows = {}
    for name, flags in SETTINGS.items():
        rows[name] = {"xla_flags": flags, **measure(flags, args.steps)}
    print(f"{'setting':62s} {'compile CPU s':>13s} {'compile wall s':>14s} {'ms/step':>8s} {'loss':>11s}")
    for name, row in rows.items():
        print(f"{name:62s} {row['compile_cpu_s']:13.2f} {row['compile_wall_s']:14.2f} {row['step_ms']:8.2f} "
              f"{row['loss']:11.6f}")
    write_json(args.json, {"steps": args.steps, "settings": rows})
    reference = rows["xla default"]["loss"]
    differing = {name: row["loss"] for name, row in rows.items() if abs(row["loss"] - reference) > 1e-5 * abs(reference)}
    if differing:
        raise SystemExit(f"losses differ from XLA's default build ({reference}) beyond float32 rounding: {differing}")


if __name__ == "__main__":
    main()
