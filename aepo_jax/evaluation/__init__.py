"""Evaluation: pass@k, per-dataset reports, per-question scoring (spec §6); the driver comes later."""

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
from aepo_jax.evaluation.scoring import correctness_reward, score_question

__all__ = [
    "DatasetReport",
    "QuestionResult",
    "build_reports",
    "correctness_reward",
    "format_report_table",
    "pass_at_k",
    "pass_at_k_table",
    "read_report_json",
    "score_question",
    "write_report_csv",
    "write_report_json",
]
