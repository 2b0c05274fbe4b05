"""Row layout of a prefix forest: split trees that overflow a row, then bin-pack pieces into rows.

A *piece* is what one row segment holds: copies of the ancestors of its first
node (context only, so every token of the piece sees its full prefix), then a
contiguous run of the forest's depth-first preorder (the nodes the piece
*owns*). Every node is owned by exactly one piece; its log-prob is read from
the logits of its parent's slot in that piece. Whole trees that fit in a row
are single pieces without copies; pieces are bin-packed into rows first-fit
decreasing.

Splitting rule, walking a tree in preorder with the current piece open:
- the subtree of the next node fits in the room left: place it whole;
- it fits in a fresh piece (depth + subtree size <= row_len): close the
  current piece, open a new one with copies of the node's ancestors, place
  the subtree whole there (the closed piece's leftover room is filled by bin
  packing with other pieces);
- otherwise place the node alone (opening a new piece with ancestor copies
  if the current one is full) and continue with its children.
What is duplicated: only the ancestor copies at the head of each non-first
piece of a split tree (`PackedLayout.copied_slots` counts them).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from aepo_jax.training.packing.trie import PrefixForest, preorder_and_sizes


@dataclass(frozen=True)
class PackedLayout:
    """Where every node went.

    Attributes:
      slot_node: int32[R, L] node in each slot, -1 for padding.
      slot_owned: bool[R, L] True where the slot owns its node (False: a copy or padding).
      subtree_end: int32[R, L] one past the last slot of the slot's subtree within
        its row segment (a slot attends to slot j iff j <= slot < subtree_end[j]);
        `slot + 1` for padding.
      score_row, score_col: int32[N] the slot (in the row that owns node n) of
        n's parent, whose logits score n; -1 for roots.
      copied_slots: number of ancestor-copy slots (duplicated compute).
      num_pieces: row segments (a tree that fits in a row is one piece).
    """

    slot_node: np.ndarray
    slot_owned: np.ndarray
    subtree_end: np.ndarray
    score_row: np.ndarray
    score_col: np.ndarray
    copied_slots: int
    num_pieces: int

    @property
    def num_rows(self) -> int:
        return int(self.slot_node.shape[0])

    @property
    def row_len(self) -> int:
        return int(self.slot_node.shape[1])


@dataclass
class _Piece:
    nodes: list[int]
    owned: list[bool]
    ends: list[int]
    slot_of: dict[int, int]


class _TreeSplitter:
    """Cuts the forest's trees into pieces of at most `row_len` slots (module doc)."""

    def __init__(self, forest: PrefixForest, row_len: int):
        self.forest = forest
        self.row_len = row_len
        self.order, self.rank, self.size = preorder_and_sizes(forest)
        self.pieces: list[_Piece] = []
        self.node_piece = np.full(forest.num_nodes, -1, np.int32)
        self.parent_slot = np.full(forest.num_nodes, -1, np.int32)

    def _open(self, first: int) -> _Piece:
        """New piece holding copies of `first`'s ancestors, root first."""
        ancestors = []
        p = int(self.forest.parent[first])
        while p >= 0:
            ancestors.append(p)
            p = int(self.forest.parent[p])
        ancestors.reverse()
        piece = _Piece(nodes=list(ancestors), owned=[False] * len(ancestors), ends=[], slot_of={})
        for slot, node in enumerate(ancestors):
            piece.slot_of[node] = slot
        self.pieces.append(piece)
        return piece

    def _place(self, piece: _Piece, nodes: np.ndarray) -> None:
        """Append owned nodes (a contiguous preorder run) to `piece`."""
        piece_id = len(self.pieces) - 1
        for node in nodes:
            node = int(node)
            slot = len(piece.nodes)
            piece.nodes.append(node)
            piece.owned.append(True)
            piece.slot_of[node] = slot
            self.node_piece[node] = piece_id
            parent = int(self.forest.parent[node])
            if parent >= 0:
                self.parent_slot[node] = piece.slot_of[parent]

    def _close(self, piece: _Piece) -> None:
        """Subtree ends. The owned run is contiguous in preorder, from rank `a` on, and
        sits after `d` copies; the part of any node's preorder subtree that lies in the
        piece (copies included: an uncle of the first node is not under its parent)
        ends at slot `d + rank + size - a`, clipped to the piece length."""
        length = len(piece.nodes)
        copies = piece.owned.index(True) if any(piece.owned) else length
        if copies == length:
            piece.ends = [length] * length
            return
        run_start = int(self.rank[piece.nodes[copies]])
        piece.ends = [min(length, copies + int(self.rank[node]) + int(self.size[node]) - run_start)
                      for node in piece.nodes]

    def split(self) -> list[_Piece]:
        L = self.row_len
        for root in self.forest.roots:
            piece = self._open(root)
            stack = [root]
            while stack:
                node = stack.pop()
                size, depth = int(self.size[node]), int(self.forest.depth[node])
                start = int(self.rank[node])
                room = L - len(piece.nodes)
                if size <= room:
                    self._place(piece, self.order[start:start + size])
                    continue
                if depth + size <= L:
                    self._close(piece)
                    piece = self._open(node)
                    self._place(piece, self.order[start:start + size])
                    continue
                if room < 1:
                    self._close(piece)
                    piece = self._open(node)
                self._place(piece, self.order[start:start + 1])
                stack.extend(reversed(self.forest.children[node]))
            self._close(piece)
        return [p for p in self.pieces if any(p.owned)]


