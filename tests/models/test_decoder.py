"""Decoder forward contract: shapes/dtypes, KV-cache equivalence, masking, GQA ratios, jit over split state."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from aepo_jax.models import Decoder, KVCache, get_preset
from aepo_jax.models.attention import masked_attention
from aepo_jax.models.attention_mask import causal_mask


def _model(**overrides):
    return Decoder(get_preset("tiny", **overrides), rngs=nnx.Rngs(0))


def _jitted(model):
    """model(...) as one compiled program (eager op-by-op dispatch is slow on 2 cores)."""
    graphdef, state = nnx.split(model)

    @jax.jit
    def forward(ids, positions=None, attention_mask=None, kv_cache=None):
        return nnx.merge(graphdef, state)(ids, positions=positions, attention_mask=attention_mask, kv_cache=kv_cache)

    return forward


def test_forward_returns_float32_logits_of_vocab_size():
    model = _model(dtype="bfloat16", param_dtype="bfloat16")
    ids = jnp.arange(10, dtype=jnp.int32).reshape(2, 5)
    logits = _jitted(model)(ids)
    assert logits.shape == (2, 5, 512) and logits.dtype == jnp.float32
    assert model.embed[...].dtype == jnp.bfloat16
    assert bool(jnp.isfinite(logits).all())


@pytest.mark.parametrize(
    "overrides", [{}, {"qkv_bias": True}, {"qk_norm": True, "head_dim": 24, "remat": "block"}, {"n_layers": 3}]
)
def test_prefill_then_token_by_token_decode_matches_full_forward(overrides):
    forward = _jitted(_model(**overrides))
    ids = jax.random.randint(jax.random.key(1), (3, 10), 0, 512, dtype=jnp.int32)
    full = forward(ids)  # [B, T, V]
    cache = KVCache.init(get_preset("tiny", **overrides), batch=3, length=16, dtype=jnp.float32)
    logits, cache = forward(ids[:, :5], kv_cache=cache)
    pieces = [logits]
    for t in range(5, 10):
        logits, cache = forward(ids[:, t : t + 1], kv_cache=cache)
        pieces.append(logits)
    cached = jnp.concatenate(pieces, axis=1)
    assert int(cache.index) == 10
    np.testing.assert_allclose(np.asarray(cached), np.asarray(full), atol=1e-5, rtol=0)


def test_cached_decode_with_explicit_mask_and_positions_for_left_padding():
    """Row 0 is left-padded by 3; its decoded logits equal an unpadded forward of its real tokens."""
    model = _model()
    forward = _jitted(model)
    tokens = jax.random.randint(jax.random.key(2), (1, 7), 0, 512, dtype=jnp.int32)
    pad = 3
    ids = jnp.concatenate([jnp.zeros((1, pad), jnp.int32), tokens[:, :4]], axis=1)  # [1, 7]
    valid = jnp.arange(7) >= pad  # key slots holding real tokens
    positions = jnp.maximum(jnp.arange(7) - pad, 0)[None]
    length = 10
    cache = KVCache.init(model.config, batch=1, length=length)
    slot_valid = jnp.concatenate([valid, jnp.ones(length - 7, bool)])  # [S]
    causal = jnp.arange(length)[None, :] <= jnp.arange(7)[:, None]  # [T, S]
    logits, cache = forward(ids, positions=positions, attention_mask=(causal & slot_valid)[None], kv_cache=cache)
    got = [logits[:, pad:]]
    for t in range(4, 7):
        slot = 7 + t - 4
        mask = (jnp.arange(length) <= slot) & slot_valid
        step, cache = forward(tokens[:, t : t + 1], jnp.array([[t]]), mask[None, None], cache)
        got.append(step)
    reference = forward(tokens)
    np.testing.assert_allclose(np.asarray(jnp.concatenate(got, 1)), np.asarray(reference), atol=1e-5, rtol=0)


def test_fully_masked_query_row_gives_zeros_not_nan():
    q = jax.random.normal(jax.random.key(0), (1, 2, 4, 8))
    k = v = jax.random.normal(jax.random.key(1), (1, 3, 2, 8))
    mask = jnp.array([[[False, False, False], [True, True, False]]])
    out = masked_attention(q, k, v, mask)
    assert bool(jnp.isfinite(out).all())
    np.testing.assert_array_equal(np.asarray(out[0, 0]), 0.0)


def test_grouped_query_attention_matches_repeated_kv_heads_in_float64_numpy():
    rng = np.random.default_rng(0)
    q, k, v = rng.normal(size=(2, 5, 6, 4)), rng.normal(size=(2, 7, 2, 4)), rng.normal(size=(2, 7, 2, 4))
    mask = rng.random((2, 5, 7)) < 0.7
    mask[:, :, 0] = True
    out = masked_attention(*(jnp.asarray(a, jnp.float32) for a in (q, k, v)), jnp.asarray(mask))
    k_rep, v_rep = np.repeat(k, 3, axis=2), np.repeat(v, 3, axis=2)  # head h uses kv head h // 3
    scores = np.einsum("bthd,bshd->bhts", q, k_rep) / 2.0
    scores = np.where(mask[:, None], scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    expected = np.einsum("bhts,bshd->bthd", probs, v_rep)
    np.testing.assert_allclose(np.asarray(out), expected, atol=1e-5)


def test_take_rows_copies_cache_rows():
    cfg = get_preset("tiny")
    cache = KVCache.init(cfg, batch=2, length=4)
    cache = cache.replace(k=cache.k.at[:, 1].set(1.0), index=jnp.int32(3))  # row 1 of every layer
    forked = cache.take_rows(jnp.array([1, 1, 0]))
    assert forked.k.shape == (cfg.n_layers, 3, cfg.n_kv_heads, 4, cfg.head_dim)  # [L, B, KVH, S, Dh]
    assert float(forked.k[1, 0].min()) == 1.0 and float(forked.k[1, 2].max()) == 0.0
    assert int(forked.index) == 3


def test_scanned_layers_equal_blocks_applied_one_by_one():
    """The scan over stacked parameters is the same as calling each layer's block in a Python loop."""
    from aepo_jax.models.layers import rope_inverse_frequencies

    model = _model(n_layers=3)
    config = model.config
    ids = jax.random.randint(jax.random.key(3), (2, 6), 0, 512, dtype=jnp.int32)
    graphdef, stacked = nnx.split(model.layers)
    positions = jnp.broadcast_to(jnp.arange(6), (2, 6))
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((6, 6), bool)), (2, 6, 6))
    inv_freq = jnp.asarray(rope_inverse_frequencies(config.head_dim, config.rope_theta, None))
    x = model.embed[...][ids]
    for i in range(config.n_layers):
        block = nnx.merge(graphdef, jax.tree.map(lambda p, i=i: p[i], stacked))
        x, _ = block(x, positions, mask, inv_freq)
    expected = model.final_norm(x) @ model.embed[...].T
    np.testing.assert_allclose(np.asarray(_jitted(model)(ids)), np.asarray(expected), atol=2e-5, rtol=0)


