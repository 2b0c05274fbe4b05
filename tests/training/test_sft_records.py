"""SFT text records from `sft.path`: every unreadable row is refused naming path:line, and every record is
the sequence RL builds (tool results as `format_tool_result`, a thinking template's `<think>` not doubled)."""

import json
from types import SimpleNamespace

import ml_collections
import numpy as np
import pytest

from aepo_jax.agent.prompts import render_prompt, response_text
from aepo_jax.agent.protocol import format_tool_result, validate_format
from aepo_jax.agent.scripted import ByteTokenizer, ChatByteTokenizer
from aepo_jax.experiment_sft import sft_records_from
from aepo_jax.tokenizers import CHATML, chat_format_from_template
from tests.qwen_vocabulary_files import THINKING_CHATML_JINJA

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
    (json.dumps({"question": "q", "response": "<search>capital of France</search>\n<information>Doc 1: Paris is "
                 "the capital.</information>\n<answer>\\boxed{Paris}</answer>"}) + "\n",
     (r":1: the tool call '<search>capital of France</search>' is followed by '\\n<information>Doc 1: .* instead "
      r"of its <result>...</result> block; .*trained as model output")),
    (json.dumps({"question": "q", "response": "<python>print(6 * 7)</python>42\n<answer>\\boxed{42}</answer>"}) + "\n",
     r":1: the tool call '<python>print\(6 \* 7\)</python>' is followed by '42\\n<answer>"),
    (json.dumps({"question": "q", "response": "I recall <result>Paris</result><answer>\\boxed{Paris}</answer>"}) + "\n",
     r":1: a <result> block does not directly follow a tool call .*after 'I recall' comes '<result>Paris</result>'"),
    # the tokenizer's own error named no line
    (GOOD + "\n" + '{"question": "q", "response": "half \\ud83d an emoji"}\n',
     r":2: 'response' holds a lone surrogate code point \(U\+D83D at character 6\)"),
], ids=["no_response", "no_question", "chat_messages", "blank_response", "blank_question", "not_a_string",
        "bad_json", "not_utf8", "not_an_object", "empty_file", "mis_cased_result", "tool_text_without_result",
        "tool_output_pasted_without_result", "result_without_call", "lone_surrogate"])
def test_bad_rows_are_refused_naming_path_and_line(tmp_path, content, message):
    with pytest.raises(ValueError, match=r"sft\.jsonl" + message):
        _read(tmp_path, content)


def test_a_prompt_error_names_path_and_line(tmp_path):
    with pytest.raises(ValueError, match=r"sft\.jsonl:2: example None: prompt has 5 tokens > max 3"):
        _read(tmp_path, json.dumps({"question": "q", "response": "r"}) + "\n" + json.dumps(
            {"question": "12345", "response": "r"}) + "\n", _env(max_prompt_len=3))





def _chat_env(tok: ChatByteTokenizer) -> SimpleNamespace:
    return SimpleNamespace(tokenizer=tok, task=None, encode_prompt=lambda row: render_prompt(tok, row["question"]))


def _read_rows(tmp_path, env: SimpleNamespace, *responses: str) -> list[dict]:
    return _read(tmp_path, "".join(json.dumps({"question": "What is 2+2?", "response": r}) + "\n" for r in responses),
                 env)


THINKING_RESPONSES = [
    "<think>2+2=4</think><answer>\\boxed{4}</answer>",
    ("<think>\nI should check.\n</think>\n<python>print(2 + 2)</python> <result>\n4\n</result>\n"
     "<answer>\\boxed{4}</answer>"),
]


def test_a_thinking_template_trains_what_rl_reads_as_a_well_formed_response(tmp_path):
    """The template's generation prompt already opens `<think>`: the response's own is dropped, so the trained
    tokens read through RL's `response_text` pass the format check (before: `<think>\n<think>`, reward -1)."""
    tok = ChatByteTokenizer(chat_format_from_template(THINKING_CHATML_JINJA))
    assert tok.chat_format.generation_prompt.endswith("<think>\n")
    prompt = render_prompt(tok, "What is 2+2?")
    for record in _read_rows(tmp_path, _chat_env(tok), *THINKING_RESPONSES):
        assert record["tokens"][:len(prompt)] == prompt
        response_ids = record["tokens"][len(prompt):]
        assert "<think>\n<think>" not in tok.decode(record["tokens"])
        assert validate_format(response_text(tok, response_ids)) == (True, "")


def test_a_template_without_think_trains_the_response_unchanged(tmp_path):
    tok = ChatByteTokenizer(CHATML)
    prompt = render_prompt(tok, "What is 2+2?")
    record, = _read_rows(tmp_path, _chat_env(tok), THINKING_RESPONSES[0])
    assert record["tokens"] == prompt + tok.encode(THINKING_RESPONSES[0]) + [tok.eos_id]
    assert record["mask"].tolist() == [0] * len(prompt) + [1] * (len(record["tokens"]) - len(prompt))


def _expected(prompt: list[int], pieces: list[tuple[str, int]], tok: ByteTokenizer) -> tuple[list[int], list[int]]:
    """Tokens and mask of `pieces` (text, mask) each encoded on its own after `prompt`, then EOS."""
    tokens, mask = list(prompt), [0] * len(prompt)
    for text, m in pieces:
        ids = tok.encode(text)
        tokens, mask = tokens + ids, mask + [m] * len(ids)
    return tokens + [tok.eos_id], mask + [1]


def test_a_multi_tool_record_in_rls_form_trains_the_same_tokens_and_mask(tmp_path):
    tok = ByteTokenizer()
    pieces = [("<search>a</search>", 1), (format_tool_result("Doc 1: a"), 0), ("\n<python>print(1)</python>", 1),
              (format_tool_result("1"), 0), ("\n<answer>\\boxed{1}</answer>", 1)]
    record, = _read_rows(tmp_path, _env(), "".join(text for text, _ in pieces))
    tokens, mask = _expected(tok.encode("What is 2+2?"), pieces, tok)
    assert record["tokens"] == tokens and record["mask"].tolist() == mask


def test_result_blocks_are_re_encoded_as_the_context_rl_appends(tmp_path):
    """A block written with other whitespace gets RL's `" <result>\\n" + text + "\\n</result>"` around its text;
    the generated text around it is trained unchanged."""
    tok = ByteTokenizer()
    record, = _read_rows(tmp_path, _env(), "<search>a</search>\n<result>Doc 1: a</result>\n<answer>\\boxed{1}</answer>")
    tokens, mask = _expected(tok.encode("What is 2+2?"), [("<search>a</search>", 1), (format_tool_result("Doc 1: a"), 0),
                                                          ("\n<answer>\\boxed{1}</answer>", 1)], tok)
    assert record["tokens"] == tokens and record["mask"].tolist() == mask


def test_a_response_may_end_at_a_tool_call(tmp_path):
    """A trajectory that stops at its tool-call limit ends after a call with no result: kept, as before."""
    tok = ByteTokenizer()
    record, = _read_rows(tmp_path, _env(), "<search>a</search>")
    assert record["tokens"] == tok.encode("What is 2+2?") + tok.encode("<search>a</search>") + [tok.eos_id]
