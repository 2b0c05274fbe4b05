"""Search and browse clients against the real search server, a local HTML page and scripted failures."""

import json
import os
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from tools_stub_http import StubServer, closed_port_url, json_reply, slow

from aepo_jax.servers import start_search_server
from aepo_jax.tools import BrowseTool, SearchTool

LONG_BODY = " ".join(["filler words about nothing"] * 200) + " the treaty was signed in 1648 at osnabrueck " + \
    " ".join(["more filler text"] * 200)
DOCS = {
    "westphalia": "Peace of Westphalia\n" + LONG_BODY,
    "eiffel": "Eiffel Tower\nThe Eiffel Tower is 330 metres tall and stands in Paris.",
    "html-doc": "Page\n<html><body><script>var x = 1;</script><p>Hidden gem paragraph</p></body></html>",
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    path.write_text("".join(json.dumps({"id": k, "contents": v}) + "\n" for k, v in DOCS.items()))
    with start_search_server(str(path)) as handle:
        yield handle


def test_search_formats_numbered_truncated_passages(server):
    tool = SearchTool(server.url, topk=2, max_result_chars=60)
    result = tool.run("treaty signed 1648")
    assert result.ok and result.status == "ok"
    first = result.text.splitlines()[0]
    assert first.startswith("Doc 1 (Title: Peace of Westphalia) filler")
    assert "[truncated" in first and len(first.split("... [truncated")[0]) == 60
    assert tool.run("eiffel tower tall").text.startswith("Doc 1 (Title: Eiffel Tower) The Eiffel Tower is 330")
    assert tool.run("zzzz qqqq").text == "No results found."


def test_search_cache_answers_repeated_queries_when_the_server_is_gone(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text(json.dumps({"id": "a", "contents": "Alpha\nalpha beta gamma"}) + "\n")
    cache = str(tmp_path / "cache")
    with start_search_server(str(path)) as handle:
        tool = SearchTool(handle.url, cache_dir=cache, retries=0)
        fresh = tool.run("alpha")
    again = SearchTool(handle.url, cache_dir=cache, retries=0).run("alpha")
    assert fresh.ok and again.ok and again.text == fresh.text
    missing = tool.run("gamma")
    assert not missing.ok and missing.status == "unavailable" and "connection failed" in missing.text


def test_search_retries_5xx_then_succeeds():
    def responder(method, path, body, n):
        if n <= 2:
            return json_reply({"error": "busy"}, 503)
        return json_reply({"result": [[{"id": "x", "contents": "Title\nbody text"}]]})

    with StubServer(responder) as stub:
        result = SearchTool(stub.url, retries=2, backoff_seconds=0.01).run("q")
    assert result.ok and result.text == "Doc 1 (Title: Title) body text" and len(stub.requests) == 3
    assert stub.requests[0][2] == {"queries": ["q"], "topk": 3, "return_scores": False}


def test_search_failures_become_text_not_exceptions():
    down = SearchTool(closed_port_url(), retries=1, backoff_seconds=0.01).run("q")
    assert not down.ok and "failed after 2 attempts" in down.text
    with StubServer(lambda *a: slow(1.0, json_reply({"result": [[]]}))) as stub:
        late = SearchTool(stub.url, timeout=(1.0, 0.2), retries=0).run("q")
    assert not late.ok and "timed out" in late.text
    with StubServer(lambda *a: json_reply({"unexpected": 1})) as stub:
        odd = SearchTool(stub.url).run("q")
    assert not odd.ok and odd.status == "failed" and "bad server answer" in odd.text
    with StubServer(lambda *a: json_reply({"error": "bad"}, 400)) as stub:
        refused = SearchTool(stub.url, retries=3).run("q")
    assert not refused.ok and "HTTP 400" in refused.text and len(stub.requests) == 1  # 4xx is not retried
    assert SearchTool("http://127.0.0.1:1").run("   ").status == "bad_call"


def test_browse_a_corpus_document_returns_the_window_around_the_query(server):
    tool = BrowseTool(search_url=server.url, window_chars=200)
    result = tool.run("westphalia treaty signed 1648")
    assert result.ok and "signed in 1648" in result.text and len(result.text) == 200
    start = BrowseTool(search_url=server.url, window_chars=200).run("westphalia")
    assert start.text.startswith("Peace of Westphalia")  # no query words: the beginning
    html = tool.run("html-doc gem")
    assert "Hidden gem paragraph" in html.text and "var x" not in html.text


def test_browse_a_url_turns_html_into_text():
    page = b"<html><head><style>p{}</style></head><body><nav>menu</nav><h1>Report</h1><p>The answer is 17.</p></body></html>"
    with StubServer(lambda *a: (200, "text/html; charset=utf-8", page)) as stub:
        result = BrowseTool(allow_loopback=True).run(f"{stub.url}/page.html answer")
    assert result.ok and result.text == "Report\nThe answer is 17."


def test_browse_a_page_of_stray_angle_brackets_keeps_them_as_text():
    """`x <y ` * 20k (100 KiB): the standard library's parser rescanned to the page's end from each `<`, about
    100 CPU-s on a thread the registry had given up on; milliseconds now. No timing here: the suite's timeout
    catches a hang, `tests/tools/test_html_text.py` checks the parser is fed no unfinished markup."""
    page = ("<html><body><p>" + "x <y " * 20_000).encode()
    with StubServer(lambda *a: (200, "text/html; charset=utf-8", page)) as stub:
        result = BrowseTool(allow_loopback=True, window_chars=20).run(f"{stub.url}/page.html")
    assert result.ok and result.text == "x <y x <y x <y x <y "


def test_browse_failures_become_text(server):
    missing = BrowseTool(search_url=server.url).run("no-such-doc")
    assert not missing.ok and "no document with id 'no-such-doc'" in missing.text
    assert missing.status == "bad_call"  # the call named a document that is not there; the server is fine
    no_server = BrowseTool().run("some-doc")
    assert not no_server.ok and "no search server" in no_server.text
    refused = BrowseTool(allow_urls=False).run("http://127.0.0.1:1/x")
    assert not refused.ok and "disabled" in refused.text
    down = BrowseTool(allow_loopback=True).run(closed_port_url() + "/page")
    assert not down.ok and "connection failed" in down.text
    assert BrowseTool().run("  ").status == "bad_call"


def test_browse_target_ends_at_any_whitespace(server):
    """`<browse>doc-id\nquery</browse>`: a newline separates the target from the query words too."""
    result = BrowseTool(search_url=server.url, window_chars=200).run("westphalia\ntreaty signed 1648")
    assert result.ok and "signed in 1648" in result.text
    tabbed = BrowseTool(search_url=server.url, window_chars=200).run("\twestphalia\t1648")
    assert tabbed.ok and "signed in 1648" in tabbed.text


def test_many_rollouts_asking_one_query_at_once_all_get_results(server, tmp_path):
    """A GRPO group's rollouts send their first query together: each writer has its own temporary file
    (one name per process let concurrent writers rename or truncate each other's file)."""
    for trial in range(6):
        tool = SearchTool(server.url, topk=2, cache_dir=str(tmp_path / f"cache{trial}"))
        barrier = threading.Barrier(16, timeout=30)

        def search(_, tool=tool, barrier=barrier):
            barrier.wait()
            return tool.run("treaty signed 1648")

        with ThreadPoolExecutor(16) as pool:
            results = list(pool.map(search, range(16)))
        assert [r.status for r in results] == ["ok"] * 16, [r.text for r in results if not r.ok]
        assert len({r.text for r in results}) == 1
        assert [n for n in os.listdir(tmp_path / f"cache{trial}") if n.endswith(".tmp")] == []


def test_a_broken_cache_is_a_miss_not_a_failed_search(server, tmp_path):
    cache = tmp_path / "cache"
    tool = SearchTool(server.url, cache_dir=str(cache))
    fresh = tool.run("eiffel tower tall")
    assert fresh.ok
    for name in os.listdir(cache):  # a half-written or foreign file where an entry should be
        (cache / name).write_text('[{"contents": "trunc')
    again = tool.run("eiffel tower tall")
    assert again.ok and again.text == fresh.text
    assert json.loads((cache / os.listdir(cache)[0]).read_text())  # rewritten whole
    shutil.rmtree(cache)  # the cache cannot be written at all: the search still answers
    gone = tool.run("treaty signed 1648")
    assert gone.ok and gone.text.startswith("Doc 1 (Title: Peace of Westphalia)")


def test_a_query_or_document_id_the_server_refuses_as_too_large_is_a_bad_call(server):
    """The real server answers 413 to a body over its 1 MiB and 414 to a request line over 64 KiB: the
    model's own mistake, once labelled `unavailable` as if the server were down."""
    search = SearchTool(server.url).run("capital " * 200_000)
    assert search.status == "bad_call" and "too large" in search.text and "HTTP 413" in search.text, search
    browse = BrowseTool(search_url=server.url).run("x" * 100_000)
    assert browse.status == "bad_call" and "too long" in browse.text and "HTTP 414" in browse.text, browse
