"""Prefix forest, row layout and ancestor mask: hand-made trees against hand-written
matrices, and random forests against the defining property (a slot attends exactly
to its root-to-node path, once each)."""

import numpy as np
import pytest

from aepo_jax.models import get_preset
from aepo_jax.models.attention_mask import tree_mask
from aepo_jax.training.batch import pad_sequences
from aepo_jax.training.packing import build_train_batch, per_sequence_values
from aepo_jax.training.packing.layout import first_fit_decreasing, layout_forest
from aepo_jax.training.packing.row_length import choose_row_len
from aepo_jax.training.packing.trie import build_prefix_forest, preorder_and_sizes


def _rows(layout):
    """(tokens per slot, mask) of a layout whose node ids are the tokens themselves."""
    return np.asarray(tree_mask(layout.subtree_end).to_dense(layout.subtree_end.shape[1]))


def _expected(sets, length):
    """bool[L, L] from, per query slot, the key slots it may attend."""
    m = np.zeros((length, length), bool)
    for i, keys in enumerate(sets):
        m[i, list(keys)] = True
    return m


def _node_tokens(forest, layout):
    return np.where(layout.slot_node >= 0, forest.tokens[np.maximum(layout.slot_node, 0)], -1)


def test_trie_merges_shared_prefixes_only_within_a_group():
    forest = build_prefix_forest([[1, 2, 3], [1, 2, 4], [1, 5], [1, 2, 3]], group_ids=[0, 0, 0, 1])
    assert forest.num_nodes == 5 + 3  # group 0: 1,2,3,4,5; group 1: its own 1,2,3
    assert forest.paths[0][:2].tolist() == forest.paths[1][:2].tolist()
    assert forest.paths[3][0] != forest.paths[0][0]
    order, _rank, size = preorder_and_sizes(forest)
    assert forest.tokens[order].tolist() == [1, 2, 3, 4, 5, 1, 2, 3]
    assert size[forest.paths[0][0]] == 5 and size[forest.paths[0][1]] == 3
    assert forest.depth[forest.paths[1]].tolist() == [0, 1, 2]


def test_ancestor_mask_of_one_tree_in_one_row():
    # 1 -> 2 -> {3, 4 -> 5}, 1 -> 6; preorder 1 2 3 4 5 6
    forest = build_prefix_forest([[1, 2, 3], [1, 2, 4, 5], [1, 6]])
    layout = layout_forest(forest, row_len=8, length_multiple=8)
    assert _node_tokens(forest, layout)[0].tolist() == [1, 2, 3, 4, 5, 6, -1, -1]
    want = _expected([{0}, {0, 1}, {0, 1, 2}, {0, 1, 3}, {0, 1, 3, 4}, {0, 5}, {6}, {7}], 8)
    np.testing.assert_array_equal(_rows(layout)[0], want)
    assert layout.copied_slots == 0
    # token 5 (node of slot 4) is scored by its parent 4 at slot 3
    assert (layout.score_row[forest.paths[1][3]], layout.score_col[forest.paths[1][3]]) == (0, 3)


def test_tree_overflowing_a_row_is_split_with_ancestor_copies_and_bin_packed():
    # group 0: 1 -> 2 -> {3, 4}, 1 -> 5 (5 nodes, row_len 4); group 1: 7 -> 8
    forest = build_prefix_forest([[1, 2, 3], [1, 2, 4], [1, 5], [7, 8]], group_ids=[0, 0, 0, 1])
    layout = layout_forest(forest, row_len=4, length_multiple=1)
    tokens = _node_tokens(forest, layout)
    assert tokens.tolist() == [[1, 2, 3, 4], [1, 5, 7, 8]]
    assert layout.slot_owned.tolist() == [[True] * 4, [False, True, True, True]]
    mask = _rows(layout)
    np.testing.assert_array_equal(mask[0], _expected([{0}, {0, 1}, {0, 1, 2}, {0, 1, 3}], 4))
    np.testing.assert_array_equal(mask[1], _expected([{0}, {0, 1}, {2}, {2, 3}], 4))
    assert layout.copied_slots == 1
    node5 = forest.paths[2][1]
    assert (layout.score_row[node5], layout.score_col[node5]) == (1, 0)  # scored by the copy of 1


