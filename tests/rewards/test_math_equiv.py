"""Math equivalence on the rule table, the sympy time limit, and agreement with math-verify."""

import importlib.util
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aepo_jax.rewards import (
    SympyWorkerPool,
    math_equal,
    math_equiv_reward,
    normalize_math_answer,
)
from aepo_jax.rewards.math_normalize import _UNIT_WORDS, _strip_units

REPO = Path(__file__).resolve().parents[2]

# The table, written from the normalisation rules of spec §5.
# (prediction, gold): must compare equal.
MUST_MATCH = [
    # \dfrac / \tfrac / \frac and short forms
    ("\\dfrac{1}{2}", "\\frac{1}{2}"),
    ("\\tfrac{3}{4}", "\\frac{3}{4}"),
    ("\\frac12", "\\frac{1}{2}"),
    ("\\dfrac34", "\\frac{3}{4}"),
    ("\\frac{2}{4}", "\\frac{1}{2}"),
    ("1/2", "\\frac{1}{2}"),
    ("-3/4", "-\\frac{3}{4}"),
    ("0.5", "\\frac{1}{2}"),
    (".25", "\\frac{1}{4}"),
    ("\\frac{6}{3}", "2"),
    # decimals and trailing zeros
    ("5.0", "5"),
    ("5.00", "5"),
    ("2.50", "2.5"),
    ("3.", "3"),
    ("-7.0", "-7"),
    # commas in numbers
    ("1,000", "1000"),
    ("12,345,678", "12345678"),
    ("1,234.5", "1234.5"),
    # percentages
    ("50\\%", "50"),
    ("12.5%", "12.5"),
    # units and text
    ("12 cm", "12"),
    ("5 \\text{ inches}", "5"),
    ("10\\text{ dollars}", "10"),
    ("\\$5.50", "5.5"),
    ("90^\\circ", "90"),
    ("45^{\\circ}", "45"),
    ("30 degrees", "30"),
    ("7 square feet", "7"),
    # leading variable, dollar math mode, spacing
    ("x = 3", "3"),
    ("y=-2", "-2"),
    ("$\\frac{1}{3}$", "\\frac{1}{3}"),
    ("\\left( 1, 2 \\right)", "(1,2)"),
    ("1 , 2", "1,2"),
    # symbolic equivalence through sympy
    ("2\\sqrt{2}", "\\sqrt{8}"),
    ("\\frac{\\sqrt{3}}{2}", "\\frac{1}{2}\\sqrt{3}"),
    ("\\sqrt{2}/2", "\\frac{1}{\\sqrt{2}}"),
    ("x^2+2x+1", "(x+1)^2"),
    ("2\\pi", "\\pi \\cdot 2"),
    ("\\sqrt[3]{8}", "2"),
    ("3 \\times 4", "12"),
    ("\\frac{\\pi}{4}", "0.25\\pi"),
    ("(1, \\frac{1}{2})", "(1, 0.5)"),
    ("5!", "120"),
    ("2^{10}", "1024"),
    # mixed numbers: a whole number before a numeric fraction (MATH's convention)
    ("2\\frac{1}{2}", "\\frac{5}{2}"),
    ("2 \\frac12", "2.5"),
    ("-2\\frac{1}{2}", "-2.5"),
    ("3\\frac{1}{3}", "\\frac{10}{3}"),
    # sets and bare lists of solutions have no order (multisets)
    ("\\{1,2\\}", "\\{2,1\\}"),
    ("2,3", "3,2"),
    ("\\{1,2\\}", "2, 1"),
    ("\\frac{1}{2}, \\frac{1}{3}", "\\frac13, 0.5"),
    ("1,1,2", "1,2,1"),
    # presentation: unicode minus, braced thousands separator, relation spellings, a nested box
    ("\u22123", "-3"),
    ("\u2212\\frac{1}{2}", "-0.5"),
    ("1{,}000", "1000"),
    ("12{,}345{,}678", "12345678"),
    ("x \\ge 2", "x\\geq 2"),
    ("x \\le 2", "x \\leqslant 2"),
    ("x \\neq 3", "x \\ne 3"),
    ("\\boxed{5}", "5"),
    ("\\boxed{\\frac{1}{2}}", "0.5"),
    # a percentage is also its hundredth when only one side wrote it
    ("50\\%", "0.5"),
    ("12.5\\%", "0.125"),
    # intervals, half-open ones included, compare item by item; `x \\in` is a leading variable
    ("[\\frac12,3)", "[0.5,3)"),
    ("(\\frac12, 3]", "(0.5,3]"),
    ("x\\in[2,3]", "[2,3]"),
    ("x \\in (1, 2)", "(1,2)"),
    # a bare list of tuples is a list of solutions (no order between them, order inside each)
    ("(1,2),(3,4)", "(3,4),(1,2)"),
    # products of letters and roots in any order (`i\\sqrt{2}` was read as one name `isqrt`, `xy` refused)
    ("i\\sqrt{2}", "\\sqrt{2}i"),
    ("1+i\\sqrt{3}", "1+\\sqrt{3}i"),
    ("2x\\sqrt{3}", "2\\sqrt{3}x"),
    ("2xy", "2yx"),
    ("a^2b", "ba^2"),
    # decimals keep a relative tolerance for their rounding
    ("0.1+0.2", "0.3"),
    # exact identities sympy does not simplify, equal to 60 digits
    ("\\cos\\frac{2\\pi}{7}+\\cos\\frac{4\\pi}{7}+\\cos\\frac{6\\pi}{7}", "-\\frac{1}{2}"),
    ("\\cos\\frac{\\pi}{9}+\\cos\\frac{5\\pi}{9}+\\cos\\frac{7\\pi}{9}", "0"),
    # display and font commands
    ("\\displaystyle\\frac{1}{2}", "0.5"),
    ("\\mathbf{5}", "5"),
    ("3\\,\\mathrm{cm}^2", "3"),
    # a unit after a fraction's or a group's closing bracket, and counting nouns
    ("\\frac{3}{4}\\text{ hours}", "\\frac{3}{4}"),
    ("(3/4)\\text{ cm}", "0.75"),
    ("5\\text{ ways}", "5"),
]

