"""Shared inputs and the numpy reference for the attention tests."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np


def numpy_attention(q, k, v, mask):
    """Per row and head: softmax over the allowed keys in float64, GQA by head // group."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    mask = np.asarray(mask)
    batch, _, n_heads, head_dim = q.shape
    groups = n_heads // k.shape[2]
    out = np.zeros_like(q)
    for b in range(batch):
        for h in range(n_heads):
            scores = q[b, :, h] @ k[b, :, h // groups].T / np.sqrt(head_dim)  # [T, S]
            scores = np.where(mask[b], scores, -np.inf)
            probs = np.exp(scores - scores.max(axis=1, keepdims=True))
            out[b, :, h] = (probs / probs.sum(axis=1, keepdims=True)) @ v[b, :, h // groups]
    return out


def random_qkv(rng, batch, length, n_keys, n_heads, n_kv_heads, head_dim):
    q = rng.normal(size=(batch, length, n_heads, head_dim)).astype(np.float32)
    k = rng.normal(size=(batch, n_keys, n_kv_heads, head_dim)).astype(np.float32)
    v = rng.normal(size=(batch, n_keys, n_kv_heads, head_dim)).astype(np.float32)
    return jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)


def random_subtree_ends(rng, batch: int, length: int, trees_end_at: tuple[int, ...] = ()) -> np.ndarray:
    """int32[B, L] subtree ends of random forests in preorder (each slot's parent is on the open-path stack).

    `trees_end_at` closes every tree at those slots (several trees per row, as bin packing does).
    """
    ends = np.zeros((batch, length), np.int32)
    for b in range(batch):
        stack: list[int] = []
        parent = np.full(length, -1)
        for i in range(length):
            if i in trees_end_at:
                stack = []
            while stack and rng.random() < 0.3:
                stack.pop()
            parent[i] = stack[-1] if stack else -1
            stack.append(i)
        ends[b] = np.arange(1, length + 1)
        for i in reversed(range(length)):
            if parent[i] >= 0:
                ends[b, parent[i]] = max(ends[b, parent[i]], ends[b, i])
    return ends


def numpy_ancestor_mask(ends: np.ndarray) -> np.ndarray:
    """bool[B, L, L] of the tree rule, slot by slot: key j is visible to queries j..ends[j]-1."""
    batch, length = ends.shape
    mask = np.zeros((batch, length, length), bool)
    for b in range(batch):
        for j in range(length):
            mask[b, j:ends[b, j], j] = True
    return mask
