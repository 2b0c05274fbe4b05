"""PromptPipeline: determinism from a seed, per-epoch reshuffle, sharding, exact resume."""

import itertools
import json

import pytest

from aepo_jax.data.pipeline import PromptPipeline

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
