"""Start the search server as a child process and wait until it serves (used by tests and the demo)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from typing import Self

import requests


class SearchServerHandle:
    """A running search server process: `.url`, `.stop()`, usable as a context manager."""

    def __init__(self, process: subprocess.Popen, url: str, log: list[str]):
        self.process, self.url, self.log = process, url, log

    def stop(self) -> None:
        """Terminate the server (kill if it does not exit within 5 s)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdin is not None and not self.process.stdin.closed:
            self.process.stdin.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_search_server(corpus_path: str, port: int = 0, host: str = "127.0.0.1",
                        index_cache: str | None = None, timeout: float = 120.0,
                        latency_ms: float = 0.0) -> SearchServerHandle:
    """Run `python -m aepo_jax.servers.search_server` and return once `/health` answers.

    `latency_ms` > 0: the server answers every search no sooner than that after it arrived.

    Raises RuntimeError with the server's output if it exits or is not ready within `timeout`.
    """
    if not os.path.exists(corpus_path):
        raise FileNotFoundError(f"corpus not found: {corpus_path}")
    # The server exits when its stdin, a pipe from this process, closes: it cannot outlive us.
    command = [sys.executable, "-m", "aepo_jax.servers.search_server", "--corpus", corpus_path,
               "--host", host, "--port", str(port), "--exit-with-parent"]
    if index_cache:
        command += ["--index-cache", index_cache]
    if latency_ms:
        command += ["--latency-ms", str(float(latency_ms))]
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    log: list[str] = []
    url_ready = threading.Event()
    found: list[str] = []

    def read_output() -> None:
        for line in process.stdout:
            log.append(line.rstrip("\n"))
            if line.startswith("serving on "):
                found.append(line.split("serving on ", 1)[1].strip())
                url_ready.set()
        url_ready.set()

    threading.Thread(target=read_output, daemon=True).start()
    deadline = time.monotonic() + timeout
    url_ready.wait(timeout)
    handle = SearchServerHandle(process, found[0] if found else "", log)
    while found and time.monotonic() < deadline and process.poll() is None:
        try:
            if requests.get(handle.url + "/health", timeout=1).ok:
                return handle
        except requests.RequestException:
            time.sleep(0.05)
    handle.stop()
    raise RuntimeError("search server did not become ready:\n" + "\n".join(log[-20:]))