@pytest.mark.parametrize("remat", ["block", "dots_with_no_batch_dims_saveable"])
def test_remat_keeps_values_and_gradients(remat):
    ids = jax.random.randint(jax.random.key(4), (2, 8), 0, 512, dtype=jnp.int32)

    def loss_and_grad(remat_name):
        graphdef, state = nnx.split(_model(remat=remat_name))
        loss = lambda s: jnp.mean(nnx.merge(graphdef, s)(ids) ** 2)
        return jax.jit(jax.value_and_grad(loss))(state)

    (base, base_grads), (got, got_grads) = loss_and_grad("none"), loss_and_grad(remat)
    np.testing.assert_allclose(float(got), float(base), rtol=1e-6)
    for a, b in zip(jax.tree.leaves(got_grads), jax.tree.leaves(base_grads), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)


def test_unknown_remat_name_raises_listing_the_choices():
    with pytest.raises(ValueError, match=r"unknown remat setting 'dots'.*'block'.*'dots_saveable'"):
        get_preset("tiny", remat="dots")


def test_jit_over_split_state_matches_eager():
    model = _model()
    graphdef, state = nnx.split(model)

    @jax.jit
    def forward(state, ids):
        return nnx.merge(graphdef, state)(ids)

    ids = jnp.arange(8, dtype=jnp.int32).reshape(1, 8)
    np.testing.assert_allclose(np.asarray(forward(state, ids)), np.asarray(model(ids)), atol=1e-5)


def test_wrong_mask_or_positions_shape_raises_naming_the_expected_shape():
    model = _model()
    ids = jnp.zeros((2, 5), jnp.int32)
    with pytest.raises(ValueError, match=r"attention_mask must be bool\[B, T, S\] with T=5 queries and S=16 keys"):
        model(ids, attention_mask=jnp.ones((2, 5, 5), bool), kv_cache=KVCache.init(model.config, 2, 16))
    with pytest.raises(ValueError, match=r"AttentionMask.key_valid must be \[B, S\] = \(2, 16\) \(S = cache slots\)"):
        model(ids, attention_mask=causal_mask(jnp.ones((2, 5), bool)), kv_cache=KVCache.init(model.config, 2, 16))
    with pytest.raises(ValueError, match=r"positions must be int32\[B, T\] = \(2, 5\)"):
        model(ids, positions=jnp.zeros((5,), jnp.int32))
