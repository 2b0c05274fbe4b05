"""pass@k against brute-force subset enumeration, and the report writers."""

import csv
import itertools
import math
from fractions import Fraction

import pytest

from aepo_jax.evaluation import (
    QuestionResult,
    build_reports,
    format_report_table,
    pass_at_k,
    pass_at_k_table,
    read_report_json,
    write_report_csv,
    write_report_json,
)


def brute_force_pass_at_k(flags: list[bool], k: int) -> Fraction:
    """Fraction of all k-subsets of the samples that contain at least one correct one."""
    subsets = list(itertools.combinations(flags, k))
    return Fraction(sum(any(s) for s in subsets), len(subsets))


@pytest.mark.parametrize("n", range(1, 9))
def test_pass_at_k_matches_subset_enumeration(n):
    for c in range(n + 1):
        flags = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(
                float(brute_force_pass_at_k(flags, k)), abs=1e-12
            )


def test_pass_at_k_stable_for_large_n():
    # C(1000, 500) overflows float64; the product form stays finite and matches exact integers.
    n, c, k = 1000, 3, 500
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-12)
    assert pass_at_k(100_000, 1, 1) == pytest.approx(1e-5, rel=1e-9)


def test_pass_at_1_is_mean_correctness():
    correct = [[True, False, False, True], [False] * 4, [True] * 4]
    table = pass_at_k_table(correct)
    assert sorted(table) == [1, 2, 3, 4]
    assert table[1] == pytest.approx((0.5 + 0 + 1) / 3)
    assert table[4] == pytest.approx(2 / 3)


@pytest.mark.parametrize(
    "args", [(0, 0, 1), (3, 4, 1), (3, 1, 0), (3, 1, 4), (3, -1, 1)]
)
def test_pass_at_k_rejects_bad_arguments(args):
    with pytest.raises(ValueError):
        pass_at_k(*args)


def test_pass_at_k_table_rejects_k_above_samples():
    with pytest.raises(ValueError, match="k=3"):
        pass_at_k_table([[True, False]], ks=[3])


def _results():
    return [
        QuestionResult("q1", "hotpotqa", [True, False], [1.0, 0.5], [2, 4], [100, 300]),
        QuestionResult("q2", "hotpotqa", [False, False], [0.0, 0.0], [1, 1], [50, 50]),
        QuestionResult("m1", "math", [True, True], [1.0, 1.0], [0, 0], [10, 30]),
    ]


def test_reports_per_dataset_and_overall():
    reports = build_reports(_results())
    by_name = {r.dataset: r for r in reports}
    assert list(by_name) == ["hotpotqa", "math", "all"]
    hotpot = by_name["hotpotqa"]
    assert hotpot.pass_at_k[1] == pytest.approx(0.25)
    assert hotpot.pass_at_k[2] == pytest.approx(0.5)
    assert hotpot.mean_f1 == pytest.approx(0.375)
    assert hotpot.tool_calls_per_question == pytest.approx(2.0)
    assert hotpot.mean_response_length == pytest.approx(125.0)
    assert by_name["all"].pass_at_k[1] == pytest.approx((0.5 + 0 + 1) / 3)


def test_question_result_rejects_ragged_lists():
    with pytest.raises(ValueError, match="f1 has 1 entries"):
        QuestionResult("q", "x", [True, False], [1.0], [0, 0], [1, 1])


def test_report_writers_round_trip(tmp_path):
    reports = build_reports(_results())
    write_report_json(reports, tmp_path / "r.json")
    assert read_report_json(tmp_path / "r.json") == reports
    write_report_csv(reports, tmp_path / "r.csv")
    rows = list(csv.reader((tmp_path / "r.csv").read_text().splitlines()))
    # Percent in the table and the CSV (fractions in the JSON), and the headers say so.
    assert rows[0] == [
        "dataset",
        "questions",
        "n",
        "pass@1_pct",
        "pass@2_pct",
        "f1_pct",
        "tool_calls",
        "resp_len",
        "correct_by",
    ]
    assert rows[1][:5] == ["hotpotqa", "2", "2", "25.0", "50.0"]
    assert reports[0].pass_at_k[1] == 0.25
    table = format_report_table(reports)
    assert table.splitlines()[0].split() == rows[0]
    assert "hotpotqa" in table and "37.5" in table


def test_build_reports_refuses_k_above_the_samples_per_question():
    """`ks=[5]` over n=2 returned an empty pass@k table, and `ks=[1, 5]` dropped k=5, silently."""
    for ks in ([5], [1, 5]):
        with pytest.raises(ValueError, match=r"k=\[5\].*'hotpotqa' has only n=2"):
            build_reports(_results(), ks=ks)
    assert set(build_reports(_results(), ks=[2])[0].pass_at_k) == {2}
