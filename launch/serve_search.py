"""Serve BM25 search over a JSONL corpus: `python -m launch.serve_search --corpus FILE.jsonl --port 8000`.

Prints `serving on http://HOST:PORT` once bound (`--port 0` picks a free port). A corpus that cannot be
read or a port that cannot be bound is one `error: ...` line, not a traceback.
"""

from __future__ import annotations

from collections.abc import Sequence

from aepo_jax.servers.search_server import main as serve


def main(argv: Sequence[str] | None = None) -> None:
    """`aepo_jax.servers.search_server.main`, with an OSError (a missing corpus, a port in use) as
    `error: MESSAGE` and exit status 1."""
    try:
        serve(argv)
    except OSError as err:
        where = f": {err.filename}" if err.filename else ""
        raise SystemExit(f"error: {err.strerror or err}{where}") from err


if __name__ == "__main__":
    main()
