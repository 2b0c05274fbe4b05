"""Flash kernels in Pallas interpret mode on CPU against the dense path: splash (causal with padding,
GQA, tree-packed rows) and the tree kernel (ancestor rule, block skipping, gradients); TPU lowering."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from attention_cases import numpy_ancestor_mask, random_qkv, random_subtree_ends

from aepo_jax.models.attention import masked_attention
from aepo_jax.models.attention_mask import cached_mask, causal_mask, tree_mask
from aepo_jax.models.tree_attention import (
    block_skip_fraction,
    tree_attention,
    tree_block_map,
)


def values_and_grads(implementation: str, q, k, v, mask, weights):
    """Output and d(sum(out * weights))/d(q, k, v): one jitted program per backend."""

    def loss(q, k, v):
        out = masked_attention(q, k, v, mask, implementation=implementation, interpret=True)
        return jnp.sum(out * weights), out

    (_, out), grads = jax.jit(jax.value_and_grad(loss, (0, 1, 2), has_aux=True))(q, k, v)
    return out, grads


def test_splash_interpret_matches_dense_on_real_queries_with_padding_and_gqa():
    rng = np.random.default_rng(0)
    q, k, v = random_qkv(rng, 2, 120, 120, 4, 2, 16)  # 120 slots: padded to one 128-slot tile inside
    valid = np.ones((2, 120), bool)
    valid[0, :37] = False  # left padding
    valid[1, 90:100] = False  # a hole (an appended tool result's padding)
    mask = causal_mask(jnp.asarray(valid))
    weights = jnp.asarray(rng.normal(size=q.shape) * valid[:, :, None, None], jnp.float32)  # padding queries unread
    out, grads = values_and_grads("splash", q, k, v, mask, weights)
    want_out, want_grads = values_and_grads("dense", q, k, v, mask, weights)
    np.testing.assert_allclose(np.asarray(out)[valid], np.asarray(want_out)[valid], atol=2e-5)
    for got, want in zip(grads, want_grads, strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=5e-5)


def test_splash_takes_the_dense_path_for_cached_blocks():
    rng = np.random.default_rng(1)
    q, k, v = random_qkv(rng, 2, 4, 32, 4, 2, 8)
    slot_valid = jnp.asarray(rng.random((2, 32)) < 0.6).at[:, 10:14].set(True)
    mask = cached_mask(slot_valid, 10)
    got = masked_attention(q, k, v, mask, implementation="splash")
    np.testing.assert_array_equal(np.asarray(got), np.asarray(masked_attention(q, k, v, mask)))


def test_tree_kernel_matches_dense_ancestor_attention_values_and_grads():
    rng = np.random.default_rng(2)
    length = 44  # not a multiple of the tiles: the kernel pads with self-only slots
    ends = random_subtree_ends(rng, 2, length, trees_end_at=(17, 30))
    q, k, v = random_qkv(rng, 2, length, length, 4, 2, 8)
    weights = jnp.asarray(rng.normal(size=q.shape), jnp.float32)
    kernel = functools.partial(tree_attention, subtree_end=jnp.asarray(ends), block_q=16, block_k=8, interpret=True)

    def loss(attend, q, k, v):
        out = attend(q, k, v)
        return jnp.sum(out * weights), out

    dense = functools.partial(masked_attention, mask=tree_mask(jnp.asarray(ends)))
    (_, out), grads = jax.jit(jax.value_and_grad(functools.partial(loss, kernel), (0, 1, 2), has_aux=True))(q, k, v)
    (_, want), want_grads = jax.jit(jax.value_and_grad(functools.partial(loss, dense), (0, 1, 2), has_aux=True))(
        q, k, v)
    np.testing.assert_allclose(np.asarray(out), np.asarray(want), atol=2e-6)
    for got, ref in zip(grads, want_grads, strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(ref), atol=1e-5)


def test_splash_backend_runs_tree_rows_through_the_tree_kernel_matching_dense():
    rng = np.random.default_rng(3)
    ends = random_subtree_ends(rng, 1, 256, trees_end_at=(100, 190))
    q, k, v = random_qkv(rng, 1, 256, 256, 2, 1, 8)
    mask = tree_mask(jnp.asarray(ends))
    weights = jnp.asarray(rng.normal(size=q.shape), jnp.float32)
    out, grads = values_and_grads("splash", q, k, v, mask, weights)
    want_out, want_grads = values_and_grads("dense", q, k, v, mask, weights)
    np.testing.assert_allclose(np.asarray(out), np.asarray(want_out), atol=2e-5)
    for got, want in zip(grads, want_grads, strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=5e-5)


def test_splash_tree_rows_lower_for_tpu():
    rng = np.random.default_rng(6)
    q, k, v = random_qkv(rng, 2, 256, 256, 4, 2, 128)
    mask = tree_mask(jnp.asarray(random_subtree_ends(rng, 2, 256, trees_end_at=(120,))))

    def loss(q, k, v):
        return masked_attention(q, k, v, mask, implementation="splash").sum()

    lowered = jax.jit(jax.grad(loss, (0, 1, 2))).trace(q, k, v).lower(lowering_platforms=("tpu",))
    text = lowered.as_text()
    assert all(name in text for name in ("tree_attention_forward", "tree_attention_dq", "tree_attention_dkv"))


def test_tree_block_map_marks_exactly_the_tiles_with_an_allowed_pair():
    ends = random_subtree_ends(np.random.default_rng(4), 3, 48, trees_end_at=(20, 33))
    dense = numpy_ancestor_mask(ends).reshape(3, 6, 8, 4, 12)  # [B, nq, bq, nk, bk]
    want = dense.any(axis=(2, 4)).astype(np.int32)
    np.testing.assert_array_equal(tree_block_map(ends, 8, 12), want)
    np.testing.assert_array_equal(np.asarray(tree_block_map(jnp.asarray(ends), 8, 12)), want)


def test_block_skip_fraction_of_two_separate_chains():
    # Two chains of 128 slots in one row: the second never sees the first.
    ends = np.concatenate([np.full(128, 128), np.full(128, 256)]).astype(np.int32)[None]
    got = block_skip_fraction(ends, 128, 128)
    assert (got["all_tiles"], got["causal_tiles"], got["visited_tiles"]) == (4, 3, 2)
    assert got["skipped_of_all"] == 0.5 and abs(got["skipped_of_causal"] - 1 / 3) < 1e-12