# (prediction, gold): must NOT compare equal.
MUST_NOT_MATCH = [
    ("\\frac{1}{3}", "0.33"),
    ("2", "-2"),
    ("\\frac{1}{2}", "\\frac{1}{3}"),
    ("1000", "100"),
    ("1,001", "1000"),
    ("x+1", "x-1"),
    ("(1,2)", "(2,1)"),
    ("(1,2)", "[1,2]"),
    ("(1,2)", "(1,2,3)"),
    ("(1,2)", "1"),
    ("\\sqrt{2}", "2"),
    ("\\sqrt{3}", "1.732"),
    ("2\\pi", "6.28"),
    ("x^2", "2x"),
    ("12 cm", "13"),
    ("50\\%", "5"),
    ("3.5", "3.05"),
    ("10", "1"),
    ("", "0"),
    ("\\frac{1}{0}", "1"),
    ("five", "5"),
    ("\\pi", "3.14"),
    ("e", "2.718"),
    ("0.1", "0.01"),
    # a mixed number is not a product (was read as 2 * 1/2 = 1)
    ("2\\frac{1}{2}", "1"),
    ("-2\\frac{1}{2}", "-1"),
    # tuples and intervals keep their order; a multiset pairs items one to one
    ("[1,2]", "[2,1]"),
    ("(1,2]", "(2,1]"),
    ("\\{1,2\\}", "\\{1,3\\}"),
    ("\\{1,2\\}", "(1,2)"),
    ("1,1,2", "1,2,2"),
    ("1,2", "1,2,3"),
    ("x \\ge 2", "x \\le 2"),
    ("(1,2),(3,4)", "(1,2),(4,3)"),
    ("(1,2]", "(1,2)"),
    ("[1,2)", "[1,2]"),
    ("50", "0.5"),
    # exact numbers are equal only exactly (a 1e-9 tolerance with a floor of 1 accepted all of these)
    ("10^{10}+1", "10^{10}"),
    ("1099511627775", "2^{40}"),
    ("2^{100}", "2^{100}-1"),
    ("0", "10^{-30}"),
    ("10^{-12}", "-10^{-12}"),
    # a letter against a number is a variable, not a unit (`s`, `m` were stripped as seconds and metres)
    ("6s^3", "6s^2"),
    ("6", "6s^2"),
    ("n+2", "n+2m"),
    ("3", "3m^2"),
    # a root index that cannot be read is no square root
    ("\\sqrt[\\alpha]{4}", "2"),
    # letters alone are a word or an order, not a product of symbols (which would commute)
    ("BAC", "ABC"),
    ("\\text{east}", "\\text{seat}"),
    ("\\text{II}", "-1"),
]

