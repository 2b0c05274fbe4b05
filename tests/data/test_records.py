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
        # another role's text was taken for the question
        ({"prompt": [{"role": "system", "content": "Be brief."}], "answer": "4"}, "arpo", "no user message"),
        # tfds failed on it naming no file or line
        ({"question": "bad \ud800 half", "answer": "4"}, "arpo", "lone surrogate code point \\(U\\+D800"),
        ({"question": "q", "answer": ["4", "x\udfff"]}, "arpo", "lone surrogate code point \\(U\\+DFFF"),
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


def row_example(row, layout="auto"):
    return example_from_row(row, layout=layout, data_source="s", where="f.jsonl:7")


def test_chat_content_parts_give_their_text_not_the_list_repr():
    """verl/OpenAI rows carry `content` as parts; the question was the Python repr of the list."""
    row = {
        "prompt": [
            {"role": "system", "content": [{"type": "text", "text": "be brief"}]},
            {"role": "user", "content": [{"type": "text", "text": "What is 2+2?"},
                                         {"type": "text", "text": "Answer in digits."}]},
        ],
        "reward_model": {"ground_truth": "4"},
    }
    assert row_example(row)["question"] == "What is 2+2?\nAnswer in digits."
    image = {"type": "image_url", "image_url": {"url": "x.png"}}
    row["prompt"][1]["content"].append(image)
    with pytest.raises(DatasetFormatError, match="f.jsonl:7: .*content part of type 'image_url'"):
        row_example(row)


def test_gsm8k_gold_is_the_last_marker_line():
    """`a #### 3\\n#### 5` gave the gold `3\\n#### 5`: the final `####` line is the answer."""
    assert row_example({"question": "q", "answer": "a #### 3\n#### 5"})["answers"] == ["5"]
    assert row_example({"question": "q", "answer": "a #### 3\nmore\n#### 1,005\n"})["answers"] == ["1005"]
    with pytest.raises(DatasetFormatError, match="#### N"):
        row_example({"question": "q", "answer": "a\n#### "}, layout="gsm8k")


def test_null_math_answer_counts_as_absent_and_the_error_says_null(tmp_path):
    """A parquet file with an `answer` column writes null for MATH rows without one."""
    row = {"problem": "p", "solution": "so \\boxed{5}", "answer": None}
    assert detect_layout(row) == "math"
    assert row_example(row)["answers"] == ["5"]
    with pytest.raises(DatasetFormatError, match=r"none of the fields .*\['answer'\] present but null"):
        row_example({"question": "q", "answer": None}, layout="arpo")
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([{"problem": "p1", "solution": "\\boxed{1}", "answer": "1"},
                                         {"problem": "p2", "solution": "\\boxed{2}", "answer": None}]),
                   tmp_path / "math.parquet")
    assert [e["answers"] for e in read_examples(tmp_path / "math.parquet")] == [["1"], ["2"]]


def test_a_non_utf8_byte_names_the_file_and_line(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"question": "q", "answer": "a"}\n\n{"question": "caf\xe9", "answer": "x"}\n')
    with pytest.raises(DatasetFormatError, match="latin1.jsonl:3: not valid UTF-8 .*0xe9"):
        read_examples(path)


def test_numeric_gold_answers_are_written_as_a_response_writes_them(tmp_path):
    """A JSON 72.0 became the gold "72.0", which the answer "72" scores F1 0 against."""
    from aepo_jax.data import records
    from aepo_jax.rewards.qa import token_f1

    rows = [
        {"question": "q", "answer": 72.0},
        {"question": "q", "answers": [72.0, 1e3, -0.0, 7]},
        {"question": "q", "reward_model": {"ground_truth": {"target": [2.5, 0.1, 1e-07]}}},
    ]
    examples = read_examples(write_jsonl(tmp_path / "numbers.jsonl", rows), layout="arpo")
    assert [e["answers"] for e in examples] == [["72"], ["72", "1000", "0", "7"], ["2.5", "0.1", "1e-07"]]
    assert token_f1("72", examples[0]["answers"]) == 1.0
    # the parse changed: tfds copies prepared by the old parser (keyed on the version) are not reused
    assert records.PARSER_VERSION >= 3


@pytest.mark.parametrize("answer", [True, [True], ["yes", False], {"target": [1, True]}])
def test_a_bool_gold_answer_is_refused_alone_or_in_a_list(answer):
    """A lone bool was refused but one inside a list became "True"/"False", which no "yes"/"no" answer matches."""
    with pytest.raises(DatasetFormatError, match=r"f.jsonl:7: .*gold answer is a bool \((True|False)\)"):
        row_example({"question": "q", "answer": answer}, layout="arpo")


@pytest.mark.parametrize("answer", [float("nan"), [1.0, float("inf")]])
def test_a_non_finite_gold_answer_is_refused(answer):
    """pandas writes NaN for a missing number; "nan" as a gold answer would match only the text "nan"."""
    with pytest.raises(DatasetFormatError, match="f.jsonl:7: .*gold answer is the float (nan|inf)"):
        row_example({"question": "q", "answer": answer}, layout="arpo")
