"""Decoder(last_logits_only=True) equals the default path's last-position logits, with and without a cache."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from aepo_jax.models import Decoder, KVCache, get_preset


def _forward(config, last_logits_only):
    graphdef, state = nnx.split(Decoder(config, rngs=nnx.Rngs(0)))

    @jax.jit
    def forward(ids, positions=None, attention_mask=None, kv_cache=None):
        model = nnx.merge(graphdef, state)
        return model(ids, positions=positions, attention_mask=attention_mask, kv_cache=kv_cache,
                     last_logits_only=last_logits_only)

    return forward


@pytest.mark.parametrize("overrides", [{}, {"tie_embeddings": False}])
def test_last_logits_only_equals_last_position_of_full_logits(overrides):
    config = get_preset("tiny", **overrides)
    ids = jax.random.randint(jax.random.key(3), (2, 9), 0, config.vocab_size, dtype=jnp.int32)
    full = _forward(config, False)(ids)  # [B, T, V]
    last = _forward(config, True)(ids)  # [B, 1, V]
    assert full.shape == (2, 9, config.vocab_size)
    assert last.shape == (2, 1, config.vocab_size) and last.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(last), np.asarray(full[:, -1:]), rtol=1e-5, atol=1e-6)
    # the last position is not interchangeable with any other: a wrong slice fails
    assert not np.allclose(np.asarray(last[:, 0]), np.asarray(full[:, -2]), atol=1e-3)


def test_last_logits_only_with_cache_returns_same_cache_and_last_logits():
    config = get_preset("tiny")
    ids = jax.random.randint(jax.random.key(4), (3, 6), 0, config.vocab_size, dtype=jnp.int32)
    cache = KVCache.init(config, batch=3, length=16, dtype=jnp.float32)
    full_logits, full_cache = _forward(config, False)(ids, kv_cache=cache)
    last_logits, last_cache = _forward(config, True)(ids, kv_cache=cache)
    np.testing.assert_allclose(np.asarray(last_logits), np.asarray(full_logits[:, -1:]), rtol=1e-5, atol=1e-6)
    assert int(last_cache.index) == int(full_cache.index) == 6
    for a, b in zip(jax.tree.leaves(last_cache), jax.tree.leaves(full_cache), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # one more cached token: both paths continue identically
    step = ids[:, :1]
    full_next, _ = _forward(config, False)(step, kv_cache=full_cache)
    last_next, _ = _forward(config, True)(step, kv_cache=last_cache)
    np.testing.assert_allclose(np.asarray(last_next), np.asarray(full_next), rtol=1e-5, atol=1e-6)


def test_default_still_returns_every_position():
    config = get_preset("tiny")
    ids = jnp.ones((1, 4), jnp.int32)
    assert _forward(config, False)(ids).shape == (1, 4, config.vocab_size)
