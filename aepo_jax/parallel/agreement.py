"""What every process of a run must hold alike, checked where the processes start.

Each process reads its own config (its own command line) and builds its own environment (data,
tokenizer). Processes that differ would train silently on different numbers: another learning rate
per shard, another data order, parameters that drift apart on devices that should hold one replica.
`differing_fields` compares the processes' digests; `require_agreement` raises the same error on
every process (a collective), so none is left waiting at the next barrier.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any


def digest(value: Any) -> str:
    """A short SHA-256 of `value`'s JSON (keys sorted; anything JSON cannot write, as its repr)."""
    text = json.dumps(value, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def differing_fields(views: Sequence[Mapping[str, str]]) -> dict[str, list[str]]:
    """field -> every process's digest, for the fields on which the processes' `views` differ."""
    fields = sorted({name for view in views for name in view})
    return {name: [str(view.get(name)) for view in views] for name in fields
            if len({view.get(name) for view in views}) > 1}


def require_agreement(mine: Mapping[str, str]) -> None:
    """A ValueError on every process when the processes' digests `mine` ({field: digest}) differ; nothing
    with one process. A collective: every process calls it at the same point."""
    from aepo_jax.parallel.multihost import gather_objects

    views = gather_objects(dict(mine))
    differing = differing_fields(views)
    if differing:
        listed = "; ".join(f"{name}: {', '.join(f'process {p} {d}' for p, d in enumerate(ds))}"
                           for name, ds in differing.items())
        raise ValueError(f"the processes of this run hold different {', '.join(differing)} ({listed}); every "
                         "process must be started with the same config file, overrides and data (the same "
                         "command line on every host)")
