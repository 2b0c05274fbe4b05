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


# The standard library parser's start-tag pattern (`html.parser.locatestarttagend_tolerant`, Python 3.11),
# with `<` left out of tag names, attribute names and unquoted values: a start tag that would need one
# there is stray text here (module docstring of `escape_stray_markup`).
_START_TAG = re.compile(r"""
  <[a-zA-Z][^\t\n\r\f />\x00<]*        # tag name
  (?:[\s/]*                            # optional whitespace before attribute name
    (?:(?<=['"\s/])[^\s/><][^\s/=><]*   # attribute name
      (?:\s*=+\s*                      # value indicator
        (?:'[^']*'                     # LITA-enclosed value
          |"[^"]*"                     # LIT-enclosed value
          |(?!['"])[^>\s<]*            # bare value
         )
        \s*                            # possibly followed by a space
       )?(?:\s|/(?!>))*
     )*
   )?
  \s*                                  # trailing whitespace
""", re.VERBOSE)
_TAG_NAME = re.compile(r"<([a-zA-Z][^\t\n\r\f />\x00<]*)")
_CDATA_END = {name: re.compile(rf"</\s*{name}\s*>", re.IGNORECASE) for name in ("script", "style")}
_COMMENT_END = re.compile(r"--\s*>")
# `<![name` sections the parser knows, and the end it looks for; any other name makes it raise.
_MARKED_SECTION = re.compile(r"<!\[([a-zA-Z][-_.a-zA-Z0-9]*)\s*")
_MARKED_SECTION_END = {"temp": re.compile(r"]\s*]\s*>"), "if": re.compile(r"]\s*>")}
for _name in ("cdata", "ignore", "include", "rcdata"):
    _MARKED_SECTION_END[_name] = _MARKED_SECTION_END["temp"]
for _name in ("else", "endif"):
    _MARKED_SECTION_END[_name] = _MARKED_SECTION_END["if"]


class _Finder:
    """`pattern.search(page, start)` for starts that only grow: a search that found nothing is not repeated
    (it read to the page's end), and a match is reused while it still lies ahead, so each pattern reads the
    page about once however many `<` ask."""

    def __init__(self, page: str, pattern: re.Pattern[str]) -> None:
        self.page, self.pattern = page, pattern
        self.match: re.Match[str] | None = None
        self.none_from: int | None = None  # nothing matches at or after this index

    def search(self, start: int) -> re.Match[str] | None:
        if self.none_from is not None and start >= self.none_from:
            return None
        if self.match is None or self.match.start() < start:
            self.match = self.pattern.search(self.page, start)
            if self.match is None:
                self.none_from = start
        return self.match


def escape_stray_markup(page: str) -> str:
    """The page with every `<` that does not open a complete piece of markup written as `&lt;`.

    Why: `html.parser` rescans to the page's end from each `<` whose tag, comment or declaration never
    closes, so a page of `"x <y " * 10_000` took tens of CPU-seconds and 1 MiB of `"<a" * n` many minutes,
    on a thread the registry had already given up on. Each `<` here is checked in one forward pass that
    reads each character a bounded number of times, with the parser's own rules for where a construct
    ends (start tags, end tags, comments, `<!...>`, `<?...>`, marked sections, script and style content
    copied untouched), so the parser only meets markup it finishes. One rule is stricter than the parser's:
    a start tag may hold `<` only inside a quoted attribute value, so `if a <b then <p>` keeps `a <b then`
    as text (the parser made `<b then <p>` one tag). A marked section of a name the parser does not know
    (`<![x`) is text too: the parser raised AssertionError on it. Pages whose markup is complete are
    returned unchanged.
    """
    last_gt = page.rfind(">")
    comment_end = _Finder(page, _COMMENT_END)
    section_ends = {pattern: _Finder(page, pattern) for pattern in set(_MARKED_SECTION_END.values())}
    cdata_ends = {name: _Finder(page, pattern) for name, pattern in _CDATA_END.items()}
    out: list[str] = []
    i = 0
    while (lt := page.find("<", i)) >= 0:
        out.append(page[i:lt])
        end = -1  # where the markup at `lt` ends, or -1: stray, text up to `stray_end`
        stray_end = lt + 1
        after = page[lt + 1:lt + 2]
        if after.isascii() and after.isalpha():  # a start tag: where the parser's pattern ends
            match = _START_TAG.match(page, lt)
            stop = match.end()
            if page.startswith(">", stop):
                end = stop + 1
            elif page.startswith("/>", stop):
                end = stop + 2
            elif stop < len(page) and page[stop] not in "<=/" and not (page[stop].isascii() and page[stop].isalpha()):
                end = stop  # the parser ends a tag there without `>` (e.g. at a NUL)
            else:
                stray_end = stop
            name = _TAG_NAME.match(page, lt).group(1).lower()
            if end >= 0 and name in cdata_ends and not page.startswith("/>", end - 2):
                # script or style: the parser reads its content as text up to the closing tag
                closing = cdata_ends[name].search(end)
                content_end = closing.start() if closing else len(page)
                out.append(page[lt:content_end])
                i = content_end
                continue
        elif after in ("/", "?") or (after == "!" and not page.startswith("<![", lt) and not page.startswith("<!--", lt)):
            end = page.find(">", lt + 2) + 1 if lt + 2 <= last_gt else -1  # end tag, `<?...>`, `<!doctype>`, `<!x>`
            if end == 0:
                end = -1
        elif page.startswith("<!--", lt):
            closing = comment_end.search(lt + 4)
            end = closing.end() if closing else -1
        elif page.startswith("<![", lt):
            section = _MARKED_SECTION.match(page, lt)
            kind = _MARKED_SECTION_END.get(section.group(1).lower()) if section and section.end() < len(page) else None
            closing = section_ends[kind].search(lt + 3) if kind else None
            end = closing.end() if closing else -1
        # else `<` before a space, a digit, ...: text to the parser too, escaped so it reads one run of text
        if end >= 0:
            out.append(page[lt:end])
            i = end
        else:
            out.append(page[lt:stray_end].replace("<", "&lt;"))
            i = stray_end
    out.append(page[i:])
    return "".join(out)


def html_to_text(page: str) -> str:
    """Readable text of an HTML page: hidden and navigation elements dropped, one line per block, blank
    lines collapsed. Stray `<` are text (`escape_stray_markup`)."""
    collector = _TextCollector()
    collector.feed(escape_stray_markup(page))
    collector.close()
    lines = (line.strip() for line in "".join(collector.parts).splitlines())
    return "\n".join(line for line in lines if line)
