"""Build a tfds dataset from local files, then read it back in a fresh process."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from aepo_jax.data import records
from aepo_jax.data.demo_datasets import DEMO_DIR
from aepo_jax.data.records import DatasetFormatError, read_examples
from aepo_jax.data.tfds_builder import (
    LocalQaDataset,
    load_local_examples,
    load_prepared,
    prepare_local_dataset,
    prepared_name,
)

READ_BACK = """
import json, sys
from aepo_jax.data.tfds_builder import load_prepared
print(json.dumps({split: load_prepared(sys.argv[1], split) for split in ("train", "test")}))
"""


def by_id(examples):
    return sorted(examples, key=lambda e: e["id"])


def test_build_then_read_back_in_a_fresh_process(tmp_path):
    splits = {
        "train": DEMO_DIR / "arithmetic.jsonl",
        "test": DEMO_DIR / "fractions.jsonl",
    }
    builder = prepare_local_dataset("demo_math", splits, tmp_path / "tfds")
    result = subprocess.run(
        [sys.executable, "-c", READ_BACK, str(builder.data_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    read_back = json.loads(result.stdout.strip().splitlines()[-1])
    for split, path in splits.items():
        expected = read_examples(path)
        assert len(read_back[split]) == len(expected)
        assert by_id(read_back[split]) == by_id(expected)
    # Preparing again reuses the files on disk.
    again = prepare_local_dataset("demo_math", splits, tmp_path / "tfds")
    assert by_id(load_prepared(again.data_path, "test")) == by_id(
        read_examples(splits["test"])
    )


def test_missing_source_file_and_bad_row(tmp_path):
    with pytest.raises(FileNotFoundError, match="split 'train'.*nowhere.jsonl"):
        prepare_local_dataset(
            "x", {"train": tmp_path / "nowhere.jsonl"}, tmp_path / "tfds"
        )
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        json.dumps({"question": "q", "answer": "a"})
        + "\n"
        + json.dumps({"question": "q"})
        + "\n"
    )
    with pytest.raises(DatasetFormatError, match="bad.jsonl:2"):
        prepare_local_dataset("bad", {"train": bad}, tmp_path / "tfds")
    with pytest.raises(FileNotFoundError, match="dataset_info.json"):
        load_prepared(Path(tmp_path / "tfds" / "nothing"))


def test_load_local_examples_one_call(tmp_path):
    examples = load_local_examples(
        DEMO_DIR / "multihop_qa.jsonl", tmp_path / "tfds", layout="multihop"
    )
    assert by_id(examples) == by_id(
        read_examples(DEMO_DIR / "multihop_qa.jsonl", layout="multihop")
    )
    assert (
        tmp_path
        / "tfds"
        / "local_qa_dataset"
        / prepared_name(DEMO_DIR / "multihop_qa.jsonl", "multihop_qa", layout="multihop", data_source="multihop_qa")
        / str(LocalQaDataset.VERSION)
        / "dataset_info.json"
    ).is_file()


def test_an_edited_data_file_is_prepared_again_not_read_from_the_old_copy(tmp_path):
    source = tmp_path / "v1" / "train.jsonl"
    source.parent.mkdir()
    rows = [{"id": f"q{i}", "question": f"q{i}?", "answer": f"old{i}"} for i in range(3)]
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert sorted(e["answers"][0] for e in load_local_examples(source, tmp_path / "tfds")) == ["old0", "old1", "old2"]
    source.write_text("".join(json.dumps({**r, "answer": r["answer"].replace("old", "new")}) + "\n" for r in rows))
    assert sorted(e["answers"][0] for e in load_local_examples(source, tmp_path / "tfds")) == ["new0", "new1", "new2"]
    other = tmp_path / "v2" / "train.jsonl"  # another file of the same name
    other.parent.mkdir()
    other.write_text(json.dumps({"id": "z", "question": "z?", "answer": "zed"}) + "\n")
    assert [e["answers"] for e in load_local_examples(other, tmp_path / "tfds")] == [["zed"]]
    assert {e["data_source"] for e in load_local_examples(other, tmp_path / "tfds")} == {"train"}  # the stem


def test_examples_come_back_in_file_order(tmp_path):
    """tfds shuffles a built dataset by hashed key unless told not to: `--max_questions N` read a
    hash-chosen N, and `data.shuffle=False` did not keep the file's order."""
    source = tmp_path / "ordered.jsonl"
    ids = [f"q-{i:03d}" for i in range(60)]
    source.write_text("".join(json.dumps({"id": i, "question": f"question {i}", "answer": "a"}) + "\n" for i in ids))
    assert [e["id"] for e in load_local_examples(source, tmp_path / "tfds")] == ids


