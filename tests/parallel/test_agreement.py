"""What every process of a run must hold alike (`parallel.agreement`, `Checkpointer.agreed_latest_step`):
processes started with different configs or data trained silently (parameters meant as one replica drifted
apart), and a process whose view of the checkpoint folder lagged resumed from an older step than the
others."""

from __future__ import annotations

import pytest

from aepo_jax.parallel.agreement import differing_fields, digest, require_agreement
from aepo_jax.training.checkpoint import agree_on_latest_step


def test_fields_that_differ_between_processes_are_named_with_every_processs_digest():
    views = [{"config": digest({"lr": 1e-6}), "data": "d0"}, {"config": digest({"lr": 0.05}), "data": "d0"}]
    assert differing_fields(views) == {"config": [views[0]["config"], views[1]["config"]]}
    assert differing_fields([views[0], dict(views[0])]) == {}
    assert differing_fields([{"data": "d0"}, {}]) == {"data": ["d0", "None"]}


def test_the_digest_follows_values_not_key_order():
    assert digest({"a": 1, "b": [1, 2]}) == digest({"b": [1, 2], "a": 1})
    assert digest({"a": 1}) != digest({"a": 2})


def test_one_process_always_agrees_with_itself():
    require_agreement({"config": "x"})  # gather_objects of one process: [mine]


def test_every_process_must_see_the_step_process_0_resumes_from():
    assert agree_on_latest_step([[1, 2, 3], [1, 2, 3]], "/ckpt") == 3
    assert agree_on_latest_step([[], []], "/ckpt") is None
    assert agree_on_latest_step([[2, 3], [1, 2, 3, 4]], "/ckpt") == 3  # process 0's newest, seen by all
    with pytest.raises(ValueError, match=r"process 0 resumes from step 3 of /ckpt, but processes \[1\] do not see "
                                         r"that step complete \(their newest: \{1: 2\}\)"):
        agree_on_latest_step([[1, 2, 3], [1, 2]], "/ckpt")


def test_sft_records_made_differently_on_another_process_are_refused(monkeypatch):
    """Each process makes its own SFT records (scripted ones run the real tools on its own host), and each
    pads and places the global batch from its own: records that differ between hosts trained on rows the
    hosts did not agree on. Here the second process's view of the records (gathered) is another record
    list's digest."""
    import jax

    from aepo_jax.experiment_sft import sft_config_from, sft_trainer_from
    from aepo_jax.parallel import multihost
    from aepo_jax.training.sft_trainer import SequenceBatches
    from configs.aepo_tiny import get_config

    cfg = sft_config_from(get_config())
    cfg.sft.batch_size = 2
    mine = [{"tokens": [1, 2, 3], "mask": [0, 1, 1]}, {"tokens": [4, 5], "mask": [0, 1]}]
    theirs = SequenceBatches([mine[0], {"tokens": [4, 6], "mask": [0, 1]}], int(cfg.sft.batch_size), int(cfg.seed))
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(multihost, "gather_objects", lambda obj: [obj, {"SFT records": theirs.records_digest}])
    with pytest.raises(ValueError, match="the processes of this run hold different SFT records"):
        sft_trainer_from(cfg, None, "/nonexistent", graphdef="built", params={}, records=mine)  # no model read
