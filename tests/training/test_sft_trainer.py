"""SFT: the text-to-token mask (tool results are context) and a short training run."""

import itertools
import json

import jax
import numpy as np
import pytest

from aepo_jax.agent.protocol import format_tool_result
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


def test_well_formed_blocks_train_only_the_generated_text_and_eos():
    tok = ByteTokenizer()
    generated = ["<search>a</search>", "<python>1</python>", "<answer>\\boxed{1}</answer>"]
    results = ["\n<result>one</result>", " <result>\ntwo\n</result>"]
    response = generated[0] + results[0] + generated[1] + results[1] + generated[2]
    record = text_record_to_tokens([5], response, tok.encode, eos_id=tok.eos_id, where="data.jsonl:1")
    trained = [t for t, m in zip(record["tokens"], record["mask"]) if m == 1]
    assert trained == tok.encode("".join(generated)) + [tok.eos_id]
    # The context is the result blocks RL appends (`format_tool_result`), whatever whitespace the data wrote.
    context = tok.decode([t for t, m in zip(record["tokens"][1:], record["mask"][1:]) if m == 0])
    assert context == format_tool_result("one") + format_tool_result("two")


@pytest.mark.parametrize("response", [
    "<search>q</search> <result>\nfound (truncated, never closed)<answer>\\boxed{1}</answer>",
    "<search>q</search> <RESULT>\nfound\n</RESULT><answer>\\boxed{1}</answer>",
    "<search>q</search> <Result>found</result><answer>\\boxed{1}</answer>",
    "<search>q</search> found</result><answer>\\boxed{1}</answer>",
], ids=["unclosed", "upper_case", "mixed_case_open", "stray_close"])
def test_malformed_result_blocks_are_refused_naming_the_record(response):
    tok = ByteTokenizer()
    with pytest.raises(ValueError, match=r"^data\.jsonl:3: the response has a (?i:'</?result>') tag outside a "
                                         r"well-formed .*trained as model output"):
        text_record_to_tokens([5, 6], response, tok.encode, eos_id=tok.eos_id, where="data.jsonl:3")


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
    # The SFT run's curves: every panel drawn from keys it logged (3 of 4 read "not logged" before).
    from aepo_jax.training.metric_keys import SFT_PLOT_PANELS
    from launch.plot_metrics import panels_for, plot_run

    assert panels_for(lines) == SFT_PLOT_PANELS
    assert all(set(keys) <= set(lines[0]) for _, keys in SFT_PLOT_PANELS)
    assert plot_run(str(tmp_path)) == str(tmp_path / "curves.png")


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


def _token_records(n: int, offset: int = 0) -> list[dict]:
    return [{"tokens": [i + 1 + offset], "mask": np.ones(1, np.float32)} for i in range(n)]


def _ids(batch: list[dict]) -> list[int]:
    return [r["tokens"][0] for r in batch]


def test_sequence_batches_resume_from_every_step_continues_the_same_order():
    records = _token_records(11)
    reference = [_ids(b) for b in itertools.islice(SequenceBatches(records, 3, seed=4), 12)]
    for stop in range(12):
        first = SequenceBatches(records, 3, seed=4)
        for _ in range(stop):
            next(first)
        resumed = SequenceBatches(records, 3, seed=4)
        resumed.restore(json.loads(json.dumps(first.state())))  # as a checkpoint saves it
        assert [_ids(next(resumed)) for _ in range(12 - stop)] == reference[stop:]


@pytest.mark.parametrize(("other", "differs"), [
    (lambda recs: SequenceBatches(recs, 3, seed=5), r"seed 4 \(now 5\)"),
    (lambda recs: SequenceBatches(recs, 2, seed=4), r"batch_size 3 \(now 2\)"),
    (lambda recs: SequenceBatches(_token_records(11, offset=100), 3, seed=4), r"records_digest '[0-9a-f]+' \(now"),
], ids=["seed", "batch_size", "same_count_other_records"])
def test_sequence_batches_refuse_a_state_of_another_batch_order(other, differs):
    saved = SequenceBatches(_token_records(11), 3, seed=4)
    next(saved)
    with pytest.raises(ValueError, match=r"saved with another batch order: " + differs):
        other(_token_records(11)).restore(json.loads(json.dumps(saved.state())))


