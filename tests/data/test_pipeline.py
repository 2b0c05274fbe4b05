"""PromptPipeline: determinism from a seed, per-epoch reshuffle, the unshuffled stream, sharding, exact resume."""

import itertools
import json
import warnings

import numpy as np
import pytest

from aepo_jax.data.pipeline import PromptPipeline
from aepo_jax.data.records import read_examples

EXAMPLES = [
    {"id": str(i), "question": f"q{i}", "answers": [str(i)], "data_source": "t"}
    for i in range(23)
]


def ids(batches):
    return [[e["id"] for e in batch] for batch in batches]


def take(pipeline, n):
    return ids(itertools.islice(pipeline, n))


def test_same_seed_same_batches_other_seed_different():
    assert take(PromptPipeline(EXAMPLES, 4, seed=3), 12) == take(
        PromptPipeline(EXAMPLES, 4, seed=3), 12
    )
    assert take(PromptPipeline(EXAMPLES, 4, seed=3), 12) != take(
        PromptPipeline(EXAMPLES, 4, seed=4), 12
    )


def test_epochs_cover_distinct_examples_and_reshuffle():
    pipeline = PromptPipeline(EXAMPLES, 4, seed=0)
    assert pipeline.steps_per_epoch == 5  # 23 // 4, tail of 3 dropped
    epoch0, epoch1 = take(pipeline, 5), take(pipeline, 5)
    flat0 = list(itertools.chain.from_iterable(epoch0))
    flat1 = list(itertools.chain.from_iterable(epoch1))
    assert len(set(flat0)) == 20 and len(set(flat1)) == 20
    assert flat0 != flat1
    assert pipeline.epoch == 1


def test_no_shuffle_keeps_file_order():
    assert take(PromptPipeline(EXAMPLES, 5, shuffle=False), 2) == [
        ["0", "1", "2", "3", "4"],
        ["5", "6", "7", "8", "9"],
    ]


def test_processes_get_disjoint_slices_of_the_global_batch():
    shards = [
        PromptPipeline(EXAMPLES, 6, seed=1, process_index=p, process_count=2)  # 6 global: 3 each
        for p in range(2)
    ]
    single = PromptPipeline(EXAMPLES, 6, seed=1)
    for _ in range(8):  # crosses epoch boundaries (3 steps per epoch)
        a, b, whole = (
            ids([next(shards[0])])[0],
            ids([next(shards[1])])[0],
            ids([next(single)])[0],
        )
        assert not set(a) & set(b)
        assert a + b == whole


@pytest.mark.parametrize("stop_after", [0, 3, 5, 7, 11])
def test_resume_gives_exactly_the_uninterrupted_batches(stop_after):
    uninterrupted = take(PromptPipeline(EXAMPLES, 4, seed=9), stop_after + 10)
    first = PromptPipeline(EXAMPLES, 4, seed=9)
    before = take(first, stop_after)
    saved = json.loads(json.dumps(first.state()))  # what a checkpoint stores
    resumed = PromptPipeline(EXAMPLES, 4, seed=9)
    resumed.restore(saved)
    assert before + take(resumed, 10) == uninterrupted


def test_restore_refuses_a_foreign_state_and_bad_arguments():
    state = PromptPipeline(EXAMPLES, 4, seed=9).state()
    with pytest.raises(ValueError, match="seed=9"):
        PromptPipeline(EXAMPLES, 4, seed=1).restore(state)
    with pytest.raises(ValueError, match="global_batch"):
        PromptPipeline(EXAMPLES, 2, seed=9).restore(state)
    with pytest.raises(ValueError, match="out of range"):
        PromptPipeline(EXAMPLES, 4, seed=9).restore({**state, "position": 99})
    with pytest.raises(ValueError, match="fewer than one global batch"):
        PromptPipeline(EXAMPLES[:5], 6, process_count=2)
    with pytest.raises(ValueError, match="not divisible by the 2 processes"):
        PromptPipeline(EXAMPLES, 3, process_count=2)
    with pytest.raises(ValueError, match="process_index"):
        PromptPipeline(EXAMPLES, 4, process_index=2, process_count=2)


def test_no_shuffle_is_one_stream_so_every_row_is_seen():
    """Restarting each epoch at row 0 dropped the same tail (rows 20-22 of 23 in batches of 4) forever."""
    pipeline = PromptPipeline(EXAMPLES, 4, shuffle=False)
    batches = take(pipeline, 50)
    assert batches == [[str((p * 4 + i) % 23) for i in range(4)] for p in range(50)]
    assert set(itertools.chain.from_iterable(batches)) == {e["id"] for e in EXAMPLES}
    assert pipeline.epoch == 9  # epochs still count steps_per_epoch steps


def test_shuffled_order_is_a_fresh_permutation_per_epoch():
    """Pins the shuffled stream: epoch e, step s takes permutation([seed, e])[4s:4s+4]."""
    batches = take(PromptPipeline(EXAMPLES, 4, seed=123), 12)
    expected = []
    for epoch in range(3):
        order = np.random.default_rng([123, epoch]).permutation(23)
        expected += [[str(i) for i in order[4 * s : 4 * s + 4]] for s in range(5)]
    assert batches == expected[:12]


