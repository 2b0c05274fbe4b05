"""Math equivalence on the rule table, the sympy time limit, and agreement with math-verify."""

import importlib.util
import time

import pytest

from aepo_jax.rewards import SympyWorkerPool, math_equal, normalize_math_answer

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
]

# Pairs where math-verify (a reference, not a runtime dependency) decides differently, and why.
MATH_VERIFY_DIFFERENCES = {
    ("12.5%", "12.5"): "math-verify keeps a bare % (only \\% is stripped)",
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
