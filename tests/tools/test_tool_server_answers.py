"""Search and browse against servers that answer in odd shapes, slowly, or with pages in odd encodings."""

import os
import time

import pytest
from tools_stub_http import StubServer, json_reply, slow

from aepo_jax.tools import BrowseTool, SearchTool
from aepo_jax.tools.http_client import (
    HttpError,
    budget_within,
    pooled_session,
    request_with_retries,
)

CAFE = "Café résumé naïve 東京"


@pytest.mark.parametrize("items, text", [
    ([{"id": "1", "contents": "T\nbody"}], "Doc 1 (Title: T) body"),
    ([{"document": {"id": "1", "contents": "T\nscored"}, "score": 1.5}], "Doc 1 (Title: T) scored"),
])
def test_search_reads_bare_and_scored_documents(tmp_path, items, text):
    """A FlashRAG-style scored hit was stored as it came: its contents sat one level down, so the passage
    came back empty ("Doc 1 (Title: ) ") and marked ok."""
    with StubServer(lambda *a: json_reply({"result": [items]})) as stub:
        result = SearchTool(stub.url, cache_dir=str(tmp_path)).run("q")
        again = SearchTool(stub.url, cache_dir=str(tmp_path)).run("q")
        assert len(stub.requests) == 1  # the second answer came from the cache, in the checked shape
    assert (result.status, result.text) == ("ok", text) and again.text == text


@pytest.mark.parametrize("answer", [
    {"result": [[{"id": "1", "contents": None}]]},
    {"result": [["just a string"]]},
    {"result": [[{"document": {"id": "1"}, "score": 1.0}]]},
    {"result": ["not a list of documents"]},
    {"result": []},
], ids=["null-contents", "strings", "no-contents", "not-a-list", "no-query-result"])
def test_a_search_answer_of_another_shape_is_a_failed_result_never_cached(tmp_path, answer):
    """`{"contents": null}` and bare strings raised AttributeError out of `run` (which must never raise),
    and the malformed answer was cached before it broke."""
    with StubServer(lambda *a: json_reply(answer)) as stub:
        result = SearchTool(stub.url, cache_dir=str(tmp_path)).run("q")
    assert (result.ok, result.status) == (False, "failed") and "bad server answer" in result.text, result
    assert os.listdir(tmp_path) == []


def test_a_read_timeout_is_retried_once_at_most():
    with StubServer(lambda *a: slow(1.0, json_reply({"result": [[]]}))) as stub:
        result = SearchTool(stub.url, timeout=(1.0, 0.2), retries=3, backoff_seconds=0.01).run("q")
        assert len(stub.requests) == 2, stub.requests  # not 4: a server too slow once is likely too slow again
    assert result.status == "unavailable" and "failed after 2 attempts" in result.text


def test_retries_and_their_pauses_end_within_the_total_budget():
    session = pooled_session()
    with StubServer(lambda *a: json_reply({"error": "busy"}, 503)) as stub:
        start = time.monotonic()
        with pytest.raises(HttpError, match="within 0.5 s"):
            request_with_retries(session, "GET", stub.url, timeout=(1.0, 5.0), retries=10, backoff_seconds=0.2,
                                 total_seconds=0.5)
        assert time.monotonic() - start < 0.6
    with StubServer(lambda *a: slow(2.0, json_reply({}))) as stub:
        start = time.monotonic()
        with pytest.raises(HttpError, match="timed out"):
            request_with_retries(session, "GET", stub.url, timeout=(1.0, 30.0), total_seconds=0.5)
        assert time.monotonic() - start < 0.8


def test_budget_within_fits_a_read_timeout_and_its_retry():
    for total in (2.0, 10.0, 120.0):
        budget = budget_within(total)
        connect, read = budget.timeout
        assert connect <= 2.0 and 2 * (connect + read) <= total and budget.total_seconds == total


