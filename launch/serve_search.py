"""Serve BM25 search over a JSONL corpus: `python -m launch.serve_search --corpus FILE.jsonl --port 8000`.

Prints `serving on http://HOST:PORT` once bound (`--port 0` picks a free port).
"""

from aepo_jax.servers.search_server import main

if __name__ == "__main__":
    main()
