"""How the browse tool decodes a page cut at `max_page_bytes`, against a real HTTP server on loopback: a cut
inside a UTF-8 character once made the whole page decode as windows-1252 ('Le cafÃ© Ã©tait trÃ¨s'), and
nothing told the model that the page went on."""

import pytest
from tools_stub_http import StubServer

from aepo_jax.tools import BrowseTool

HEAD = '<html><head><meta charset="utf-8"><title>Café</title></head><body><p>'
NOTE = "[page truncated: only its first {} bytes were read]"


def serve(content_type: str, body: bytes):
    """A loopback server answering every GET with `body` as `content_type`."""
    return StubServer(lambda method, path, _body, n: (200, content_type, body))


def browse(url: str, max_page_bytes: int, **kwargs) -> tuple[str, str]:
    result = BrowseTool(allow_loopback=True, max_page_bytes=max_page_bytes, **kwargs).run(f"{url}/page")
    assert result.ok, result.text
    return result.status, result.text


# Characters of two, three and four bytes, cut after each of their bytes but the last.
CUT_CHARACTERS = [(char, keep) for char in ("è", "€", "🐟") for keep in range(1, len(char.encode()))]


@pytest.mark.parametrize("content_type, head", [
    ("text/html; charset=utf-8", HEAD),  # declared in the header
    ("text/html", HEAD),  # declared in the page
    ("text/html", "<p>"),  # declared nowhere: UTF-8 is tried first
    ("text/plain; charset=UTF-8", ""),
])
@pytest.mark.parametrize("char, keep", CUT_CHARACTERS)
def test_a_page_cut_inside_a_utf8_character_stays_utf8_and_says_it_was_cut(content_type, head, char, keep):
    page = f"{head}Le café était bon {char} et chaud</p></body></html>".encode()
    cut = page.index(char.encode()) + keep  # the cut falls after `keep` bytes of `char`
    with serve(content_type, page) as stub:
        status, text = browse(stub.url, max_page_bytes=cut)
    expected = "Le café était bon" + (" " if head == "" else "")  # plain text keeps its trailing space
    assert (status, text) == ("ok", f"{expected}\n{NOTE.format(cut)}")


def test_a_page_of_exactly_max_page_bytes_is_whole_and_not_marked():
    page = "<p>Le café était très bon 🐟</p>".encode()
    with serve("text/html; charset=utf-8", page) as stub:
        assert browse(stub.url, max_page_bytes=len(page)) == ("ok", "Le café était très bon 🐟")
        assert browse(stub.url, max_page_bytes=len(page) - 1)[1].endswith(NOTE.format(len(page) - 1))


def test_a_windows_1252_page_cut_short_keeps_its_encoding_and_its_last_characters():
    """Only a page that is UTF-8 up to the cut loses an incomplete character; Latin-1 bytes are characters."""
    page = "<p>Le café était crème brûlée</p>".encode("cp1252")
    cut = page.index("brû".encode("cp1252")) + 3  # after the û, a complete character in windows-1252
    with serve("text/html", page) as stub:
        assert browse(stub.url, max_page_bytes=cut) == ("ok", f"Le café était crème brû\n{NOTE.format(cut)}")


def test_the_truncation_note_fits_within_max_result_chars():
    page = ("<p>" + "word " * 2000 + "</p>").encode()
    with serve("text/html", page) as stub:
        _, text = browse(stub.url, max_page_bytes=5000, window_chars=1000, max_result_chars=300)
    assert len(text) <= 300 and text.endswith(f"more characters]\n{NOTE.format(5000)}")


@pytest.mark.parametrize("body, kept", [
    ("très".encode()[:3], b"tr"),  # è cut after its first byte
    ("🐟".encode()[:3], b""),
    (b"fini", b"fini"),  # nothing cut
    (b"caf\xe9 cr\xc3", b"caf\xe9 cr\xc3"),  # not UTF-8 before its end either (Latin-1 é): left whole
    # Latin-1 that is UTF-8 up to a last byte that could start a character: the cut page loses that byte.
    (b"caf\xe9", b"caf"),
])
def test_without_cut_character_drops_only_an_incomplete_utf8_tail(body, kept):
    from aepo_jax.tools.browse import without_cut_character

    assert without_cut_character(body) == kept
