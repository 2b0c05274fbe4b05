"""Browser tool: fetch a web page or a corpus document and return the window that best matches a query.

`<browse>TARGET optional query words</browse>`: TARGET (up to the first
whitespace) is an http(s) URL or a corpus document id (fetched from the search
server's `GET /doc/{id}`). HTML becomes text in one streaming pass
(`aepo_jax.tools.html_text`).

A page is decoded from its bytes: the charset of its Content-Type header,
else (HTML) its `<meta charset>`, else UTF-8, else a detected encoding (never
`requests`' ISO-8859-1 default for `text/*`, which garbled UTF-8 pages). Only
text is read: a content type that is not text, HTML, XML or JSON (an image, a
PDF) is refused before its body is read.

A URL is fetched (with `allow_urls`) within bounds, since the model picks it:
- the body is streamed and only its first `max_page_bytes` are read; a page cut
  there says so at the end of the result, and a UTF-8 character the cut splits
  is dropped (left in, it failed strict UTF-8 and the whole page was decoded as
  windows-1252: 'cafÃ©');
- the whole fetch, redirects included, ends by `deadline_seconds` (a server
  that drips one byte at a time never trips a per-read timeout), the DNS
  lookups too (each on a daemon thread, since `getaddrinfo` has no timeout);
- every host, the first and each redirect's (followed by hand, at most
  `max_redirects`), is resolved and refused when an address is link-local
  (169.254.0.0/16, where cloud metadata services answer; fe80::/10) or, unless
  `allow_loopback`, loopback or unspecified (127.0.0.0/8, ::1, 0.0.0.0).
Known limit: the check resolves the name and the HTTP client resolves it again,
so a DNS answer that changes in between (rebinding) is not caught.
"""

from __future__ import annotations

import codecs
import dataclasses
import functools
import ipaddress
import re
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable
from concurrent.futures import Future

import requests
import urllib3
from bs4 import UnicodeDammit
from bs4.dammit import EncodingDetector

from aepo_jax.tools.base import ToolResult, truncate_within
from aepo_jax.tools.html_text import html_to_text
from aepo_jax.tools.http_client import (
    BadServerAnswer,
    HttpError,
    RefusedRequest,
    pooled_session,
    request_with_retries,
)

_WORD = re.compile(r"\w+")
_TEXT_TYPES = ("application/json", "application/xml", "application/xhtml+xml", "application/javascript")


class DocumentNotFound(ValueError):
    """The corpus has no document with that id: the call's mistake (status `bad_call`)."""


@dataclasses.dataclass(frozen=True)
class Page:
    """A page's text, and a note for the model about how it was read ('' when there is nothing to say)."""

    text: str
    note: str = ""


def content_type(header: str) -> tuple[str, str]:
    """(media type lower-cased, charset) of a Content-Type header; '' for what it does not say."""
    media, *params = header.split(";")
    charset = ""
    for param in params:
        key, _, value = param.partition("=")
        if key.strip().lower() == "charset":
            charset = value.strip().strip("'\"")
    return media.strip().lower(), charset


def is_text(media: str) -> bool:
    """Whether a page of media type `media` ('' when the server did not say) is read as text."""
    return (not media or media.startswith("text/") or media in _TEXT_TYPES
            or media.endswith(("+xml", "+json")))


def without_cut_character(body: bytes) -> bytes:
    """`body` less the incomplete UTF-8 character at its end, if it has one and is UTF-8 before it.

    For a body cut at `max_page_bytes`: the first bytes of a character the cut split made strict UTF-8 fail,
    and the whole page was decoded as windows-1252 even with `charset=utf-8` declared. A page in another
    encoding that happens to be UTF-8 up to its last bytes loses at most three of them, where it was cut anyway.
    """
    decoder = codecs.getincrementaldecoder("utf-8")()
    try:
        decoder.decode(body, final=False)  # keeps an incomplete last character back instead of failing on it
    except UnicodeDecodeError:
        return body  # not UTF-8: the detector's to decode
    pending, _ = decoder.getstate()
    return body[: len(body) - len(pending)]


def decode_page(body: bytes, charset: str, html: bool) -> str:
    """`body` as text: in `charset` (the header's) when given and known, else (HTML) in its `<meta charset>`,
    else UTF-8, else windows-1252 (the web's default for undeclared pages; a detector's guess garbled
    French Latin-1 text), else UTF-8 with replacement characters."""
    # The page's own declaration before the fallbacks (UnicodeDammit tries its user encodings first).
    declared = EncodingDetector.find_declared_encoding(body, is_html=html) if html and not charset else None
    known = [c for c in (charset, declared) if c]
    dammit = UnicodeDammit(body, known_definite_encodings=known, user_encodings=["utf-8", "windows-1252"],
                           is_html=html)
    return dammit.unicode_markup if dammit.unicode_markup is not None else body.decode("utf-8", "replace")


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


def resolve(host: str, port: int) -> set[str]:
    """The addresses `host` resolves to for a TCP connection to `port` (no timeout of its own)."""
    return {info[4][0] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)}


