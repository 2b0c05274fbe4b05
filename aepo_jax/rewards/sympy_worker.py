"""A sympy equivalence worker process: JSON lines in on stdin, JSON lines out on stdout.

Run as a script (`python sympy_worker.py`), never imported by the trainer:
sympy can take unbounded time or memory on expressions such as
`10**10**10**10`, so it lives in its own process that the parent kills when
it runs past its time limit (see `math_equiv.SympyWorkerPool`).

Request: `{"a": "<sympy source>", "b": "<sympy source>"}`.
Reply: `{"equal": true|false, "error": null|"<message>"}`.
"""

from __future__ import annotations

import json
import resource
import sys

# A memory ceiling so a giant integer fails with MemoryError instead of swapping the host.
_MEMORY_LIMIT_BYTES = 2 * 1024**3


def _equal(a_source: str, b_source: str) -> bool:
    import sympy
    from sympy.parsing.sympy_parser import (
        convert_xor,
        implicit_multiplication_application,
        parse_expr,
        standard_transformations,
    )

    transformations = standard_transformations + (
        implicit_multiplication_application,
        convert_xor,
    )
    a = parse_expr(a_source, transformations=transformations)
    b = parse_expr(b_source, transformations=transformations)
    difference = sympy.simplify(a - b)
    if difference == 0:
        return True
    if difference.free_symbols or difference.is_Rational:  # a nonzero rational: distinct exact numbers
        return False
    # A decimal side (`0.1 + 0.2` against `0.3`) gets a tolerance relative to the sides for its rounding. Two
    # exact sides that `simplify` cannot show equal (`\\cos\\frac{2\\pi}{7} + ...` against `-\\frac12`) are
    # evaluated to 60 digits: equal ones then differ by rounding only, 1e-25 of the sides or 1e-40 near zero,
    # where distinct exact numbers differ by far more (`2^{40}` and `2^{40} - 1`: 1e-12 of them; `10^{-30}` and 0).
    decimal = bool(a.atoms(sympy.Float) or b.atoms(sympy.Float))
    digits, relative, absolute = (30, 1e-9, 0.0) if decimal else (60, 1e-25, 1e-40)
    value = abs(complex(sympy.N(difference, digits)))
    scale = max(abs(complex(sympy.N(a, digits))), abs(complex(sympy.N(b, digits))))
    return value <= relative * scale or value <= absolute


def main() -> None:
    try:
        resource.setrlimit(
            resource.RLIMIT_AS, (_MEMORY_LIMIT_BYTES, _MEMORY_LIMIT_BYTES)
        )
    except (ValueError, OSError):
        pass
    import sympy  # noqa: F401  (import once, before the first request)

    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        try:
            reply = {"equal": _equal(request["a"], request["b"]), "error": None}
        except Exception as exc:  # noqa: BLE001  (any sympy failure means "not shown equal")
            reply = {"equal": False, "error": f"{type(exc).__name__}: {exc}"[:500]}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