# Pairs where math-verify (a reference, not a runtime dependency) decides differently, and why.
MATH_VERIFY_DIFFERENCES = {
    ("12.5%", "12.5"): "math-verify keeps a bare % (only \\% is stripped)",
    ("1,1,2", "1,2,2"): "math-verify compares lists of solutions as sets (duplicates dropped); we pair items one to one",
    ("\\{1,2\\}", "(1,2)"): "math-verify compares a set with a tuple as sets; a tuple has an order here",
    ("n+2", "n+2m"): "math-verify drops the `m` of `2m` as metres; a letter against a number is a variable here",
    ("BAC", "ABC"): "math-verify reads letters alone as a product of symbols; here they are a word or an order",
    ("\\cos\\frac{2\\pi}{7}+\\cos\\frac{4\\pi}{7}+\\cos\\frac{6\\pi}{7}", "-\\frac{1}{2}"):
        "an identity sympy's simplify does not show; here the two sides agree to 60 digits",
    ("\\cos\\frac{\\pi}{9}+\\cos\\frac{5\\pi}{9}+\\cos\\frac{7\\pi}{9}", "0"):
        "an identity sympy's simplify does not show; here the two sides agree to 60 digits",
}


@pytest.fixture(scope="module")
def pool():
    with SympyWorkerPool(size=1, timeout_s=10.0) as p:
        yield p


def test_table_sizes():
    assert len(MUST_MATCH) >= 40 and len(MUST_NOT_MATCH) >= 20


@pytest.mark.parametrize(("prediction", "gold"), MUST_MATCH)
def test_must_match(prediction, gold, pool):
    assert math_equal(prediction, gold, pool=pool)
    assert math_equal(gold, prediction, pool=pool)


@pytest.mark.parametrize(("prediction", "gold"), MUST_NOT_MATCH)
def test_must_not_match(prediction, gold, pool):
    assert not math_equal(prediction, gold, pool=pool)
    assert not math_equal(gold, prediction, pool=pool)


@pytest.mark.parametrize(
    ("raw", "normalized"),
    [
        ("\\dfrac12", "\\frac{1}{2}"),
        ("1,000", "1000"),
        ("x = 2.50", "2.5"),
        ("3/4", "\\frac{3}{4}"),
        ("90^\\circ", "90"),
        ("5 \\text{ cm}", "5"),
        (".5", "0.5"),
    ],
)
def test_normalize_math_answer(raw, normalized):
    assert normalize_math_answer(raw) == normalized


@pytest.mark.parametrize("bomb", ["10^{10^{10^{10}}}", "1000000000!"])
def test_sympy_bomb_finishes_within_its_limit(bomb):
    limit = 1.5
    with SympyWorkerPool(size=1, timeout_s=limit) as pool:
        assert math_equal(
            "2", "\\sqrt{4}", pool=pool
        )  # start the worker outside the timed call
        start = time.perf_counter()
        assert not math_equal(bomb, "1", pool=pool)
        elapsed = time.perf_counter() - start
        assert pool.timeouts == 1
        assert elapsed < limit + 1.0, (
            f"bomb took {elapsed:.2f} s against a {limit} s limit"
        )
        # The killed worker is replaced on the next request.
        assert math_equal("2\\sqrt{2}", "\\sqrt{8}", pool=pool)


def test_unsafe_source_never_reaches_sympy(pool):
    # Names outside the whitelist are refused before parse_expr sees them.
    assert not math_equal("__import__('os').getpid()", "1", pool=pool)
    assert not math_equal("exec(1)", "1", pool=pool)


