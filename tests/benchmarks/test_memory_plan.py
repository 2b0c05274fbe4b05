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
    assert [row["program"] for row in rows] == ["train_step", "tree_train_step", "score", "tree_score",
                                                "sampler_prefill",
                                                "sampler_decode",
                                                "sampler_decode_rows", "sampler_append_rows", "sampler_grow",
                                                "sampler_shrink"]
    for row in rows:
        assert row["topology"] == "cpu:8" and row["mesh"] == "data8xfsdp1xtensor1" and row["n_layers"] == 1
        assert row["argument_bytes"] > 0
        assert row["per_device_bytes"] >= row["argument_bytes"] + row["temp_bytes"]
    train, tree_train, score, tree_score, prefill, decode, decode_rows, append, grow, shrink = rows
    for row in (train, tree_train, score, tree_score):
        assert row["seq_len"] == 32 and row["rows"] == 8 and row["temp_bytes"] > 0
    # The largest tree mini-batch of one process: 2 prompts x k 4 = 8 sequences, a micro-batch each at most
    # (M 8), all in one at most (B 8 flat rows), one packed row per device (8 devices) in each.
    assert tree_train["micro_batches"] == tree_score["micro_batches"] == 8
    assert tree_train["flat_rows"] == 8
    # The train step's arguments hold the optimiser state too: more than the scorer's parameters.
    assert train["argument_bytes"] > score["argument_bytes"]
    # The sampler rows: the config's whole rollout batch (4 prompts x k 4 = 16 rows) and the loop's largest
    # cache (next_pow2(prompt 448 + response 64) = 512 slots: ragged rows); the KV cache is an argument of both.
    # The prefill block is the prompt's bucket (512) cut to MAX_BLOCK_TOKENS (256); decode is one window of
    # DECODE_WINDOW steps whose attention reads the whole cache (the largest span).
    from configs.aepo_tiny import get_config

    cfg = get_config()
    assert (cfg.data.prompts_per_step, cfg.rollout.k, cfg.rollout.max_prompt_len, cfg.rollout.max_response_len) == (
        4, 4, 448, 64)
    for row in (prefill, decode):
        assert row["rows"] == 16 and row["cache_slots"] == 512
        # K and V of this device's 16 / 8 rows: the cache is split over the data axis.
        assert row["argument_bytes"] > 2 * (16 // 8) * 512 * cfg_kv_bytes_per_slot(cfg)
    from aepo_jax.sampling.program_runs import DECODE_WINDOW

    assert prefill["seq_len"] == 256 and decode["seq_len"] == DECODE_WINDOW
    assert decode["output_bytes"] < decode["argument_bytes"]  # the cache is donated: it aliases its output
    # The window over half the rows reads the full state (donated, aliased) and takes their whole-cache span
    # out as temporaries: half the cache at least, and its outputs are half the rows'.
    cache = 2 * (16 // 8) * 512 * cfg_kv_bytes_per_slot(cfg)  # this device's K and V of the full batch
    assert decode_rows["rows"] == 16 and decode_rows["seq_len"] == DECODE_WINDOW
    assert decode_rows["argument_bytes"] >= cache and decode_rows["temp_bytes"] >= 0.5 * cache
    assert decode_rows["output_bytes"] < decode["output_bytes"]
    # The rollout's whole-cache copies: growing 8 rows into 16 reads both caches (the grown one donated,
    # aliasing its output); shrinking 16 rows to 8 reads the full cache and writes a half one.
    assert grow["rows"] == shrink["rows"] == append["rows"] == 16 and grow["cache_slots"] == shrink["cache_slots"] == 512
    assert append["seq_len"] == 256 and append["argument_bytes"] > cache  # the whole cache: donated, aliased
    assert grow["argument_bytes"] >= 1.5 * cache and grow["output_bytes"] < 0.5 * cache
    assert shrink["argument_bytes"] >= cache and shrink["output_bytes"] >= 0.5 * cache


def cfg_kv_bytes_per_slot(cfg) -> int:
    """Bytes of one slot of one cache row of the tiny config's model at 1 layer, K or V."""
    from aepo_jax.training.build import model_config_from

    m = model_config_from(cfg)
    return m.n_kv_heads * m.head_dim * 4  # float32 cache


def test_unknown_program_is_refused(memory_plan):
    with pytest.raises(SystemExit):
        memory_plan.main(["--platform", "cpu", "--programs", "train_step,decode"])
