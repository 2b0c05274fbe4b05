"""Local servers the agent's tools talk to over HTTP: the BM25 search server.

`aepo_jax.servers.search_server` holds the HTTP server itself (run it with
`python -m launch.serve_search`); it is not imported here so that it can run
as `python -m aepo_jax.servers.search_server` cleanly.
"""

from aepo_jax.servers.bm25_index import Bm25Index, load_corpus
from aepo_jax.servers.process import SearchServerHandle, start_search_server

__all__ = ["Bm25Index", "SearchServerHandle", "load_corpus", "start_search_server"]
