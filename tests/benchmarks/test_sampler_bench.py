"""The sampler benchmark counts the bytes, FLOPs and weight products of a decode step as documented."""

from __future__ import annotations

import argparse
import statistics

import jax
import numpy as np
import pytest
from flax import nnx

from aepo_jax.sampling import Sampler, SamplingParams
from benchmarks.sampler_bench import (
    build_model,
    matmul_peak,
    matmul_peak_dtypes,
    mean_attended_slots,
    numpy_product_seconds,
    physical_floor,
    step_products_time,
    weight_products,
    xla_product_seconds,
)


def test_physical_floor_counts_parameters_live_kv_and_matmul_flops():
    args = argparse.Namespace(layers=2, d_model=32, heads=4, kv_heads=2, mlp_dim=0, vocab=64, dtype="float32",
                              prompt_len=8, new_tokens=9)
    model = build_model(args)
    d, v, layers, heads, kvh, dh, mlp = 32, 64, 2, 4, 2, 8, 128
    # Hand count of the Qwen3-shaped model: tied embedding, q/k/v/o, gated MLP, two norms per layer,
    # q and k norms per layer, the final norm.
    matrices = v * d + layers * (d * heads * dh + 2 * d * kvh * dh + heads * dh * d + 3 * d * mlp)
    vectors = layers * (2 * d + 2 * dh) + d
    batch, live = 4, 8 + (9 + 1) / 2  # mean slots attended over 9 decode steps after an 8-token prompt
    kv_bytes = 2 * layers * batch * live * kvh * dh * 4
    floor = physical_floor(model, batch, prompt_len=8, new_tokens=9, matmul_flops=1e9)
    assert floor["bytes_per_step"] == int(4 * (matrices + vectors) + kv_bytes)
    assert floor["flops_per_step"] == int(2 * batch * matrices + 4 * batch * layers * heads * dh * live)
    assert floor["floor_compute_ms"] == pytest.approx(1e3 * floor["flops_per_step"] / 1e9)
    assert floor["copy_gb_per_s"] > 0
    assert floor["physical_floor_ms"] == max(floor["floor_compute_ms"], floor["floor_memory_ms"])


def test_weight_products_are_the_steps_matrix_products_contracted_as_the_model_does():
    args = argparse.Namespace(layers=3, d_model=32, heads=4, kv_heads=2, mlp_dim=0, vocab=64, dtype="float32",
                              prompt_len=8, new_tokens=9)
    products = weight_products(build_model(args), batch=5)
    d, v, heads, kvh, dh, mlp = 32, 64, 4, 2, 8, 128
    per_layer = [(5, d, heads * dh), (5, d, kvh * dh), (5, d, kvh * dh), (5, heads * dh, d),
                 (5, d, mlp), (5, d, mlp), (5, mlp, d)]
    assert sorted(products) == sorted(per_layer * 3 + [(5, d, v)])  # the tied embedding is the LM head


def test_step_products_time_counts_each_shape_as_often_as_the_step_runs_it():
    products = [(4, 16, 32), (4, 16, 32), (4, 32, 16)]
    per_shape = {(4, 16, 32): 2e-3, (4, 32, 16): 5e-3}  # seconds, as timers would report them
    timed = step_products_time(products, xla=lambda *s: per_shape[s], numpy=lambda *s: 10 * per_shape[s])
    assert timed["step_products_xla_ms"] == pytest.approx(1e3 * (2 * 2e-3 + 5e-3))
    assert timed["step_products_numpy_ms"] == pytest.approx(1e4 * (2 * 2e-3 + 5e-3))
    assert timed["step_products_xla_gflops"] == pytest.approx(3 * 2 * 4 * 16 * 32 / (2 * 2e-3 + 5e-3) / 1e9)


def test_product_timers_time_a_real_product():
    for timer in (xla_product_seconds, numpy_product_seconds):
        small, large = timer(4, 16, 32, repeats=4), timer(64, 512, 512, repeats=4)
        assert 0 < small < large  # 4096x the FLOPs cannot run faster



@pytest.mark.parametrize(("prompt_len", "new_tokens"), [(8, 9), (5, 1), (3, 6)])
def test_mean_attended_slots_is_the_samplers_own_count_step_by_step(prompt_len, new_tokens):
    """Brute force over the real sampler: generate one token at a time and count, after each step, the
    valid slots of the row (the step's token is written at its own slot, then attended with all before it)."""
    args = argparse.Namespace(layers=1, d_model=32, heads=4, kv_heads=2, mlp_dim=0, vocab=64, dtype="float32",
                              prompt_len=prompt_len, new_tokens=new_tokens)
    graphdef, params = nnx.split(build_model(args))
    sampler = Sampler(graphdef, params, eos_ids=[], params=SamplingParams(), seed=0)
    state = sampler.prefill([list(range(1, prompt_len + 1))])
    assert int(np.asarray(state.arrays.slot_valid)[0].sum()) == prompt_len
    attended = []
    for step in range(new_tokens):
        state, out = sampler.generate(state, 1, rng=jax.random.key(step))
        assert out.num_tokens.tolist() == [1]
        attended.append(int(np.asarray(state.arrays.slot_valid)[0].sum()))
    assert mean_attended_slots(prompt_len, new_tokens) == pytest.approx(statistics.mean(attended))


def test_cpu_matmul_peak_is_also_measured_in_float32_and_the_highest_reading_is_used():
    assert matmul_peak_dtypes("bfloat16", on_cpu=True) == ("bfloat16", "float32")
    assert matmul_peak_dtypes("float32", on_cpu=True) == ("float32",)
    assert matmul_peak_dtypes("bfloat16", on_cpu=False) == ("bfloat16",)  # an accelerator's bf16 peak is its own
    # bf16 on XLA:CPU reads far below f32: the floor takes the f32 reading, and says so.
    readings = [{"bfloat16": 12.0, "float32": 104.0}, {"bfloat16": 15.0, "float32": 110.0}]
    assert matmul_peak(readings) == (110.0, "float32")