@pytest.mark.parametrize("shuffle", [True, False])
def test_resume_at_every_position_under_any_process_count(shuffle):
    uninterrupted = take(PromptPipeline(EXAMPLES, 4, seed=5, shuffle=shuffle), 20)
    for stop in range(16):
        first = PromptPipeline(EXAMPLES, 4, seed=5, shuffle=shuffle)
        take(first, stop)
        saved = json.loads(json.dumps(first.state()))
        for count in (1, 2, 4):
            shards = [PromptPipeline(EXAMPLES, 4, seed=5, shuffle=shuffle, process_index=p, process_count=count)
                      for p in range(count)]
            for shard in shards:
                shard.restore(saved)
            resumed = [[i for s in shards for i in ids([next(s)])[0]] for _ in range(4)]
            assert resumed == uninterrupted[stop : stop + 4], (stop, count)


def test_restore_refuses_a_state_over_other_data_of_the_same_size():
    first = PromptPipeline(EXAMPLES, 4, seed=9)
    next(first)
    other = [{**e, "question": e["question"] + "?"} for e in EXAMPLES]
    with pytest.raises(ValueError, match="data_digest='[0-9a-f]+' but .* '[0-9a-f]+': the data changed"):
        PromptPipeline(other, 4, seed=9).restore(first.state())
    with pytest.raises(ValueError, match="the data changed"):
        PromptPipeline(EXAMPLES[::-1], 4, seed=9).restore(first.state())
    # An upgrade that reads the same file otherwise (a float answer 72.0 became '72') changes the digest too:
    # the error says so, not only that the data changed.
    with pytest.raises(ValueError, match=r"or this aepo_jax reads it otherwise .* \(record parser version \d+"):
        PromptPipeline(other, 4, seed=9).restore(first.state())


def test_a_renamed_or_moved_file_restores(tmp_path):
    """The digest is of the content: rows without ids get ids from the file name, which may change."""
    rows = "".join(json.dumps({"question": f"q{i}?", "answer": str(i)}) + "\n" for i in range(9))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "train.jsonl").write_text(rows)
    (tmp_path / "b" / "renamed.jsonl").write_text(rows)
    first = PromptPipeline(read_examples(tmp_path / "a" / "train.jsonl"), 2, seed=1)
    take(first, 3)
    moved = PromptPipeline(read_examples(tmp_path / "b" / "renamed.jsonl"), 2, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        moved.restore(first.state())
    assert [[e["question"] for e in batch] for batch in itertools.islice(moved, 2)] == [
        [e["question"] for e in batch] for batch in itertools.islice(first, 2)
    ]


def test_an_old_state_without_digest_or_version():
    """Unversioned states (before the digest, the shuffle setting and the unshuffled stream) restore where they
    mean the same."""
    state = PromptPipeline(EXAMPLES, 4, seed=9).state()
    old = {k: v for k, v in state.items() if k not in ("version", "data_digest", "shuffle")}
    unchecked = "no shuffle setting .* cannot check"
    with pytest.warns(UserWarning, match="no data_digest .* cannot check"), pytest.warns(UserWarning, match=unchecked):
        PromptPipeline(EXAMPLES, 4, seed=9).restore({**old, "epoch": 3, "position": 2})
    unshuffled = PromptPipeline(EXAMPLES, 4, seed=9, shuffle=False)
    with pytest.warns(UserWarning, match="no data_digest"), pytest.warns(UserWarning, match=unchecked):
        unshuffled.restore({**old, "epoch": 0, "position": 2})  # epoch 0: the same rows either way
    assert take(unshuffled, 1) == [["8", "9", "10", "11"]]
    with pytest.raises(ValueError, match="version 1 .*restarted every epoch at row 0"), pytest.warns(UserWarning):
        PromptPipeline(EXAMPLES, 4, seed=9, shuffle=False).restore({**old, "epoch": 1, "position": 2})
    with pytest.raises(ValueError, match="newer"):
        PromptPipeline(EXAMPLES, 4, seed=9).restore({**state, "version": 99})


@pytest.mark.parametrize("saved_shuffled", [True, False])
def test_restore_refuses_a_state_saved_under_the_other_shuffle_setting(saved_shuffled):
    """A shuffled run's position restored into an unshuffled pipeline (or back) silently replayed other rows:
    the state did not record `shuffle`."""
    first = PromptPipeline(EXAMPLES, 4, seed=9, shuffle=saved_shuffled)
    take(first, 2)
    saved = json.loads(json.dumps(first.state()))  # what a checkpoint stores
    assert saved["shuffle"] is saved_shuffled
    other = PromptPipeline(EXAMPLES, 4, seed=9, shuffle=not saved_shuffled)
    with pytest.raises(ValueError, match=rf"shuffle={saved_shuffled} but this pipeline has {not saved_shuffled} "
                                         r"\(data.shuffle\): the shuffled and unshuffled streams take other rows"):
        other.restore(saved)
    same = PromptPipeline(EXAMPLES, 4, seed=9, shuffle=saved_shuffled)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        same.restore(saved)
    assert take(same, 2) == take(first, 2)


def test_a_state_saved_before_shuffle_was_kept_restores_with_a_warning():
    """Such a state cannot be checked (nothing in it tells the streams apart); refusing it would strand every older
    checkpoint, so it restores as it did, and the warning says what could not be checked."""
    first = PromptPipeline(EXAMPLES, 4, seed=9)
    take(first, 2)
    old = {k: v for k, v in first.state().items() if k != "shuffle"}
    resumed = PromptPipeline(EXAMPLES, 4, seed=9)
    with pytest.warns(UserWarning, match="no shuffle setting .* cannot check that it was taken with shuffle=True"):
        resumed.restore(old)
    assert take(resumed, 3) == take(first, 3)
