"""Normalisation of math answers and LaTeX-to-sympy translation (spec §5, `math_equiv`).

Two answers that differ only in presentation should compare equal as strings
after `normalize_math_answer`: `\\dfrac`/`\\tfrac` become `\\frac`, `\\frac12`
gets its braces, units and `\\text{...}` unit words are dropped, as are `%`,
degree signs, dollar signs, thousands separators in numbers (`1,000`,
`1{,}000`), trailing `.0`, a leading `x =` (or `x \\in`) and a `\\boxed{}` around the whole
answer; a unicode minus is `-`, `\\geq`/`\\leq`/`\\neq` are `\\ge`/`\\le`/`\\ne`,
and a mixed number `2\\frac{1}{2}` is `\\frac{5}{2}`. Normalising takes time
linear in the answer's length, whatever the model wrote (no backtracking
pattern: the trainer scores rewards in its own process).
What is left goes to sympy (in a worker process, see
`math_equiv.py`) after `latex_to_sympy_source` turns it into a plain
expression string built from a whitelisted alphabet.
"""

from __future__ import annotations

import re
from fractions import Fraction

from aepo_jax.agent.protocol import brace_pairs

# Unit words dropped after a number ("12 cm", "5 dollars", "3 square feet").
# fmt: off
_UNIT_WORDS = frozenset((
    "cm", "m", "km", "mm", "inch", "inches", "in", "ft", "foot", "feet", "yd", "yard", "yards", "mile",
    "miles", "meter", "meters", "metre", "metres", "centimeter", "centimeters", "millimeter", "millimeters",
    "kilometer", "kilometers", "mi", "sq", "square", "cubic", "units", "unit", "dollar", "dollars",
    "cent", "cents", "degree", "degrees", "deg", "hour", "hours", "hr", "hrs", "minute", "minutes",
    "min", "mins", "second", "seconds", "sec", "s", "day", "days", "week", "weeks", "month", "months",
    "year", "years", "mph", "kg", "g", "gram", "grams", "kilogram", "kilograms", "lb", "lbs", "pound",
    "pounds", "ounce", "ounces", "oz", "l", "liter", "liters", "litre", "litres", "ml", "cups", "cup",
    "gallons", "gallon", "people", "students", "apples", "marbles", "books", "points", "times", "percent",
    "ways", "arrangements", "outcomes", "handshakes", "games",
))
# fmt: on
# One unit-like word with an optional power ("cm", " ft^2", "m^{3}"); a unit tail is a run of these.
_UNIT_TOKEN = re.compile(r"\s*[a-zA-Z]+(?:\s*\^\{?\d\}?)?")  # `cm ^2`: what `\\mathrm{cm}^2` leaves
_TRAILING_SPACE = re.compile(r"\s*\Z")
_DIGIT = re.compile(r"\d")
_CLOSING = frozenset("})")  # what may close a number before its unit: a fraction's or a group's bracket
_TEXT_COMMAND = re.compile(
    r"\\(?:text|textbf|textrm|textit|mbox|mathrm|mathbf|mathit|boldsymbol|operatorname)\s*\{([^{}]*)\}"
)
_THOUSANDS_NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_LEADING_VARIABLE = re.compile(r"^[a-zA-Z](?:_\{?\w+\}?)?\s*(?:=|\\in(?![a-zA-Z]))\s*(?P<rhs>[^=]+)$")
_MIXED_NUMBER = re.compile(r"^(-?)(\d+)\\frac\{(\d+)\}\{(\d+)\}$")
_RELATION = re.compile(r"\\(ge|le|ne)q?(?:slant)?(?![a-zA-Z])")
_SIMPLE_FRACTION = re.compile(r"^(-?)\\frac\{(-?\d+(?:\.\d+)?)\}\{(-?\d+(?:\.\d+)?)\}$")
_SLASH_FRACTION = re.compile(r"^(-?\d+(?:\.\d+)?)/(-?\d+(?:\.\d+)?)$")
_DECIMAL = re.compile(r"^-?\d+(?:\.\d+)?$")


