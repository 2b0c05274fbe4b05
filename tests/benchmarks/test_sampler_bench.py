"""The sampler benchmark counts the bytes, FLOPs and weight products of a decode step as documented."""

from __future__ import annotations

import argparse

import pytest

from benchmarks.sampler_bench import (
    build_model,
    physical_floor,
    step_products_time,
    weight_products,
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
    batch, live = 4, 8 + (9 - 1) / 2  # mean slots attended over 9 decode steps after an 8-token prompt
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


def test_step_products_time_reports_both_libraries_over_the_same_flops():
    products = [(4, 16, 32), (4, 16, 32), (4, 32, 16)]
    timed = step_products_time(products, repeats=4)
    flops = 3 * 2 * 4 * 16 * 32
    for library in ("xla", "numpy"):
        assert timed[f"step_products_{library}_ms"] > 0
        assert timed[f"step_products_{library}_gflops"] == pytest.approx(
            flops / (timed[f"step_products_{library}_ms"] / 1e3) / 1e9)
