"""Browsing a URL the model chose, against a real HTTP server on loopback that misbehaves: a body that
drips forever, a body far over the size cap, redirects to link-local and local addresses; and a DNS lookup that
never answers."""

import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from aepo_jax.tools import BrowseTool

DRIP_LIMIT_SECONDS = 20.0  # the server gives up dripping after this, so an unbounded client still ends
FILLER = b"filler " * (1 << 14)  # 112 KiB
HUGE_BODY_BYTES = 72 * len(FILLER) + len(b" needle")  # about 8 MiB of filler, then the needle


class MisbehavingServer:
    """Serves /page, /drip, /huge and redirects on a free loopback port; counts requests per path."""

    def __init__(self):
        self.requests: list[str] = []
        self.stop = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _head(self, status, headers):
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()

            def do_GET(self):
                outer.requests.append(self.path)
                try:
                    self._serve()
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client hung up: what a bounded client does

            def _serve(self):
                if self.path == "/page":
                    body = b"<html><body><p>The answer is 17.</p></body></html>"
                    self._head(200, {"Content-Type": "text/html", "Content-Length": str(len(body))})
                    self.wfile.write(body)
                elif self.path == "/drip":  # a byte every 20 ms: never idle for a read timeout
                    self._head(200, {"Content-Type": "text/plain", "Content-Length": str(10**6)})
                    end = time.monotonic() + DRIP_LIMIT_SECONDS
                    while time.monotonic() < end and not outer.stop.is_set():
                        self.wfile.write(b"x")
                        self.wfile.flush()
                        time.sleep(0.02)
                    self.close_connection = True
                elif self.path == "/huge":
                    self._head(200, {"Content-Type": "text/plain", "Content-Length": str(HUGE_BODY_BYTES)})
                    for _ in range(72):
                        self.wfile.write(FILLER)
                    self.wfile.write(b" needle")
                elif self.path.startswith("/redirect?"):
                    self._head(302, {"Location": self.path.split("?", 1)[1], "Content-Length": "0"})
                elif self.path == "/loop":
                    self._head(302, {"Location": "/loop", "Content-Length": "0"})
                else:
                    self._head(404, {"Content-Length": "0"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def site():
    server = MisbehavingServer()
    yield server
    server.close()


def loopback_browser(**kwargs) -> BrowseTool:
    return BrowseTool(allow_loopback=True, **kwargs)


def test_a_page_on_an_allowed_loopback_server_is_read(site):
    result = loopback_browser().run(f"{site.url}/page answer")
    assert (result.status, result.text) == ("ok", "The answer is 17.")


def test_a_dripping_body_ends_at_the_overall_deadline(site):
    """Each byte comes well within the read timeout; only a deadline over the whole fetch ends it.
    (Unbounded, the call ran until the server gave up, DRIP_LIMIT_SECONDS later, and failed on its
    short body with another message.)"""
    result = loopback_browser(deadline_seconds=1.0, timeout=(2.0, 30.0)).run(f"{site.url}/drip")
    assert (result.ok, result.status) == (False, "unavailable")
    assert "took longer than 1 s" in result.text


def test_only_the_first_max_page_bytes_of_a_huge_body_are_read(site):
    """The needle lies past the cap: a tool that read the whole body would find it."""
    result = loopback_browser(max_page_bytes=1 << 20).run(f"{site.url}/huge needle")
    assert result.ok and "needle" not in result.text and result.text.startswith("filler")
    whole = loopback_browser(max_page_bytes=HUGE_BODY_BYTES).run(f"{site.url}/huge needle")
    assert whole.ok and whole.text.endswith(" needle")


def test_a_redirect_to_a_link_local_address_is_refused_before_connecting(site):
    metadata = "http://169.254.169.254/latest/meta-data/"
    result = loopback_browser().run(f"{site.url}/redirect?{metadata}")
    assert (result.ok, result.status) == (False, "unavailable")
    assert "link-local address 169.254.169.254; refused" in result.text


def test_redirects_are_followed_and_each_target_checked(site):
    followed = loopback_browser().run(f"{site.url}/redirect?/page answer")
    assert (followed.status, followed.text) == ("ok", "The answer is 17.")
    endless = loopback_browser(max_redirects=3).run(f"{site.url}/loop")
    assert not endless.ok and "more than 3 redirects" in endless.text


@pytest.mark.parametrize("host", ["127.0.0.1", "127.1", "0.0.0.0", "[::ffff:127.0.0.1]", "localhost"])
def test_local_addresses_are_refused_unless_allowed(site, host):
    before = len(site.requests)
    result = BrowseTool().run(f"http://{host}:{site.port}/page")
    assert (result.ok, result.status) == (False, "unavailable")
    assert "refused" in result.text and len(site.requests) == before  # nothing was sent


def test_refusal_names_what_it_refuses():
    from aepo_jax.tools.browse import refusal

    assert "local address 127.0.0.1; refused" in refusal("http://127.0.0.1:8000/admin", allow_loopback=False)
    assert refusal("http://127.0.0.1:8000/admin", allow_loopback=True) == ""
    assert "link-local address fe80::1; refused" in refusal("http://[fe80::1]/", allow_loopback=True)
    assert "not an http(s) URL" in refusal("file:///etc/passwd", allow_loopback=True)


def test_a_dns_lookup_that_never_answers_ends_at_the_deadline(monkeypatch):
    """`getaddrinfo` has no timeout: with a resolver that never answered, a call with a 2 s deadline returned
    after 10 s. The lookup is now given up on at the deadline; the call returns while it still hangs."""
    release, finished = threading.Event(), threading.Event()

    def unanswered_lookup(*args, **kwargs):
        release.wait(20)  # far past the deadline (the test lets it go when it is done)
        finished.set()
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    monkeypatch.setattr(socket, "getaddrinfo", unanswered_lookup)
    try:
        result = BrowseTool(deadline_seconds=0.5).run("http://unanswered.example/page words")
        lookup_had_ended = finished.is_set()
        lookup_threads = [thread for thread in threading.enumerate() if thread.name == "browse-dns"]
    finally:
        release.set()
    assert not lookup_had_ended  # the call did not wait for the lookup
    assert lookup_threads and all(thread.daemon for thread in lookup_threads)  # nor will the interpreter's exit
    assert (result.ok, result.status) == (False, "unavailable")
    assert "resolving unanswered.example took longer than 0.5 s" in result.text
