"""HTTP requests with connect/read timeouts and bounded retries with exponential backoff.

Retries on connection errors, timeouts and 5xx responses; a 4xx is the
caller's mistake and is returned at once. A read timeout is retried at most
once (a server too slow once is likely too slow again). With `total_seconds`
every attempt's timeouts and every pause fit in that budget, so a tool call
ends by its time limit (`budget_within` derives the timeouts from it).
Used by the search, browse and LLM-judge clients.
"""

from __future__ import annotations

import dataclasses
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


class RefusedRequest(HttpError):
    """The server refused the request itself (HTTP 4xx: too large, too long, malformed): the caller's mistake,
    to be fixed in the call, not a server that is down."""


class BadServerAnswer(HttpError):
    """The server answered, but not in the shape its protocol promises (a bug there, not a network failure)."""


@dataclasses.dataclass(frozen=True)
class HttpBudget:
    """(connect, read) timeouts and retries for requests that must end, retries included, by `total_seconds`."""

    timeout: tuple[float, float]
    retries: int
    total_seconds: float


def budget_within(total_seconds: float, retries: int = 2) -> HttpBudget:
    """Timeouts for a tool call limited to `total_seconds` (`rollout.tool_timeout_s`): connecting takes at
    most a tenth of it (2 s at most), and a read timeout and its one retry fit in it together."""
    connect = min(2.0, total_seconds / 10)
    read = max(total_seconds / 2 - connect, 0.05)
    return HttpBudget(timeout=(connect, read), retries=retries, total_seconds=float(total_seconds))


def request_with_retries(
    session: requests.Session,
    method: str,
    url: str,
    *,
    timeout: tuple[float, float] = (2.0, 30.0),
    retries: int = 2,
    backoff_seconds: float = 0.2,
    total_seconds: float | None = None,
    **kwargs: Any,
) -> requests.Response:
    """`session.request(...)`, retried `retries` times on transient failures, a read timeout once at most;
    with `total_seconds`, no attempt or pause runs past that many seconds from now (each attempt's
    timeouts are cut to the time left).

    Returns the response (2xx..4xx). Raises HttpError naming the last failure
    (status code with a snippet of the body, or the connection error).
    """
    deadline = None if total_seconds is None else time.monotonic() + total_seconds
    last, attempts, read_timeouts = "", 0, 0
    for attempt in range(retries + 1):
        if attempt:
            pause = backoff_seconds * 2 ** (attempt - 1)
            if deadline is not None and time.monotonic() + pause >= deadline:
                break
            time.sleep(pause)
        attempt_timeout = timeout
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            connect = min(timeout[0], remaining / 2)
            attempt_timeout = (connect, min(timeout[1], remaining - connect))
        attempts += 1
        try:
            response = session.request(method, url, timeout=attempt_timeout, **kwargs)
        except requests.ReadTimeout as error:
            last = f"timed out ({error.__class__.__name__})"
            read_timeouts += 1
            if read_timeouts > 1:
                break
            continue
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
    within = f" within {total_seconds:g} s" if deadline is not None else ""
    raise HttpError(f"{method} {url} failed after {attempts} attempt{'s' if attempts != 1 else ''}{within}: "
                    f"{last or 'no time left'}")
