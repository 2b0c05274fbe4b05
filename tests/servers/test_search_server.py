"""The search server process (issue 4): Search-R1 API, BM25 against a float64 reference, 4xx errors, parallelism."""

import json
import math
import socket
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
import requests

from aepo_jax.servers import Bm25Index, load_corpus, start_search_server

# Words chosen to be neither English stopwords nor one-letter, so a plain split is bm25s's tokenisation.
DOCS = {
    "paris": "Paris\nparis capital france river seine paris",
    "berlin": "Berlin\nberlin capital germany river spree",
    "cats/1": "Cats\ncats small mammals whiskers",
    "seine": "Seine\nseine river flows through paris france normandy channel",
    "rome": "Rome\nrome capital italy tiber",
}


@pytest.fixture(scope="module")
def corpus_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    path.write_text("".join(json.dumps({"id": k, "contents": v}) + "\n" for k, v in DOCS.items()))
    return str(path)


@pytest.fixture(scope="module")
def server(corpus_path):
    with start_search_server(corpus_path) as handle:
        yield handle


def reference_bm25(query: str, k1: float = 1.5, b: float = 0.75) -> dict[str, float]:
    """Lucene BM25 in float64 over lower-cased whitespace tokens (an independent reference)."""
    tokens = {doc_id: text.lower().split() for doc_id, text in DOCS.items()}
    n = len(tokens)
    avgdl = np.mean([len(t) for t in tokens.values()], dtype=np.float64)
    df = Counter(word for t in tokens.values() for word in set(t))
    scores = {}
    for doc_id, words in tokens.items():
        tf = Counter(words)
        score = 0.0
        for term in set(query.lower().split()):
            if tf[term]:
                idf = math.log(1 + (n - df[term] + 0.5) / (df[term] + 0.5))
                score += idf * tf[term] / (tf[term] + k1 * (1 - b + b * len(words) / avgdl))
        scores[doc_id] = score
    return scores


def retrieve(server, payload):
    return requests.post(server.url + "/retrieve", json=payload, timeout=10)


def test_health(server):
    assert requests.get(server.url + "/health", timeout=5).json() == {"status": "ok", "documents": len(DOCS)}


@pytest.mark.parametrize("query", ["paris river", "capital", "seine france channel", "whiskers"])
def test_scores_and_order_match_a_float64_bm25_reference(server, query):
    result = retrieve(server, {"queries": [query], "topk": 5, "return_scores": True}).json()["result"][0]
    expected = {k: v for k, v in reference_bm25(query).items() if v > 0}
    got = {hit["document"]["id"]: hit["score"] for hit in result}
    assert got.keys() == expected.keys()
    for doc_id, score in expected.items():
        assert got[doc_id] == pytest.approx(score, rel=1e-5)
    assert [h["score"] for h in result] == sorted(got.values(), reverse=True)
    assert all(h["document"]["contents"] == DOCS[h["document"]["id"]] for h in result)


def test_bare_documents_without_scores_and_topk_and_batching(server):
    result = retrieve(server, {"queries": ["capital", "whiskers", "nothingmatches"], "topk": 2}).json()["result"]
    assert len(result) == 3 and len(result[0]) == 2
    assert set(result[0][0]) == {"id", "contents"}
    assert result[1] == [{"id": "cats/1", "contents": DOCS["cats/1"]}]
    assert result[2] == []


def test_doc_endpoint_serves_full_documents_by_encoded_id(server):
    response = requests.get(server.url + "/doc/cats%2F1", timeout=5)
    assert response.json() == {"document": {"id": "cats/1", "contents": DOCS["cats/1"]}}
    missing = requests.get(server.url + "/doc/nope", timeout=5)
    assert missing.status_code == 404 and "nope" in missing.json()["error"]


@pytest.mark.parametrize(
    "body, status, words",
    [
        (b"{not json", 400, "JSON"),
        (b"[1, 2]", 400, "object"),
        (b'{"topk": 3}', 400, "queries"),
        (b'{"queries": "paris"}', 400, "queries"),
        (b'{"queries": [1]}', 400, "queries"),
        (b'{"queries": ["a"], "topk": 0}', 400, "topk"),
        (b'{"queries": ["a"], "topk": 1000}', 400, "topk"),
        (b'{"queries": ["a"], "topk": "3"}', 400, "topk"),
        (b'{"queries": ["a"], "return_scores": "yes"}', 400, "return_scores"),
        (json.dumps({"queries": ["a"] * 300}).encode(), 400, "limit"),
        (b"x" * (2 << 20), 413, "exceeds"),
    ],
)
def test_bad_requests_get_4xx_json(server, body, status, words):
    response = requests.post(server.url + "/retrieve", data=body, timeout=10)
    assert response.status_code == status and words in response.json()["error"]


def test_unknown_paths_methods_and_garbage_get_4xx_json(server):
    assert requests.get(server.url + "/nowhere", timeout=5).status_code == 404
    assert requests.post(server.url + "/health", json={}, timeout=5).status_code == 404
    put = requests.put(server.url + "/retrieve", json={}, timeout=5)
    assert put.status_code == 405 and "PUT" in put.json()["error"]
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as raw:
        raw.sendall(b"NONSENSE\r\n\r\n")
        reply = b"".join(iter(lambda: raw.recv(4096), b"")).decode()  # the server closes after an error
    assert reply.startswith("HTTP/1.") and " 400 " in reply.split("\r\n")[0] and '{"error"' in reply
    assert requests.get(server.url + "/health", timeout=5).ok  # still serving


