"""The agent loop's limits, end reasons, masks and branch bookkeeping, driven by a scripted generator."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import jax
import numpy as np
import pytest

from aepo_jax.agent.entropy import segment_entropy, top10_sum_entropy
from aepo_jax.agent.loop import AgentLoop, LoopConfig, agent_stop_sequences
from aepo_jax.agent.prompts import (
    DEFAULT_SYSTEM_PROMPT,
    PromptConfig,
    build_messages,
    render_prompt,
)
from aepo_jax.agent.scripted import ByteTokenizer, ScriptedGenerator, ScriptedSegment
from aepo_jax.agent.tags import AGENT_SPECIAL_TOKENS
from aepo_jax.agent.trajectory import (
    END_ANSWER,
    END_CONTEXT,
    END_EOS,
    END_LENGTH,
    END_TOOL_LIMIT,
    Segment,
    ToolStep,
    Trajectory,
)
from aepo_jax.rollout.strategies import EntropyBranchPolicy
from aepo_jax.tokenizers import CHATML, train_sentencepiece

TOK = ByteTokenizer()
RESULT = TOK.token_to_id("<result>")


class RecordingTools:
    """Returns `<tag>:<content>` and records the batches the loop sends (to see concurrency per round)."""

    def __init__(self):
        self.batches = []

    def run_many(self, calls):
        self.batches.append(list(calls))
        return [SimpleNamespace(text=f"{c.tag}:{c.content}", ok=True) for c in calls]


def segments_script(texts_by_call, end="stop", entropy=1.0):
    """Row generates texts_by_call[n] after its n-th tool result (the last entry repeats)."""

    def script(ids, rng):
        n = ids.count(RESULT)
        text = texts_by_call[min(n, len(texts_by_call) - 1)]
        tokens = TOK.encode(text) + ([TOK.eos_id] if end == "eos" else [])
        return ScriptedSegment(tokens, [entropy] * len(tokens), end)

    return script


def run(script, n_prompts=1, k=1, **cfg):
    tools = RecordingTools()
    config = LoopConfig(**{"max_tool_calls": 6, "max_response_tokens": 2000, "max_context_len": 4000, **cfg})
    loop = AgentLoop(ScriptedGenerator(script), TOK, tools, config)
    prompts = [TOK.encode(f"q{i}") for i in range(n_prompts)]
    result = loop.run(prompts, k, k, rng=np.random.default_rng(0), key=jax.random.key(0))
    return result, tools


def test_tool_calls_masks_and_answer():
    result, tools = run(segments_script(["<search>alpha</search>", "<python>print(1)</python>",
                                         "<answer>\\boxed{2}</answer>"]), n_prompts=3)
    for (traj,) in result.groups:
        assert traj.stop_reason == END_ANSWER and traj.num_tool_calls == 2
        assert [(s.tag, s.content) for s in traj.tool_steps] == [("search", "alpha"), ("python", "print(1)")]
        text = TOK.decode(traj.response_ids)
        assert text == ("<search>alpha</search> <result>\nsearch:alpha\n</result><python>print(1)</python> "
                        "<result>\npython:print(1)\n</result><answer>\\boxed{2}</answer>")
        expected = [1] * len(traj.response_ids)
        for s in traj.tool_steps:
            expected[s.result_start:s.result_end] = [0] * (s.result_end - s.result_start)
            assert TOK.decode(traj.response_ids[s.result_start:s.result_end]).startswith(" <result>\n")
        assert traj.mask == expected
        assert traj.tool_result_ends == [s.result_end for s in traj.tool_steps]
        assert [seg.after_tool for seg in traj.segments] == [False, True, True]
    # The three prompts' calls of one round went to the registry together.
    assert [len(b) for b in tools.batches] == [3, 3]
    assert result.counters["append_tokens"] == sum(
        s.result_end - s.result_start for (t,) in result.groups for s in t.tool_steps)


def test_end_reasons():
    (traj,), = run(segments_script(["<search>x</search>"]), max_tool_calls=2)[0].groups
    assert traj.stop_reason == END_TOOL_LIMIT and traj.num_tool_calls == 2
    (traj,), = run(segments_script(["<think>no answer</think>"], end="eos"))[0].groups
    assert traj.stop_reason == END_EOS and traj.response_ids[-1] == TOK.eos_id
    (traj,), = run(segments_script(["<answer>\\boxed{1}</answer>"], end="eos"))[0].groups
    assert traj.stop_reason == END_ANSWER
    (traj,), = run(segments_script(["<think>" + "x" * 100]), max_response_tokens=40)[0].groups
    assert traj.stop_reason == END_LENGTH and len(traj.response_ids) == 40
    (traj,), = run(segments_script(["<think>" + "x" * 100]), max_context_len=30)[0].groups
    assert traj.stop_reason == END_CONTEXT and traj.total_length == 30
    # A tool result that would overflow the response budget is not appended.
    (traj,), = run(segments_script(["<search>" + "y" * 30 + "</search>"]), max_response_tokens=60)[0].groups
    assert traj.stop_reason == END_LENGTH and traj.num_tool_calls == 0 and all(traj.mask)


def test_stop_at_a_closing_tag_without_a_call_becomes_an_error_result():
    (traj,), = run(segments_script(["oops</search>", "<answer>\\boxed{1}</answer>"]))[0].groups
    assert traj.num_tool_calls == 1 and traj.tool_steps[0].tag == "invalid" and not traj.tool_steps[0].ok
    assert "without a complete tool call" in traj.tool_steps[0].result_text
    assert traj.stop_reason == END_ANSWER


def test_branch_copies_the_prefix_and_lineage():
    parent = Trajectory(traj_id=0, prompt_index=0, prompt_ids=[5, 6], root_id=0)
    parent.add_generated([1, 2], [-0.1, -0.2], [0.5, 0.6])
    parent.add_tool_result([7, 7, 7])
    parent.segments.append(Segment(0, 2, 0.55, False))
    parent.tool_steps.append(ToolStep("search", "q", "r", True, 2, 5))
    parent.decisions.append((5, True))
    parent.add_generated([3], [-0.3], [0.7])
    child = parent.branch(9, 5)
    assert child.response_ids == [1, 2, 7, 7, 7] and child.mask == [1, 1, 0, 0, 0]
    assert child.parent_id == 0 and child.root_id == 0 and not child.is_global and child.branch_point == 5
    assert child.lineage == [True] and child.consecutive_branchings == 1
    with pytest.raises(ValueError, match="not the end of a tool result"):
        parent.branch(10, 3)
    with pytest.raises(ValueError, match="lengths differ"):
        parent.add_generated([1], [0.0, 0.0], [0.0])


def test_entropy_measures_against_float64_references():
    h = np.random.default_rng(0).uniform(0, 3, size=50)
    assert segment_entropy(h, 20) == pytest.approx(h[:20].mean(), rel=1e-12)
    assert segment_entropy(h[:5], 20) == pytest.approx(h[:5].mean(), rel=1e-12)
    with pytest.raises(ValueError, match="empty"):
        segment_entropy([], 20)
    logits = np.random.default_rng(1).normal(size=(30, 100))
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    top = -np.sort(-logp, axis=-1)[:, :10]
    expected = sum(-(np.exp(top[t]) * top[t]).sum() for t in range(20)) / np.log(100)
    assert top10_sum_entropy(top, 100) == pytest.approx(expected, rel=1e-12)


def test_top10_sum_needs_top_logprobs_from_the_generator():
    # the loop asks generate(..., top_logprobs=10); the scripted generator cannot answer it
    with pytest.raises(TypeError, match="top_logprobs"):
        run(segments_script(["<answer>\\boxed{1}</answer>"]), entropy_measure="top10_sum")


def test_bad_config_and_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="entropy_measure"):
        LoopConfig(entropy_measure="mean")
    with pytest.raises(ValueError, match="max_response_tokens"):
        LoopConfig(max_response_tokens=0)
    loop = AgentLoop(ScriptedGenerator(segments_script(["x"])), TOK, RecordingTools())
    with pytest.raises(ValueError, match="prompt 0 is empty"):
        loop.run([[]], 1, 1, rng=np.random.default_rng(0), key=jax.random.key(0))
    with pytest.raises(ValueError, match="exceeds k"):
        loop.run([[5]], 2, 3, rng=np.random.default_rng(0), key=jax.random.key(0))


def test_prompts_render_through_the_chat_template():
    tok = train_sentencepiece([DEFAULT_SYSTEM_PROMPT, "What is the capital of Brindle?"] * 3, vocab_size=400,
                              chat_format=CHATML, special_tokens=("<|im_start|>", "<|im_end|>", *AGENT_SPECIAL_TOKENS))
    ids = render_prompt(tok, "What is the capital of Brindle?")
    text = tok.decode(ids)
    assert text.startswith("<|im_start|>system\n" + DEFAULT_SYSTEM_PROMPT)
    assert "<|im_start|>user\nWhat is the capital of Brindle?<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")
    assert ids == tok.apply_chat_template(build_messages("What is the capital of Brindle?"))
    assert [m["role"] for m in build_messages("q", PromptConfig(system_prompt=None))] == ["user"]
    with pytest.raises(ValueError, match="non-empty"):
        build_messages("  ")
    stops = agent_stop_sequences(tok)
    assert all(len(s) == 1 for s in stops)  # every closing tag is one special token


def test_rows_are_repacked_when_the_lockstep_cursor_runs_out_of_cache():
    from aepo_jax.agent.scripted import tool_use_script
    from aepo_jax.rollout.strategies import EntropyBranchPolicy

    def go(max_cache_len):
        gen = ScriptedGenerator(tool_use_script(TOK, 0.9, max_calls=5), seed=4, max_cache_len=max_cache_len)
        loop = AgentLoop(gen, TOK, RecordingTools(), LoopConfig(max_response_tokens=300, max_context_len=400))
        policy = EntropyBranchPolicy(3, 0.2, 0.5, 2)
        return loop.run([TOK.encode(f"question {i}") for i in range(3)], 6, 2, rng=np.random.default_rng(4),
                        key=jax.random.key(0), policy=policy)

    roomy, tight = go(None), go(330)
    assert roomy.repacks == 0 and tight.repacks > 0
    # Same trajectories either way; the repacks cost re-prefilled tokens.
    flat = lambda r: [(t.traj_id, t.parent_id, t.response_ids, t.mask, t.stop_reason) for g in r.groups for t in g]
    assert flat(tight) == flat(roomy)
    assert tight.counters["prefill_tokens"] > roomy.counters["prefill_tokens"]
    assert tight.counters["decode_tokens"] == roomy.counters["decode_tokens"]


def test_segments_decoded_in_chunks_are_parsed_and_measured_whole():
    think = "<think>" + "z" * 45 + "</think>"
    script = segments_script([think + "<search>split across chunks</search>", think + "<answer>\\boxed{3}</answer>"])
    whole, _ = run(script, n_prompts=2)
    chunked, _ = run(script, n_prompts=2, max_segment_tokens=20)
    for (a,), (b,) in zip(whole.groups, chunked.groups, strict=True):
        assert b.response_ids == a.response_ids and b.mask == a.mask and b.stop_reason == END_ANSWER
        assert [(s.start, s.end, s.after_tool) for s in b.segments] == [(s.start, s.end, s.after_tool) for s in a.segments]
        assert [(s.tag, s.content) for s in b.tool_steps] == [("search", "split across chunks")]
    assert chunked.rounds > whole.rounds
    with pytest.raises(ValueError, match="max_segment_tokens"):
        LoopConfig(max_segment_tokens=5, entropy_tokens=20)


def test_loop_ends_rows_that_have_no_cache_room_instead_of_spinning():
    """A cache no larger than the prompt's bucket leaves no room to decode even after a repack:
    the rows must end with END_CONTEXT (regression: the loop used to pause them forever)."""
    from flax import nnx

    from aepo_jax.models import Decoder, get_preset
    from aepo_jax.sampling import Sampler, SamplingParams

    model = Decoder(get_preset("tiny", n_layers=1), rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    sampler = Sampler(graphdef, state, params=SamplingParams(greedy=True), max_cache_len=32, eos_ids=[1])
    loop = AgentLoop(sampler, TOK, RecordingTools(), LoopConfig(max_response_tokens=64, max_context_len=512))
    prompt = list(range(2, 34))  # 32 tokens: the whole cache
    result = loop.run([prompt], 2, 2, key=jax.random.key(0), rng=np.random.default_rng(0))
    trajs = result.groups[0]
    assert len(trajs) == 2
    assert all(t.stop_reason == END_CONTEXT for t in trajs), [t.stop_reason for t in trajs]


# ----- branch decisions: measured over K tokens, drawn only with budget left -------------------


class CappedGenerator(ScriptedGenerator):
    """A scripted generator whose calls number `capped_calls` (1-based) decode at most `cap` tokens per row,
    the way a nearly full cache cuts a chunk short (the loop pauses the row and continues it next round)."""

    def __init__(self, script, cap, capped_calls, **kwargs):
        super().__init__(script, **kwargs)
        self.cap, self.capped_calls, self.calls = cap, set(capped_calls), 0

    def generate(self, state, max_new_tokens, rng=None):
        self.calls += 1
        if self.calls in self.capped_calls:
            budgets = [max_new_tokens] * state.num_rows if isinstance(max_new_tokens, int) else list(max_new_tokens)
            max_new_tokens = [min(b, self.cap) for b in budgets]
        return super().generate(state, max_new_tokens, rng)


def ramp_script(calls_before_answer):
    """Token j of every segment has entropy 0.1 * j (plus 1 after a tool result): a mean over fewer than K
    tokens differs from the mean over K."""

    def script(ids, rng):
        n = ids.count(RESULT)
        text = "<think>" + "w" * 30 + "</think>"
        text += "<search>q</search>" if n < calls_before_answer else "<answer>\\boxed{1}</answer>"
        tokens = TOK.encode(text)
        return ScriptedSegment(tokens, [0.1 * j + (1.0 if n else 0.0) for j in range(len(tokens))], "stop")

    return script


class LoggingPolicy:
    """Branches at every decision (Z = 2) and records what it was asked."""

    def __init__(self):
        self.asked = []

    def branch_count(self, traj, entropy_now, rng):
        rng.uniform()
        self.asked.append((traj.traj_id, len(traj.response_ids), entropy_now, traj.h_init))
        return 1

    def end_round(self, new_trajectories):
        pass


def test_segment_entropy_spans_chunk_boundaries():
    """A first chunk cut to 3 tokens is re-measured over K = 20 tokens (and H_init with it); the decision
    after a tool result whose segment was cut short waits for K tokens (regression: both read 3 tokens)."""
    k_tokens = 20
    expected_root = float(np.mean([0.1 * j for j in range(k_tokens)]))
    expected_after = expected_root + 1.0
    # Call 1 decodes the first segment; call 3 the segment after the first tool result.
    gen = CappedGenerator(ramp_script(1), cap=3, capped_calls={1, 3})
    policy = LoggingPolicy()
    loop = AgentLoop(gen, TOK, RecordingTools(), LoopConfig(max_response_tokens=2000, max_context_len=4000,
                                                            entropy_tokens=k_tokens))
    result = loop.run([TOK.encode("q0")], 2, 1, rng=np.random.default_rng(0), key=jax.random.key(0), policy=policy)
    root = next(t for t in result.groups[0] if t.is_global)
    assert root.segments[0].entropy == pytest.approx(expected_root)
    assert root.h_init == pytest.approx(expected_root)
    assert root.segments[1].entropy == pytest.approx(expected_after)
    (asked,) = policy.asked
    assert asked[2] == pytest.approx(expected_after) and asked[3] == pytest.approx(expected_root)
    assert asked[1] >= root.segments[1].start + k_tokens  # decided once K tokens were there
    child = next(t for t in result.groups[0] if not t.is_global)
    assert child.branch_point == root.tool_steps[0].result_end
    assert child.response_ids[: child.branch_point] == root.response_ids[: child.branch_point]


def test_no_branch_decision_is_drawn_without_budget():
    """k = 2 from one global that branches at once: the budget is gone after the first decision, so its
    later tool results draw nothing (regression: every later tool result drew and logged a decision)."""
    policy = LoggingPolicy()
    rng = np.random.default_rng(0)
    loop = AgentLoop(ScriptedGenerator(ramp_script(4)), TOK, RecordingTools(), LoopConfig())
    result = loop.run([TOK.encode("q0")], 2, 1, rng=rng, key=jax.random.key(0), policy=policy)
    assert len(result.groups[0]) == 2
    assert len(policy.asked) == 1
    assert all(len(t.decisions) == 1 for t in result.groups[0])  # the branch decision only
    assert rng.bit_generator.state == _after_draws(0, 1)  # one alpha drawn in total


class ForkLog(ScriptedGenerator):
    """Records the rows of every `fork` (snapshots for branch decisions, compactions)."""

    def __init__(self, script):
        super().__init__(script)
        self.forks = []

    def fork(self, state, rows):
        self.forks.append(list(rows))
        return super().fork(state, rows)


@pytest.mark.parametrize(("initial", "snapshots"), [(2, 0), (1, 3)])
def test_a_tool_result_is_snapshotted_only_while_its_prompt_has_branch_budget(initial, snapshots):
    """k = 2, every row makes three calls and the policy never branches (tau too high): with both
    globals started there is no budget, so no tool result needs a snapshot for a decision; with one,
    each of its three results does. No row finishes before the last round, so no compaction forks."""
    gen = ForkLog(ramp_script(3))
    policy = EntropyBranchPolicy(1, 0.2, 100.0, 2)
    loop = AgentLoop(gen, TOK, RecordingTools(), LoopConfig(max_tool_calls=6))
    result = loop.run([TOK.encode("q0")], 2, initial, rng=np.random.default_rng(0), key=jax.random.key(0),
                      policy=policy)
    assert len(gen.forks) == snapshots
    assert len(policy.log) == snapshots and sum(len(t.decisions) for t in result.groups[0]) == snapshots


def _after_draws(seed: int, draws: int) -> dict:
    rng = np.random.default_rng(seed)
    rng.uniform(size=draws)
    return rng.bit_generator.state


# ----- the continuous schedule: tool calls run while other rows decode ---------------------------


class TimedTools:
    """`search` takes `slow_seconds`, `python` answers at once; records (tag, content, start, end) per call."""

    def __init__(self, slow_seconds):
        self.slow_seconds, self.calls = slow_seconds, []

    def run_many(self, calls):
        import time

        out = []
        for c in calls:
            start = time.monotonic()
            if c.tag == "search":
                time.sleep(self.slow_seconds)
            self.calls.append((c.tag, c.content, start, time.monotonic()))
            out.append(SimpleNamespace(text=f"{c.tag}:{c.content}", ok=True))
        return out


def slow_and_fast_script(ids, rng):
    """Prompt "q0" makes one slow search then answers; "q1" makes three fast python calls then answers."""
    n = ids.count(RESULT)
    if TOK.decode(ids).startswith("q0"):
        text = "<search>slow</search>" if n == 0 else "<answer>\\boxed{0}</answer>"
    else:
        text = f"<python>print({n})</python>" if n < 3 else "<answer>\\boxed{1}</answer>"
    tokens = TOK.encode("<think>" + "x" * (5 + n) + "</think>" + text)
    return ScriptedSegment(tokens, [1.0] * len(tokens), "stop")


@pytest.mark.parametrize("schedule", ["rounds", "continuous"])
def test_continuous_schedule_runs_tools_while_other_rows_decode(schedule):
    """Under "continuous" the fast row makes all its calls while the slow search runs; under "rounds" its
    second call waits for the search. Both schedules give the same trajectories."""
    tools = TimedTools(slow_seconds=0.5)
    config = LoopConfig(max_tool_calls=6, max_response_tokens=2000, max_context_len=4000, schedule=schedule)
    loop = AgentLoop(ScriptedGenerator(slow_and_fast_script), TOK, tools, config)
    result = loop.run([TOK.encode("q0"), TOK.encode("q1")], 1, 1, rng=np.random.default_rng(0),
                      key=jax.random.key(0))
    (slow,), (fast,) = result.groups
    assert [(s.tag, s.content) for s in slow.tool_steps] == [("search", "slow")]
    assert [s.content for s in fast.tool_steps] == ["print(0)", "print(1)", "print(2)"]
    assert slow.stop_reason == fast.stop_reason == END_ANSWER
    for traj in (slow, fast):
        reference = list(traj.prompt_ids)
        while len(reference) < traj.total_length:  # the script's own segments plus the formatted results
            segment = slow_and_fast_script(reference, None).tokens
            reference += segment
            step = next((s for s in traj.tool_steps if s.result_start == len(reference) - len(traj.prompt_ids)), None)
            if step is not None:
                reference += traj.response_ids[step.result_start:step.result_end]
        assert traj.prompt_ids + traj.response_ids == reference
    search_end = next(end for tag, _, _, end in tools.calls if tag == "search")
    last_python_start = max(start for tag, _, start, _ in tools.calls if tag == "python")
    if schedule == "continuous":
        assert last_python_start < search_end
    else:
        assert last_python_start > search_end


def three_slow_one_fast_script(ids, rng):
    """Prompts "q0"-"q2" make one slow search, "q3" three fast python calls; then each answers."""
    n = ids.count(RESULT)
    if TOK.decode(ids).startswith("q3"):
        text = f"<python>print({n})</python>" if n < 3 else "<answer>\\boxed{1}</answer>"
    else:
        text = "<search>slow</search>" if n == 0 else "<answer>\\boxed{0}</answer>"
    tokens = TOK.encode("<think>x</think>" + text)
    return ScriptedSegment(tokens, [1.0] * len(tokens), "stop")


def test_continuous_schedule_decodes_a_few_rows_while_tool_workers_are_idle():
    """One row of four is generating (below min_generating_fraction = 0.5) while three wait on slow
    searches, but the tool runner has idle workers: the loop decodes that row rather than waiting, so
    all its calls run during the searches (regression: it waited for the searches first)."""
    tools = TimedTools(slow_seconds=0.5)
    config = LoopConfig(max_tool_calls=6, max_response_tokens=2000, max_context_len=4000, schedule="continuous",
                        min_generating_fraction=0.5)
    loop = AgentLoop(ScriptedGenerator(three_slow_one_fast_script), TOK, tools, config)
    result = loop.run([TOK.encode(f"q{i}") for i in range(4)], 1, 1, rng=np.random.default_rng(0),
                      key=jax.random.key(0))
    assert [len(g[0].tool_steps) for g in result.groups] == [1, 1, 1, 3]
    first_search_end = min(end for tag, _, _, end in tools.calls if tag == "search")
    assert max(start for tag, _, start, _ in tools.calls if tag == "python") < first_search_end


class PlacingGenerator(ScriptedGenerator):
    """Records `place` calls and the largest decode state a generate call saw."""

    def __init__(self, script):
        super().__init__(script)
        self.placed, self.largest = [], 0

    def place(self, state, dst_rows, source, src_rows):
        self.placed.append(list(dst_rows))
        return super().place(state, dst_rows, source, src_rows)

    def generate(self, state, max_new_tokens, rng=None):
        self.largest = max(self.largest, state.num_rows)
        return super().generate(state, max_new_tokens, rng)


def two_slow_one_fast_script(ids, rng):
    """q0 and q1 make one slow search, then answer; q2 answers at once."""
    text = TOK.decode(ids)
    if text.startswith("q2") or ids.count(RESULT) > 0:
        body = "<answer>\\boxed{1}</answer>"
    else:
        body = "<search>slow</search>"
    tokens = TOK.encode("<think>x</think>" + body)
    return ScriptedSegment(tokens, [1.0] * len(tokens), "stop")


def test_continuous_schedule_reuses_a_finished_rows_slot_for_a_top_up():
    """q2's first trajectory finishes while q0 and q1 wait on their searches: its top-up goes into the freed
    row (`place`), so the decode state keeps its 3 rows; under "rounds" the batch is compacted instead."""
    for schedule in ("continuous", "rounds"):
        gen = PlacingGenerator(two_slow_one_fast_script)
        config = LoopConfig(max_tool_calls=2, max_response_tokens=500, max_context_len=1000, schedule=schedule)
        result = AgentLoop(gen, TOK, TimedTools(slow_seconds=0.3), config).run(
            [TOK.encode(f"q{i}") for i in range(3)], 2, 1, rng=np.random.default_rng(0), key=jax.random.key(0))
        assert [len(g) for g in result.groups] == [2, 2, 2]
        assert all(t.stop_reason == END_ANSWER for g in result.groups for t in g)
        if schedule == "continuous":
            assert gen.placed and gen.placed[0] == [2], gen.placed
            assert gen.largest == 3
        else:
            assert gen.placed == []


def test_min_generating_fraction_is_checked():
    with pytest.raises(ValueError, match="min_generating_fraction"):
        LoopConfig(min_generating_fraction=1.5)


class GateTools:
    """Each call waits (up to `timeout` s) until `needed` calls are in flight at once; records the peak.
    `max_workers` is the limit a `ToolRegistry` would report."""

    def __init__(self, needed, max_workers, timeout=20.0):
        import threading

        self.max_workers, self.timeout = max_workers, timeout
        self.barrier = threading.Barrier(needed)
        self.lock, self.in_flight, self.peak = threading.Lock(), 0, 0

    def run_many(self, calls):
        import threading

        with self.lock:
            self.in_flight += len(calls)
            self.peak = max(self.peak, self.in_flight)
        try:
            self.barrier.wait(self.timeout)
        except threading.BrokenBarrierError:
            pass
        with self.lock:
            self.in_flight -= len(calls)
        return [SimpleNamespace(text=f"{c.tag}:{c.content}", ok=True) for c in calls]


def test_continuous_schedule_runs_as_many_calls_at_once_as_the_tool_runner_allows():
    """40 rows call a tool in the same tick; the runner allows 40 at once (more than the schedule's
    fallback TOOL_THREADS), so all 40 are in flight together and none waits for a free thread."""
    from aepo_jax.agent.continuous import TOOL_THREADS

    rows = TOOL_THREADS + 8
    tools = GateTools(needed=rows, max_workers=rows)
    config = LoopConfig(max_tool_calls=6, max_response_tokens=2000, max_context_len=4000, schedule="continuous")
    loop = AgentLoop(ScriptedGenerator(segments_script(["<search>q</search>", "<answer>\\boxed{1}</answer>"])),
                     TOK, tools, config)
    result = loop.run([TOK.encode(f"q{i}") for i in range(rows)], 1, 1, rng=np.random.default_rng(0),
                      key=jax.random.key(0))
    assert tools.peak == rows and not tools.barrier.broken
    assert all(t.stop_reason == END_ANSWER for g in result.groups for t in g)


class StaggeredTools:
    """A search for `dN` answers after `base + N * gap` seconds: calls started together finish a few ms apart."""

    def __init__(self, base, gap):
        self.base, self.gap = base, gap

    def run_many(self, calls):
        import time

        for c in calls:
            time.sleep(self.base + self.gap * int(c.content.lstrip("d")))
        return [SimpleNamespace(text=f"{c.tag}:{c.content}", ok=True) for c in calls]


class BudgetLog(ScriptedGenerator):
    """Records, per generate call, how many rows got a budget (rows decoding in that tick)."""

    def __init__(self, script):
        super().__init__(script)
        self.decoding = []

    def generate(self, state, max_new_tokens, rng=None):
        budgets = [max_new_tokens] * state.num_rows if isinstance(max_new_tokens, int) else list(max_new_tokens)
        self.decoding.append(sum(1 for b in budgets if b > 0))
        return super().generate(state, max_new_tokens, rng)


def staggered_script(ids, rng):
    """Prompt qN searches `dN` once, then answers."""
    body = "<answer>\\boxed{1}</answer>" if ids.count(RESULT) else f"<search>d{TOK.decode(ids)[1]}</search>"
    tokens = TOK.encode("<think>x</think>" + body)
    return ScriptedSegment(tokens, [1.0] * len(tokens), "stop")


def test_continuous_schedule_resumes_results_that_arrive_together_in_one_tick():
    """Four searches started in one tick finish 5 ms apart. With a 100 ms arrival window the loop, woken
    by the first result, waits for the other three and decodes all four rows in one chunk; with no window
    it would decode as soon as half of them are back, and the others would take a chunk of their own
    (the tick counts are what this checks; the trajectories are the same either way)."""
    gen = BudgetLog(staggered_script)
    config = LoopConfig(max_tool_calls=2, max_response_tokens=500, max_context_len=1000, schedule="continuous",
                        arrival_window_ms=100.0)
    result = AgentLoop(gen, TOK, StaggeredTools(base=0.2, gap=0.005), config).run(
        [TOK.encode(f"q{i}") for i in range(4)], 1, 1, rng=np.random.default_rng(0), key=jax.random.key(0))
    assert all(t.stop_reason == END_ANSWER and len(t.tool_steps) == 1 for g in result.groups for t in g)
    assert gen.decoding == [4, 4], gen.decoding


class CallLog(ScriptedGenerator):
    """Records the order of generate ("decode") and append calls."""

    def __init__(self, script):
        super().__init__(script)
        self.calls = []

    def generate(self, state, max_new_tokens, rng=None):
        self.calls.append("decode")
        return super().generate(state, max_new_tokens, rng)

    def append(self, state, tokens):
        self.calls.append("append")
        return super().append(state, tokens)


class TwoWorkerStaggeredTools(StaggeredTools):
    max_workers = 2  # the loop then runs two calls at once and waits while fewer than half the rows decode


def test_continuous_schedule_appends_the_results_of_a_tick_in_one_append():
    """Four searches, two tool workers: the results come back 40 ms apart, and the loop waits for a second
    one (half the rows) before it decodes. Both go into the cache in one append, just before that decode;
    appended as each arrived, the tick made two appends (regression: one append per wait)."""
    gen = CallLog(staggered_script)
    config = LoopConfig(max_tool_calls=2, max_response_tokens=500, max_context_len=1000, schedule="continuous",
                        arrival_window_ms=5.0, min_generating_fraction=0.5)
    result = AgentLoop(gen, TOK, TwoWorkerStaggeredTools(base=0.05, gap=0.04), config).run(
        [TOK.encode(f"q{i}") for i in range(4)], 1, 1, rng=np.random.default_rng(0), key=jax.random.key(0))
    assert all(t.stop_reason == END_ANSWER and len(t.tool_steps) == 1 for g in result.groups for t in g)
    between = "".join("a" if c == "append" else "|" for c in gen.calls).split("|")[1:]
    assert gen.calls[0] == "decode" and gen.calls.count("append") >= 2, gen.calls
    assert all(len(appends) <= 1 for appends in between), gen.calls


def test_arrival_window_is_checked():
    with pytest.raises(ValueError, match="arrival_window_ms"):
        LoopConfig(arrival_window_ms=-1.0)


def test_background_compile_is_on_under_continuous_by_default_and_reaches_the_rollout_sampler():
    """`LoopConfig.background_compile`: "auto" turns the rollout sampler's background compiles on under the
    continuous schedule only (rounds stays bit-reproducible); "on" / "off" force it; anything else is refused."""
    from flax import nnx

    from aepo_jax.models import Decoder, get_preset
    from aepo_jax.rollout.agent_sampler import agent_sampler
    from aepo_jax.sampling import SamplingParams

    tok = ByteTokenizer()
    graphdef, params = nnx.split(Decoder(get_preset("tiny", vocab_size=tok.vocab_size), rngs=nnx.Rngs(0)))
    # (schedule, mode): (compiles in the background, holds them until the run ends)
    expected = {("rounds", "auto"): (False, False), ("continuous", "auto"): (True, True),
                ("rounds", "on"): (True, False), ("continuous", "on"): (True, False),
                ("rounds", "after_run"): (True, True), ("continuous", "off"): (False, False)}
    for (schedule, mode), (on, after_run) in expected.items():
        loop = LoopConfig(max_context_len=256, max_response_tokens=128, schedule=schedule, background_compile=mode)
        assert (loop.compiles_in_background, loop.compiles_after_run) == (on, after_run), (schedule, mode)
        sampler = agent_sampler(graphdef, params, tok, loop, SamplingParams(), seed=0)
        assert sampler._compiles.enabled is on
    with pytest.raises(ValueError, match="background_compile"):
        LoopConfig(background_compile="sometimes")


def test_layerwise_decode_reaches_the_rollout_sampler_from_the_config():
    """`rollout.layerwise_decode`: "on" / "off" force the rollout sampler's decode windows, "auto" leaves the
    choice to the Sampler (`default_layerwise_decode`); anything else is refused, naming the setting."""
    from flax import nnx

    from aepo_jax.experiment import loop_config_from
    from aepo_jax.models import Decoder, get_preset
    from aepo_jax.rollout.agent_sampler import agent_sampler
    from aepo_jax.sampling import SamplingParams
    from aepo_jax.sampling.sampler import default_layerwise_decode
    from configs.aepo_tiny import get_config

    tok = ByteTokenizer()
    graphdef, params = nnx.split(Decoder(get_preset("tiny", vocab_size=tok.vocab_size), rngs=nnx.Rngs(0)))
    cfg = get_config()
    assert cfg.rollout.layerwise_decode == "auto"  # the base config's default
    auto = default_layerwise_decode({d.platform for d in jax.devices()})
    for mode, expected in (("on", True), ("off", False), ("auto", auto)):
        cfg.rollout.layerwise_decode = mode
        loop = loop_config_from(cfg)
        assert loop.layerwise_decode == mode
        assert loop.decode_layerwise is {"on": True, "off": False, "auto": None}[mode]  # auto: the Sampler decides
        sampler = agent_sampler(graphdef, params, tok, loop, SamplingParams(), seed=0)
        assert sampler.layerwise_decode is expected, mode
    with pytest.raises(ValueError, match="layerwise_decode"):
        LoopConfig(layerwise_decode="sometimes")


class HoldLog(ScriptedGenerator):
    """Has `compiles_held()`; records, per generate call, how many such blocks were open, and how many ended."""

    def __init__(self, script):
        super().__init__(script)
        self.open, self.ended, self.open_at_generate = 0, 0, []

    @contextlib.contextmanager
    def compiles_held(self):
        self.open += 1
        try:
            yield
        finally:
            self.open -= 1
            self.ended += 1

    def generate(self, state, max_new_tokens, rng=None):
        self.open_at_generate.append(self.open)
        return super().generate(state, max_new_tokens, rng)


@pytest.mark.parametrize(("schedule", "mode", "held"), [("continuous", "auto", True), ("rounds", "auto", False),
                                                        ("rounds", "after_run", True), ("continuous", "on", False)])
def test_a_run_holds_the_generators_background_compiles_until_it_ends(schedule, mode, held):
    """With `compiles_after_run`, one `compiles_held()` block spans the whole run: every generate call of the
    run is inside it, and it has ended when `run` returns; otherwise the loop never opens one."""
    gen = HoldLog(segments_script(["<search>q</search>", "<answer>\\boxed{1}</answer>"]))
    config = LoopConfig(max_tool_calls=2, max_response_tokens=500, max_context_len=1000, schedule=schedule,
                        background_compile=mode)
    result = AgentLoop(gen, TOK, RecordingTools(), config).run(
        [TOK.encode(f"q{i}") for i in range(3)], 2, 2, rng=np.random.default_rng(0), key=jax.random.key(0))
    assert all(t.stop_reason == END_ANSWER for g in result.groups for t in g)
    assert len(gen.open_at_generate) >= 2
    assert gen.open_at_generate == [int(held)] * len(gen.open_at_generate)
    assert (gen.open, gen.ended) == (0, int(held))
