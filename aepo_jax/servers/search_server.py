"""The search HTTP server (DESIGN "Search server"): Search-R1-compatible retrieval over BM25.

    POST /retrieve {"queries": [...], "topk": k, "return_scores": bool}
      -> {"result": [[{"document": {"id", "contents"}, "score": s}, ...], ...]}
         (bare documents when return_scores is false)
    GET /doc/{id}  -> {"document": {"id", "contents"}}   (id URL-encoded)
    GET /health    -> {"status": "ok", "documents": N}

Every bad request gets a 4xx JSON `{"error": "..."}`; a `ThreadingHTTPServer`
serves requests in parallel. Run with `python -m launch.serve_search`.
`--latency-ms N` makes every `/retrieve` answer no sooner than N ms after it
arrived (a remote retrieval service's round trip, for benchmarks; default 0).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import urllib.parse
from collections.abc import Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from aepo_jax.servers.bm25_index import Bm25Index


class RequestError(Exception):
    """A client mistake: becomes a 4xx JSON response."""

    def __init__(self, status: HTTPStatus, message: str):
        super().__init__(message)
        self.status = status


class _SearchHandler(BaseHTTPRequestHandler):
    server: _SearchServer
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes; without TCP_NODELAY, Nagle plus the
    # client's delayed ACK adds ~40 ms to every keep-alive request.
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: object) -> None:
        if self.server.verbose:
            super().log_message(format, *args)

    def _send(self, status: HTTPStatus, payload: object) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _handle(self, action) -> None:
        try:
            self._send(HTTPStatus.OK, action())
        except RequestError as error:
            self.close_connection = True
            self._send(error.status, {"error": str(error)})
        except Exception as error:  # noqa: BLE001 - the server must answer, never die
            self.close_connection = True
            self._send(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"internal error: {error}"})

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own errors (malformed request line, oversize headers) as JSON too."""
        self.close_connection = True
        if self.request_version == "HTTP/0.9":  # an unparsable request line; answer with headers anyway
            self.request_version = "HTTP/1.0"
        try:
            self._send(HTTPStatus(code), {"error": message or HTTPStatus(code).phrase})
        except (ValueError, OSError):
            pass

    def do_GET(self) -> None:
        self._handle(self._get)

    def do_POST(self) -> None:
        self._handle(self._post)

    def _method_not_allowed(self) -> None:
        def refuse() -> object:
            raise RequestError(HTTPStatus.METHOD_NOT_ALLOWED, f"{self.command} is not supported; use GET or POST")

        self._handle(refuse)

    do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _method_not_allowed

    def _get(self) -> object:
        path = urllib.parse.urlsplit(self.path).path
        if path == "/health":
            return {"status": "ok", "documents": len(self.server.index)}
        if path.startswith("/doc/"):
            doc_id = urllib.parse.unquote(path[len("/doc/") :])
            document = self.server.index.by_id.get(doc_id)
            if document is None:
                raise RequestError(HTTPStatus.NOT_FOUND, f"no document with id {doc_id!r}")
            return {"document": document}
        raise RequestError(HTTPStatus.NOT_FOUND, f"unknown path {path!r}; try /retrieve, /doc/ID or /health")

    def _read_json(self) -> dict:
        length_header = self.headers.get("Content-Length")
        if length_header is None:
            raise RequestError(HTTPStatus.LENGTH_REQUIRED, "Content-Length header required")
        try:
            length = int(length_header)
        except ValueError:
            raise RequestError(HTTPStatus.BAD_REQUEST, "Content-Length is not an integer") from None
        if length < 0 or length > self.server.max_body_bytes:
            raise RequestError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                               f"body of {length} bytes exceeds {self.server.max_body_bytes}")
        try:
            payload = json.loads(self.rfile.read(length))
        except (ValueError, UnicodeDecodeError) as error:
            raise RequestError(HTTPStatus.BAD_REQUEST, f"body is not valid JSON: {error}") from None
        if not isinstance(payload, dict):
            raise RequestError(HTTPStatus.BAD_REQUEST, "body must be a JSON object")
        return payload

    def _post(self) -> object:
        path = urllib.parse.urlsplit(self.path).path
        if path != "/retrieve":
            raise RequestError(HTTPStatus.NOT_FOUND, f"unknown path {path!r}; POST goes to /retrieve")
        payload = self._read_json()
        queries = payload.get("queries")
        if not isinstance(queries, list) or not queries or not all(isinstance(q, str) for q in queries):
            raise RequestError(HTTPStatus.BAD_REQUEST, '"queries" must be a non-empty list of strings')
        if len(queries) > self.server.max_queries:
            raise RequestError(HTTPStatus.BAD_REQUEST,
                               f"{len(queries)} queries exceed the limit of {self.server.max_queries}")
        topk = payload.get("topk", 3)
        if not isinstance(topk, int) or isinstance(topk, bool) or not 1 <= topk <= self.server.max_topk:
            raise RequestError(HTTPStatus.BAD_REQUEST, f'"topk" must be an integer in [1, {self.server.max_topk}]')
        return_scores = payload.get("return_scores", False)
        if not isinstance(return_scores, bool):
            raise RequestError(HTTPStatus.BAD_REQUEST, '"return_scores" must be a boolean')
        started = time.monotonic()
        hits = self.server.index.search(queries, topk)
        time.sleep(max(0.0, started + self.server.latency_seconds - time.monotonic()))
        if return_scores:
            return {"result": [[{"document": doc, "score": score} for doc, score in row] for row in hits]}
        return {"result": [[doc for doc, _ in row] for row in hits]}


