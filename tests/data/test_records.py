"""Row layouts -> examples, and the errors that name the file and line."""

import json

import pytest

from aepo_jax.data.records import (
    DatasetFormatError,
    decode_example,
    detect_layout,
    example_from_row,
    read_examples,
)


def write_jsonl(path, rows):
    path.write_text(
        "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)
    )
    return path


def test_arpo_layouts(tmp_path):
    rows = [
        {"question": "Who wrote X?", "answer": "Ann", "data_source": "hotpotqa"},
        {"prompt": "Capital of Y?", "answer": ["Zed", "Zed City"]},
        {
            "prompt": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "2+2?"},
            ],
            "reward_model": {"ground_truth": {"target": ["4"]}, "style": "rule"},
            "data_source": "math",
            "extra_info": {"index": 7},
        },
        {"question": "n?", "golden_answers": [1, 2], "id": "abc"},
    ]
    examples = read_examples(write_jsonl(tmp_path / "arpo.jsonl", rows), layout="arpo")
    assert examples[0] == {
        "id": "arpo-1",
        "question": "Who wrote X?",
        "answers": ["Ann"],
        "data_source": "hotpotqa",
    }
    assert (
        examples[1]["answers"] == ["Zed", "Zed City"]
        and examples[1]["data_source"] == "arpo"
    )
    assert examples[2] == {
        "id": "7",
        "question": "2+2?",
        "answers": ["4"],
        "data_source": "math",
    }
    assert examples[3]["id"] == "abc" and examples[3]["answers"] == ["1", "2"]


def test_gsm8k_math_and_multihop_layouts(tmp_path):
    rows = [
        {"question": "How many?", "answer": "3 + 4 = 7\nSo 1,007 in all.\n#### 1,007"},
        {
            "problem": "Half of one?",
            "solution": "It is $\\boxed{\\frac{1}{\\sqrt{4}}}$.",
        },
        {
            "question": "Where?",
            "answer": "Paris",
            "aliases": ["Paris, France", "Paris"],
        },
    ]
    examples = read_examples(
        write_jsonl(tmp_path / "mixed.jsonl", rows), data_source="mix"
    )
    assert examples[0]["answers"] == ["1007"]
    assert examples[1]["answers"] == [
        "\\frac{1}{\\sqrt{4}}"
    ]  # nested braces kept whole
    assert examples[2]["answers"] == ["Paris", "Paris, France"]
    assert {e["data_source"] for e in examples} == {"mix"}
    assert [detect_layout(r) for r in rows] == ["gsm8k", "math", "multihop"]


GOOD_ROW = {
    "arpo": {"question": "ok", "answer": "a"},
    "gsm8k": {"question": "ok", "answer": "#### 1"},
    "math": {"problem": "ok", "solution": "\\boxed{1}"},
    "multihop": {"question": "ok", "answer": "a"},
}


@pytest.mark.parametrize(
    ("row", "layout", "message"),
    [
        ({"question": "q"}, "arpo", "none of the fields"),
        ({"question": "q", "answer": "no marker"}, "gsm8k", "#### N"),
        ({"problem": "p", "solution": "no box"}, "math", "boxed"),
        ({"question": "", "answer": "a"}, "arpo", "empty question"),
        ({"question": "q", "answer": []}, "arpo", "non-empty list"),
        ({"question": "q", "answer": "  "}, "arpo", "blank"),
        ({"question": "q", "answer": ["Paris", ""]}, "arpo", "blank"),
        ({"question": "q", "answer": "a", "aliases": [" "]}, "multihop", "blank"),
        ({"problem": "p", "solution": "\\boxed{ }"}, "math", "blank"),
    ],
)
def test_bad_row_names_the_line(tmp_path, row, layout, message):
    path = write_jsonl(tmp_path / "bad.jsonl", [GOOD_ROW[layout], "", row])
    with pytest.raises(DatasetFormatError, match=f"bad.jsonl:3: .*{message}"):
        read_examples(path, layout=layout)


def test_bad_json_and_missing_file(tmp_path):
    path = write_jsonl(
        tmp_path / "broken.jsonl", [{"question": "q", "answer": "a"}, "{not json"]
    )
    with pytest.raises(DatasetFormatError, match="broken.jsonl:2: not valid JSON"):
        read_examples(path)
    with pytest.raises(FileNotFoundError, match="nowhere.jsonl"):
        read_examples(tmp_path / "nowhere.jsonl")
    with pytest.raises(IsADirectoryError, match="is a directory; pass one JSONL or parquet file"):
        read_examples(tmp_path)
    with pytest.raises(ValueError, match="unknown dataset layout"):
        example_from_row(
            {"question": "q", "answer": "a"}, layout="csv", data_source="x", where="w"
        )


def test_parquet_file(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    table = pa.table(
        {"question": ["a?", "b?"], "answer": ["1", "2"], "data_source": ["s", "s"]}
    )
    pq.write_table(table, tmp_path / "qa.parquet")
    examples = read_examples(tmp_path / "qa.parquet")
    assert [e["answers"] for e in examples] == [["1"], ["2"]]


def test_decode_example_turns_bytes_into_str():
    import numpy as np

    raw = {
        "id": b"1",
        "question": "caf\u00e9".encode(),
        "answers": np.array([b"x", b"y"]),
        "data_source": b"s",
    }
    assert decode_example(raw) == {
        "id": "1",
        "question": "caf\u00e9",
        "answers": ["x", "y"],
        "data_source": "s",
    }