@pytest.mark.skipif(
    importlib.util.find_spec("math_verify") is None, reason="math-verify not installed"
)
def test_agrees_with_math_verify_on_the_table():
    from math_verify import parse, verify

    differences = {}
    for expected, table in ((True, MUST_MATCH), (False, MUST_NOT_MATCH)):
        for prediction, gold in table:
            verdict = verify(parse(f"${gold}$"), parse(f"${prediction}$"))
            if verdict != expected:
                differences[(prediction, gold)] = verdict
    assert set(differences) == set(MATH_VERIFY_DIFFERENCES), differences


# The unit-suffix regex `_strip_units` replaced: right, but exponential on a failing letter run.
# (With the closing brackets a number may end in, `\\frac{3}{4} hours`, added to it.)
_BACKTRACKING_UNIT_SUFFIX = re.compile(r"^(?P<num>.*?\d[})]*)\s*(?:(?:[a-zA-Z]+)(?:\s*\^\{?\d\}?)?\s*)+$")


def _strip_units_by_backtracking_regex(text):
    match = _BACKTRACKING_UNIT_SUFFIX.match(text)
    if not match:
        return text
    tail = text[len(match.group("num")) :]
    words = re.findall(r"[a-zA-Z]+", tail)
    if not tail[0].isspace() and any(len(w) == 1 for w in words):  # `6s^3`: a variable against the number
        return text
    return match.group("num") if words and all(w.lower() in _UNIT_WORDS for w in words) else text


def test_unit_stripping_agrees_with_the_backtracking_regex_it_replaced():
    """Same result as the old regex on every string it can still decide quickly (short ones);
    newlines are spaces by the time units are stripped, so the alphabet has none."""
    rng = random.Random(0)
    alphabet = ["1", "2", " ", "\t", "^", "{", "}", ")", ",", "!", "m", "cm", "s", "x", "ft", "q", "\u0663"]
    cases = ["12 cm", "7 square feet", "12 cm^2", "3 m^{2}", "x^2 cm", "2x^2", "5 \\text{ inches}", "1 a^2b"]
    cases += ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 8))) for _ in range(20_000)]
    for text in cases:
        assert _strip_units(text) == _strip_units_by_backtracking_regex(text), repr(text)


def test_answers_that_made_the_normaliser_backtrack_finish_in_a_child_process():
    """`1 <long sentence>` took exponential time in the unit regex (the trainer scores rewards in its own
    process); long digit runs took quadratic time in the decimal clean-up; deeply nested boxes must
    unwrap in one pass. A child process normalises them under a generous wall-clock limit that the
    old code exceeds by orders of magnitude."""
    code = (
        "from aepo_jax.rewards.math_normalize import normalize_math_answer as n\n"
        "n('1 The answer is the capital city of the French Republic, Paris')\n"
        "n('1' + ' abcdefgh' * 2000 + '!')\n"
        "n('1' + 'a^2' * 20000 + '!')\n"
        "n('1' * 300000)\n"
        "n('1.' + '0' * 300000 + '1')\n"
        "assert n('\\\\boxed{' * 50000 + '5' + '}' * 50000) == '5'\n"
        "print('done')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], check=False, cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "done", proc.stderr[-2000:]


def test_a_number_beyond_pythons_int_digit_limit_is_compared_not_crashed(pool):
    """Fraction() of a string over 4300 digits raises ValueError; such a number is just not an exact number."""
    huge = "1" * 5000
    assert not math_equal(huge, "1", pool=pool)
    assert math_equal(huge, huge, pool=pool)
    assert not math_equal(f"\\frac{{{huge}}}{{2}}", "0.5", pool=pool)
    assert not math_equal(f"{huge}\\frac{{1}}{{2}}", "1", pool=pool)
    response = f"<think>t</think><answer>\\boxed{{{huge}}}</answer>"
    assert math_equiv_reward(response, ["1"], pool=pool) == 0.0
    assert math_equiv_reward(response, [huge], pool=pool) == 1.0


def test_nesting_too_deep_to_translate_scores_zero_instead_of_raising(pool):
    """`\\sqrt{` a thousand times deep raised RecursionError out of the reward (and the step with it)."""
    from aepo_jax.rewards import compute_reward

    nested = "\\sqrt{" * 1000 + "2" + "}" * 1000
    text = "<think>x</think><answer>\\boxed{" + nested + "}</answer>"
    assert compute_reward("math_equiv", text, ["3"], pool=pool) == 0.0
    assert not math_equal(nested, "3", pool=pool)
