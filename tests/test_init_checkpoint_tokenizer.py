"""A run that starts from another run's checkpoint (`model.init_checkpoint`) reads its ids with that run's
tokenizer: a SentencePiece trained anew from this run's texts gave other ids to the same vocabulary size,
and the weights loaded without complaint (found by a review: 12 of 39 ids differed with another seed)."""

import json
import os

import pytest

from aepo_jax.experiment_tokenizer import tokenizer_from
from aepo_jax.tokenizers import train_sentencepiece
from configs.aepo_tiny import get_config

TEXTS_A = ["the river town of Ashford lies north of the hills", "print(6 * 7)", "search the answer"] * 30
TEXTS_B = ["a harbour city with seven bridges and a market", "who founded the old mill?", "x = 1 + 2"] * 30


def _ids(tokenizer) -> list[list[int]]:
    return [tokenizer.encode(text) for text in TEXTS_A[:3] + TEXTS_B[:3]]


def _init_run(tmp_path, texts=TEXTS_A, trained=True):
    """A run directory as the trainer leaves it: config.json, checkpoints/<step>, and its tokenizer.model
    when it trained one."""
    run = tmp_path / "sft_run"
    (run / "checkpoints" / "2" / "state").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"tokenizer": {"kind": "", "path": "", "agent_tags": "special"}}))
    if trained:
        train_sentencepiece(texts, 300, model_prefix=str(run / "tokenizer"))
    return run


def _config(init_run, path=""):
    cfg = get_config()
    cfg.model.init_checkpoint = str(init_run)
    cfg.tokenizer.path = path
    cfg.tokenizer.vocab_size = 300
    return cfg


def test_a_fresh_run_takes_the_init_runs_sentencepiece_instead_of_training_one(tmp_path):
    run = _init_run(tmp_path)
    workdir = tmp_path / "rl"
    tokenizer = tokenizer_from(_config(run), str(workdir), texts=lambda: TEXTS_B)
    trained_here = train_sentencepiece(TEXTS_B, 300, model_prefix=str(tmp_path / "other"))
    assert _ids(trained_here) != _ids(tokenizer)  # the case is real
    assert (workdir / "tokenizer.model").read_bytes() == (run / "tokenizer.model").read_bytes()
    reference = tokenizer_from(get_config(), str(run), texts=lambda: TEXTS_A)  # the init run's own
    assert _ids(tokenizer) == _ids(reference)


def test_a_tokenizer_path_that_differs_from_the_init_runs_is_refused(tmp_path):
    run = _init_run(tmp_path)
    other = train_sentencepiece(TEXTS_B, 300, model_prefix=str(tmp_path / "other"))
    assert other.vocab_size == 300
    with pytest.raises(ValueError, match=r"differs from the one of model.init_checkpoint's run .*\(pieces differ\)"):
        tokenizer_from(_config(run, path=str(tmp_path / "other.model")), str(tmp_path / "rl"), texts=list)
    # the same file under another path is the same tokenizer
    assert tokenizer_from(_config(run, path=str(run / "tokenizer.model")), str(tmp_path / "rl2"), texts=list)


def test_an_init_run_without_a_trained_tokenizer_needs_tokenizer_path(tmp_path):
    run = _init_run(tmp_path, trained=False)
    with pytest.raises(ValueError, match=r"has no tokenizer.model: set tokenizer.path"):
        tokenizer_from(_config(run), str(tmp_path / "rl"), texts=lambda: TEXTS_B)
    assert not os.path.exists(tmp_path / "rl" / "tokenizer.model")  # nothing trained anew


def test_a_resumed_run_given_another_tokenizer_file_is_refused(tmp_path):
    """`tokenizer.path` may change on --resume (a bucket mounted elsewhere), but another tokenizer went
    through with only "config changes accepted: ['tokenizer.path']": the run's embeddings then trained on
    other ids for the same text (found by a review)."""
    run = _init_run(tmp_path)  # checkpoints/2 and the tokenizer.model the run trained
    (run / "checkpoints" / "2" / "commit_success.txt").write_text("done")  # step 2 complete
    train_sentencepiece(TEXTS_B, 300, model_prefix=str(tmp_path / "other"))
    cfg = get_config()
    cfg.tokenizer.vocab_size = 300
    cfg.tokenizer.path = str(tmp_path / "other.model")
    with pytest.raises(ValueError, match=r"differs from the one of the resumed run .*\(pieces differ\)"):
        tokenizer_from(cfg, str(run), texts=list)
    cfg.tokenizer.path = str(tmp_path / "copy.model")  # the same tokenizer under another path
    (tmp_path / "copy.model").write_bytes((run / "tokenizer.model").read_bytes())
    assert tokenizer_from(cfg, str(run), texts=list).vocab_size == 300