def test_uncle_after_a_split_does_not_see_the_copied_parent():
    # 1 -> 2 -> {3 -> 4 -> 5, 6}, 1 -> 7; row_len 5: piece A = 1 2 3 4 5, piece B = 1' 2' 6 7
    forest = build_prefix_forest([[1, 2, 3, 4, 5], [1, 2, 6], [1, 7]])
    layout = layout_forest(forest, row_len=5, length_multiple=1)
    tokens = _node_tokens(forest, layout)
    assert tokens.tolist() == [[1, 2, 3, 4, 5], [1, 2, 6, 7, -1]]
    np.testing.assert_array_equal(_rows(layout)[1], _expected([{0}, {0, 1}, {0, 1, 2}, {0, 3}, {4}], 5))


def test_first_fit_decreasing():
    # longest first: 5 -> bin 0, 4 -> bin 1, 3 -> bin 2, 2 -> bin 1 after the 4, 1 -> bin 0 after the 5
    bins, offsets = first_fit_decreasing([3, 5, 2, 4, 1], capacity=6)
    assert bins == [2, 0, 1, 1, 0] and offsets == [0, 0, 4, 0, 5]
    with pytest.raises(ValueError, match="exceeds the bin capacity"):
        first_fit_decreasing([7], capacity=6)


def test_sequence_longer_than_a_row_raises():
    with pytest.raises(ValueError, match="does not fit in row_len=3"):
        layout_forest(build_prefix_forest([[1, 2, 3, 4]]), row_len=3)


def _random_sequences(rng, num_groups):
    sequences, groups = [], []
    for g in range(num_groups):
        prompt = rng.integers(0, 6, size=int(rng.integers(1, 6))).tolist()
        trajs = [prompt + rng.integers(0, 6, size=int(rng.integers(0, 8))).tolist()]
        for _ in range(int(rng.integers(0, 6))):
            parent = trajs[int(rng.integers(len(trajs)))]
            cut = int(rng.integers(1, len(parent) + 1))
            trajs.append(parent[:cut] + rng.integers(0, 6, size=int(rng.integers(0, 8))).tolist())
        sequences += trajs
        groups += [g] * len(trajs)
    return sequences, groups


@pytest.mark.parametrize("seed", range(40))
def test_random_forests_attend_exactly_their_path(seed):
    rng = np.random.default_rng(seed)
    sequences, groups = _random_sequences(rng, int(rng.integers(1, 5)))
    forest = build_prefix_forest(sequences, groups)
    longest = max(len(s) for s in sequences)
    layout = layout_forest(forest, row_len=int(rng.integers(longest, longest + 12)), length_multiple=1)
    mask = _rows(layout)
    owned = layout.slot_node[layout.slot_owned]
    assert sorted(owned.tolist()) == list(range(forest.num_nodes))  # every node owned exactly once
    for r in range(layout.num_rows):
        for i in range(layout.row_len):
            node = layout.slot_node[r, i]
            keys = np.flatnonzero(mask[r, i])
            if node < 0:
                assert keys.tolist() == [i]
                continue
            path = []
            n = node
            while n >= 0:
                path.append(int(n))
                n = forest.parent[n]
            assert sorted(layout.slot_node[r, keys].tolist()) == sorted(path)  # the path, each node once
    for path, seq in zip(forest.paths, sequences):
        assert forest.tokens[path].tolist() == seq
        for t in range(1, len(path)):
            r, c = layout.score_row[path[t]], layout.score_col[path[t]]
            assert layout.slot_node[r, c] == path[t - 1]  # scored by its parent's slot
            owner = np.argwhere((layout.slot_node == path[t]) & layout.slot_owned)[0]
            assert owner[0] == r  # in the row that owns the token
            assert mask[r, owner[1], c]


