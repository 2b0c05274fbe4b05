"""Demo task files, tokenizer text and SFT sequences executed against the real search server and sandbox."""

import json
from types import SimpleNamespace

import numpy as np
import pytest

from aepo_jax.agent.prompts import render_prompt, response_text
from aepo_jax.agent.protocol import (
    format_tool_result,
    parse_last_tool_call,
    validate_format,
)
from aepo_jax.agent.scripted import ChatByteTokenizer
from aepo_jax.envs.facts_sft import build_sft_sequences
from aepo_jax.envs.facts_task import (
    DEMO_SYSTEM_PROMPT,
    demo_prompt_config,
    tokenizer_texts,
    write_task,
)
from aepo_jax.envs.pretrained import grow_vocabulary_rows
from aepo_jax.envs.synthetic_facts import scripted_segments
from aepo_jax.servers.process import start_search_server
from aepo_jax.tokenizers import CHATML, chat_format_from_template
from aepo_jax.tokenizers.sentencepiece_tokenizer import train_sentencepiece
from aepo_jax.tools import (
    PythonSandbox,
    PythonTool,
    SandboxLimits,
    SearchTool,
    ToolRegistry,
)
from tests.qwen_vocabulary_files import THINKING_CHATML_JINJA


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return write_task(tmp_path_factory.mktemp("task"), seed=1, n_towns=60, n_train=12, n_heldout=4,
                      n_distractors=10, kinds=("years_between",), heldout_fraction=0.2, max_syllables=1)


def test_write_task_keeps_only_the_asked_kinds_and_writes_jsonl(task):
    assert len(task.env.train) == 12 and len(task.env.heldout) == 4
    assert {q.kind for q in task.env.train + task.env.heldout} == {"years_between"}
    rows = [json.loads(line) for line in task.heldout.read_text().splitlines()]
    assert [r["id"] for r in rows] == [q.id for q in task.env.heldout]
    with pytest.raises(ValueError, match="kinds"):
        write_task(task.corpus.parent / "bad", seed=1, n_towns=20, n_train=2, n_heldout=2, n_distractors=0,
                   kinds=("distance",))


def test_tokenizer_text_replaces_real_town_names_by_invented_ones(task):
    texts = tokenizer_texts(task, DEMO_SYSTEM_PROMPT, seed=0, max_syllables=1)
    words = "\n".join(texts).replace(".", " ").replace("?", " ").split()
    assert "founded" in words and any("<search>" in t for t in texts)
    real = {t.name for t in task.env.towns}
    raw_mentions = sum(d["contents"].count(name) for d in task.env.corpus for name in real)
    # Invented names may coincide with a real one by chance (one-syllable names), rarely.
    assert sum(w in real for w in words) < 0.05 * raw_mentions


@pytest.fixture(scope="module")
def executed(task):
    tokenizer = train_sentencepiece(tokenizer_texts(task, DEMO_SYSTEM_PROMPT, 0, max_syllables=1), 600)
    server = start_search_server(str(task.corpus))
    sandbox = PythonSandbox(SandboxLimits(wall_seconds=10.0), pool_size=1)
    registry = ToolRegistry({"search": SearchTool(server.url, topk=1), "python": PythonTool(sandbox)})
    config = demo_prompt_config()
    try:
        seqs = build_sft_sequences(task.env.train, task.towns_by_name, tokenizer, registry,
                                   lambda q: render_prompt(tokenizer, q, config), np.random.default_rng(3), 0.5)
    finally:
        registry.close()
        sandbox.close()
        server.stop()
    return tokenizer, config, seqs


