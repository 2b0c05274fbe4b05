"""How many examples a property test draws under the active hypothesis profile.

`@settings(max_examples=n)` on a test overrides the profile's count, so the
fuzz profile could never run more. Tests write `max_examples=examples(n)`
instead: `n` under the ci profile, and `n` scaled by the ratio of the active
profile's count to ci's otherwise (x10 under `fuzz`). The
profiles are registered and loaded in tests/conftest.py, before any test
module is imported.
"""

from __future__ import annotations

from hypothesis import settings


def examples(n: int) -> int:
    """`n` examples scaled by the active profile's max_examples relative to ci's."""
    if n < 1:
        raise ValueError(f"a property test needs at least one example, got {n}")
    return max(1, n * settings.default.max_examples // settings.get_profile("ci").max_examples)