def test_the_configs_search_and_browse_end_by_the_tool_timeout():
    """`tools_from` built search with (2, 30) s timeouts and 2 retries whatever `rollout.tool_timeout_s` was:
    one call could take 90 s, and one the registry gave up on kept retrying behind its back."""
    from aepo_jax.agent.protocol import ToolCall
    from aepo_jax.experiment_tools import tools_from
    from configs.aepo_tiny import get_config

    cfg = get_config()
    cfg.rollout.tool_timeout_s = 1.0
    cfg.rollout.tool_concurrency = 1
    with StubServer(lambda *a: slow(3.0, json_reply({"result": [[]], "document": {"contents": "x"}}))) as stub:
        cfg.data.search_url = stub.url
        registry, closers = tools_from(cfg, None)
        try:
            for call in (ToolCall("search", "q"), ToolCall("browse", "doc-1")):
                start = time.monotonic()
                result = registry.run(call)
                assert result.status == "unavailable" and time.monotonic() - start < 1.3, (call, result)
        finally:
            for close in reversed(closers):
                close()


FRENCH = "Le château est situé près de la forêt; où êtes-vous allés? Très bien, déjà vu à côté du théâtre."


def _page(content_type: str, body: bytes):
    return lambda *a: (200, content_type, body)


@pytest.mark.parametrize("content_type, body", [
    ("text/html", f"<html><head><meta charset='utf-8'></head><body><p>{CAFE}</p></body></html>".encode()),
    ("text/html", f"<html><body><p>{CAFE}</p></body></html>".encode()),
    ("text/plain", CAFE.encode()),
    ("text/plain; charset=utf-8", CAFE.encode()),
    ("text/html", f'<html><head><meta charset="windows-1251"></head><body><p>{CAFE[:4]} Привет</p></body>'
                  "</html>".replace("é", "e").encode("cp1251")),
    ("text/plain", FRENCH.encode("latin-1")),
], ids=["html-meta-utf8", "html-no-charset", "plain-no-charset", "plain-utf8", "html-meta-cp1251", "plain-latin1"])
def test_a_page_is_decoded_by_its_declared_or_detected_charset(content_type, body):
    """`requests` decodes text/* without a charset as ISO-8859-1: "CafÃ© rÃ©sumÃ©"; an undeclared Latin-1 page
    that is not UTF-8 is read as windows-1252, the web's default (a detector's guess garbled French text)."""
    expected = "Cafe Привет" if b"1251" in body else FRENCH if body == FRENCH.encode("latin-1") else CAFE
    with StubServer(_page(content_type, body)) as stub:
        result = BrowseTool(allow_loopback=True).run(f"{stub.url}/page")
    assert (result.status, result.text) == ("ok", expected)


@pytest.mark.parametrize("content_type, body", [
    ("image/png", b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 20),
    ("application/pdf", b"%PDF-1.4\n" + bytes(range(256)) * 20),
    ("", b"\x00\x01binary" * 100),
], ids=["png", "pdf", "untyped-binary"])
def test_a_page_that_is_not_text_is_refused(content_type, body):
    """A PNG or a PDF came back as text (mojibake in the model's context)."""
    with StubServer(_page(content_type, body)) as stub:
        result = BrowseTool(allow_loopback=True).run(f"{stub.url}/file")
    assert not result.ok and "browse reads text only" in result.text and "\x89" not in result.text, result


@pytest.mark.parametrize("document", [{"id": "x", "contents": None}, ["x"], {"id": "x"}])
def test_a_document_server_answer_of_another_shape_is_a_failed_result(document):
    """`"contents": null` raised AttributeError out of `run`."""
    with StubServer(lambda *a: json_reply({"document": document})) as stub:
        result = BrowseTool(search_url=stub.url).run("x")
    assert (result.ok, result.status) == (False, "failed") and "bad server answer" in result.text, result


def test_a_document_id_that_is_not_there_is_a_bad_call():
    with StubServer(lambda *a: json_reply({"error": "no such document"}, 404)) as stub:
        result = BrowseTool(search_url=stub.url).run("missing-id words")
    assert (result.ok, result.status) == (False, "bad_call") and "no document with id 'missing-id'" in result.text


def test_a_browse_result_is_at_most_max_result_chars():
    """The truncation marker was added past `max_result_chars`, the browse result's hard cap."""
    with StubServer(lambda *a: json_reply({"document": {"id": "x", "contents": "word " * 1000}})) as stub:
        result = BrowseTool(search_url=stub.url, window_chars=500, max_result_chars=300).run("x word")
    assert result.ok and len(result.text) <= 300 and "[truncated," in result.text