def refusal(url: str, allow_loopback: bool, resolve_host: Callable[[str, int], set[str]] = resolve) -> str:
    """Why `url` may not be fetched, or '' when it may: not http(s), no host, unresolvable (by `resolve_host`),
    or an address that is link-local (always refused) or loopback/unspecified (refused unless `allow_loopback`)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{url!r} is not an http(s) URL with a host"
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        addresses = resolve_host(parts.hostname, port)
    except (OSError, ValueError, UnicodeError) as error:  # socket.gaierror is an OSError; a bad port a ValueError
        return f"cannot resolve the host of {url!r}: {error}"
    for text in sorted(addresses):
        address = ipaddress.ip_address(text.split("%", 1)[0])  # an IPv6 scope ("fe80::1%eth0") is not part of it
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
            address = address.ipv4_mapped
        if address.is_link_local:
            return f"{parts.hostname} resolves to the link-local address {address}; refused"
        if (address.is_loopback or address.is_unspecified) and not allow_loopback:
            return f"{parts.hostname} resolves to the local address {address}; refused"
    return ""


def with_note(text: str, note: str, max_chars: int) -> str:
    """`text` cut (with its marker) so that it and `note`, on a line of its own after it, fit in `max_chars`;
    a note that does not fit at all is left out, as the cap is the hard limit."""
    room = max_chars - len(note) - 1
    if not note or room <= 0:
        return truncate_within(text, max_chars)
    return f"{truncate_within(text, room)}\n{note}"


class BrowseTool:
    """Fetch a URL or corpus document and return a window of its text around the query.

    Args:
      search_url: base URL of the search server for document ids; None allows only URLs.
      window_chars: size of the returned window. max_result_chars: hard cap of the result.
      allow_urls: whether http(s) URLs may be fetched at all.
      allow_loopback: whether a URL may reach this machine (127.0.0.0/8, ::1, 0.0.0.0); for
        tests against a local server. Link-local addresses are refused regardless.
      max_page_bytes: bytes of a page's body read (the rest is never fetched; the result says the page was cut).
      deadline_seconds: the most a URL fetch may take in all, redirects and DNS lookups included.
      max_redirects: redirects followed, each target checked like the first URL.
      timeout: (connect, read) seconds per request. retries / backoff_seconds: for the document
        server (`request_with_retries`, all attempts within `deadline_seconds` too); a URL is fetched once,
        within its deadline.
    """

    def __init__(self, search_url: str | None = None, window_chars: int = 2000, max_result_chars: int = 3000,
                 allow_urls: bool = True, allow_loopback: bool = False, max_page_bytes: int = 2 << 20,
                 deadline_seconds: float = 30.0, max_redirects: int = 5, timeout: tuple[float, float] = (2.0, 30.0),
                 retries: int = 2, backoff_seconds: float = 0.2):
        self.search_url = search_url.rstrip("/") if search_url else None
        self.window_chars, self.max_result_chars, self.allow_urls = window_chars, max_result_chars, allow_urls
        self.allow_loopback, self.max_page_bytes = allow_loopback, max_page_bytes
        self.deadline_seconds, self.max_redirects = deadline_seconds, max_redirects
        self.timeout, self.retries, self.backoff_seconds = timeout, retries, backoff_seconds
        self.session = pooled_session()

    def _read_timeout(self, url: str, deadline: float) -> float:
        """The read timeout that ends by `deadline`; raises HttpError once it has passed."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise HttpError(f"{url} took longer than {self.deadline_seconds:g} s")
        return min(self.timeout[1], remaining)

    def _resolve_by(self, host: str, port: int, deadline: float) -> set[str]:
        """`resolve(host, port)`, given up on at `deadline` (HttpError): the system's resolver has no timeout,
        and one that never answered held a 2 s call for 10 s. The lookup runs on a daemon thread of its own,
        left to end by itself when given up on (a pool's threads would hold up the interpreter's exit)."""
        remaining = deadline - time.monotonic()
        if remaining > 0:
            future: Future[set[str]] = Future()

            def lookup() -> None:
                try:
                    future.set_result(resolve(host, port))
                except BaseException as error:  # noqa: BLE001 - the caller's, through the future
                    future.set_exception(error)

            threading.Thread(target=lookup, name="browse-dns", daemon=True).start()
            try:
                return future.result(timeout=remaining)
            except TimeoutError:  # concurrent.futures' is this one (and an OSError: `refusal` would eat it)
                pass
        raise HttpError(f"resolving {host} took longer than {self.deadline_seconds:g} s")

    def _read_body(self, url: str, response: requests.Response, deadline: float) -> tuple[bytes, bool]:
        """Up to `max_page_bytes` of the body, read as it arrives, each read ending by `deadline`, and whether
        the body went on past them (one byte more is read to tell, so a body of exactly that size is whole)."""
        chunks, size, limit = [], 0, self.max_page_bytes + 1
        while size < limit:
            read_timeout = self._read_timeout(url, deadline)
            sock = getattr(getattr(response.raw, "connection", None), "sock", None)
            if sock is not None:
                sock.settimeout(read_timeout)
            try:
                chunk = response.raw.read1(min(65536, limit - size), decode_content=True)  # what has arrived
            except (urllib3.exceptions.HTTPError, OSError) as error:
                self._read_timeout(url, deadline)  # past the deadline: say so
                raise HttpError(f"{url}: reading the page failed ({error.__class__.__name__})") from error
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        body = b"".join(chunks)
        return body[: self.max_page_bytes], len(body) > self.max_page_bytes

    def fetch_url(self, url: str) -> Page:
        """A web page as plain text, within the bounds in the module docstring. Raises HttpError or ValueError."""
        deadline = time.monotonic() + self.deadline_seconds
        resolve_host = functools.partial(self._resolve_by, deadline=deadline)
        for _ in range(self.max_redirects + 1):
            reason = refusal(url, self.allow_loopback, resolve_host)
            if reason:
                raise ValueError(reason)
            try:
                response = self.session.get(url, stream=True, allow_redirects=False,
                                            timeout=(self.timeout[0], self._read_timeout(url, deadline)))
            except requests.Timeout as error:
                raise HttpError(f"{url} timed out ({error.__class__.__name__})") from error
            except requests.ConnectionError as error:
                raise HttpError(f"{url}: connection failed ({error.__class__.__name__})") from error
            except requests.RequestException as error:
                raise HttpError(f"{url}: {error}") from error
            with response:
                if response.is_redirect:
                    url = urllib.parse.urljoin(url, response.headers["Location"])
                    continue
                if response.status_code != 200:
                    raise HttpError(f"{url} answered HTTP {response.status_code}")
                media, charset = content_type(response.headers.get("Content-Type", ""))
                if not is_text(media):
                    raise ValueError(f"{url} is {media}, not a text or HTML page; browse reads text only")
                body, cut = self._read_body(url, response, deadline)
                if not media and b"\0" in body[:4096]:
                    raise ValueError(f"{url} is binary (no content type, NUL bytes); browse reads text only")
                html = not media or "html" in media
                text = decode_page(without_cut_character(body) if cut else body, charset, html)
                note = f"[page truncated: only its first {self.max_page_bytes} bytes were read]" if cut else ""
                return Page(html_to_text(text) if html else text, note)
        raise HttpError(f"{url}: more than {self.max_redirects} redirects")

    def fetch_page(self, target: str) -> Page:
        """The page or document as plain text, with a note on how it was read. Raises HttpError or ValueError
        saying what failed."""
        if target.startswith(("http://", "https://")):
            if not self.allow_urls:
                raise ValueError("fetching URLs is disabled; browse a corpus document id instead")
            return self.fetch_url(target)
        if self.search_url is None:
            raise ValueError(f"{target!r} is not a URL and no search server is configured for document ids")
        response = request_with_retries(self.session, "GET", f"{self.search_url}/doc/{urllib.parse.quote(target, safe='')}",
                                        timeout=self.timeout, retries=self.retries,
                                        backoff_seconds=self.backoff_seconds, total_seconds=self.deadline_seconds)
        if response.status_code == 404:
            raise DocumentNotFound(f"no document with id {target!r}")
        if response.status_code == 414:
            raise RefusedRequest(f"the document id is too long ({len(target)} characters, HTTP 414); "
                                 "browse a document id from the search results")
        if 400 <= response.status_code < 500:
            raise RefusedRequest(f"the document server refused the id {target[:100]!r} (HTTP {response.status_code})")
        if response.status_code != 200:
            raise HttpError(f"document server answered HTTP {response.status_code}")
        try:
            document = response.json()["document"]
            contents = document["contents"]
        except (ValueError, KeyError, TypeError) as error:
            raise BadServerAnswer(f"bad server answer (not {{'document': {{'contents': ...}}}}): "
                                  f"{response.text[:200]}") from error
        if not isinstance(contents, str):
            raise BadServerAnswer(f"bad server answer: document {target!r} has {type(contents).__name__} contents, "
                                  "not text")
        return Page(html_to_text(contents) if "<html" in contents.lower() else contents)

    def run(self, content: str) -> ToolResult:
        """Browse `TARGET [query]` (split at the first whitespace, a newline too); failures become result text."""
        start = time.monotonic()
        target, query = (content.split(None, 1) + ["", ""])[:2]
        if not target:
            return ToolResult("Browse failed: no URL or document id given.", False, time.monotonic() - start,
                              "bad_call")
        try:
            page = self.fetch_page(target)
        except (DocumentNotFound, RefusedRequest) as error:  # the call's mistake: no such id, or a refused one
            return ToolResult(f"Browse failed: {error}", False, time.monotonic() - start, "bad_call")
        except BadServerAnswer as error:
            return ToolResult(f"Browse failed: {error}", False, time.monotonic() - start, "failed")
        except (HttpError, ValueError, KeyError, TypeError, OSError) as error:
            return ToolResult(f"Browse failed: {error}", False, time.monotonic() - start, "unavailable")
        window = best_window(page.text, query, self.window_chars)
        return ToolResult(with_note(window, page.note, self.max_result_chars), True, time.monotonic() - start, "ok")