@pytest.mark.parametrize("position", [4, 99, -1])
def test_sequence_batches_refuse_a_position_outside_the_epoch(position):
    batches = SequenceBatches(_token_records(11), 3, seed=4)  # 3 steps per epoch
    state = {**batches.state(), "position": position}
    with pytest.raises(ValueError, match=rf"epoch=0, position={position} is out of range \(3 steps per epoch"):
        batches.restore(state)


def test_sequence_batches_restore_an_old_state_with_a_warning():
    records = _token_records(11)
    first = SequenceBatches(records, 3, seed=4)
    for _ in range(3):  # the end of epoch 0: the next batch starts epoch 1
        next(first)
    old = {k: v for k, v in first.state().items() if k in ("epoch", "position", "num_records")}
    resumed = SequenceBatches(records, 3, seed=4)
    with pytest.warns(UserWarning, match="no seed, batch_size, records_digest .*only its record count"):
        resumed.restore(old)
    assert _ids(next(resumed)) == _ids(next(first))


@pytest.mark.parametrize("keep", [0, -1])
def test_keeping_no_checkpoint_is_refused_when_the_trainer_is_built(tmp_path, keep):
    """keep=0 (orbax's max_to_keep=0) deleted every checkpoint, the one just saved too: the run ended with
    none and exit status 0."""
    cfg = get_config()
    cfg.checkpoint.keep = keep
    cfg.log.tensorboard = False
    graphdef, params = tiny_model()
    records = [{"tokens": [1, 2, 3], "mask": np.ones(3, np.float32)}] * 2
    with pytest.raises(ValueError, match=rf"checkpoint.keep={keep}: it is how many checkpoints are kept, at least 1"):
        SFTTrainer(cfg, str(tmp_path), batches=SequenceBatches(records, batch_size=2), graphdef=graphdef,
                   params=params)
    assert not (tmp_path / "checkpoints").exists()


@pytest.mark.parametrize("micro", [0, -2])
def test_a_micro_batch_below_one_row_is_refused_naming_the_key(tmp_path, micro):
    """SFT divided by it (train.micro_batch_size=0: a ZeroDivisionError while padding the first batch) or
    silently took one row per device (below 0); the RL trainer already refused it in these words."""
    cfg = get_config()
    cfg.train.micro_batch_size = micro
    cfg.log.tensorboard = False
    graphdef, params = tiny_model()
    records = [{"tokens": [1, 2, 3], "mask": np.ones(3, np.float32)}] * 2
    with pytest.raises(ValueError, match=rf"^train.micro_batch_size={micro}: a micro-batch \(the rows of one "
                                         r"forward/backward pass\) needs at least 1 row$"):
        SFTTrainer(cfg, str(tmp_path), batches=SequenceBatches(records, batch_size=2), graphdef=graphdef,
                   params=params)
    assert not (tmp_path / "checkpoints").exists()


def test_a_response_ending_in_the_eos_text_trains_eos_once():
    """A Hugging Face tokenizer encodes the EOS text (`<|im_end|>`) as the EOS id; it was appended again."""
    tok = ByteTokenizer()

    def encode(text: str) -> list[int]:  # as a tokenizer that knows the EOS text "</s>"
        return tok.encode(text.removesuffix("</s>")) + ([tok.eos_id] if text.endswith("</s>") else [])

    plain = text_record_to_tokens([5], "<answer>\\boxed{1}</answer>", encode, eos_id=tok.eos_id)
    ended = text_record_to_tokens([5], "<answer>\\boxed{1}</answer></s>", encode, eos_id=tok.eos_id)
    assert ended["tokens"] == plain["tokens"] and ended["tokens"][-2:] != [tok.eos_id] * 2
    np.testing.assert_array_equal(ended["mask"], plain["mask"])


def test_crlf_around_a_result_block_gives_the_context_rl_appends():
    tok = ByteTokenizer()
    lf = text_record_to_tokens([5], "<search>a</search> <result>\nfound\n</result><answer>1</answer>", tok.encode,
                               eos_id=tok.eos_id)
    crlf = text_record_to_tokens([5], "<search>a</search> <result>\r\nfound\r\n</result><answer>1</answer>",
                                 tok.encode, eos_id=tok.eos_id)
    assert crlf["tokens"] == lf["tokens"]
    np.testing.assert_array_equal(crlf["mask"], lf["mask"])
