"""The files a run starts from (RUN_DIR/sources.json): a resume may read them from another path, never
other contents (`aepo_jax.run_sources`, `launch.resume_check.check_run_sources`)."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
from safetensors.numpy import save_file

from aepo_jax.file_digests import (
    SAMPLE_BLOCKS,
    SAMPLE_BYTES,
    file_digest,
    sampled_file_digest,
)
from aepo_jax.run_sources import SOURCES_FILE, run_source_paths
from configs.aepo_tiny import get_config
from launch.resume_check import check_run_sources
from launch.run_setup import prepare_workdir


def _checkpoint(folder, seed: int = 0, rows: int = 8):
    """A Hugging Face style folder: config.json, one safetensors file, and files that may change freely."""
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(seed)
    save_file({"model.embed_tokens.weight": rng.standard_normal((rows, 4)).astype(np.float32)},
              os.path.join(folder, "model.safetensors"))
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"model_type": "qwen2", "vocab_size": rows}, f)
    with open(os.path.join(folder, "README.md"), "w") as f:
        f.write("a model card\n")
    return str(folder)


def _config(checkpoint_dir=None, data_path=None, corpus_path=None):
    cfg = get_config()
    if checkpoint_dir:
        cfg.model.checkpoint_dir = checkpoint_dir
    if data_path:
        cfg.data.path = data_path
    if corpus_path:
        cfg.data.corpus_path = corpus_path
    return cfg


def _started_run(run_dir, cfg):
    """A workdir as a fresh start leaves it, with one complete checkpoint step (resumable)."""
    prepare_workdir(cfg, str(run_dir), resume=False)
    step = run_dir / "checkpoints" / "1"
    step.mkdir(parents=True)
    (step / "commit_success.txt").write_text("done")


def test_a_fresh_start_fingerprints_the_checkpoint_folders_config_and_weights(tmp_path):
    ckpt = _checkpoint(tmp_path / "Qwen")
    _started_run(tmp_path / "run", _config(ckpt))
    saved = json.loads((tmp_path / "run" / SOURCES_FILE).read_text())
    assert saved == {"model.checkpoint_dir": {
        "config.json": file_digest(os.path.join(ckpt, "config.json"), 16),
        "model.safetensors": file_digest(os.path.join(ckpt, "model.safetensors"), 16)}}  # README.md: not read


def test_the_same_checkpoint_at_another_path_resumes_and_other_weights_are_refused(tmp_path, capsys):
    """`model.checkpoint_dir` may change on resume (a bucket mounted elsewhere); a folder of other weights
    behind it (a fine-tune of the same shapes) went through unchecked and changed the reference model."""
    _started_run(tmp_path / "run", _config(_checkpoint(tmp_path / "a")))
    moved = shutil.copytree(tmp_path / "a", tmp_path / "mnt" / "a")
    (tmp_path / "mnt" / "a" / "README.md").write_text("edited card\n")
    prepare_workdir(_config(str(moved)), str(tmp_path / "run"), resume=True)
    other = _checkpoint(tmp_path / "b", seed=1)
    with pytest.raises(SystemExit, match=r"model.checkpoint_dir: other contents in \['model.safetensors'\]"):
        prepare_workdir(_config(other), str(tmp_path / "run"), resume=True)
    grown = _checkpoint(tmp_path / "c", rows=12)
    with pytest.raises(SystemExit, match=r"other contents in \['config.json', 'model.safetensors'\]"):
        check_run_sources(str(tmp_path / "run"), _config(grown), allow_changes=False)
    sharded = shutil.copytree(tmp_path / "a", tmp_path / "d")
    save_file({"lm_head.weight": np.zeros((8, 4), np.float32)}, os.path.join(sharded, "model-2.safetensors"))
    with pytest.raises(SystemExit, match=r"new files \['model-2.safetensors'\]"):
        check_run_sources(str(tmp_path / "run"), _config(str(sharded)), allow_changes=False)
    capsys.readouterr()


def test_accepted_changes_replace_the_fingerprints_and_keep_the_old_ones(tmp_path, capsys):
    run_dir = tmp_path / "run"
    _started_run(run_dir, _config(_checkpoint(tmp_path / "a")))
    before = (run_dir / SOURCES_FILE).read_text()
    other = _config(_checkpoint(tmp_path / "b", seed=1))
    assert check_run_sources(str(run_dir), other, allow_changes=True) == [
        "model.checkpoint_dir: other contents in ['model.safetensors']"]
    assert "other source files accepted" in capsys.readouterr().out
    kept = [name for name in os.listdir(run_dir) if name.startswith("sources.before-resume-")]
    assert len(kept) == 1 and (run_dir / kept[0]).read_text() == before
    assert check_run_sources(str(run_dir), other, allow_changes=False) == []  # the new ones are the run's now


def test_a_changed_questions_file_or_corpus_is_refused_and_an_unread_one_is_not_checked(tmp_path):
    data, corpus = tmp_path / "train.jsonl", tmp_path / "corpus.jsonl"
    data.write_text('{"question": "q", "answer": "a"}\n')
    corpus.write_text('{"id": "1", "contents": "Paris is in France"}\n')
    run_dir = tmp_path / "run"
    _started_run(run_dir, _config(data_path=str(data), corpus_path=str(corpus)))
    corpus.write_text('{"id": "1", "contents": "Paris is in Texas"}\n')
    with pytest.raises(SystemExit, match=r"data.corpus_path: other contents in \['corpus.jsonl'\]"):
        check_run_sources(str(run_dir), _config(data_path=str(data), corpus_path=str(corpus)), allow_changes=False)
    with pytest.raises(SystemExit, match=r"data.corpus_path: the run read \['corpus.jsonl'\]; this resume reads no"):
        check_run_sources(str(run_dir), _config(data_path=str(data)), allow_changes=False)
    demo = _config(data_path=str(data), corpus_path=str(corpus))
    demo.env = {"task": "towns"}  # a generated task reads neither file
    assert run_source_paths(demo) == {}


def test_a_source_whose_path_is_missing_now_is_left_to_its_reader_and_an_old_run_gets_the_file(tmp_path):
    run_dir = tmp_path / "run"
    _started_run(run_dir, _config(_checkpoint(tmp_path / "a")))
    assert check_run_sources(str(run_dir), _config(str(tmp_path / "gone")), allow_changes=False) == []
    os.remove(run_dir / SOURCES_FILE)  # a run saved before sources.json existed
    assert check_run_sources(str(run_dir), _config(str(tmp_path / "a")), allow_changes=False) == []
    assert "model.checkpoint_dir" in json.loads((run_dir / SOURCES_FILE).read_text())


def test_a_sampled_digest_reads_spread_blocks_of_a_large_file(tmp_path):
    """Each sampled block (first, middle, last) and the size count; a byte between blocks does not, the
    documented limit of reading about 1 MiB of a many-GB shard. A small file is digested whole."""
    size = SAMPLE_BLOCKS * SAMPLE_BYTES * 4
    path = tmp_path / "shard.safetensors"
    original = np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8).tobytes()
    path.write_bytes(original)
    reference = sampled_file_digest(path)
    step = (size - SAMPLE_BYTES) // (SAMPLE_BLOCKS - 1)

    def digest_with(offset: int) -> str:
        changed = bytearray(original)
        changed[offset] ^= 0xFF
        path.write_bytes(bytes(changed))
        return sampled_file_digest(path)

    for offset in (0, 7 * step + 5, size - 1):
        assert digest_with(offset) != reference, offset
    assert digest_with(step - 1) == reference  # between block 0 and block 1
    path.write_bytes(original + b"\0")
    assert sampled_file_digest(path) != reference
    small = tmp_path / "config.json"
    small.write_text("{}")
    assert sampled_file_digest(small) == file_digest(small, 16)