def _unit_tail_start(text: str) -> int | None:
    """The first index `i` after a digit (and the closing brackets right after it) from which `text[i:]`
    is a run of unit-like tokens, else None.

    A left-to-right scan in linear time. (A single regex, `(.*?\\d)\\s*(?:[a-zA-Z]+(...)?\\s*)+$`,
    backtracks exponentially over the ways to split a long letter run into words when the
    tail then fails, e.g. `1 The answer is the capital of France, Paris`.) The token scan is
    deterministic (a token takes a whole letter run and the longest power), and a scan that
    fails at `end` also fails from any later start before `end` (those starts follow a
    power's digit inside the scanned run, and scanning from them meets the same tokens), so
    the next start is looked for at or after `end`.
    """
    start = 0
    while (digit := _DIGIT.search(text, start)) is not None:
        begin = digit.end()
        while begin < len(text) and text[begin] in _CLOSING:  # `\\frac{3}{4} hours`, `(3/4) cm`
            begin += 1
        end = begin
        while (token := _UNIT_TOKEN.match(text, end)) is not None:
            end = token.end()
        if end > begin and _TRAILING_SPACE.match(text, end):
            return begin
        start = end
    return None


def _strip_units(text: str) -> str:
    """`12 cm` -> `12`, `7 square feet` -> `7`: drop a unit tail whose words are all unit words.

    A one-letter word written against the number is a variable, not a unit: `6s^3`, `3m^2` and `n+2m`
    keep it (`12 m`, `12cm` and `5 \\text{ m}` still lose theirs)."""
    begin = _unit_tail_start(text)
    if begin is None:
        return text
    words = re.findall(r"[a-zA-Z]+", text[begin:])
    if not text[begin].isspace() and any(len(w) == 1 for w in words):
        return text
    if all(w.lower() in _UNIT_WORDS for w in words):
        return text[:begin]
    return text


def _brace_short_commands(text: str) -> str:
    """`\\frac12` -> `\\frac{1}{2}`, `\\frac1{x}` -> `\\frac{1}{x}`, `\\sqrt2` -> `\\sqrt{2}`."""
    text = re.sub(r"\\frac\s*(\d)\s*(\d)", r"\\frac{\1}{\2}", text)
    text = re.sub(r"\\frac\s*(\d)\s*(?=\{)", r"\\frac{\1}", text)
    text = re.sub(r"\\frac\s*(\{[^{}]*\})\s*(\d)", r"\\frac\1{\2}", text)
    return re.sub(r"\\sqrt\s*(\d)", r"\\sqrt{\1}", text)


def _unwrap_boxed(text: str) -> str:
    """`\\boxed{5}` -> `5` when the box holds the whole answer (a box nested in the graded box).

    The braces are paired in one pass first, so peeling many nested boxes stays linear.
    """
    if not text.startswith("\\boxed"):
        return text
    closing = brace_pairs(text)  # index of "{" -> index of its "}"
    begin, end = 0, len(text)
    while text.startswith("\\boxed", begin, end):
        brace = begin + len("\\boxed")
        while brace < end and text[brace].isspace():
            brace += 1
        if closing.get(brace) != end - 1:
            break
        begin, end = brace + 1, end - 1
        while begin < end and text[begin].isspace():
            begin += 1
        while end > begin and text[end - 1].isspace():
            end -= 1
    return text[begin:end]


def _mixed_number_as_fraction(text: str) -> str:
    """`2\\frac{1}{2}` -> `\\frac{5}{2}`: a whole number before a numeric fraction is a mixed number.

    That is how MATH writes them and how math-verify reads them; the product `2 * 1/2` would be
    written with `\\cdot`. The sign applies to the whole: `-2\\frac{1}{2}` is `-\\frac{5}{2}`.
    """
    mixed = _MIXED_NUMBER.match(text)
    if not mixed:
        return text
    sign, whole, num, den = mixed.groups()
    try:
        numerator = int(whole) * int(den) + int(num)
    except ValueError:  # over Python's int-from-string digit limit
        return text
    return f"{sign}\\frac{{{numerator}}}{{{den}}}"


