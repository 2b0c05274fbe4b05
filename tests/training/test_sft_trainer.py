"""SFT: the text-to-token mask (tool results are context) and a short training run."""

import json

import jax
import numpy as np
import pytest

from aepo_jax.agent.scripted import ByteTokenizer
from aepo_jax.training.sft_trainer import (
    SequenceBatches,
    SFTTrainer,
    text_record_to_tokens,
)
from configs.aepo_tiny import get_config
from tests.training.fixtures import tiny_model


def test_result_blocks_are_masked_and_pieces_tokenised_separately():
    tok = ByteTokenizer()
    response = "<search>x</search> <result>\nfound\n</result>then<answer>\\boxed{1}</answer>"
    record = text_record_to_tokens([5, 6], response, tok.encode, eos_id=tok.eos_id)
    tokens, mask = record["tokens"], record["mask"]
    result_ids = tok.encode(" <result>\nfound\n</result>")
    start = 2 + len(tok.encode("<search>x</search>"))
    assert tokens[start:start + len(result_ids)] == result_ids
    assert mask[:2].tolist() == [0, 0]
    assert mask[start:start + len(result_ids)].tolist() == [0] * len(result_ids)
    assert mask[2:start].all() and mask[start + len(result_ids):].all()
    assert tokens[-1] == tok.eos_id
    assert tok.decode(tokens[2:-1]) == response


def test_sft_loss_falls_on_a_repeated_batch_and_checkpoints(tmp_path):
    rng = np.random.default_rng(0)
    records = []
    for _ in range(8):
        prompt = rng.integers(1, 64, 5).tolist()
        answer = [7, 8, 9, 10, 11, 12]  # the same continuation after every prompt: learnable
        records.append({"tokens": prompt + answer, "mask": np.array([0] * 5 + [1] * 6, np.float32)})
    cfg = get_config()
    cfg.train.total_steps = 6
    cfg.train.max_seq_len = 16
    cfg.train.length_bucket = 16
    cfg.optim.lr = 1e-2
    cfg.optim.warmup_steps = 0
    cfg.checkpoint.every = 3
    cfg.log.progress_bar = False
    cfg.log.tensorboard = False
    graphdef, params = tiny_model()
    trainer = SFTTrainer(cfg, str(tmp_path), batches=SequenceBatches(records, batch_size=8), graphdef=graphdef,
                         params=params)
    logged = trainer.train()
    trainer.close()
    losses = [r["loss"] for r in logged]
    assert losses[-1] < 0.5 * losses[0]
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2, 3, 4, 5, 6]
    assert {"nll", "token_accuracy", "learning_rate"} <= set(lines[0])
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["3", "6"]


def test_sft_resume_continues_exactly_with_the_batch_position(tmp_path):
    rng = np.random.default_rng(1)
    records = [{"tokens": rng.integers(1, 64, 9).tolist(), "mask": np.array([0] * 3 + [1] * 6, np.float32)}
               for _ in range(6)]
    cfg = get_config()
    cfg.train.total_steps = 4
    cfg.train.max_seq_len = 16
    cfg.train.length_bucket = 16
    cfg.checkpoint.every = 2
    cfg.log.progress_bar = False
    cfg.log.tensorboard = False

    def trainer(workdir):
        graphdef, params = tiny_model()
        # batch 4 of 6 records: the shuffle order, hence the data position, matters
        return SFTTrainer(cfg, str(workdir), batches=SequenceBatches(records, batch_size=4, seed=3),
                          graphdef=graphdef, params=params)

    full = trainer(tmp_path / "full")
    full.train()
    full.close()
    part = trainer(tmp_path / "part")
    part.train(num_steps=2)
    part.close()
    resumed = trainer(tmp_path / "part")
    assert resumed.restore_latest() and int(resumed.state.rounds) == 2
    assert resumed.batches.state() == part.batches.state()
    resumed.train()
    resumed.close()
    for a, b in zip(jax.tree.leaves(resumed.state.params), jax.tree.leaves(full.state.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_sequence_batches_reject_bad_sizes():
    records = [{"tokens": [1, 2], "mask": np.ones(2, np.float32)}] * 3
    with pytest.raises(ValueError, match="batch_size must be >= 1, got 0"):
        SequenceBatches(records, batch_size=0)
    with pytest.raises(ValueError, match="3 SFT records are fewer than one batch of 4"):
        SequenceBatches(records, batch_size=4)


def test_records_longer_than_max_seq_len_are_refused_naming_the_key(tmp_path):
    records = [{"tokens": list(range(1, 10)), "mask": np.ones(9, np.float32)},
               {"tokens": list(range(1, 30)), "mask": np.ones(29, np.float32)}]
    cfg = get_config()
    cfg.train.max_seq_len = 16
    graphdef, params = tiny_model()
    with pytest.raises(ValueError, match=r"1 of 2 SFT records are longer than train.max_seq_len=16 \(longest 29"):
        SFTTrainer(cfg, str(tmp_path), batches=SequenceBatches(records, batch_size=2), graphdef=graphdef,
                   params=params)
