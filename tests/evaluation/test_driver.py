"""The evaluation driver with the real tiny model, sampler, agent loop, search server (loopback) and python sandbox.

A random-weight model almost never writes a tool call or an answer by itself,
so the sampler is wrapped in `ToolForcingGenerator`: each segment samples a few
real tokens, then the planned search / python / answer is forced. The sampled
tokens sometimes stop a segment early or break the answer format, so the
per-sample correctness is a real mix that the metrics must aggregate.
"""

from __future__ import annotations

import itertools
import json
from math import comb

import numpy as np
import pytest
from flax import nnx

from aepo_jax.agent.forcing import ToolForcingGenerator
from aepo_jax.agent.loop import LoopConfig
from aepo_jax.agent.prompts import PromptConfig, render_prompt
from aepo_jax.agent.tags import AGENT_SPECIAL_TOKENS
from aepo_jax.evaluation import format_report_table
from aepo_jax.evaluation.driver import EvalConfig, evaluate
from aepo_jax.models import Decoder, get_preset
from aepo_jax.rewards import SympyWorkerPool
from aepo_jax.rollout.strategies import RolloutConfig
from aepo_jax.servers import start_search_server
from aepo_jax.tokenizers import train_sentencepiece
from aepo_jax.tools import (
    PythonSandbox,
    PythonTool,
    SandboxLimits,
    SearchTool,
    ToolRegistry,
)

CORPUS = {
    "brindle": "Brindle\nBrindle is a river town of 4200 people, founded in 1803 on the Kell river.",
    "ostwick": "Ostwick\nOstwick is a hill town of 950 people; its bridge was built in 1911.",
}
SYSTEM = "Think, then use <search>query</search> or <python>code</python>; answer as <answer>\\boxed{x}</answer>."
# The forced plan always answers 42: questions with gold 42 can be right, the others never.
EXAMPLES = [
    {"id": "a", "question": "How many people live in Brindle?", "answers": ["42"], "data_source": "towns"},
    {"id": "b", "question": "When was the Ostwick bridge built?", "answers": ["1911"], "data_source": "towns"},
    {"id": "c", "question": "What is six times seven?", "answers": ["42"], "data_source": "arith_qa"},
    {"id": "d", "question": "What is forty two?", "answers": ["forty two", "42"], "data_source": "arith_qa"},
]
LOOP = LoopConfig(max_tool_calls=3, max_response_tokens=100, max_context_len=256)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    texts = list(CORPUS.values()) + [e["question"] for e in EXAMPLES] + [SYSTEM, "print(6 * 7) the a of in"] * 3
    tok = train_sentencepiece(texts, vocab_size=400, special_tokens=AGENT_SPECIAL_TOKENS)
    graphdef, params = nnx.split(Decoder(get_preset("tiny", vocab_size=tok.vocab_size, n_layers=1), rngs=nnx.Rngs(0)))
    plan = [tok.encode("<search>Brindle people</search>"), tok.encode("<python>print(6 * 7)</python>"),
            tok.encode("<answer>\\boxed{42}</answer>")]
    corpus = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": k, "contents": v}) + "\n" for k, v in CORPUS.items()))
    limits = SandboxLimits(wall_seconds=5.0, cpu_seconds=2, memory_bytes=256 << 20)
    with start_search_server(str(corpus)) as server, PythonSandbox(limits, pool_size=2) as sandbox:
        registry = ToolRegistry({"search": SearchTool(server.url, topk=1, max_result_chars=40),
                                 "python": PythonTool(sandbox)}, max_workers=4)

        def run(config: EvalConfig, free_tokens: int = 3, examples=EXAMPLES, plan_texts=None, **reward_kw):
            segments = plan if plan_texts is None else [tok.encode(text) for text in plan_texts]
            return evaluate(
                examples, graphdef=graphdef, params=params, tokenizer=tok, tools=registry,
                encode_prompt=lambda ex: render_prompt(tok, ex["question"], PromptConfig(system_prompt=SYSTEM)),
                config=config, progress=False,
                make_generator=lambda s: ToolForcingGenerator(s, segments, free_tokens=free_tokens,
                                                              temperature=config.temperature),
                **reward_kw,
            )

        yield run
        registry.close()


def brute_force_pass_at_k(flags: list[bool], k: int) -> float:
    """Fraction of k-subsets of the samples that hold at least one correct one (float64 reference)."""
    subsets = list(itertools.combinations(flags, k))
    return sum(any(s) for s in subsets) / len(subsets)


