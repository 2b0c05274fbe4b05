"""One process of `test_evaluate_multihost.py`'s failure test: what the evaluation's exchange does when
the processes disagree or one of them fails (prints `RESULT <json>`)."""

from __future__ import annotations

import json

import jax

from aepo_jax.evaluation.driver import _check_same_questions, _exchange
from aepo_jax.parallel.distributed import maybe_initialize_distributed


def outcome(fn) -> str:
    try:
        fn()
    except Exception as err:  # noqa: BLE001 - the test reads which error each process got
        return f"{type(err).__name__}: {err}"
    return "ok"


def main() -> None:
    part, _ = maybe_initialize_distributed("on")
    examples = [{"id": f"q{i}"} for i in range(3)]
    same = outcome(lambda: _check_same_questions(examples, [[1, 2]] * 3))
    other_prompts = outcome(lambda: _check_same_questions(examples, [[1, 2 + part]] * 3))
    error = RuntimeError("tool server down") if part == 1 else None
    failed = outcome(lambda: _exchange([], [], error, 3))
    gaps = outcome(lambda: _exchange([(part, None, [], [])], [], None, 3))  # question 2 is nobody's
    # Process p scored question p of batch 0 and question 2 + p of batch 1 (its part of each batch).
    scored = [(p, None, [f"q{p}"], []) for p in (part, 2 + part)]
    merged, stats = _exchange(scored, [(0, part, f"b0p{part}"), (1, part, f"b1p{part}")], None, 4)
    print("RESULT " + json.dumps({"part": jax.process_index(), "same": same, "other_prompts": other_prompts,
                                  "failed": failed, "gaps": gaps, "merged": [m[2][0] for m in merged],
                                  "stats": [entry[2] for entry in stats]}), flush=True)


if __name__ == "__main__":
    main()
