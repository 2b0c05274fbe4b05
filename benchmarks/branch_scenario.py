"""Where do ARPO and AEPO put their branches when a few lineages stay uncertain? (scripted, seeded)

The scenario (`benchmarks.branch_scenarios.few_uncertain_lineages`): a quarter
of the global trajectories meet consecutive high-entropy tool steps, the rest
stay calm; P is not saturated. Every configuration rolls out the same seeded
prompts (k = 16, 4 prompts per seed) through the real agent loop with the
scripted generator; metrics are root-credited (`aepo_jax.rollout.stats`),
computed per seed over its groups, then mean ± std over seeds.

    .venv/bin/python -m benchmarks.branch_scenario [--seeds 24] [--json OUT]

Configurations: ARPO (m = k/2), AEPO penalty only (m = k/2, so the branch
budget equals ARPO's) and full AEPO (dynamic m), each AEPO one with both
penalty scopes ("lineage", "prompt"), at the spec's penalty slope 0.05 and,
to show the mechanism's direction when it is strong, 0.3.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from benchmarks.bench_json import add_json_flag, write_json
from benchmarks.branch_scenarios import METRICS, Scenario, measure


def table(results: dict[str, dict[str, list[float]]]) -> str:
    head = "| configuration | " + " | ".join(h for _, h in METRICS) + " |"
    lines = [head, "|---|" + "---:|" * len(METRICS)]
    for name, row in results.items():
        cells = []
        for key, _ in METRICS:
            values = np.asarray(row[key], np.float64)
            values = values[~np.isnan(values)]
            cells.append("n/a" if values.size == 0 else f"{values.mean():.3f} ± {values.std():.3f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=24)
    parser.add_argument("--k", type=int, default=16)
    parser.add_argument("--prompts", type=int, default=4)
    add_json_flag(parser)
    args = parser.parse_args()
    t0 = time.perf_counter()
    results = measure(args.seeds, args.k, args.prompts)
    print(f"{args.seeds} seeds x {args.prompts} groups of k={args.k} per configuration, "
          f"{time.perf_counter() - t0:.0f} s; mean ± std over seeds")
    print(table(results))
    write_json(args.json, {"seeds": args.seeds, "k": args.k, "prompts": args.prompts,
                           "scenario": Scenario().__dict__, "results": results})


if __name__ == "__main__":
    main()
