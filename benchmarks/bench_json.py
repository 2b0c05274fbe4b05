"""The `--json OUT` convention every benchmark follows: print a table, write JSON only when asked.

Nothing lands in the repository unless OUT points there.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", metavar="OUT", default=None,
                        help="also write the results as JSON to OUT (default: print only, write nothing)")


def write_json(path: str | None, result: Any) -> None:
    """Write `result` to `path` (parents created) when a path was given."""
    if not path:
        return
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(f"wrote {out}")
