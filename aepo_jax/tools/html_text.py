"""Readable text of an HTML page, for the browse tool.

One streaming pass of the standard library's parser, no document tree: a
2 MB page is a fraction of a CPU-second (`python -m benchmarks.tools_bench
--part html`), where building a BeautifulSoup tree of it took seconds inside
a tool call's deadline. Text keeps the page's reading order: inline elements
(`<b>`, `<a>`, `<span>`) stay inside their line, block elements (`<p>`,
`<div>`, `<li>`, headings, table cells) start a new one, whitespace collapses
as a browser shows it (line breaks kept inside `<pre>`), and what a reader
never sees (scripts, styles, `<head>`) or skips (navigation, footers) is
dropped.
"""

from __future__ import annotations

import html.parser
import re

# Elements whose content is not page text. `head` also ends where `body` starts (pages often omit `</head>`).
HIDDEN_ELEMENTS = frozenset({"script", "style", "noscript", "template", "head", "nav", "footer", "svg"})
# Elements that start and end a line of text.
BLOCK_ELEMENTS = frozenset({
    "address", "article", "aside", "blockquote", "br", "caption", "dd", "details", "div", "dl", "dt",
    "fieldset", "figcaption", "figure", "form", "h1", "h2", "h3", "h4", "h5", "h6", "header", "hr", "li",
    "main", "ol", "p", "pre", "section", "summary", "table", "td", "th", "tr", "ul", "body", "title",
})
_SPACES = re.compile(r"[ \t\r\n\f\v]+")


# Elements that never have content or an end tag.
VOID_ELEMENTS = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param",
                           "source", "track", "wbr"})


class _TextCollector(html.parser.HTMLParser):
    """Collects the visible text of the fed HTML as lines (module docstring).

    Open elements are kept on a stack, so an end tag also ends the elements left open inside it (a
    `<nav>` never closed inside a `<div>` hides nothing after `</div>`), as a browser's parser does; an
    end tag with no open element of its name is ignored. A count of open elements per name answers
    "is one open?" without scanning the stack, and ending pops from the top, so each element costs O(1)
    however deep the page nests: scanning (and copying) the stack per end tag made a page of `<b>` * n
    then `</i>` * n, or a table that omits its legal-to-omit `</td>`, quadratic (25 CPU-s at 273 KiB)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.open: list[str] = []  # open non-void elements, outermost first
        self.open_counts: dict[str, int] = {}  # how many of `open` have each name
        self.hidden_depth = 0  # hidden elements among them
        self.pre_depth = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "body":  # pages often omit `</head>`: it ends here, with what is open inside it
            while self.open_counts.get("head"):
                self._pop()
        if tag in BLOCK_ELEMENTS:
            self.parts.append("\n")
        if tag in VOID_ELEMENTS:
            return
        self.open.append(tag)
        self.open_counts[tag] = self.open_counts.get(tag, 0) + 1
        self.hidden_depth += tag in HIDDEN_ELEMENTS
        self.pre_depth += tag == "pre"

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in BLOCK_ELEMENTS:  # <br/>, <hr/>
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if self.open_counts.get(tag):
            while self._pop() != tag:  # the elements left open inside it end first, innermost first
                pass

    def _pop(self) -> str:
        """End the innermost open element; returns its name."""
        tag = self.open.pop()
        self.open_counts[tag] -= 1
        self.hidden_depth -= tag in HIDDEN_ELEMENTS
        self.pre_depth -= tag == "pre"
        if tag in BLOCK_ELEMENTS:
            self.parts.append("\n")
        return tag

    def handle_data(self, data: str) -> None:
        if self.hidden_depth:
            return
        self.parts.append(data if self.pre_depth else _SPACES.sub(" ", data))

    def unknown_decl(self, data: str) -> None:
        if data.startswith("CDATA["):  # <![CDATA[...]]> in XHTML: its text is page text
            self.handle_data(data[len("CDATA["):])


def html_to_text(page: str) -> str:
    """Readable text of an HTML page: hidden and navigation elements dropped, one line per block, blank
    lines collapsed."""
    collector = _TextCollector()
    collector.feed(page)
    collector.close()
    lines = (line.strip() for line in "".join(collector.parts).splitlines())
    return "\n".join(line for line in lines if line)
