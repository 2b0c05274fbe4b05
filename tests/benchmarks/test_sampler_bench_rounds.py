"""The sampler benchmark's summary covers every round, and the tunix peer gets a max_prompt_length that fits."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.sampler_bench import (
    PEER_SCRIPT,
    combine_rounds,
    physical_floor_ratios,
    summarise_calls,
)
from benchmarks.sampler_peer import (
    DECODE_TIMING_SCRIPT,
    peer_command,
    peer_comparison,
    peer_max_prompt_length,
    run_peer,
)

BATCH, NEW = 2, 4


def _round(first_call, prefill, decode, floor, cache=128):
    return summarise_calls(first_call, prefill, decode, floor, BATCH, NEW) | {
        "batch_bucket": BATCH, "layerwise_decode": True, "cache_length": cache}


def test_combine_rounds_takes_the_compile_from_round_one_and_means_and_bests_over_all_rounds():
    # Round 1 compiles (first call 13 s) and has the best call; round 2 is already compiled and slower.
    one = _round(13.0, [0.01, 0.02], [0.04, 0.08], [0.02, 0.02])
    two = _round(0.07, [0.03, 0.03], [0.12, 0.16], [0.01, 0.03])
    combined = combine_rounds([one, two], BATCH, NEW)
    totals = [0.05, 0.10, 0.15, 0.19]
    assert combined["first_call_s"] == 13.0
    assert combined["first_call_s_per_round"] == [13.0, 0.07]
    assert combined["calls_timed"] == 4
    assert combined["tokens_per_s_mean"] == pytest.approx(BATCH * NEW / statistics.mean(totals))
    assert combined["tokens_per_s_best"] == pytest.approx(BATCH * NEW / 0.05)
    assert combined["decode_tokens_per_s_best"] == pytest.approx(BATCH * NEW / 0.04)
    assert combined["step_ms_best"] == pytest.approx(1e3 * 0.04 / NEW)  # round 1's, not the last round's
    assert combined["step_ms_mean"] == pytest.approx(1e3 * statistics.mean([0.04, 0.08, 0.12, 0.16]) / NEW)
    assert combined["floor_ms_best"] == pytest.approx(10.0)
    assert combined["prefill_ms_mean"] == pytest.approx(1e3 * statistics.mean([0.01, 0.02, 0.03, 0.03]))
    assert combined["rounds"] == [one, two]  # each round's own figures are kept


def test_physical_floor_headline_is_the_median_step_and_the_best_step_is_secondary():
    # Five calls over two rounds; one lucky fast call must not set the headline.
    one = _round(13.0, [0.01, 0.01, 0.01], [0.02, 0.08, 0.09], [0.02] * 3)
    two = _round(0.1, [0.01, 0.01], [0.10, 0.12], [0.02] * 2)
    combined = combine_rounds([one, two], BATCH, NEW)
    median_step_ms = 1e3 * statistics.median([0.02, 0.08, 0.09, 0.10, 0.12]) / NEW
    assert combined["step_ms_median"] == pytest.approx(median_step_ms)
    ratios = physical_floor_ratios(combined | {"physical_floor_ms": 2.0})
    assert ratios["step_over_physical_floor_median"] == pytest.approx(median_step_ms / 2.0)
    assert ratios["step_over_physical_floor_best"] == pytest.approx(1e3 * 0.02 / NEW / 2.0)


def test_combine_rounds_refuses_rounds_of_different_shapes():
    with pytest.raises(ValueError, match="cache_length"):
        combine_rounds([_round(1.0, [0.1], [0.1], [0.1]), _round(1.0, [0.1], [0.1], [0.1], cache=256)], BATCH, NEW)


def test_peer_speedup_is_the_ratio_of_both_sides_means_over_the_same_rounds():
    ours = [_round(13.0, [0.01], [0.04], [0.02]), _round(0.1, [0.02], [0.08], [0.02])]
    peers = [{"tokens_per_s": 100.0}, {"tokens_per_s": 50.0}]
    peer = peer_comparison("tunix", ours, peers, prompt_len=16, new_tokens=NEW)
    ours_tps = [BATCH * NEW / 0.05, BATCH * NEW / 0.10]
    assert peer["ours_tokens_per_s"] == pytest.approx(ours_tps)
    assert peer["speedup_of_means"] == pytest.approx(statistics.mean(ours_tps) / 75.0)
    assert peer["speedup_per_round"] == pytest.approx([ours_tps[0] / 100.0, ours_tps[1] / 50.0])
    assert (peer["max_prompt_length"], peer["cache_size"]) == (17, 17 + NEW)


@pytest.mark.parametrize("prompt_len", [4, 16, 31, 32, 64, 100])
def test_tunix_gets_the_prompt_plus_bos_as_max_prompt_length(prompt_len):
    """tunix 0.1.7 left-pads to max_prompt_length when the prompt (with its BOS) fits, else to the next
    power of two, and needs max_prompt_length + new tokens <= the driver's cache (max_prompt_length +
    new tokens): prompt + 1 fits exactly, with no padding (the driver's default, 32, crashed at >= 32)."""
    length = peer_max_prompt_length(prompt_len)
    assert length == prompt_len + 1
    args = argparse.Namespace(peer_python="py", peer_script="driver.py", batch=2, new_tokens=8, prompt_len=prompt_len,
                              layers=1, d_model=64, heads=4, kv_heads=2, vocab=256, dtype="float32", mode="sample",
                              iters=2)
    command = peer_command(args)
    assert command[command.index("--max-prompt-length") + 1] == str(length)
    assert command[command.index("--prompt-len") + 1] == str(prompt_len)


FAKE_DRIVER = """
import argparse, json, os
p = argparse.ArgumentParser()
for flag in ("--batch", "--new-tokens", "--prompt-len", "--max-prompt-length", "--layers", "--d-model", "--heads",
             "--kv-heads", "--vocab", "--iters"):
    p.add_argument(flag, type=int)
p.add_argument("--dtype"); p.add_argument("--mode")
a = p.parse_args()
print(json.dumps({"max_prompt_length": a.max_prompt_length + SHIFT, "tokens_per_s": 1.0,
                  "generated_tokens_per_call": a.batch * a.new_tokens + TOKENS_SHIFT,
                  "xla_flags": os.environ.get("XLA_FLAGS")}))
"""


def _peer_args(driver, **overrides):
    return argparse.Namespace(**{"peer_python": sys.executable, "peer_script": str(driver), "batch": 2,
                                 "new_tokens": 8, "prompt_len": 64, "layers": 1, "d_model": 64, "heads": 4,
                                 "kv_heads": 2, "vocab": 256, "dtype": "float32", "mode": "sample", "iters": 2,
                                 **overrides})


@pytest.mark.parametrize("shift", [0, 15])
def test_run_peer_passes_the_max_prompt_length_and_checks_the_peer_used_it(tmp_path, shift):
    driver = tmp_path / "driver.py"
    driver.write_text(FAKE_DRIVER.replace("TOKENS_SHIFT", "0").replace("SHIFT", str(shift)))
    args = _peer_args(driver)
    if shift:
        with pytest.raises(RuntimeError, match="max_prompt_length 80, not 65"):
            run_peer(args)
    else:
        assert run_peer(args)["max_prompt_length"] == 65


def test_run_peer_refuses_a_peer_that_generated_other_than_batch_times_new_tokens(tmp_path):
    driver = tmp_path / "driver.py"
    driver.write_text(FAKE_DRIVER.replace("TOKENS_SHIFT", "-3").replace("SHIFT", "0"))
    with pytest.raises(RuntimeError, match="generated 13 tokens per call, not batch x new tokens = 16"):
        run_peer(_peer_args(driver))


def test_the_peer_runs_with_our_xla_flags(tmp_path, monkeypatch):
    flags = os.environ.get("XLA_FLAGS", "") + " --xla_cpu_enable_fast_math=false"
    monkeypatch.setenv("XLA_FLAGS", flags)
    driver = tmp_path / "driver.py"
    driver.write_text(FAKE_DRIVER.replace("TOKENS_SHIFT", "0").replace("SHIFT", "0"))
    assert run_peer(_peer_args(driver))["xla_flags"] == flags


def test_peer_decode_only_speedup_is_the_ratio_of_both_sides_decode_means():
    ours = [_round(13.0, [0.01], [0.04], [0.02]), _round(0.1, [0.02], [0.08], [0.02])]
    peers = [{"tokens_per_s": 100.0, "decode": {"decode_tokens_per_s": 400.0}},
             {"tokens_per_s": 50.0, "decode": {"decode_tokens_per_s": 200.0}}]
    peer = peer_comparison("tunix", ours, peers, prompt_len=16, new_tokens=NEW)
    ours_decode = [BATCH * NEW / 0.04, BATCH * NEW / 0.08]
    assert peer["ours_decode_tokens_per_s"] == pytest.approx(ours_decode)
    assert peer["decode_speedup_of_means"] == pytest.approx(statistics.mean(ours_decode) / 300.0)
    assert peer["decode_speedup_per_round"] == pytest.approx([ours_decode[0] / 400.0, ours_decode[1] / 200.0])
    assert "decode_speedup_of_means" not in peer_comparison("tunix", ours, [{"tokens_per_s": 1.0}] * 2, 16, NEW)


def test_peer_command_runs_the_driver_under_the_decode_timer_when_asked():
    args = _peer_args("driver.py", peer_python="py", peer_decode="on")
    assert peer_command(args)[:4] == ["py", str(DECODE_TIMING_SCRIPT), "--driver", "driver.py"]
    assert peer_command(_peer_args("driver.py", peer_python="py", peer_decode="off"))[:2] == ["py", "driver.py"]


TUNIX_PYTHON = Path(os.environ.get("TUNIX_PYTHON", "/work/venv-tunix/bin/python"))
TUNIX_DRIVER = Path(os.environ.get("TUNIX_DRIVER", PEER_SCRIPT))  # the shared driver beside the checkout


@pytest.mark.skipif(not (TUNIX_PYTHON.exists() and TUNIX_DRIVER.exists()),
                    reason="needs a venv with google-tunix (TUNIX_PYTHON) and the shared peer driver (TUNIX_DRIVER)")
def test_decode_timer_keeps_the_drivers_figures_and_times_one_decode_per_extra_call():
    """The real tunix driver under the timer, at a tiny shape: its own end-to-end figures come out as the
    driver prints them, and each of the extra calls ran exactly one prefill and one decode program."""
    args = _peer_args(TUNIX_DRIVER, peer_python=str(TUNIX_PYTHON), peer_decode="on", prompt_len=4, new_tokens=4,
                      iters=2)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "XLA_FLAGS")}
    done = subprocess.run(peer_command(args), capture_output=True, text=True, env=env, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["bench"] == "tunix_vanilla_sampler"
    assert result["generated_tokens_per_call"] == 2 * 4
    decode = result["decode"]
    assert len(decode["decode_s"]) == len(decode["prefill_s"]) == len(decode["host_s"]) == 2
    assert all(x > 0 for x in decode["decode_s"] + decode["prefill_s"])
    assert decode["decode_tokens_per_s"] == pytest.approx(2 * 4 / statistics.mean(decode["decode_s"]))
