"""Normalisation of math answers and LaTeX-to-sympy translation (spec §5, `math_equiv`).

Two answers that differ only in presentation should compare equal as strings
after `normalize_math_answer`: `\\dfrac`/`\\tfrac` become `\\frac`, `\\frac12`
gets its braces, units and `\\text{...}` unit words are dropped, as are `%`,
degree signs, dollar signs, thousands separators in numbers, trailing `.0`
and a leading `x =`. What is left goes to sympy (in a worker process, see
`math_equiv.py`) after `latex_to_sympy_source` turns it into a plain
expression string built from a whitelisted alphabet.
"""

from __future__ import annotations

import re
from fractions import Fraction

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
))
# fmt: on
_UNIT_SUFFIX = re.compile(r"^(?P<num>.*?\d)\s*(?:(?:[a-zA-Z]+)(?:\^\{?\d\}?)?\s*)+$")
_TEXT_COMMAND = re.compile(
    r"\\(?:text|textbf|textrm|mbox|mathrm|operatorname)\s*\{([^{}]*)\}"
)
_THOUSANDS_NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_LEADING_VARIABLE = re.compile(r"^[a-zA-Z](?:_\{?\w+\}?)?\s*=\s*(?P<rhs>[^=]+)$")
_SIMPLE_FRACTION = re.compile(r"^(-?)\\frac\{(-?\d+(?:\.\d+)?)\}\{(-?\d+(?:\.\d+)?)\}$")
_SLASH_FRACTION = re.compile(r"^(-?\d+(?:\.\d+)?)/(-?\d+(?:\.\d+)?)$")
_DECIMAL = re.compile(r"^-?\d+(?:\.\d+)?$")


def _strip_units(text: str) -> str:
    match = _UNIT_SUFFIX.match(text)
    if not match:
        return text
    tail = text[len(match.group("num")) :]
    words = re.findall(r"[a-zA-Z]+", tail)
    if words and all(w.lower() in _UNIT_WORDS for w in words):
        return match.group("num")
    return text


def _brace_short_commands(text: str) -> str:
    """`\\frac12` -> `\\frac{1}{2}`, `\\frac1{x}` -> `\\frac{1}{x}`, `\\sqrt2` -> `\\sqrt{2}`."""
    text = re.sub(r"\\frac\s*(\d)\s*(\d)", r"\\frac{\1}{\2}", text)
    text = re.sub(r"\\frac\s*(\d)\s*(?=\{)", r"\\frac{\1}", text)
    text = re.sub(r"\\frac\s*(\{[^{}]*\})\s*(\d)", r"\\frac\1{\2}", text)
    return re.sub(r"\\sqrt\s*(\d)", r"\\sqrt{\1}", text)


def normalize_math_answer(text: str) -> str:
    """Canonical string form of a math answer (see the module docstring for the rules)."""
    s = text.strip()
    s = s.replace("\n", " ").replace("\\!", "")
    s = re.sub(r"\\(?:left|right|big|Big|bigg|Bigg)\s*(?=[()\[\]|.]|\\[{}])", "", s)
    s = s.replace("\\$", "").replace("$", "")
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
    s = re.sub(r"(\d+\.\d*?)0+(?![\d])", r"\1", s)  # 2.50 -> 2.5, 3.00 -> 3.
    s = re.sub(r"(\d+)\.(?![\d])", r"\1", s)  # 3. -> 3
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
    except ZeroDivisionError:
        return None
    return None


def split_top_level(normalized: str) -> tuple[str, list[str], str] | None:
    """Split a bracketed or bare comma list `(a,b)` / `a,b` into (open, items, close); None if no comma."""
    opening, closing = "", ""
    body = normalized
    pairs = {"(": ")", "[": "]", "\\{": "\\}"}
    for left, right in pairs.items():
        if body.startswith(left) and body.endswith(right):
            opening, closing, body = (
                left,
                right,
                body[len(left) : len(body) - len(right)],
            )
            break
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


def latex_to_sympy_source(normalized: str) -> str | None:
    """Translate a normalised LaTeX answer into a sympy-parsable string, or None if unsupported.

    Only digits, single-letter symbols, + - * / ^ ! ( ) and the functions in
    `_ALLOWED_NAMES` survive, so the string is safe to hand to `parse_expr`.
    """
    out: list[str] = []
    i = 0
    s = normalized
    try:
        while i < len(s):
            if s.startswith("\\frac", i):
                num, i = _read_group(s, i + 5)
                den, i = _read_group(s, i)
                num_src, den_src = (
                    latex_to_sympy_source(num),
                    latex_to_sympy_source(den),
                )
                if num_src is None or den_src is None:
                    return None
                out.append(f"(({num_src})/({den_src}))")
                continue
            if s.startswith("\\sqrt", i):
                i += 5
                root = None
                if i < len(s) and s[i] == "[":
                    end = s.index("]", i)
                    root, i = latex_to_sympy_source(s[i + 1 : end]), end + 1
                arg, i = _read_group(s, i)
                arg_src = latex_to_sympy_source(arg)
                if arg_src is None:
                    return None
                out.append(
                    f"(({arg_src})**(1/({root})))" if root else f"sqrt({arg_src})"
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
    source = "".join(out)
    if not _ALLOWED_CHARS.match(source) or "__" in source:
        return None
    for name in re.findall(r"[A-Za-z]{2,}", source):
        if name not in _ALLOWED_NAMES:
            return None
    return source
