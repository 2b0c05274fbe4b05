"""Prefix trie (a forest) over token sequences: every shared prefix token becomes one node.

Tree-packed training (docs/packing.md) computes each node once. Two sequences
share a node exactly when they share the token ids from the start of the
sequence up to and including that token, because a decoder's hidden state at a
token depends on nothing else: the token ids of its prefix and their positions
(= depths). So nodes are merged on the token id alone. Masks, `logp_old` and
advantages stay per trajectory in the flat layout (`packed_batch.py`), which is
why a generated token and a tool-result token with the same id and prefix may
share a node: their logits are identical, only their loss weights differ.

For reference: merged policy tokens also carry equal `logp_old` up to sampler
numerics. A fork copies the parent's values verbatim; two independent samples
that produce the same prefix were scored from the same context, so their
`logp_old` differ only by batch-shape-dependent float rounding in the sampler.
Packing never reads `logp_old`, so the loss is unaffected either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PrefixForest:
    """Nodes of a prefix forest; node ids are indices into the arrays.

    Attributes:
      tokens: int32[N] token id of each node.
      parent: int32[N] parent node, -1 for a root.
      depth: int32[N] number of ancestors (= rotary position of the token).
      paths: per sequence, int32[len] the node of each of its tokens.
      roots: root node ids, one per tree.
      children: per node, its child node ids in order of first appearance.
    """

    tokens: np.ndarray
    parent: np.ndarray
    depth: np.ndarray
    paths: list[np.ndarray]
    roots: list[int]
    children: list[list[int]]

    @property
    def num_nodes(self) -> int:
        return int(self.tokens.shape[0])


def build_prefix_forest(sequences: Sequence[Sequence[int]], group_ids: Sequence[int] | None = None) -> PrefixForest:
    """Merge sequences into a prefix forest.

    Args:
      sequences: token ids per sequence (prompt + response), each non-empty.
      group_ids: sequences share nodes only within the same group id (one
        prompt's group); `None` lets every pair of sequences share.

    Returns:
      The forest; `paths[i]` lists the nodes of `sequences[i]` root first.
    """
    if group_ids is not None and len(group_ids) != len(sequences):
        raise ValueError(f"group_ids has {len(group_ids)} entries for {len(sequences)} sequences")
    tokens: list[int] = []
    parent: list[int] = []
    depth: list[int] = []
    children: list[list[int]] = []
    child_of: list[dict[int, int]] = []
    root_of: dict[tuple[int, int], int] = {}
    roots: list[int] = []
    paths: list[np.ndarray] = []

    def new_node(token: int, parent_node: int, node_depth: int) -> int:
        node = len(tokens)
        tokens.append(token)
        parent.append(parent_node)
        depth.append(node_depth)
        children.append([])
        child_of.append({})
        return node

    for index, seq in enumerate(sequences):
        ids = [int(t) for t in seq]
        if not ids:
            raise ValueError(f"sequence {index} is empty")
        group = 0 if group_ids is None else int(group_ids[index])
        key = (group, ids[0])
        node = root_of.get(key)
        if node is None:
            node = root_of[key] = new_node(ids[0], -1, 0)
            roots.append(node)
        path = [node]
        for t, token in enumerate(ids[1:], start=1):
            nxt = child_of[node].get(token)
            if nxt is None:
                nxt = new_node(token, node, t)
                child_of[node][token] = nxt
                children[node].append(nxt)
            node = nxt
            path.append(node)
        paths.append(np.asarray(path, np.int32))
    return PrefixForest(
        tokens=np.asarray(tokens, np.int32),
        parent=np.asarray(parent, np.int32),
        depth=np.asarray(depth, np.int32),
        paths=paths,
        roots=roots,
        children=children,
    )


def preorder_and_sizes(forest: PrefixForest) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Depth-first preorder of every tree (roots in order) and subtree sizes.

    Returns:
      `(order int32[N], rank int32[N], size int32[N])`: `order[i]` is the i-th
      node visited, `rank[n]` its index in `order`, `size[n]` the number of
      nodes in the subtree of `n` (itself included). The subtree of `n` is
      exactly `order[rank[n] : rank[n] + size[n]]`.
    """
    n = forest.num_nodes
    order = np.empty(n, np.int32)
    i = 0
    for root in forest.roots:
        stack = [root]
        while stack:
            node = stack.pop()
            order[i] = node
            i += 1
            stack.extend(reversed(forest.children[node]))
    rank = np.empty(n, np.int32)
    rank[order] = np.arange(n, dtype=np.int32)
    size = np.ones(n, np.int64)
    # Children come after their parents in preorder: accumulate in reverse.
    for node in order[::-1]:
        p = forest.parent[node]
        if p >= 0:
            size[p] += size[node]
    return order, rank, size.astype(np.int32)
