"""HTTP requests with connect/read timeouts and bounded retries with exponential backoff.

Retries on connection errors, timeouts and 5xx responses; a 4xx is the
caller's mistake and is returned at once. Used by the search, browse and
LLM-judge clients.
"""

from __future__ import annotations

import time
from typing import Any

import requests
import requests.adapters


def pooled_session(pool_size: int = 64) -> requests.Session:
    """A `requests.Session` whose connection pool holds `pool_size` connections per host.

    The tool registry calls one tool from many threads at once; the default
    pool of 10 would discard connections (and log a warning for each).
    """
    session = requests.Session()
    adapter = requests.adapters.HTTPAdapter(pool_connections=4, pool_maxsize=pool_size)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


class HttpError(RuntimeError):
    """A request that failed after all retries; the message says why."""


def request_with_retries(
    session: requests.Session,
    method: str,
    url: str,
    *,
    timeout: tuple[float, float] = (2.0, 30.0),
    retries: int = 2,
    backoff_seconds: float = 0.2,
    **kwargs: Any,
) -> requests.Response:
    """`session.request(...)`, retried `retries` times on transient failures.

    Returns the response (2xx..4xx). Raises HttpError naming the last failure
    (status code with a snippet of the body, or the connection error).
    """
    last = ""
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(backoff_seconds * 2 ** (attempt - 1))
        try:
            response = session.request(method, url, timeout=timeout, **kwargs)
        except requests.Timeout as error:
            last = f"timed out ({error.__class__.__name__})"
            continue
        except requests.ConnectionError as error:
            last = f"connection failed ({error.__class__.__name__}: {str(error)[:200]})"
            continue
        except requests.RequestException as error:
            raise HttpError(f"{method} {url}: {error}") from error
        if response.status_code >= 500:
            last = f"HTTP {response.status_code}: {response.text[:200]}"
            continue
        return response
    raise HttpError(f"{method} {url} failed after {retries + 1} attempts: {last}")
