"""Evaluation metrics: unbiased pass@k and per-dataset reports (spec §6).

Inputs are per-question lists over the `n` samples of that question: whether
each sample was correct, its F1, its tool-call count and its response length
in tokens. Outputs are one `DatasetReport` per data source, rendered as a
console table, JSON and CSV.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimate `1 - C(n-c, k) / C(n, k)` from `c` correct of `n` samples.

    Computed as `1 - prod_{i=n-c+1}^{n} (1 - k/i)`, which never forms a
    binomial coefficient, so it stays exact-ish in float64 for any n.
    """
    if not (isinstance(n, int) and isinstance(c, int) and isinstance(k, int)):
        raise TypeError(f"pass_at_k takes integers, got n={n!r}, c={c!r}, k={k!r}")
    if n < 1 or not 0 <= c <= n:
        raise ValueError(f"pass_at_k needs n >= 1 and 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 1 <= k <= n, got k={k} with n={n}")
    if n - c < k:
        return 1.0  # every k-subset contains a correct sample
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def pass_at_k_table(
    correct: Sequence[Sequence[bool]], ks: Sequence[int] | None = None
) -> dict[int, float]:
    """Mean pass@k over questions for each k (default: every k up to the smallest n).

    Args:
      correct: one list per question of per-sample correctness flags.
      ks: which k to report; each must be <= the smallest sample count.
    """
    if not correct:
        raise ValueError("pass_at_k_table needs at least one question")
    n_min = min(len(samples) for samples in correct)
    if n_min == 0:
        raise ValueError("every question needs at least one sample")
    ks = list(range(1, n_min + 1)) if ks is None else list(ks)
    for k in ks:
        if not 1 <= k <= n_min:
            raise ValueError(
                f"k={k} is outside 1..{n_min} (the smallest number of samples per question)"
            )
    return {
        k: sum(pass_at_k(len(s), sum(bool(x) for x in s), k) for s in correct)
        / len(correct)
        for k in ks
    }


@dataclass
class QuestionResult:
    """The `n` sampled answers to one question, scored.

    `correctness` names the reward that decided `correct` (e.g. "exact_match"); `math_timeouts` counts the
    sympy checks that ran out of time while scoring it, each of which counted as "not equal".
    """

    question_id: str
    data_source: str
    correct: list[bool]
    f1: list[float]
    tool_calls: list[int]
    response_length: list[int]
    correctness: str = ""
    math_timeouts: int = 0

    def __post_init__(self) -> None:
        n = len(self.correct)
        if n == 0:
            raise ValueError(f"question {self.question_id!r} has no samples")
        for name in ("f1", "tool_calls", "response_length"):
            if len(getattr(self, name)) != n:
                raise ValueError(
                    f"question {self.question_id!r}: {name} has {len(getattr(self, name))} entries, "
                    f"correct has {n}"
                )


@dataclass
class DatasetReport:
    """Aggregate metrics of one data source; `pass_at_k` maps k to the mean estimate (a fraction).

    `correctness`: the reward(s) that decided correctness, comma-separated when the row mixes several;
    `math_timeouts`: sympy checks that ran out of time (each scored "not equal") over its questions.
    """

    dataset: str
    num_questions: int
    samples_per_question: int
    pass_at_k: dict[int, float] = field(default_factory=dict)
    mean_f1: float = 0.0
    tool_calls_per_question: float = 0.0
    mean_response_length: float = 0.0
    correctness: str = ""
    math_timeouts: int = 0


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _report(
    name: str, results: Sequence[QuestionResult], ks: Sequence[int] | None
) -> DatasetReport:
    n_min = min(len(r.correct) for r in results)
    too_large = [k for k in ks or () if k > n_min]
    if too_large:
        raise ValueError(f"pass@k for k={too_large} needs k samples per question, but {name!r} has only "
                         f"n={n_min}; ask for k <= {n_min} or sample more")
    return DatasetReport(
        dataset=name,
        num_questions=len(results),
        samples_per_question=n_min,
        pass_at_k=pass_at_k_table([r.correct for r in results], ks),
        # Per question first, then over questions, so every question weighs the same.
        mean_f1=_mean([_mean(r.f1) for r in results]),
        tool_calls_per_question=_mean([_mean(r.tool_calls) for r in results]),
        mean_response_length=_mean([_mean(r.response_length) for r in results]),
        correctness=",".join(sorted({r.correctness for r in results if r.correctness})),
        math_timeouts=sum(r.math_timeouts for r in results),
    )


def build_reports(
    results: Sequence[QuestionResult],
    ks: Sequence[int] | None = None,
    overall: bool = True,
) -> list[DatasetReport]:
    """One report per data source (sorted by name), plus an `all` row over every question.

    `ks` (default: every k up to each row's n) must not exceed any data source's samples per question.
    """
    if not results:
        raise ValueError("build_reports needs at least one QuestionResult")
    by_source: dict[str, list[QuestionResult]] = {}
    for result in results:
        by_source.setdefault(result.data_source, []).append(result)
    reports = [_report(name, by_source[name], ks) for name in sorted(by_source)]
    if overall and len(by_source) > 1:
        reports.append(_report("all", results, ks))
    return reports


def _columns(reports: Sequence[DatasetReport]) -> list[int]:
    return sorted({k for r in reports for k in r.pass_at_k})


def report_rows(reports: Sequence[DatasetReport]) -> tuple[list[str], list[list[str]]]:
    """Header and rows (strings) shared by the table and the CSV.

    pass@k and F1 are in percent here, and the headers say so (`pass@1_pct`); the JSON keeps fractions.
    """
    ks = _columns(reports)
    header = [
        "dataset",
        "questions",
        "n",
        *[f"pass@{k}_pct" for k in ks],
        "f1_pct",
        "tool_calls",
        "resp_len",
        "correct_by",
    ]
    rows = []
    for r in reports:
        cells = [r.dataset, str(r.num_questions), str(r.samples_per_question)]
        cells += [f"{100 * r.pass_at_k[k]:.1f}" if k in r.pass_at_k else "" for k in ks]
        cells += [
            f"{100 * r.mean_f1:.1f}",
            f"{r.tool_calls_per_question:.2f}",
            f"{r.mean_response_length:.1f}",
            r.correctness,
        ]
        rows.append(cells)
    return header, rows


def format_report_table(reports: Sequence[DatasetReport]) -> str:
    """A fixed-width console table of the reports."""
    header, rows = report_rows(reports)
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(
            cell.rjust(w) if i else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(row, widths))
        )
        for row in [header, *rows]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def write_report_json(reports: Sequence[DatasetReport], path: str | Path) -> None:
    """Write the reports as a JSON list (pass@k keys become strings "1", "2", ...)."""
    payload = [
        {**asdict(r), "pass_at_k": {str(k): v for k, v in r.pass_at_k.items()}}
        for r in reports
    ]
    Path(path).write_text(json.dumps(payload, indent=2) + "\n")


def read_report_json(path: str | Path) -> list[DatasetReport]:
    """Read reports written by `write_report_json`."""
    reports = []
    for item in json.loads(Path(path).read_text()):
        item["pass_at_k"] = {int(k): v for k, v in item["pass_at_k"].items()}
        reports.append(DatasetReport(**item))
    return reports


def write_report_csv(reports: Sequence[DatasetReport], path: str | Path) -> None:
    """Write the same header and rows as the console table to a CSV file."""
    header, rows = report_rows(reports)
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
