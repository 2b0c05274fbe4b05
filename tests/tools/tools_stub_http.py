"""A tiny scriptable HTTP server on 127.0.0.1 for client tests: real sockets, canned behaviour."""

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# A responder gets (method, path, parsed JSON body or None, request number) and returns
# (status, content type, body bytes), optionally after sleeping to simulate a slow server.
Responder = Callable[[str, str, object, int], tuple[int, str, bytes]]


class StubServer:
    """Serves `responder` on a free loopback port; `requests` counts what arrived."""

    def __init__(self, responder: Responder):
        self.requests: list[tuple[str, str, object]] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _serve(self):
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                stub.requests.append((self.command, self.path, body))
                status, content_type, payload = responder(self.command, self.path, body, len(stub.requests))
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = _serve

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        # A short poll interval: `shutdown` waits up to one interval, once per test.
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def json_reply(payload: object, status: int = 200) -> tuple[int, str, bytes]:
    return status, "application/json", json.dumps(payload).encode()


def slow(seconds: float, reply: tuple[int, str, bytes]) -> tuple[int, str, bytes]:
    time.sleep(seconds)
    return reply


def closed_port_url() -> str:
    """A loopback URL nothing listens on."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"
