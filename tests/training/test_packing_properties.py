"""Property test of the whole tree-batch builder (`build_train_batch(pack="tree")`: trie, row layout,
cutting groups larger than a micro-batch, micro-batch assignment, compile buckets) against the
defining property of the packed layout, on random prompt groups whose trajectories branch from
one another: every scored token's slot sees exactly that token's prefix, in order, at the right
depths; every trajectory is one flat row, once."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from aepo_jax.training.packing import build_train_batch


@st.composite
def prompt_groups(draw):
    """(sequences, group_ids, length): 1-4 groups of 1-6 trajectories over a 4-token vocabulary (so
    unrelated prefixes collide too), each trajectory either fresh from the group's prompt or a branch
    of an earlier one cut at a random point."""
    length = draw(st.sampled_from([8, 16, 24]))
    sequences, group_ids = [], []
    for group in range(draw(st.integers(1, 4))):
        prompt = draw(st.lists(st.integers(1, 4), min_size=1, max_size=min(6, length - 1)))
        members: list[list[int]] = []
        for _ in range(draw(st.integers(1, 6))):
            if members and draw(st.booleans()):
                parent = members[draw(st.integers(0, len(members) - 1))]
                base = parent[:draw(st.integers(len(prompt), len(parent)))]
            else:
                base = list(prompt)
            tail = draw(st.lists(st.integers(1, 4), min_size=0, max_size=length - len(base)))
            members.append(base + tail)
        for tokens in members:
            n = len(tokens)
            sequences.append({"tokens": tokens,
                              "mask": [0.0] * len(prompt) + [1.0] * (n - len(prompt)),
                              "advantages": [float(len(sequences) + 1)] * n,
                              "logp_old": [-0.01 * (i + 1) for i in range(n)]})
            group_ids.append(group)
    return sequences, group_ids, length


def _visible_tokens(batch, m: int, row: int, col: int) -> tuple[list[int], list[int]]:
    """Tokens and positions slot `col` of packed row `row` attends to (tree mask: slot j is visible
    from `col` iff j <= col < subtree_end[j]), in slot order."""
    ends = batch["packed_subtree_end"][m, row]
    seen = [j for j in range(col + 1) if col < ends[j]]
    return (batch["packed_ids"][m, row, seen].tolist(), batch["packed_positions"][m, row, seen].tolist())


@given(prompt_groups(), st.integers(1, 4), st.sampled_from([1, 2, 4]), st.sampled_from([None, 2]))
def test_every_scored_token_sees_exactly_its_prefix_in_the_built_tree_batch(groups, micro_batch_size,
                                                                             data_parallel, row_len_factor):
    sequences, group_ids, length = groups
    row_len = None if row_len_factor is None else row_len_factor * length
    batch, stats = build_train_batch(sequences, "tree", group_ids=group_ids, length=length,
                                     micro_batch_size=micro_batch_size, data_parallel=data_parallel,
                                     row_len=row_len)
    m_count, flat_rows = batch["sequence_index"].shape
    packed_rows = batch["packed_ids"].shape[1]
    assert flat_rows % data_parallel == 0 and packed_rows % data_parallel == 0

    index = batch["sequence_index"]
    placed = sorted(index[index >= 0].tolist())
    assert placed == list(range(len(sequences))), "every trajectory is one flat row, exactly once"

    for m in range(m_count):
        for b in range(flat_rows):
            s = int(index[m, b])
            if s < 0:
                assert not batch["scored"][m, b].any() and not batch["mask"][m, b].any()
                continue
            seq = sequences[s]
            tokens, n = seq["tokens"], len(seq["tokens"])
            np.testing.assert_array_equal(batch["input_ids"][m, b, :n], tokens)
            np.testing.assert_allclose(batch["mask"][m, b, :n], seq["mask"])
            np.testing.assert_allclose(batch["advantages"][m, b, :n], seq["advantages"])
            np.testing.assert_allclose(batch["logp_old"][m, b, :n], seq["logp_old"], rtol=1e-6)
            assert batch["scored"][m, b].tolist() == [0.0] + [1.0] * (n - 1) + [0.0] * (length - n)
            for t in range(1, n):
                row, col = int(batch["score_row"][m, b, t]), int(batch["score_col"][m, b, t])
                seen, positions = _visible_tokens(batch, m, row, col)
                assert seen == tokens[:t], f"sequence {s} token {t}: its slot sees {seen}, not {tokens[:t]}"
                assert positions == list(range(t))
                if batch["packed_next_ids"][m, row, col] != tokens[t]:
                    # not the slot's first child: the scorer reads this token's own logit instead
                    assert any(sequences[o]["tokens"][:t] == tokens[:t] and len(sequences[o]["tokens"]) > t
                               for o in range(len(sequences)) if o != s)
    assert stats.flat_tokens == sum(len(s["tokens"]) for s in sequences)