def test_an_empty_file_is_refused_naming_it_before_tfds_sees_it(tmp_path):
    """tfds' own error ("No examples were yielded") names no file."""
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n  \n")
    with pytest.raises(ValueError, match="split 'train' has no rows: .*empty.jsonl"):
        load_local_examples(empty, tmp_path / "tfds")
    assert not (tmp_path / "tfds").exists()  # refused before the builder was made


def test_layout_data_source_and_parser_version_are_part_of_the_prepared_copy(tmp_path, monkeypatch):
    """The copy was named by the file alone: a second call with another layout read rows parsed before."""
    source = tmp_path / "g.jsonl"
    source.write_text(json.dumps({"question": "q", "answer": "steps\n#### 42"}) + "\n")
    data_dir = tmp_path / "tfds"
    assert load_local_examples(source, data_dir, layout="arpo")[0]["answers"] == ["steps\n#### 42"]
    assert load_local_examples(source, data_dir, layout="gsm8k")[0]["answers"] == ["42"]
    assert load_local_examples(source, data_dir, data_source="x")[0]["data_source"] == "x"
    name = prepared_name(source, "g", layout="gsm8k", data_source="g")
    monkeypatch.setattr(records, "PARSER_VERSION", records.PARSER_VERSION + 1)
    assert prepared_name(source, "g", layout="gsm8k", data_source="g") != name


def test_auto_layout_says_when_one_file_reads_as_several_and_a_set_layout_refuses_the_odd_row(tmp_path):
    """A GSM8K row that lost its `#### N` line was read as an "arpo" row whose gold answer is the whole
    solution (no response can match it), with no word; training could not ask for the strict layout."""
    path = tmp_path / "gsm.jsonl"
    path.write_text(json.dumps({"question": "2+3?", "answer": "2+3=5\n#### 5"}) + "\n"
                    + json.dumps({"question": "4+4?", "answer": "4+4=8\n8"}) + "\n")
    with pytest.warns(UserWarning, match=r"gsm.jsonl: layout 'auto' read its rows as several layouts "
                                         r"\(arpo: 1 rows \(first at line 2\), gsm8k: 1 rows"):
        examples = load_local_examples(path, tmp_path / "tfds")
    assert [e["answers"] for e in examples] == [["5"], ["4+4=8\n8"]]
    with pytest.raises(DatasetFormatError, match=r"gsm.jsonl:2: row does not fit the 'gsm8k' layout"):
        load_local_examples(path, tmp_path / "tfds", layout="gsm8k")


def test_the_run_reads_data_path_in_the_configs_layout(tmp_path):
    from aepo_jax.experiment import environment_from
    from configs.aepo_tiny import get_config

    path = tmp_path / "gsm.jsonl"
    path.write_text(json.dumps({"question": "4+4?", "answer": "4+4=8\n8"}) + "\n")
    cfg = get_config()
    cfg.data.path, cfg.data.layout = str(path), "gsm8k"
    with pytest.raises(DatasetFormatError, match=r"gsm.jsonl:1: row does not fit the 'gsm8k' layout"):
        environment_from(cfg, str(tmp_path / "run"))