def normalize_math_answer(text: str) -> str:
    """Canonical string form of a math answer (see the module docstring for the rules)."""
    s = text.strip()
    s = s.replace("\n", " ").replace("\\!", "")
    s = s.replace("\u2212", "-").replace("{,}", ",")  # unicode minus; `1{,}000`
    s = s.replace("≥", "\\ge").replace("≤", "\\le").replace("≠", "\\ne")
    s = _RELATION.sub(r"\\\1", s)  # \geq, \geqslant -> \ge (likewise \le, \ne)
    s = re.sub(r"\\(?:left|right|big|Big|bigg|Bigg)\s*(?=[()\[\]|.]|\\[{}])", "", s)
    s = s.replace("\\$", "").replace("$", "")
    s = re.sub(r"\\(?:displaystyle|textstyle)(?![a-zA-Z])", "", s)
    s = _unwrap_boxed(s.strip())
    s = s.replace("\\%", "").replace("%", "")
    s = re.sub(r"\^\s*\{?\s*\\circ\s*\}?", "", s).replace("\\circ", "").replace("°", "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = _TEXT_COMMAND.sub(r" \1 ", s)
    s = (
        s.replace("\\,", " ")
        .replace("\\;", " ")
        .replace("\\:", " ")
        .replace("\\ ", " ")
        .replace("~", " ")
    )
    s = s.strip().rstrip(".").strip()
    leading = _LEADING_VARIABLE.match(s)
    if leading:
        s = leading.group("rhs").strip()
    s = _strip_units(s).strip()
    if _THOUSANDS_NUMBER.fullmatch(s):
        s = s.replace(",", "")
    s = _brace_short_commands(s)
    s = s.replace(" ", "")
    s = re.sub(r"(?<![\d.])\.(\d)", r"0.\1", s)  # .5 -> 0.5
    # (?<!\d): a match starts where a digit run starts, so the scan is linear in a long run of digits.
    s = re.sub(r"(?<!\d)(\d+\.(?:\d*[1-9])?)0+(?!\d)", r"\1", s)  # 2.50 -> 2.5, 3.00 -> 3.
    s = re.sub(r"(?<!\d)(\d+)\.(?!\d)", r"\1", s)  # 3. -> 3
    s = _mixed_number_as_fraction(s)
    slash = _SLASH_FRACTION.match(s)
    if slash:
        num, den = slash.groups()
        s = (
            f"-\\frac{{{num[1:]}}}{{{den}}}"
            if num.startswith("-")
            else f"\\frac{{{num}}}{{{den}}}"
        )
    return s


def as_exact_number(normalized: str) -> Fraction | None:
    """The exact rational value of a normalised integer, decimal or numeric fraction, else None."""
    try:
        if _DECIMAL.match(normalized):
            return Fraction(normalized)
        frac = _SIMPLE_FRACTION.match(normalized)
        if frac:
            sign, num, den = frac.groups()
            value = Fraction(num) / Fraction(den)
            return -value if sign else value
    except (ZeroDivisionError, ValueError):  # ValueError: over Python's int-from-string digit limit (4300)
        return None
    return None


def split_top_level(normalized: str) -> tuple[str, list[str], str] | None:
    """Split a bracketed or bare comma list `(a,b)` / `a,b` into (open, items, close); None if no comma."""
    opening, closing = _enclosing_brackets(normalized)
    body = normalized[len(opening) : len(normalized) - len(closing)]
    items, depth, current = [], 0, []
    for ch in body:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            items.append("".join(current))
            current = []
        else:
            current.append(ch)
    items.append("".join(current))
    if len(items) < 2:
        return None
    return opening, items, closing


def _enclosing_brackets(normalized: str) -> tuple[str, str]:
    """The bracket pair around the whole answer: `(`/`[` with `)`/`]` (a tuple, or an interval, closed
    or half-open) or `\\{` with `\\}`; ("", "") when none, or when the first bracket closes before the
    end (`(1,2),(3,4)` is a bare list of two tuples)."""
    if normalized.startswith("\\{") and normalized.endswith("\\}"):
        opening, closing = "\\{", "\\}"
    elif normalized[:1] in ("(", "[") and normalized[-1:] in (")", "]"):
        opening, closing = normalized[0], normalized[-1]
    else:
        return "", ""
    depth = 0
    for i, ch in enumerate(normalized):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if depth <= 0 and len(opening) <= i < len(normalized) - 1:
            return "", ""
    return opening, closing


def _read_group(text: str, start: int) -> tuple[str, int]:
    """The content of the `{...}` group starting at `text[start]` and the index after it."""
    if start >= len(text) or text[start] != "{":
        raise ValueError(f"expected '{{' at position {start} of {text!r}")
    depth = 0
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start + 1 : i], i + 1
    raise ValueError(f"unbalanced braces in {text!r}")


