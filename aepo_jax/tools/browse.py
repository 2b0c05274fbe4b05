"""Browser tool: fetch a web page or a corpus document and return the window that best matches a query.

`<browse>TARGET optional query words</browse>`: TARGET is an http(s) URL
(fetched with `requests`) or a corpus document id (fetched from the search
server's `GET /doc/{id}`). HTML becomes text with BeautifulSoup.
"""

from __future__ import annotations

import re
import time
import urllib.parse

from bs4 import BeautifulSoup

from aepo_jax.tools.base import ToolResult, truncate
from aepo_jax.tools.http_client import HttpError, pooled_session, request_with_retries

_WORD = re.compile(r"\w+")


def html_to_text(html: str) -> str:
    """Readable text of an HTML page: scripts, styles and navigation dropped, blank lines collapsed."""
    soup = BeautifulSoup(html, "html.parser")
    for element in soup(["script", "style", "noscript", "head", "nav", "footer"]):
        element.decompose()
    lines = (line.strip() for line in soup.get_text("\n").splitlines())
    return "\n".join(line for line in lines if line)


def best_window(text: str, query: str, window_chars: int) -> str:
    """The `window_chars` slice of `text` holding the most occurrences of the query's words (first one on ties)."""
    if len(text) <= window_chars:
        return text
    words = {w.lower() for w in _WORD.findall(query)}
    if not words:
        return text[:window_chars]
    positions = [m.start() for m in _WORD.finditer(text) if m.group(0).lower() in words]
    best_start, best_count, end = 0, 0, 0
    for i, position in enumerate(positions):  # two pointers: matches in [position, position + window)
        end = max(end, i)
        while end < len(positions) and positions[end] < position + window_chars:
            end += 1
        if end - i > best_count:
            best_start, best_count = position, end - i
    # Start a little before the first match, so its sentence has some context.
    start = max(0, min(best_start - window_chars // 8, len(text) - window_chars))
    return text[start : start + window_chars]


class BrowseTool:
    """Fetch a URL or corpus document and return a window of its text around the query.

    Args:
      search_url: base URL of the search server for document ids; None allows only URLs.
      window_chars: size of the returned window. max_result_chars: hard cap of the result.
      allow_urls: whether http(s) URLs may be fetched at all.
    """

    def __init__(self, search_url: str | None = None, window_chars: int = 2000, max_result_chars: int = 3000,
                 allow_urls: bool = True, timeout: tuple[float, float] = (2.0, 30.0), retries: int = 2,
                 backoff_seconds: float = 0.2):
        self.search_url = search_url.rstrip("/") if search_url else None
        self.window_chars, self.max_result_chars, self.allow_urls = window_chars, max_result_chars, allow_urls
        self.timeout, self.retries, self.backoff_seconds = timeout, retries, backoff_seconds
        self.session = pooled_session()

    def fetch_text(self, target: str) -> str:
        """The page or document as plain text. Raises HttpError or ValueError saying what failed."""
        if target.startswith(("http://", "https://")):
            if not self.allow_urls:
                raise ValueError("fetching URLs is disabled; browse a corpus document id instead")
            response = request_with_retries(self.session, "GET", target, timeout=self.timeout,
                                            retries=self.retries, backoff_seconds=self.backoff_seconds)
            if response.status_code != 200:
                raise HttpError(f"{target} answered HTTP {response.status_code}")
            if "html" in response.headers.get("Content-Type", "html"):
                return html_to_text(response.text)
            return response.text
        if self.search_url is None:
            raise ValueError(f"{target!r} is not a URL and no search server is configured for document ids")
        response = request_with_retries(self.session, "GET", f"{self.search_url}/doc/{urllib.parse.quote(target, safe='')}",
                                        timeout=self.timeout, retries=self.retries,
                                        backoff_seconds=self.backoff_seconds)
        if response.status_code == 404:
            raise ValueError(f"no document with id {target!r}")
        if response.status_code != 200:
            raise HttpError(f"document server answered HTTP {response.status_code}")
        contents = response.json()["document"]["contents"]
        return html_to_text(contents) if "<html" in contents.lower() else contents

    def run(self, content: str) -> ToolResult:
        """Browse `TARGET [query]`; failures become result text, never exceptions."""
        start = time.monotonic()
        target, _, query = content.strip().partition(" ")
        if not target:
            return ToolResult("Browse failed: no URL or document id given.", False, time.monotonic() - start,
                              "bad_call")
        try:
            text = self.fetch_text(target)
        except (HttpError, ValueError, KeyError, TypeError, OSError) as error:
            return ToolResult(f"Browse failed: {error}", False, time.monotonic() - start, "unavailable")
        window = best_window(text, query, self.window_chars)
        return ToolResult(truncate(window, self.max_result_chars), True, time.monotonic() - start, "ok")
