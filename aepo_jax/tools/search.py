"""Search tool: query the local search server (`POST /retrieve`) and format numbered passages (spec §4).

Queries are cached on disk, keyed by (server URL, query, topk), so evaluation
is reproducible and a repeated query costs a file read. Only successful
responses are cached, and only in the shape they were checked to have: a list
of `{"id", "contents"}` with string contents (an answer of another shape is a
failed search, never cached). The cache is best effort: an entry is written to its own
temporary file and renamed into place (many rollouts of one prompt ask the same
query at once), and a cache file that cannot be read or written is a miss, never
a failed search.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time

from aepo_jax.tools.base import ToolResult, truncate
from aepo_jax.tools.http_client import (
    BadServerAnswer,
    HttpError,
    RefusedRequest,
    pooled_session,
    request_with_retries,
)


def checked_documents(items: object) -> list[dict[str, str]]:
    """`items` as `[{"id", "contents"}]`, accepting bare documents and FlashRAG-style scored hits
    (`{"document": {...}, "score": s}`); raises BadServerAnswer for anything else (contents must be a string)."""
    if not isinstance(items, list):
        raise BadServerAnswer(f"bad server answer: the documents are a {type(items).__name__}, not a list")
    documents = []
    for number, item in enumerate(items):
        document = item.get("document", item) if isinstance(item, dict) else item
        contents = document.get("contents") if isinstance(document, dict) else None
        if not isinstance(contents, str):
            raise BadServerAnswer(f"bad server answer: document {number} has no string 'contents': {str(item)[:200]}")
        documents.append({"id": str(document.get("id", "")), "contents": contents})
    return documents


def format_passages(documents: list[dict[str, str]], max_result_chars: int) -> str:
    """`Doc 1 (Title: ...) text` blocks, each truncated to `max_result_chars`."""
    if not documents:
        return "No results found."
    blocks = []
    for number, document in enumerate(documents, start=1):
        title, _, body = document.get("contents", "").partition("\n")
        blocks.append(truncate(f"Doc {number} (Title: {title.strip()}) {body.strip()}", max_result_chars))
    return "\n".join(blocks)


class SearchTool:
    """`<search>query</search>` against a Search-R1-style retrieval server.

    Args:
      url: server base URL, e.g. `http://127.0.0.1:8000`.
      topk: passages per query.
      max_result_chars: characters kept per passage (spec §4 default 1000).
      cache_dir: on-disk query cache; None disables it.
      timeout: (connect, read) seconds. retries / backoff_seconds / total_seconds (the most one search may
        take, retries included; None: no bound but the timeouts): see `request_with_retries`.
    """

    def __init__(self, url: str, topk: int = 3, max_result_chars: int = 1000, cache_dir: str | None = None,
                 timeout: tuple[float, float] = (2.0, 30.0), retries: int = 2, backoff_seconds: float = 0.2,
                 total_seconds: float | None = None):
        if topk < 1:
            raise ValueError(f"topk must be >= 1, got {topk}")
        self.url = url.rstrip("/")
        self.topk, self.max_result_chars, self.cache_dir = topk, max_result_chars, cache_dir
        self.timeout, self.retries, self.backoff_seconds = timeout, retries, backoff_seconds
        self.total_seconds = total_seconds
        self.session = pooled_session()
        if cache_dir:
            os.makedirs(cache_dir, exist_ok=True)

    def _cache_path(self, query: str) -> str:
        key = json.dumps([self.url, query, self.topk], ensure_ascii=False)
        return os.path.join(self.cache_dir, hashlib.sha256(key.encode()).hexdigest() + ".json")

    def _cached(self, path: str) -> list[dict[str, str]] | None:
        """The cached documents at `path`, or None when absent, unreadable or of another shape (a miss)."""
        try:
            with open(path, encoding="utf-8") as f:
                return checked_documents(json.load(f))
        except (OSError, ValueError, BadServerAnswer):
            return None

    def _store(self, path: str, documents: list[dict[str, str]]) -> None:
        """Write `documents` to `path` through a temporary file of this call's own, renamed into place;
        a failed write leaves the cache as it was."""
        try:
            handle, temporary = tempfile.mkstemp(dir=self.cache_dir, prefix=".", suffix=".tmp")
        except OSError:
            return
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as f:
                json.dump(documents, f, ensure_ascii=False)
            os.replace(temporary, path)
        except (OSError, ValueError):
            try:
                os.unlink(temporary)
            except OSError:
                pass

    def retrieve(self, query: str) -> list[dict[str, str]]:
        """Documents for one query, from the cache or the server. Raises HttpError on failure (BadServerAnswer,
        one, when the server's answer has another shape)."""
        path = self._cache_path(query) if self.cache_dir else None
        cached = self._cached(path) if path else None
        if cached is not None:
            return cached
        response = request_with_retries(
            self.session, "POST", self.url + "/retrieve",
            json={"queries": [query], "topk": self.topk, "return_scores": False},
            timeout=self.timeout, retries=self.retries, backoff_seconds=self.backoff_seconds,
            total_seconds=self.total_seconds,
        )
        if response.status_code == 413:
            raise RefusedRequest(f"the query is too large for the search server ({len(query)} characters, HTTP 413); "
                                 "use a shorter query")
        if 400 <= response.status_code < 500:
            raise RefusedRequest(f"the search server refused the query (HTTP {response.status_code}): "
                                 f"{response.text[:200]}")
        if response.status_code != 200:
            raise HttpError(f"search server answered HTTP {response.status_code}: {response.text[:200]}")
        try:
            items = response.json()["result"][0]
        except (ValueError, KeyError, IndexError, TypeError) as error:
            raise BadServerAnswer(f"bad server answer (not {{'result': [[...]]}}): {response.text[:200]}") from error
        documents = checked_documents(items)
        if path:
            self._store(path, documents)
        return documents

    def run(self, content: str) -> ToolResult:
        """Search for `content`; failures become result text, never exceptions."""
        start = time.monotonic()
        query = content.strip()
        if not query:
            return ToolResult("Search failed: the query is empty.", False, time.monotonic() - start, "bad_call")
        try:
            documents = self.retrieve(query)
        except BadServerAnswer as error:
            return ToolResult(f"Search failed: {error}", False, time.monotonic() - start, "failed")
        except RefusedRequest as error:  # the call's mistake (HTTP 4xx), not a server that is down
            return ToolResult(f"Search failed: {error}", False, time.monotonic() - start, "bad_call")
        except (HttpError, OSError, ValueError) as error:
            return ToolResult(f"Search failed: {error}", False, time.monotonic() - start, "unavailable")
        return ToolResult(format_passages(documents, self.max_result_chars), True, time.monotonic() - start, "ok")
