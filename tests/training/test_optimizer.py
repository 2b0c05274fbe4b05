"""Optimiser: schedule shape, decay mask, clipping and AdamW against numpy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from aepo_jax.training.optimizer import (
    cast_for_compute,
    learning_rate_schedule,
    make_optimizer,
    resolve_dtype,
    weight_decay_mask,
)


def test_warmup_then_constant_cosine_linear():
    const = learning_rate_schedule(1.0, total_steps=10, warmup_steps=4, schedule="constant")
    assert [float(const(s)) for s in (0, 2, 4, 9)] == pytest.approx([0.0, 0.5, 1.0, 1.0])
    cos = learning_rate_schedule(1.0, total_steps=14, warmup_steps=4, schedule="cosine")
    assert float(cos(4)) == pytest.approx(1.0)
    assert float(cos(9)) == pytest.approx(0.5 * (1 + np.cos(np.pi * 5 / 10)))
    assert float(cos(14)) == pytest.approx(0.0, abs=1e-7)
    lin = learning_rate_schedule(1.0, total_steps=14, warmup_steps=4, schedule="linear", final_lr_fraction=0.1)
    assert float(lin(9)) == pytest.approx(1.0 - 0.9 * 0.5)


def test_unknown_schedule_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown lr schedule 'step'"):
        learning_rate_schedule(1.0, 10, schedule="step")
    with pytest.raises(ValueError, match="unknown compute dtype"):
        resolve_dtype("int7")


def test_decay_mask_skips_norms_and_biases():
    params = {"attn": {"kernel": jnp.ones((4, 4)), "bias": jnp.ones((4,))},
              "input_norm": {"scale": jnp.ones((4,))}, "embed": jnp.ones((8, 4))}
    mask = weight_decay_mask(params)
    assert mask == {"attn": {"kernel": True, "bias": False}, "input_norm": {"scale": False}, "embed": True}


def _numpy_adamw_step(p, g, lr, wd, clip, b1=0.9, b2=0.999, eps=1e-8):
    """One AdamW step from zero moments, float64, with global-norm clipping."""
    norm = np.sqrt(sum(float(np.sum(x.astype(np.float64) ** 2)) for x in g.values()))
    scale = min(1.0, clip / norm)
    out = {}
    for k in p:
        gk = g[k].astype(np.float64) * scale
        m = (1 - b1) * gk / (1 - b1)
        v = (1 - b2) * gk**2 / (1 - b2)
        step = m / (np.sqrt(v) + eps)
        if p[k].ndim >= 2:
            step = step + wd * p[k]
        out[k] = p[k] - lr * step
    return out


def test_one_update_matches_float64_adamw_with_clipping_and_mask():
    rng = np.random.default_rng(0)
    params = {"w": rng.normal(size=(3, 5)).astype(np.float32), "b": rng.normal(size=(5,)).astype(np.float32)}
    grads = {"w": 10 * rng.normal(size=(3, 5)).astype(np.float32), "b": rng.normal(size=(5,)).astype(np.float32)}
    tx, _ = make_optimizer(0.1, total_steps=10, weight_decay=0.5, grad_clip_norm=1.0)
    jp = jax.tree.map(jnp.asarray, params)
    updates, _ = tx.update(jax.tree.map(jnp.asarray, grads), tx.init(jp), jp)
    new = jax.tree.map(lambda a, u: np.asarray(a + u), jp, updates)
    want = _numpy_adamw_step(params, grads, lr=0.1, wd=0.5, clip=1.0)
    for k in params:
        np.testing.assert_allclose(new[k], want[k], rtol=1e-5, atol=1e-6)


def test_bf16_compute_keeps_float32_gradients():
    params = {"w": jnp.linspace(-1, 1, 6, dtype=jnp.float32).reshape(2, 3), "i": jnp.arange(3)}

    def loss(p):
        q = cast_for_compute(p, jnp.bfloat16)
        assert q["w"].dtype == jnp.bfloat16 and q["i"].dtype == p["i"].dtype
        return jnp.sum(q["w"].astype(jnp.float32) ** 2)

    grads = jax.grad(loss, allow_int=True)(params)
    assert grads["w"].dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(grads["w"]), 2 * np.asarray(params["w"].astype(jnp.bfloat16), np.float32))
