"""The memory plan's code path (config -> real train step and scorer -> compile -> rows) on fake CPU devices.

The TPU plan itself needs the libtpu wheel (`make memory-plan`); here the same
programs compile for this machine's 8 fake CPU devices, which checks the
abstract state, the batch and their shardings, not the TPU byte counts.
"""

import importlib.util
import json
from pathlib import Path

import pytest

PLAN = Path(__file__).resolve().parents[2] / "benchmarks" / "memory_plan.py"


@pytest.fixture(scope="module")
def memory_plan():
    spec = importlib.util.spec_from_file_location("memory_plan", PLAN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tiny_config_plan_writes_one_row_per_program(memory_plan, tmp_path):
    out = tmp_path / "plan.json"
    rows = memory_plan.main(["--platform", "cpu", "--config", "aepo_tiny", "--layers", "1", "--seq-len", "32",
                             "--json", str(out)])
    assert json.loads(out.read_text()) == rows
    assert [row["program"] for row in rows] == ["train_step", "score"]
    for row in rows:
        assert row["topology"] == "cpu:8" and row["mesh"] == "data8xfsdp1xtensor1"
        assert row["n_layers"] == 1 and row["seq_len"] == 32 and row["rows"] == 8
        assert row["argument_bytes"] > 0 and row["temp_bytes"] > 0
        assert row["per_device_bytes"] >= row["argument_bytes"] + row["temp_bytes"]
    # The train step's arguments hold the optimiser state too: more than the scorer's parameters.
    assert rows[0]["argument_bytes"] > rows[1]["argument_bytes"]


def test_unknown_program_is_refused(memory_plan):
    with pytest.raises(SystemExit):
        memory_plan.main(["--platform", "cpu", "--programs", "train_step,decode"])
