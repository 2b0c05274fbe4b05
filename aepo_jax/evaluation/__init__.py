"""Evaluation: pass@k, per-dataset reports and (later) the evaluation driver (spec §6)."""

from aepo_jax.evaluation.metrics import (
    DatasetReport,
    QuestionResult,
    build_reports,
    format_report_table,
    pass_at_k,
    pass_at_k_table,
    read_report_json,
    write_report_csv,
    write_report_json,
)

__all__ = [
    "DatasetReport",
    "QuestionResult",
    "build_reports",
    "format_report_table",
    "pass_at_k",
    "pass_at_k_table",
    "read_report_json",
    "write_report_csv",
    "write_report_json",
]