def test_reports_aggregate_the_recorded_per_sample_correctness(setup):
    n = 4
    result = setup(EvalConfig(n=n, questions_per_batch=3, loop=LOOP, seed=3))
    print(format_report_table(result.reports))
    assert [q.question_id for q in result.questions] == [e["id"] for e in EXAMPLES]
    assert len(result.samples) == n * len(EXAMPLES)
    flags = {e["id"]: [s["correct"] for s in result.samples if s["question_id"] == e["id"]] for e in EXAMPLES}
    assert not any(flags["b"]), "gold 1911 can never match the forced answer 42"
    every = [f for fs in flags.values() for f in fs]
    assert any(every) and not all(every), f"expected a mix of right and wrong samples, got {flags}"
    # A correct sample really answered \boxed{42} and used tools; every sample ran through the tool loop.
    for s in result.samples:
        if s["correct"]:
            assert "\\boxed{42}" in s["response"] and s["stop_reason"] == "answer"
        assert s["tool_calls"] <= s["response"].count(" <result>\n") and 0 < s["response_length"]
    assert any(s["tool_calls"] >= 2 for s in result.samples)
    reports = {r.dataset: r for r in result.reports}
    assert set(reports) == {"towns", "arith_qa", "all"}
    for name, ids in {"towns": "ab", "arith_qa": "cd", "all": "abcd"}.items():
        report = reports[name]
        assert report.num_questions == len(ids) and report.samples_per_question == n
        assert report.pass_at_k[1] == pytest.approx(np.mean([np.mean(flags[i]) for i in ids]), abs=1e-12)
        for k in range(1, n + 1):
            expected = np.mean([brute_force_pass_at_k(flags[i], k) for i in ids])
            assert report.pass_at_k[k] == pytest.approx(expected, abs=1e-12)
            closed_form = np.mean([1 - comb(n - sum(flags[i]), k) / comb(n, k) for i in ids])
            assert report.pass_at_k[k] == pytest.approx(closed_form, abs=1e-12)
        lengths = [s["response_length"] for s in result.samples if s["question_id"] in ids]
        calls = [s["tool_calls"] for s in result.samples if s["question_id"] in ids]
        assert report.mean_response_length == pytest.approx(np.mean(lengths))
        assert report.tool_calls_per_question == pytest.approx(np.mean(calls))
    assert result.tree_stats is None


def test_tool_calls_count_the_calls_the_loop_ran_not_malformed_closings(setup):
    """A segment that ends at a closing tag without a call is answered by the loop itself (no tool ran):
    it was counted as a tool call, so "tool calls / answer" read 1.48 where 1.42 calls ran."""
    plan_texts = ["<answer>dale</search>", "<python>print(6 * 7)</python>", "<answer>\\boxed{42}</answer>"]
    result = setup(EvalConfig(n=2, questions_per_batch=4, loop=LOOP, seed=3), free_tokens=0, plan_texts=plan_texts)
    malformed = [s for s in result.samples if "without a complete tool call" in s["response"]]
    assert malformed, "the forced plan's first segment ends at </search> without a call"
    for s in result.samples:
        ran = s["response"].count(" <result>\n") - s["response"].count("without a complete tool call")
        assert s["tool_calls"] == ran and s["python_calls"] == min(ran, 1)
    assert any(s["tool_calls"] == 1 for s in malformed)


def test_seeded_sampling_reproduces_and_greedy_is_deterministic(setup):
    config = EvalConfig(n=2, questions_per_batch=2, loop=LOOP, seed=11)
    first = setup(config, examples=EXAMPLES[:2])
    again = setup(config, examples=EXAMPLES[:2])
    other = setup(EvalConfig(n=2, questions_per_batch=2, loop=LOOP, seed=12), examples=EXAMPLES[:2])
    texts = [s["response"] for s in first.samples]
    assert texts == [s["response"] for s in again.samples]
    assert texts != [s["response"] for s in other.samples]

    greedy = EvalConfig(n=1, greedy=True, loop=LOOP, seed=0)
    runs = [setup(greedy), setup(dataclass_replace(greedy, seed=5))]
    assert [s["response"] for s in runs[0].samples] == [s["response"] for s in runs[1].samples]
    assert runs[0].reports == runs[1].reports
    assert all(r.samples_per_question == 1 and set(r.pass_at_k) == {1} for r in runs[0].reports)


def dataclass_replace(config, **changes):
    import dataclasses

    return dataclasses.replace(config, **changes)


