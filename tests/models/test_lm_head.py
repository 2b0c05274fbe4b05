"""Chunked LM head: the same log-probs, entropies and gradients as full logits, without a [B, T, V] array."""

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import pytest

from aepo_jax.models.lm_head import head_token_scores

B, T, D, V = 2, 37, 16, 300


@pytest.fixture(scope="module")
def inputs():
    keys = jax.random.split(jax.random.key(0), 3)
    hidden = jax.random.normal(keys[0], (B, T, D))
    head = jax.random.normal(keys[1], (D, V)) * 0.5
    targets = jax.random.randint(keys[2], (B, T), 0, V)
    return hidden, head, targets


def _numpy_reference(hidden, head, targets, temperature):
    """float64 numpy: log-softmax of (hidden @ head) / temperature, target log-prob and entropy."""
    logits = np.asarray(hidden, np.float64) @ np.asarray(head, np.float64) / temperature  # [B, T, V]
    shifted = logits - logits.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    logp = np.take_along_axis(log_probs, np.asarray(targets)[..., None], axis=-1)[..., 0]
    return logp, -(np.exp(log_probs) * log_probs).sum(-1)


@pytest.mark.parametrize("chunk_size", [None, 8, 37, 64])
def test_values_equal_full_vocabulary_reference(inputs, chunk_size):
    hidden, head, targets = inputs
    got = jax.jit(lambda h, w, t: head_token_scores(h, w, t, dtype=jnp.float32, temperature=0.7,
                                                    chunk_size=chunk_size))(hidden, head, targets)
    logp, entropy = _numpy_reference(hidden, head, targets, 0.7)
    np.testing.assert_allclose(np.asarray(got.logp), logp, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(got.entropy), entropy, rtol=1e-5, atol=1e-5)
    logits = np.asarray(hidden) @ np.asarray(head)
    np.testing.assert_array_equal(np.asarray(got.is_argmax), logits.argmax(-1) == np.asarray(targets))


def test_gradients_equal_the_unchunked_path(inputs):
    hidden, head, targets = inputs
    weights = jax.random.normal(jax.random.key(5), (2, B, T))

    def loss(h, w, chunk_size):
        scores = head_token_scores(h, w, targets, dtype=jnp.float32, temperature=1.3, chunk_size=chunk_size)
        return jnp.sum(scores.logp * weights[0]) + jnp.sum(scores.entropy * weights[1])

    full = jax.jit(jax.grad(loss, argnums=(0, 1)), static_argnums=2)(hidden, head, None)
    chunked = jax.jit(jax.grad(loss, argnums=(0, 1)), static_argnums=2)(hidden, head, 8)
    for a, b in zip(chunked, full, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def _shapes_in(jaxpr) -> set[tuple[int, ...]]:
    """Every array shape that a (closed) jaxpr or any jaxpr nested in it produces."""
    shapes = set()
    for eqn in jaxpr.eqns:
        shapes.update(tuple(v.aval.shape) for v in eqn.outvars if hasattr(v.aval, "shape"))
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            shapes |= _shapes_in(sub)
    return shapes


@pytest.mark.parametrize("chunk_size", [None, 8])
def test_no_full_logits_array_in_forward_or_backward_when_chunked(inputs, chunk_size):
    hidden, head, targets = inputs

    def loss(h, w):
        scores = head_token_scores(h, w, targets, dtype=jnp.float32, chunk_size=chunk_size)
        return jnp.sum(scores.logp) + jnp.sum(scores.entropy)

    shapes = _shapes_in(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(hidden, head).jaxpr)
    has_full_logits = any(len(s) >= 2 and s[-1] == V and int(np.prod(s[:-1])) >= B * T for s in shapes)
    assert has_full_logits == (chunk_size is None)  # the check itself sees the unchunked [B, T, V]
    if chunk_size is not None:
        assert (B, chunk_size, V) in shapes


def test_bad_arguments_raise_naming_the_problem(inputs):
    hidden, head, targets = inputs
    with pytest.raises(ValueError, match="chunk_size must be a positive int"):
        head_token_scores(hidden, head, targets, dtype=jnp.float32, chunk_size=0)
    with pytest.raises(ValueError, match=r"targets must be \[B, T\]"):
        head_token_scores(hidden, head, targets[:, :3], dtype=jnp.float32)
    with pytest.raises(ValueError, match=r"hidden must be \[B, T, D\] and head \[D, V\]"):
        head_token_scores(hidden, head.T, targets, dtype=jnp.float32)
