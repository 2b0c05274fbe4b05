"""launch.compare's table (root-credited columns, NaN where nothing branched) and its entropy-curve PNG."""

from __future__ import annotations

import math

from launch.compare import COLUMNS, format_markdown, plot_entropy_curves, summarise


def run(algorithm, seed, pass1, roots, curve):
    row = {key: 0.5 for key, _, _ in COLUMNS}
    row.update({"algorithm": algorithm, "seed": seed, "pass@1": pass1, "train_branch_roots": roots,
                "entropy_curve": curve})
    return row


def test_summary_and_markdown_carry_the_root_credited_columns(tmp_path):
    runs = [run("aepo", 0, 0.2, 3.0, [1.0, 0.9]), run("aepo", 1, 0.4, 5.0, [1.1, 0.7]),
            run("grpo", 0, 0.1, math.nan, [1.2, 1.0])]
    table = summarise(runs)
    assert math.isclose(table["aepo"]["pass@1"][0], 0.3) and math.isclose(table["aepo"]["pass@1"][1], 0.1)
    assert table["aepo"]["train_branch_roots"] == (4.0, 1.0)
    assert all(math.isnan(v) for v in table["grpo"]["train_branch_roots"])  # GRPO never branches
    text = format_markdown({"pass@1": 0.0, "tool_calls": 1.0, "python_rate": 0.0}, table, [0, 1])
    assert "roots with branches (train, end)" in text and "largest root's branch share" in text
    assert "| grpo |" in text and "n/a" in text.split("| grpo |")[1]
    png = plot_entropy_curves(runs, str(tmp_path / "entropy.png"))
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
