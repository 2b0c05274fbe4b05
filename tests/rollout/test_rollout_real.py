"""End to end with the real tiny model, the real sampler, the search server on loopback and the python sandbox."""

from __future__ import annotations

import dataclasses
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from aepo_jax.agent.forcing import ToolForcingGenerator
from aepo_jax.agent.loop import AgentLoop, LoopConfig, agent_stop_sequences
from aepo_jax.agent.prompts import PromptConfig, render_prompts
from aepo_jax.agent.tags import AGENT_SPECIAL_TOKENS
from aepo_jax.models import Decoder, get_preset
from aepo_jax.rollout.strategies import RolloutConfig, rollout
from aepo_jax.sampling import Sampler
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
    "kell": "Kell river\nThe Kell river is 212 km long and runs past Brindle and Marrow.",
}
QUESTIONS = ["How many people live in Brindle?", "When was the Ostwick bridge built?", "How long is the Kell?"]
SYSTEM = "Think, then use <search>query</search> or <python>code</python>; answer as <answer>\\boxed{x}</answer>."


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    texts = list(CORPUS.values()) + QUESTIONS + [SYSTEM, "print(6 * 7) the a of in is to and"] * 3
    tok = train_sentencepiece(texts, vocab_size=400, special_tokens=AGENT_SPECIAL_TOKENS)
    model = Decoder(get_preset("tiny", vocab_size=tok.vocab_size), rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    sampler = Sampler(graphdef, params, eos_ids=[tok.eos_id], pad_id=tok.pad_id,
                      stop_sequences=agent_stop_sequences(tok), max_cache_len=4096, seed=0)
    plan = [tok.encode("<think>look</think><search>Brindle people</search>"),
            tok.encode("<python>print(6 * 7)</python>"),
            tok.encode("<answer>\\boxed{42}</answer>")]
    generator = ToolForcingGenerator(sampler, plan, free_tokens=6)
    corpus = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": k, "contents": v}) + "\n" for k, v in CORPUS.items()))
    limits = SandboxLimits(wall_seconds=5.0, cpu_seconds=2, memory_bytes=256 << 20)
    with start_search_server(str(corpus)) as server, PythonSandbox(limits, pool_size=2) as sandbox:
        registry = ToolRegistry({"search": SearchTool(server.url, topk=1, max_result_chars=40),
                                 "python": PythonTool(sandbox)}, max_workers=4)
        loop = AgentLoop(generator, tok, registry,
                         LoopConfig(max_tool_calls=4, max_response_tokens=320, max_context_len=600))
        prompts = render_prompts(tok, QUESTIONS, PromptConfig(system_prompt=SYSTEM))
        yield {"tok": tok, "model": model, "loop": loop, "prompts": prompts, "sampler": sampler}
        registry.close()


@functools.partial(jax.jit, static_argnums=0)
def _response_logp(graphdef, params, ids):  # ids int32[N, T] right-padded -> logp of ids[:, 1:], [N, T-1]
    logits = nnx.merge(graphdef, params)(ids).astype(jnp.float32)  # [N, T, V]
    logz = jax.nn.log_softmax(logits[:, :-1], axis=-1)  # [N, T-1, V]
    return jnp.take_along_axis(logz, ids[:, 1:, None], axis=-1)[..., 0]


def full_forward_logp(model, trajs) -> list[np.ndarray]:
    """The trainer's view: log-probs of each response under one causal forward over prompt + response.

    Right padding to a fixed [power of two, 640] shape keeps it to a few compiles; causal attention
    makes the padding invisible to the real positions.
    """
    graphdef, params = nnx.split(model)
    rows = [t.prompt_ids + t.response_ids for t in trajs]
    batch = np.zeros((1 << (len(rows) - 1).bit_length(), 640), np.int32)
    for i, r in enumerate(rows):
        batch[i, :len(r)] = r
    logp = np.asarray(_response_logp(graphdef, params, jnp.asarray(batch)))
    return [logp[i, len(t.prompt_ids) - 1:len(rows[i]) - 1] for i, t in enumerate(trajs)]  # [R] each


def assert_logp_old_matches_full_forward(model, trajs) -> None:
    for t, recomputed in zip(trajs, full_forward_logp(model, trajs), strict=True):
        mask = np.asarray(t.mask, bool)
        assert mask.sum() > 0
        np.testing.assert_allclose(recomputed[mask], np.asarray(t.logp_old)[mask], atol=2e-4, rtol=1e-4)


def test_aepo_end_to_end_real_model_and_tools(agent):
    tok, k = agent["tok"], 4
    groups, stats = rollout(agent["prompts"], k, loop=agent["loop"], config=RolloutConfig(strategy="aepo"),
                            rng=np.random.default_rng(0), key=jax.random.key(0))
    print("AEPO end-to-end stats:", json.dumps(stats.as_dict(), default=str))
    trajs = [t for g in groups for t in g]
    assert [len(g) for g in groups] == [k] * len(QUESTIONS) and all(t.finished for t in trajs)
    tags_used = {s.tag for t in trajs for s in t.tool_steps}
    assert {"search", "python"} <= tags_used
    for t in trajs:
        for step in t.tool_steps:
            text = tok.decode(t.response_ids[step.result_start:step.result_end])
            assert text == " <result>\n" + step.result_text + "\n</result>"
            if step.tag == "search" and step.content == "Brindle people":
                assert step.ok and step.result_text.startswith("Doc 1 (Title: Brindle)")
            if step.tag == "python" and step.content == "print(6 * 7)":
                assert step.ok and "42" in step.result_text
        expected = np.ones(len(t.response_ids), np.int32)
        for step in t.tool_steps:
            expected[step.result_start:step.result_end] = 0
        np.testing.assert_array_equal(t.mask, expected)
    # Trainer-side log-probs by a full forward equal the sampler's logp_old (float32).
    assert_logp_old_matches_full_forward(agent["model"], trajs)
    assert stats.trajectories_per_prompt == k and stats.num_global + stats.num_branch == k * len(QUESTIONS)
    assert stats.forward_tokens > 0 and stats.trajectory_tokens > 0
    assert stats.global_budgets is not None and all(1 <= m <= k for m in stats.global_budgets)
    # Branches were forked from the KV cache: the only prefilled tokens are the global trajectories' prompts
    # (the pre-monitoring samples included) and the shared prefixes of the reused pre-monitoring samples'
    # own branches (that run's decode state is gone by then), none of another branch's prefix.
    by_id = {t.traj_id: t for t in trajs}
    assert stats.num_branch > 0 and stats.repacks == 0
    globals_started = [t for t in trajs if t.is_global]  # reused pre-monitoring samples are among them
    reused = {t.traj_id for t in trajs if t.traj_id < len(QUESTIONS)}  # the pre-run's ids come first
    from_reused = [t for t in trajs if t.parent_id in reused]
    assert stats.prefill_tokens == (sum(len(t.prompt_ids) for t in globals_started)
                                    + sum(len(t.prompt_ids) + t.branch_point for t in from_reused))
    check_branches(agent["model"], by_id)


def test_aepo_under_rounds_repeats_bit_for_bit(agent):
    """`rounds` depends on no timing: AEPO's pre-monitoring run, the reused samples' replayed decisions and
    the branches give the same trees from the same seeds, token for token and score for score."""
    assert agent["loop"].config.schedule == "rounds"
    config = RolloutConfig(strategy="aepo", branch_threshold=0.0)  # every decision with budget left branches
    runs = [rollout(agent["prompts"], 4, loop=agent["loop"], config=config, rng=np.random.default_rng(7),
                    key=jax.random.key(7)) for _ in range(2)]
    (groups_a, stats_a), (groups_b, stats_b) = runs
    assert stats_a.num_branch > 0 and stats_a.global_budgets == stats_b.global_budgets
    for a, b in zip(groups_a, groups_b, strict=True):
        assert [(t.traj_id, t.parent_id, t.branch_point, t.response_ids, t.logp_old, t.entropy) for t in a] == [
            (t.traj_id, t.parent_id, t.branch_point, t.response_ids, t.logp_old, t.entropy) for t in b]


def test_branches_re_prefilled_cost_their_prefix_in_prefill_tokens(agent):
    """The contrast to the fork path above: `branch_by="prefill"` recomputes every branch's prefix."""
    base = agent["loop"]
    loop = AgentLoop(base.generator, base.tokenizer, base.tools, dataclasses.replace(base.config, branch_by="prefill"))
    config = RolloutConfig(strategy="arpo", initial_rollouts=1, branch_threshold=0.0)  # every decision branches
    groups, stats = rollout(agent["prompts"][:2], 4, loop=loop, config=config, rng=np.random.default_rng(1),
                            key=jax.random.key(1))
    trajs = {t.traj_id: t for g in groups for t in g}
    branches = [t for t in trajs.values() if not t.is_global]
    assert branches and stats.repacks == 0 and stats.branch_prefix_tokens > 0
    global_prompt_tokens = sum(len(t.prompt_ids) for t in trajs.values() if t.is_global)
    assert stats.prefill_tokens == global_prompt_tokens + stats.branch_prefix_tokens
    check_branches(agent["model"], trajs)


def check_branches(model, trajs: dict) -> None:
    branches = [t for t in trajs.values() if not t.is_global]
    for child in branches:
        parent, bp = trajs[child.parent_id], child.branch_point
        assert bp in parent.tool_result_ends
        assert child.prompt_ids == parent.prompt_ids
        assert child.response_ids[:bp] == parent.response_ids[:bp] and child.mask[:bp] == parent.mask[:bp]
        assert child.logp_old[:bp] == parent.logp_old[:bp] and child.entropy[:bp] == parent.entropy[:bp]
        assert len(child.response_ids) > bp  # it sampled its own continuation
    # The branches' caches are right: their own sampled tokens score the same under a full forward.
    assert_logp_old_matches_full_forward(model, branches)


class _WithoutMarks:
    """The wrapped generator without `mark` / `fork_marked`: the loop snapshots by forking rows."""

    def __init__(self, generator, forked_rows: list[int]) -> None:
        self._generator, self._forked_rows = generator, forked_rows

    def fork(self, state, rows):
        self._forked_rows.append(len(rows))
        return self._generator.fork(state, rows)

    def __getattr__(self, name: str):
        if name in ("mark", "fork_marked"):
            raise AttributeError(name)
        return getattr(self._generator, name)


class _CountingForks(_WithoutMarks):
    def __getattr__(self, name: str):
        return getattr(self._generator, name)


@pytest.mark.parametrize("schedule", ["rounds", "continuous"])
def test_branch_snapshots_by_marks_give_the_rollout_of_forked_snapshots(agent, schedule):
    """A branch snapshot kept as marks (the rows keep growing; branches are forked from them as marked)
    gives the trajectories a copied snapshot gives, token for token and score for score, while the
    loop forks fewer rows. Rounds are bit-reproducible, so the two rollouts must be identical; under
    `continuous` (timing decides which tick a result joins) the checks are the invariants."""
    base = agent["loop"]
    config = dataclasses.replace(base.config, schedule=schedule)
    strategy = RolloutConfig(strategy="arpo", initial_rollouts=1, branch_threshold=0.0)  # every decision branches
    runs = []
    for wrapper in (_CountingForks, _WithoutMarks):
        forked: list[int] = []
        loop = AgentLoop(wrapper(base.generator, forked), base.tokenizer, base.tools, config)
        groups, stats = rollout(agent["prompts"], 4, loop=loop, config=strategy, rng=np.random.default_rng(3),
                                key=jax.random.key(3))
        trajs = {t.traj_id: t for g in groups for t in g}
        assert stats.num_branch > 0 and stats.repacks == 0
        check_branches(agent["model"], trajs)
        runs.append((trajs, sum(forked)))
    (by_marks, marks_forked), (by_forks, forks_forked) = runs
    assert marks_forked < forks_forked
    if schedule == "rounds":
        assert sorted(by_marks) == sorted(by_forks)
        for tid, t in by_marks.items():
            other = by_forks[tid]
            assert (t.parent_id, t.branch_point, t.response_ids, t.mask) == (
                other.parent_id, other.branch_point, other.response_ids, other.mask)
            assert t.logp_old == other.logp_old and t.entropy == other.entropy


@pytest.mark.parametrize("schedule", ["rounds", "continuous"])
def test_a_rollout_holds_at_most_one_and_a_half_caches(agent, schedule):
    """Counted after every sampler program of a real rollout: the live KV caches together never exceed
    1.5 times the largest decode state's cache (a batch that grows or halves is copied once: old and new
    side by side). With branch snapshots copied as forks, this rollout held 1.9 (rounds) and 2.0 times."""
    from benchmarks.cache_census import LiveCacheCensus

    base = agent["loop"]
    loop = AgentLoop(base.generator, base.tokenizer, base.tools, dataclasses.replace(base.config, schedule=schedule))
    strategy = RolloutConfig(strategy="arpo", initial_rollouts=2, branch_threshold=0.0)  # every decision branches
    with LiveCacheCensus(agent["sampler"]) as census:
        groups, stats = rollout(agent["prompts"] * 3, 6, loop=loop, config=strategy, rng=np.random.default_rng(5),
                                key=jax.random.key(5))
    assert stats.num_branch > 0 and census.largest_batch >= 32
    assert [len(g) for g in groups] == [6] * 9 and all(t.finished for g in groups for t in g)
    assert 1.0 <= census.peak_caches <= 1.5, (census.peak_caches, census.largest_batch)