def test_a_stalled_client_does_not_block_others(server):
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as stalled:
        stalled.sendall(b"POST /retrieve HTTP/1.1\r\nContent-Length: 100\r\n\r\n{")  # body never finishes
        assert retrieve(server, {"queries": ["paris"], "topk": 1}).json()["result"][0][0]["id"] == "paris"


def test_index_cache_is_reused_and_gives_the_same_results(corpus_path, tmp_path):
    first = Bm25Index(corpus_path, cache_dir=str(tmp_path))
    second = Bm25Index(corpus_path, cache_dir=str(tmp_path))
    assert not first.loaded_from_cache and second.loaded_from_cache
    assert first.search(["paris river"], 3) == second.search(["paris river"], 3)


def test_corpus_errors_name_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "a", "contents": "x"}\n{"id": "b"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        load_corpus(str(path))


def test_launch_entry_point_prints_the_url_for_port_zero(corpus_path):
    process = subprocess.Popen([sys.executable, "-m", "launch.serve_search", "--corpus", corpus_path, "--port", "0"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = ""
        for line in process.stdout:
            if line.startswith("serving on "):
                break
        url = line.removeprefix("serving on ").strip()
        assert url.startswith("http://127.0.0.1:") and not url.endswith(":0")
        assert requests.get(url + "/health", timeout=5).json()["documents"] == len(DOCS)
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_a_started_server_ends_with_the_process_that_started_it_even_a_killed_one(corpus_path):
    """A notebook kernel that crashed or restarted left its search server running under init (230 MB)."""
    import os
    import signal
    import time

    code = ("import time; from aepo_jax.servers import start_search_server; "
            f"handle = start_search_server({corpus_path!r}); print(handle.process.pid, flush=True); time.sleep(600)")
    starter = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        server_pid = int(starter.stdout.readline())
        os.kill(server_pid, 0)  # serving
        starter.send_signal(signal.SIGKILL)
        starter.wait(timeout=10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(server_pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            os.kill(server_pid, signal.SIGKILL)
            raise AssertionError("the search server outlived the process that started it")
    finally:
        starter.kill()


def test_latency_option_delays_every_search_and_searches_wait_in_parallel(corpus_path):
    """`latency_ms` (rollout_bench's tool latency): each /retrieve answers after >= the latency, and
    concurrent ones wait together, not one after the other."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    latency = 1.0  # long beside a search's own work, so the bound below holds on a loaded machine
    with start_search_server(corpus_path, latency_ms=int(latency * 1000)) as slow:
        payload = {"queries": ["paris"], "topk": 1}

        def timed_call(_):
            start = time.monotonic()
            answer = requests.post(slow.url + "/retrieve", json=payload, timeout=30)
            return start, time.monotonic(), answer

        start, end, answer = timed_call(0)
        assert answer.json()["result"][0][0]["id"] == "paris" and end - start >= latency
        with ThreadPoolExecutor(4) as pool:
            calls = list(pool.map(timed_call, range(4)))
        assert all(a.ok and e - s >= latency for s, e, a in calls)
        # One after the other, four waits would take 4 latencies; together about one.
        assert max(e for _, e, _ in calls) - min(s for s, _, _ in calls) < 2 * latency


def test_corpus_text_that_is_not_valid_unicode_is_repaired_and_searchable(tmp_path):
    """Half an escaped emoji (a lone surrogate, which `json.loads` returns) or bytes that are not UTF-8
    would reach the agent's tokenizer in a search result and crash the rollout."""
    path = tmp_path / "corpus.jsonl"
    lines = [json.dumps({"id": "emoji", "contents": "Emoji\nbroken \ud83d emoji text"}).encode(),
             b'{"id": "latin", "contents": "Latin\\nbroken caf\xe9 bytes"}',
             json.dumps({"id": "half\udc80", "contents": "Id\nan id with half a character"}).encode()]
    path.write_bytes(b"\n".join(lines) + b"\n")
    documents = {doc["id"]: doc["contents"] for doc in load_corpus(str(path))}
    assert documents == {"emoji": "Emoji\nbroken ? emoji text", "latin": "Latin\nbroken caf\ufffd bytes",
                         "half?": "Id\nan id with half a character"}
    with start_search_server(str(path)) as handle:
        hits = retrieve(handle, {"queries": ["broken emoji"], "topk": 1}).json()["result"][0]
    assert hits == [{"id": "emoji", "contents": "Emoji\nbroken ? emoji text"}]
    for contents in documents.values():
        contents.encode("utf-8")


@pytest.mark.parametrize("contents", [["", "  \n "], ["The\nthe and of it", "a b c", ""]])
def test_a_corpus_with_no_word_to_index_is_refused_by_name(tmp_path, contents):
    """Empty documents, stop words and one-character words leave bm25s an empty vocabulary, on which it
    raised a bare `max() arg is an empty sequence` from inside its indexing."""
    path = tmp_path / "wordless.jsonl"
    path.write_text("".join(json.dumps({"id": str(i), "contents": c}) + "\n" for i, c in enumerate(contents)))
    with pytest.raises(ValueError, match=r"wordless\.jsonl: no document has a word to index"):
        Bm25Index(str(path))


def test_a_corpus_with_some_wordless_documents_is_indexed(tmp_path):
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps({"id": k, "contents": v}) + "\n"
                            for k, v in {"empty": "", "stop": "the of", "seine": DOCS["seine"]}.items()))
    assert [doc["id"] for doc, _ in Bm25Index(str(path)).search(["seine river"], 3)[0]] == ["seine"]