def test_tree_strategy_reports_tree_statistics(setup):
    config = EvalConfig(n=4, loop=LOOP, seed=1,
                        rollout=RolloutConfig(strategy="arpo", initial_rollouts=1, branch_threshold=0.0))
    result = setup(config, free_tokens=2, examples=EXAMPLES[:2])
    assert result.tree_stats is not None and set(result.tree_stats) == {"towns", "all"}
    overall = result.tree_stats["all"]
    assert overall["trajectories_per_prompt"] == 4 and overall["num_global"] + overall["num_branch"] == 8
    assert overall["num_branch"] > 0 and overall["forward_tokens"] > 0
    assert overall["tool_calls"] > 0 and overall["serial_tool_calls"] > 0  # the calls the rollouts made
    assert "tool_calls" not in result.tree_stats["towns"]  # a per-source row has no rollout counters
    # One global per question: every branch is credited to that root, whichever trajectory forked it.
    assert overall["branch_roots"] == 1.0 and overall["max_root_branch_share"] == 1.0
    assert overall["effective_branch_roots"] == 1.0 and overall["top3_branch_fraction"] == 1.0
    assert 0.0 < overall["top3_parent_branch_fraction"] <= 1.0
    assert result.reports[0].samples_per_question == 4


def test_bad_decoding_settings_fail_when_the_config_is_made():
    with pytest.raises(ValueError, match="temperature must be a finite number > 0, got -1.0"):
        EvalConfig(temperature=-1.0)
    with pytest.raises(ValueError, match=r"top_p must be in \(0, 1\], got 2.0"):
        EvalConfig(top_p=2.0)


def test_bad_config_and_examples_are_clear_errors(setup):
    with pytest.raises(ValueError, match="greedy"):
        EvalConfig(n=3, greedy=True)
    with pytest.raises(ValueError, match="lacks"):
        setup(EvalConfig(loop=LOOP), examples=[{"id": "x", "question": "q?"}])
    with pytest.raises(ValueError, match="at least one example"):
        setup(EvalConfig(loop=LOOP), examples=[])


def test_duplicate_question_ids_are_refused_naming_them():
    """Two copies of one id were both sampled and counted in pass@k."""
    copies = [EXAMPLES[0], EXAMPLES[1], EXAMPLES[0], {**EXAMPLES[2], "id": "b"}]
    with pytest.raises(ValueError, match=r"2 question id\(s\) occur more than once, e.g. \['a', 'b'\]"):
        evaluate(copies, graphdef=None, params=None, tokenizer=None, tools=None, encode_prompt=None,
                 config=EvalConfig())


def test_timed_out_math_checks_are_reported_and_warned(setup):
    """A sympy check past its limit counted as wrong, and nothing said so."""
    # A gold answer whose check takes sympy about 10 ms: the pool waits for a reply with a selector whose
    # timeout has 1 ms steps, so a 1e-6 s limit is 1 ms, and `\\sqrt{1764}` (checked in about 0.8 ms) came
    # back in time in two full suite runs (no timeout, no warning).
    gold = "42+(x+1)^{6}-(x^{6}+6x^{5}+15x^{4}+20x^{3}+15x^{2}+6x+1)"
    examples = [{"id": "m", "question": "What is six times seven?", "answers": [gold], "data_source": "math"}]
    with SympyWorkerPool(size=1, timeout_s=1e-6) as pool, \
            pytest.warns(UserWarning, match=r"sympy equivalence check\(s\) ran out of time in this evaluation"):
        result = setup(EvalConfig(n=2, loop=LOOP, seed=3), free_tokens=0, examples=examples, pool=pool,
                       plan_texts=["<answer>\\boxed{42}</answer>"])
    assert result.math_timeouts == pool.timeouts > 0
    assert result.reports[0].math_timeouts == result.math_timeouts
    assert result.reports[0].correctness == "math_equiv"


def test_batch_keys_of_one_process_are_unchanged_and_each_part_gets_its_own():
    import jax

    from aepo_jax.evaluation.driver import batch_keys

    key, rng = batch_keys(7, 3)
    want = jax.random.fold_in(jax.random.key(7), 3)
    assert np.array_equal(jax.random.key_data(key), jax.random.key_data(want))
    assert rng.integers(1 << 30) == np.random.default_rng([7, 3]).integers(1 << 30)
    parts = [batch_keys(7, 3, part) for part in range(3)]
    datas = {tuple(np.asarray(jax.random.key_data(k)).tolist()) for k, _ in parts}
    draws = {r.integers(1 << 30) for _, r in parts}
    assert len(datas) == 3 and len(draws) == 3
    assert tuple(np.asarray(jax.random.key_data(key)).tolist()) not in datas
