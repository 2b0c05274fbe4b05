"""SFT text records from `sft.path`: every unreadable row is refused naming path:line."""

import json
from types import SimpleNamespace

import ml_collections
import numpy as np
import pytest

from aepo_jax.agent.scripted import ByteTokenizer
from aepo_jax.experiment_sft import sft_records_from

GOOD = json.dumps({"question": "q1", "response": "<search>a</search> <result>b</result><answer>1</answer>"})


def _env(max_prompt_len: int = 100) -> SimpleNamespace:
    tok = ByteTokenizer()

    def encode_prompt(row: dict) -> list[int]:
        ids = tok.encode(row["question"])
        if len(ids) > max_prompt_len:
            raise ValueError(f"example {row.get('id')}: prompt has {len(ids)} tokens > max {max_prompt_len}")
        return ids

    return SimpleNamespace(tokenizer=tok, task=None, encode_prompt=encode_prompt)


def _read(tmp_path, content: str | bytes, env: SimpleNamespace | None = None) -> list[dict]:
    path = tmp_path / "sft.jsonl"
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return sft_records_from(ml_collections.ConfigDict({"sft": {"path": str(path)}}), env or _env())


def test_good_rows_become_token_records_with_result_blocks_masked(tmp_path):
    records = _read(tmp_path, GOOD + "\n\n" + GOOD + "\n")
    tok = ByteTokenizer()
    assert len(records) == 2
    trained = [t for t, m in zip(records[0]["tokens"], records[0]["mask"]) if m == 1]
    assert trained == tok.encode("<search>a</search><answer>1</answer>") + [tok.eos_id]
    assert records[0]["mask"].dtype == np.float32


@pytest.mark.parametrize(("content", "message"), [
    (GOOD + "\n" + json.dumps({"question": "q", "answer": "x"}) + "\n",
     r":2: no 'response' field; an SFT row is .*this one has \['answer', 'question'\]"),
    (json.dumps({"prompt": "q", "response": "r"}) + "\n", r":1: no 'question' field"),
    (json.dumps({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}) + "\n",
     r":1: no 'question' field \(a chat `messages` row is not read"),
    (GOOD + "\n" + json.dumps({"question": "q", "response": " \n"}) + "\n", r":2: 'response' is blank"),
    (json.dumps({"question": "", "response": "r"}) + "\n", r":1: 'question' is blank"),
    (json.dumps({"question": "q", "response": ["r"]}) + "\n", r":1: 'response' must be a string, got list"),
    (GOOD + "\n{oops\n", r":2: not valid JSON \(Expecting property name"),
    (GOOD.encode() + b"\n" + b'{"question": "caf\xe9", "response": "r"}\n', r":2: not valid UTF-8 \(byte 0xe9"),
    ("[1, 2]\n", r":1: expected a JSON object, got list"),
    ("\n  \n", r": no SFT rows"),
    (json.dumps({"question": "q", "response": "<search>a</search> <RESULT>b</RESULT>"}) + "\n",
     r":1: the response has a '<RESULT>' tag outside a well-formed"),
], ids=["no_response", "no_question", "chat_messages", "blank_response", "blank_question", "not_a_string",
        "bad_json", "not_utf8", "not_an_object", "empty_file", "mis_cased_result"])
def test_bad_rows_are_refused_naming_path_and_line(tmp_path, content, message):
    with pytest.raises(ValueError, match=r"sft\.jsonl" + message):
        _read(tmp_path, content)


def test_a_prompt_error_names_path_and_line(tmp_path):
    with pytest.raises(ValueError, match=r"sft\.jsonl:2: example None: prompt has 5 tokens > max 3"):
        _read(tmp_path, json.dumps({"question": "q", "response": "r"}) + "\n" + json.dumps(
            {"question": "12345", "response": "r"}) + "\n", _env(max_prompt_len=3))