class _SearchServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], index: Bm25Index, max_topk: int, max_queries: int,
                 max_body_bytes: int, verbose: bool, latency_seconds: float = 0.0):
        self.index = index
        self.latency_seconds = latency_seconds
        self.max_topk, self.max_queries, self.max_body_bytes = max_topk, max_queries, max_body_bytes
        self.verbose = verbose
        super().__init__(address, _SearchHandler)


def make_server(index: Bm25Index, host: str = "127.0.0.1", port: int = 0, max_topk: int = 100,
                max_queries: int = 256, max_body_bytes: int = 1 << 20, verbose: bool = False,
                latency_ms: float = 0.0) -> ThreadingHTTPServer:
    """A bound, not yet serving, search server; call `serve_forever()` on it."""
    if latency_ms < 0:
        raise ValueError(f"latency_ms must be >= 0, got {latency_ms}")
    return _SearchServer((host, port), index, max_topk, max_queries, max_body_bytes, verbose, latency_ms / 1000.0)


def _exit_when_stdin_closes() -> None:
    """Ends this process once stdin reaches EOF: the process that started it holds the pipe's other end,
    which closes when it exits in any way (SIGKILL, a crashed notebook kernel), so no server is orphaned."""

    def watch() -> None:
        while sys.stdin.buffer.read(65536):
            pass
        os._exit(0)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: build the index, bind, print `serving on URL`, serve until killed."""
    parser = argparse.ArgumentParser(description="BM25 search server over a JSONL corpus")
    parser.add_argument("--corpus", required=True, help='JSONL file of {"id", "contents"}')
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    parser.add_argument("--index-cache", default=None, help="directory to cache the BM25 index in")
    parser.add_argument("--max-topk", type=int, default=100)
    parser.add_argument("--max-queries", type=int, default=256)
    parser.add_argument("--max-body-bytes", type=int, default=1 << 20)
    parser.add_argument("--verbose", action="store_true", help="log every request")
    parser.add_argument("--latency-ms", type=float, default=0.0,
                        help="answer /retrieve no sooner than this after the request (benchmarks; default 0)")
    parser.add_argument("--exit-with-parent", action="store_true",
                        help="exit when stdin closes: a server another process started (start_search_server) "
                             "ends with it, even if it was killed")
    args = parser.parse_args(argv)
    if args.exit_with_parent:
        _exit_when_stdin_closes()
    index = Bm25Index(args.corpus, cache_dir=args.index_cache)
    server = make_server(index, args.host, args.port, args.max_topk, args.max_queries, args.max_body_bytes,
                         args.verbose, args.latency_ms)
    host, port = server.server_address[:2]
    print(f"indexed {len(index)} documents" + (" (index from cache)" if index.loaded_from_cache else ""), flush=True)
    print(f"serving on http://{host}:{port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    sys.exit(0)


if __name__ == "__main__":
    main()
