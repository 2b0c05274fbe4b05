"""`aepo_jax.tools.html_text.html_to_text`: the visible text of a page in reading order, against the text a
browser shows (written out by hand for each page)."""

from __future__ import annotations

import pytest

from aepo_jax.tools.html_text import html_to_text

PAGES = [
    # inline elements stay in their line; a source line break inside a paragraph is a space
    ("<html><body><p>The <b>Eiffel</b> tower is in\n   <a href='/paris'>Paris</a>.</p></body></html>",
     "The Eiffel tower is in Paris."),
    # scripts, styles, head, navigation and footers are dropped; blocks start lines
    (("<html><head><title>T</title><style>p{color:red}</style></head><body><nav>Home | About</nav>"
     "<h1>Report</h1><div>First</div><div>Second<br>third</div><script>var x = '<p>no</p>';</script>"
     "<footer>(c) 2026</footer></body></html>"),
     "Report\nFirst\nSecond\nthird"),
    # a head left open ends where the body starts; entities are decoded
    ("<html><head><meta charset='utf-8'><body><p>caf&eacute; &amp; cr&#232;me &lt;3</p></body></html>",
     "café & crème <3"),
    # list items and table cells are lines; pre keeps its line breaks
    (("<ul><li>one</li><li>two <i>and a half</i></li></ul><table><tr><td>a</td><td>b</td></tr></table>"
     "<pre>x = 1\n  y = 2</pre>"),
     "one\ntwo and a half\na\nb\nx = 1\ny = 2"),
    # nested hidden elements, and a self-closed break
    ("<div>keep<noscript><nav>gone</nav>still gone</noscript> this<br/>line</div>", "keep this\nline"),
    # text outside any element, and an unclosed paragraph at the end
    ("plain words <p>an unclosed paragraph", "plain words\nan unclosed paragraph"),
]


@pytest.mark.parametrize("page, text", PAGES)
def test_html_becomes_the_text_a_browser_shows(page, text):
    assert html_to_text(page) == text


def test_an_unclosed_hidden_element_hides_the_rest_and_nothing_before_it():
    assert html_to_text("<p>before</p><script>x = 1; <p>after</p>") == "before"


@pytest.mark.parametrize("page, text", [
    ("<body><div><nav><a href=/>Home</a></div><p>Main article text</p>", "Main article text"),
    ("<body><section><footer>f</section><p>More text</p>", "More text"),
    ("<body><div><svg><path d=1></div><p>Text after</p>", "Text after"),
    ("<div><pre>a\n<b>b</div><p>c  d</p>", "a\nb\nc d"),  # a pre left open ends with its div
    ("<p>one</span> two</p>", "one two"),  # an end tag with nothing open of its name is ignored
    ("<p><![CDATA[cdata text]]></p>", "cdata text"),
])
def test_an_end_tag_also_ends_the_elements_left_open_inside_it(page, text):
    """Hidden elements left open (a `<nav>` never closed) hid the rest of the page after their parent had
    ended (BeautifulSoup's tree, used before, ended them with it)."""
    assert html_to_text(page) == text