def _two_groups_with_long_prompts(prompt_len=20):
    rng = np.random.default_rng(3)
    sequences, groups = [], []
    for g in range(2):
        prompt = rng.integers(0, 50, size=prompt_len).tolist()
        for _ in range(4):
            sequences.append(prompt + rng.integers(0, 50, size=30 - prompt_len).tolist())
            groups.append(g)
    return sequences, groups


def test_choose_row_len_trades_copies_against_quadratic_attention():
    sequences, groups = _two_groups_with_long_prompts()  # a group: 20 + 4 * 10 = 60 nodes, sequences of 30
    linear_heavy = get_preset("tiny", vocab_size=1_000_000)  # per-slot cost dominates: fewest slots wins
    best, costs = choose_row_len(sequences, groups, linear_heavy, [30, 60, 20], length_multiple=1)
    assert sorted(costs) == [30, 60] and best == 60  # 20 is too short for a sequence; 60 holds a group, no copies
    # Little sharing (prompt of 2): rows of 30 cost 8 * 30^2 score pairs, rows of 120 cost 2 * 120^2.
    sequences, groups = _two_groups_with_long_prompts(prompt_len=2)
    attention_heavy = get_preset("tiny", vocab_size=2, d_model=8, mlp_dim=8, n_heads=64, n_kv_heads=64)
    best, _ = choose_row_len(sequences, groups, attention_heavy, [30, 120], length_multiple=1)
    assert best == 30  # L^2 per row dominates: short rows
    best, _ = choose_row_len(sequences, groups, linear_heavy, [30, 120], length_multiple=1)
    assert best == 120
    with pytest.raises(ValueError, match="no candidate row length fits"):
        choose_row_len(sequences, groups, linear_heavy, [10])


def test_train_pack_switch_builds_the_matching_batch():
    sequences, groups = _two_groups_with_long_prompts()
    seqs = [{"tokens": s, "mask": [0] * 20 + [1] * 10, "advantages": 1.0} for s in sequences]
    flat, stats = build_train_batch(seqs, "flat", group_ids=groups, length=32)
    assert stats is None and flat["input_ids"].shape == (8, 32)
    np.testing.assert_array_equal(flat["mask"], pad_sequences(seqs, max_len=32)["mask"])
    tree, stats = build_train_batch(seqs, "tree", group_ids=groups, length=32, row_len=64, micro_batch_size=2)
    # a 64-slot row per group (60 distinct tokens), micro-batches of about two flat rows (64 slots): one group each
    assert tree["packed_ids"].shape[:2] == (2, 1) and stats.unique_tokens == 2 * 60
    order = per_sequence_values(tree["input_ids"], tree, "tree", len(seqs))
    np.testing.assert_array_equal(order, flat["input_ids"])  # back in input order
    with pytest.raises(ValueError, match="unknown train.pack 'ragged'"):
        build_train_batch(seqs, "ragged", group_ids=groups, length=32)


def test_groups_that_fit_cut_only_groups_whose_tree_exceeds_the_budget():
    """Each part of a cut group holds at most `budget` distinct prefixes (its tree's nodes); a group within
    the budget keeps its id, and every sequence keeps a group."""
    from aepo_jax.training.packing.trainer_batches import groups_that_fit

    sequences, groups = _two_groups_with_long_prompts()  # two groups of 60 nodes, sequences of 30
    small = [[7, 7]] * 2
    tokens, ids = sequences + small, groups + [5, 5]
    cut = groups_that_fit(tokens, ids, budget=45)
    assert cut[-2:] == [5, 5]  # 3 nodes: kept whole
    for g in (0, 1):
        parts = {cut[i] for i, old in enumerate(ids) if old == g}
        assert len(parts) == 2, parts  # 60 nodes in parts of <= 45: two
        for part in parts:
            nodes = {tuple(tokens[i][:n]) for i in range(len(tokens)) if cut[i] == part
                     for n in range(1, len(tokens[i]) + 1)}
            assert len(nodes) <= 45, (part, len(nodes))
    assert groups_that_fit(tokens, ids, budget=60) == ids  # every group fits