def first_fit_decreasing(lengths: list[int], capacity: int) -> tuple[list[int], list[int]]:
    """Bin-pack items of the given lengths into bins of `capacity`, longest first.

    Returns:
      `(bin_of_item, offset_of_item)`: each item's bin and its start inside the bin.
    """
    fill: list[int] = []
    bin_of = [0] * len(lengths)
    offset = [0] * len(lengths)
    for item in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        n = lengths[item]
        if n > capacity:
            raise ValueError(f"item of length {n} exceeds the bin capacity {capacity}")
        for b, used in enumerate(fill):
            if used + n <= capacity:
                break
        else:
            b = len(fill)
            fill.append(0)
        bin_of[item], offset[item] = b, fill[b]
        fill[b] += n
    return bin_of, offset


def layout_forest(forest: PrefixForest, row_len: int, row_multiple: int = 1, length_multiple: int = 8) -> PackedLayout:
    """Split and bin-pack a forest into rows of `row_len` slots (see the module doc).

    The row length of the result is the fullest row rounded up to `length_multiple`
    (at most `row_len`); the row count is rounded up to `row_multiple` with padding rows.
    """
    if row_len < 1:
        raise ValueError(f"row_len must be >= 1, got {row_len}")
    deepest = int(forest.depth.max()) + 1 if forest.num_nodes else 0
    if deepest > row_len:
        raise ValueError(f"a sequence of {deepest} tokens does not fit in row_len={row_len}; raise train.row_len")
    splitter = _TreeSplitter(forest, row_len)
    pieces = splitter.split()
    piece_index = {id(p): i for i, p in enumerate(pieces)}
    lengths = [len(p.nodes) for p in pieces]
    bin_of, offset = first_fit_decreasing(lengths, row_len)
    fill = np.zeros(max(bin_of, default=-1) + 1, np.int64)
    for b, o, n in zip(bin_of, offset, lengths, strict=True):
        fill[b] = max(fill[b], o + n)
    rows = -(-max(len(fill), 1) // row_multiple) * row_multiple
    length = min(row_len, -(-max(int(fill.max(initial=1)), 1) // length_multiple) * length_multiple)

    slot_node = np.full((rows, length), -1, np.int32)
    slot_owned = np.zeros((rows, length), bool)
    subtree_end = np.broadcast_to(np.arange(1, length + 1, dtype=np.int32), (rows, length)).copy()
    for p, piece in enumerate(pieces):
        row, start = bin_of[p], offset[p]
        span = slice(start, start + len(piece.nodes))
        slot_node[row, span] = piece.nodes
        slot_owned[row, span] = piece.owned
        subtree_end[row, span] = np.asarray(piece.ends, np.int32) + start

    # Map the splitter's per-piece numbering to rows (pieces with no owned node were dropped).
    all_index = np.full(len(splitter.pieces), -1, np.int32)
    for i, p in enumerate(splitter.pieces):
        all_index[i] = piece_index.get(id(p), -1)
    node_piece = all_index[splitter.node_piece]  # [N]
    if (node_piece < 0).any():
        raise AssertionError("a node was not placed in any piece")
    piece_row = np.asarray(bin_of, np.int32)
    piece_offset = np.asarray(offset, np.int32)
    has_parent = forest.parent >= 0
    score_row = np.where(has_parent, piece_row[node_piece], -1).astype(np.int32)
    score_col = np.where(has_parent, piece_offset[node_piece] + splitter.parent_slot, -1).astype(np.int32)
    copied = int(sum(len(p.owned) - sum(p.owned) for p in pieces))
    return PackedLayout(slot_node, slot_owned, subtree_end, score_row, score_col, copied, len(pieces))