def test_sft_sequences_are_prompt_then_segments_then_real_tool_results(task, executed):
    tokenizer, config, seqs = executed
    assert {s.used_python for s in seqs} == {True, False}  # the flaw is present at rate 0.5
    for q, seq in zip(task.env.train, seqs, strict=True):
        prompt = render_prompt(tokenizer, q.question, config)
        assert seq.tokens[: len(prompt)] == prompt and not any(seq.mask[: len(prompt)])
        assert seq.tool_failures == 0
        # Re-split the response by mask: runs of 1 are the script's segments, runs of 0 the tool results.
        runs, current, flag = [], [], None
        for token, m in zip(seq.tokens[len(prompt):], seq.mask[len(prompt):], strict=True):
            if m != flag and current:
                runs.append((flag, current))
                current = []
            flag = m
            current.append(token)
        runs.append((flag, current))
        generated = [tokenizer.decode(ids) for m, ids in runs if m == 1]
        results = [tokenizer.decode(ids) for m, ids in runs if m == 0]
        town = task.towns_by_name[q.towns[0]]
        assert generated[0] == f"<search>founding year of {town.name}</search>"
        assert results[0] == format_tool_result(f"Doc 1 (Title: {town.name}) {town.name} was founded in "
                                                f"{town.founded}. Population {town.population}.")
        assert generated[-1] == f"\n<answer>\\boxed{{{q.answer if seq.used_python else town.founded}}}</answer>"
        if seq.used_python:
            assert results[-1] == format_tool_result(q.answer)  # the sandbox really computed it


def test_scripted_queries_repeat_the_question_wording(task):
    q = task.env.train[0]
    segments = scripted_segments(q, task.towns_by_name, np.random.default_rng(0))
    assert [s.strip() for s in segments[:2]] == [f"<search>founding year of {n}</search>" for n in q.towns]


def test_grow_vocabulary_rows_appends_mean_rows_and_keeps_old_ones():
    rng = np.random.default_rng(0)
    embed, head = rng.normal(size=(5, 3)).astype(np.float32), rng.normal(size=(5, 3)).astype(np.float32)
    grown = grow_vocabulary_rows({"model.embed_tokens.weight": embed, "lm_head.weight": head, "x": embed}, 8)
    for name, table in (("model.embed_tokens.weight", embed), ("lm_head.weight", head)):
        assert grown[name].shape == (8, 3)
        np.testing.assert_array_equal(grown[name][:5], table)
        np.testing.assert_allclose(grown[name][5:], np.repeat(table.astype(np.float64).mean(0, keepdims=True), 3, 0),
                                   rtol=1e-6)
    assert grown["x"] is embed
    with pytest.raises(ValueError, match="vocab_size"):
        grow_vocabulary_rows({"model.embed_tokens.weight": embed}, 4)





class _EchoTools:
    """Tools that answer each call with a fixed text (the test is about the sequence, not the tools)."""

    @staticmethod
    def text(call) -> str:
        return f"result of {call.content}"

    def run_many(self, calls):
        return [SimpleNamespace(text=self.text(call), ok=True) for call in calls]


def _scripted(task, tok, questions):
    return build_sft_sequences(questions, task.towns_by_name, tok, _EchoTools(), lambda q: render_prompt(tok, q),
                               np.random.default_rng(3), 0.5)


def test_scripted_sequences_under_a_thinking_template_pass_rls_format_check(task):
    """The generation prompt opens `<think>`: the first segment closes it (an empty think block), so RL's
    `response_text` of the response is well formed (before, the block was never closed: reward -1)."""
    tok = ChatByteTokenizer(chat_format_from_template(THINKING_CHATML_JINJA))
    questions = task.env.train[:6]
    for q, seq in zip(questions, _scripted(task, tok, questions), strict=True):
        prompt = render_prompt(tok, q.question)
        assert seq.tokens[:len(prompt)] == prompt
        assert validate_format(response_text(tok, seq.tokens[len(prompt):])) == (True, "")


def test_scripted_sequences_under_a_template_without_think_are_unchanged(task):
    tok = ChatByteTokenizer(CHATML)
    questions = task.env.train[:6]
    rng = np.random.default_rng(3)  # the scripts' draws, in the order `build_sft_sequences` makes them
    scripts = [scripted_segments(q, task.towns_by_name, rng, 0.5) for q in questions]
    for q, script, seq in zip(questions, scripts, _scripted(task, tok, questions), strict=True):
        expected = render_prompt(tok, q.question)
        for segment in script[:-1]:
            expected += tok.encode(segment) + tok.encode(format_tool_result(_EchoTools.text(parse_last_tool_call(segment))))
        assert seq.tokens == expected + tok.encode(script[-1])
