"""The sampler benchmark's physical floor counts the bytes and FLOPs of a decode step as documented."""

from __future__ import annotations

import argparse

import pytest

from benchmarks.sampler_bench import build_model, physical_floor


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