_LATEX_WORDS = {
    "\\cdot": "*",
    "\\times": "*",
    "\\div": "/",
    "\\pi": "pi",
    "\\infty": "oo",
    "\\ln": "log",
    "\\log": "log",
    "\\sin": "sin",
    "\\cos": "cos",
    "\\tan": "tan",
    "\\exp": "exp",
}
_ALLOWED_NAMES = frozenset(
    {"sqrt", "pi", "oo", "log", "sin", "cos", "tan", "exp", "E", "I"}
)
_ALLOWED_CHARS = re.compile(r"^[0-9A-Za-z+\-*/().!\s]*$")
_ATTRIBUTE = re.compile(r"\.\s*[A-Za-z]")  # `x.n`: an attribute, never a decimal point
_ARITHMETIC = re.compile(r"[0-9+\-*/]")  # a digit or an operator: the letters around it are symbols


def latex_to_sympy_source(normalized: str) -> str | None:
    """Translate a normalised LaTeX answer into a sympy-parsable string, or None if unsupported.

    Only digits, single-letter symbols, + - * / ^ ! ( ) and the functions in
    `_ALLOWED_NAMES` survive, so the string is safe to hand to `parse_expr`. A run of
    letters that is no such function is a product of single-letter symbols (`2xy` is
    `2x*y`) where a digit or an operator shows it is math; letters alone (`BAC`, a
    word) are not translated, so they compare as strings only. Nesting too deep for Python's recursion (`\\sqrt{` a thousand times) is
    unsupported, not an error: the text is a model's.
    """
    try:
        source = _translate(normalized)
    except RecursionError:
        return None
    if source is None or not _ALLOWED_CHARS.match(source) or "__" in source or _ATTRIBUTE.search(source):
        return None
    words = [run for run in re.findall(r"[A-Za-z]{2,}", source) if run not in _ALLOWED_NAMES]
    if words and not _ARITHMETIC.search(source):
        return None  # letters only (`BAC`, `\\text{east}`): a word or an order, not a product of symbols
    return re.sub(r"[A-Za-z]{2,}", _symbols_or_function, source)


def _symbols_or_function(run: re.Match) -> str:
    """A letter run of the translated source: an allowed function name as it is, else its letters multiplied."""
    name = run.group(0)
    return name if name in _ALLOWED_NAMES else "*".join(name)


def _translate(normalized: str) -> str | None:
    """`latex_to_sympy_source` before its character and name checks."""
    out: list[str] = []
    i = 0
    s = normalized
    try:
        while i < len(s):
            if s.startswith("\\frac", i):
                num, i = _read_group(s, i + 5)
                den, i = _read_group(s, i)
                num_src, den_src = _translate(num), _translate(den)
                if num_src is None or den_src is None:
                    return None
                out.append(f"(({num_src})/({den_src}))")
                continue
            if s.startswith("\\sqrt", i):
                i += 5
                root = None
                if i < len(s) and s[i] == "[":
                    end = s.index("]", i)
                    root, i = _translate(s[i + 1 : end]), end + 1
                    if root is None:  # an index we cannot read is not a square root
                        return None
                arg, i = _read_group(s, i)
                arg_src = _translate(arg)
                if arg_src is None:
                    return None
                # A space before `sqrt`: `i\\sqrt{2}` must not read as one name `isqrt`.
                out.append(
                    f" (({arg_src})**(1/({root})))" if root else f" sqrt({arg_src})"
                )
                continue
            word = next(
                (
                    w
                    for w in sorted(_LATEX_WORDS, key=len, reverse=True)
                    if s.startswith(w, i)
                ),
                None,
            )
            if word is not None:
                out.append(f" {_LATEX_WORDS[word]} ")
                i += len(word)
                continue
            ch = s[i]
            out.append({"{": "(", "}": ")", "^": "**"}.get(ch, ch))
            i += 1
    except ValueError:
        return None
    return "".join(out)
