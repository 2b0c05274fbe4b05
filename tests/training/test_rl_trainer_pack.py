"""`train.pack = "tree"` versus `"flat"` in the RL trainer: one step on the same real
AEPO rollout of the tiny model (real sampler and agent loop, AEPO branching at tool
results so trajectories share whole turns) gives the same loss, metrics and updated
parameters, and the tree step logs that it computed fewer tokens."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from aepo_jax.agent.forcing import ToolForcingGenerator
from aepo_jax.agent.loop import AgentLoop, LoopConfig, agent_stop_sequences
from aepo_jax.agent.prompts import PromptConfig, render_prompts
from aepo_jax.agent.tags import AGENT_SPECIAL_TOKENS
from aepo_jax.data import PromptPipeline
from aepo_jax.models import Decoder, get_preset
from aepo_jax.rollout.strategies import RolloutConfig, rollout
from aepo_jax.sampling import Sampler
from aepo_jax.tokenizers import train_sentencepiece
from aepo_jax.tools import ToolRegistry
from aepo_jax.training.packing import pack_mini_batch
from aepo_jax.training.rl_trainer import RLTrainer
from aepo_jax.training.rollout_batch import rollout_sequences
from aepo_jax.training.train_step import sequence_logprobs
from configs.aepo_tiny import get_config as aepo_config

QUESTIONS = ["How many people live in Brindle?", "When was the Ostwick bridge built?"]
SYSTEM = "Think, then use <search>query</search> or <python>code</python>; answer as <answer>\\boxed{x}</answer>."


class ReplayedRollout:
    """The real AEPO rollout, run once on the first call and replayed after it, so that
    both trainers train on the very same trees (the sampler is not what is compared)."""

    def __init__(self, tok, graphdef, params):
        self.tok, self.graphdef, self.initial = tok, graphdef, params
        self.cache = {}
        self.branches = 0

    def __call__(self, prompts, k, params, key, rng):
        for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(self.initial), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # a first step: initial weights
        cache_key = (tuple(map(tuple, prompts)), k)
        if cache_key not in self.cache:
            out = self._run(prompts, k, params, key, rng)
            self.cache[cache_key] = out, rng.bit_generator.state
        else:
            # A replay leaves `rng` where the real rollout left it: the trainer's mini-batch plan draws from it
            # next, so every trainer shuffles epochs after the first alike.
            out, state = self.cache[cache_key]
            rng.bit_generator.state = state
        return out

    def _run(self, prompts, k, params, key, rng):
        tok = self.tok
        sampler = Sampler(self.graphdef, params, eos_ids=[tok.eos_id], pad_id=tok.pad_id,
                          stop_sequences=agent_stop_sequences(tok), max_cache_len=512, seed=0)
        plan = [tok.encode("<search>Brindle people</search>"), tok.encode("<python>print(6 * 7)</python>"),
                tok.encode("<answer>\\boxed{42}</answer>")]
        generator = ToolForcingGenerator(sampler, plan, free_tokens=4)
        registry = ToolRegistry({}, max_workers=2)  # every call gets the registry's failure text (mask 0)
        loop = AgentLoop(generator, tok, registry, LoopConfig(max_tool_calls=3, max_response_tokens=120,
                                                              max_context_len=256))
        # AEPO with a fixed budget of one global sample and tau = 0: the group is a branched tree.
        config = RolloutConfig(strategy="aepo", initial_rollouts=1, dynamic_budget=False, branch_threshold=0.0)
        try:
            groups, stats = rollout(prompts, k, loop=loop, config=config, rng=rng, key=key)
        finally:
            registry.close()
        self.branches += sum(not t.is_global for g in groups for t in g)
        return groups, stats.as_dict()


@pytest.fixture(scope="module")
def setup():
    texts = QUESTIONS + [SYSTEM, "Brindle river town people Ostwick bridge print(6 * 7) the a of in is to"] * 3
    tok = train_sentencepiece(texts, vocab_size=400, special_tokens=AGENT_SPECIAL_TOKENS)
    graphdef, params = nnx.split(Decoder(get_preset("tiny", vocab_size=tok.vocab_size), rngs=nnx.Rngs(0)))
    params = jax.tree.map(np.array, params)  # host copy: each trainer donates its own device buffers
    prompts = {q: ids for q, ids in zip(QUESTIONS, render_prompts(tok, QUESTIONS, PromptConfig(system_prompt=SYSTEM)))}
    return tok, graphdef, params, prompts, ReplayedRollout(tok, graphdef, params)


def _config(pack: str):
    c = aepo_config()
    c.train.pack = pack
    c.data.prompts_per_step = 2
    c.rollout.k = 4
    c.train.mini_batch_prompts = 2  # one update over both groups ...
    c.train.micro_batch_size = 2  # ... accumulated over micro-batches (flat: 4 of 2 rows; tree: 2 of one group)
    c.mesh.shape = {"data": 2, "fsdp": 1, "tensor": -1}  # rows over 2 devices, so a tree micro-batch fills them
    c.train.max_seq_len = 512
    c.train.length_bucket = 64
    c.total_steps = 1
    c.optim.warmup_steps = 0  # the tiny config warms up from lr 0: the first update would be a no-op
    # Adam's first step is lr * g / (|g| + eps): with eps = 1e-8 it is ~lr * sign(g), so a gradient within
    # float32 rounding of zero may move a weight by up to lr either way. A larger eps keeps the update a
    # smooth function of the gradient, so equal gradients show as equal parameters.
    c.optim.eps = 1e-3
    c.log.progress_bar = False
    c.log.tensorboard = False
    c.checkpoint.async_save = False
    return c


def _reward(example, trajectory):
    """Fraction of response tokens with an even id: differs between branches of a tree."""
    del example
    return float(np.mean(np.asarray(trajectory.response_ids) % 2 == 0))


def _one_step(setup, pack, workdir):
    tok, graphdef, params, prompts, rollout_fn = setup
    cfg = _config(pack)
    examples = [{"id": f"q{i}", "question": q, "answers": ["42"], "data_source": "test"}
                for i, q in enumerate(QUESTIONS)]
    trainer = RLTrainer(cfg, str(workdir), rollout_fn=rollout_fn, pipeline=PromptPipeline(examples, 2, seed=0),
                        encode_prompt=lambda ex: prompts[ex["question"]], reward_fn=_reward,
                        graphdef=graphdef, params=jax.tree.map(jnp.asarray, params), pad_id=tok.pad_id)
    try:
        metrics = trainer.train_step()
        return metrics, jax.device_get(trainer.state.params)
    finally:
        trainer.close()


def test_tree_and_flat_trainer_steps_agree(setup, tmp_path):
    tree_metrics, tree_params = _one_step(setup, "tree", tmp_path / "tree")
    flat_metrics, flat_params = _one_step(setup, "flat", tmp_path / "flat")
    assert setup[4].branches > 0  # the rollout really branched
    assert tree_metrics["updates"] == flat_metrics["updates"] == 1.0

    np.testing.assert_allclose(tree_metrics["loss"], flat_metrics["loss"], rtol=1e-5, atol=1e-7)
    assert abs(flat_metrics["loss"]) > 1e-6
    for key in ("grad_norm", "clip_frac_upper", "train_tokens", "entropy_mean", "adv/advantage_mean"):
        if key in flat_metrics:
            np.testing.assert_allclose(tree_metrics[key], flat_metrics[key], rtol=2e-5, atol=1e-7, err_msg=key)
    initial = setup[2]
    moved = 0.0
    for t, f, p in zip(jax.tree.leaves(tree_params), jax.tree.leaves(flat_params), jax.tree.leaves(initial),
                       strict=True):
        np.testing.assert_allclose(np.asarray(t), np.asarray(f), rtol=1e-5, atol=1e-6)
        moved = max(moved, float(np.abs(np.asarray(f) - np.asarray(p)).max()))
    assert moved > 1e-4  # the update is not a no-op (lr 1e-3)

    # packing statistics: same flat counts, fewer tokens computed by the tree step
    assert tree_metrics["pack/flat_tokens"] == flat_metrics["pack/flat_tokens"] > 0
    assert tree_metrics["pack/flat_slots"] == flat_metrics["pack/flat_slots"]
    assert flat_metrics["pack/token_ratio"] == 1.0 and flat_metrics["pack/slot_ratio"] == 1.0
    assert tree_metrics["pack/computed_tokens"] == tree_metrics["pack/unique_tokens"] + tree_metrics[
        "pack/copied_tokens"]
    assert tree_metrics["pack/computed_tokens"] < tree_metrics["pack/flat_tokens"]
    assert tree_metrics["pack/token_ratio"] > 1.5  # four trajectories per group share the prompt and turns
    assert tree_metrics["pack/micro_batches"] == 2.0  # one group's tree (two rows of T) per forward
    assert tree_metrics["pack/slot_ratio"] > 1.5


def test_unknown_pack_mode_is_a_clear_error(setup, tmp_path):
    _, graphdef, params, _, rollout_fn = setup
    with pytest.raises(ValueError, match="unknown train.pack 'ragged'"):
        RLTrainer(_config("ragged"), str(tmp_path), rollout_fn=rollout_fn, pipeline=iter([]),
                  encode_prompt=lambda ex: [], reward_fn=_reward, graphdef=graphdef, params=params)


def _chain(group: int, length: int) -> dict:
    """A group of two trajectories sharing all but the last token."""
    return {"tokens": [group + 1] * (length - 1) + [group + 2], "mask": [0] + [1] * (length - 1),
            "logp_old": [0.0] * length, "advantages": [1.0] * length}


@pytest.mark.parametrize(("micro_batch_size", "data_parallel", "parts", "rows"),
                         [(2, 1, 2, 2), (4, 1, 1, 4), (1, 4, 1, 4), (1, 2, 2, 2), (1, 1, 4, 1)])
def test_pack_mini_batch_sizes_micro_batches_by_packed_slots(micro_batch_size, data_parallel, parts, rows):
    # four groups, each a tree of 8 nodes that fills one row of T = 8
    sequences, groups = [], []
    for g in range(4):
        sequences += [_chain(10 * g, 7), dict(_chain(10 * g, 7), tokens=[10 * g + 1] * 6 + [10 * g + 3])]
        groups += [g, g]
    batch, stats = pack_mini_batch(sequences, groups, 8, micro_batch_size=micro_batch_size,
                                   data_parallel=data_parallel)
    assert batch["packed_ids"].shape == (parts, rows, 8)
    assert batch["mask"].shape[0] == parts and batch["mask"].shape[2] == 8
    assert stats.unique_tokens == 4 * 8 and stats.flat_tokens == 8 * 7


def _trainer(setup, pack, workdir, **overrides):
    tok, graphdef, params, prompts, rollout_fn = setup
    cfg = _config(pack)
    for key, value in overrides.items():
        cfg.train[key] = value
    examples = [{"id": f"q{i}", "question": q, "answers": ["42"], "data_source": "test"}
                for i, q in enumerate(QUESTIONS)]
    return RLTrainer(cfg, str(workdir), rollout_fn=rollout_fn, pipeline=PromptPipeline(examples, 2, seed=0),
                     encode_prompt=lambda ex: prompts[ex["question"]], reward_fn=_reward,
                     graphdef=graphdef, params=jax.tree.map(jnp.asarray, params), pad_id=tok.pad_id)


@pytest.mark.parametrize("pack", ["tree", "flat"])
def test_micro_batched_scoring_equals_one_shot_flat_scoring(setup, tmp_path, pack):
    """`RLTrainer._score` (one mini-batch of one group at a time, micro-batched, in the update's
    layout) equals one flat forward over all the step's rows, on real branched rollouts."""
    tok, graphdef, params, prompts, rollout_fn = setup
    trainer = _trainer(setup, pack, tmp_path, mini_batch_prompts=1)
    try:
        groups, _ = rollout_fn([prompts[q] for q in QUESTIONS], 4, trainer.state.params, jax.random.key(0),
                               np.random.default_rng(0))
        seqs = rollout_sequences(groups, [[_reward(None, t) for t in g] for g in groups], max_len=512,
                                 length_bucket=64)
        plan = trainer._mini_batch_plan(len(groups), seqs.group_ids, np.random.default_rng(0))
        assert len(plan[0]) == 2  # scored in two mini-batches (and each in micro-batches)
        logp, entropy = trainer._score(trainer.state.params, seqs, plan[0])
    finally:
        trainer.close()
    padded = seqs.padded(tok.pad_id)
    want_logp, want_entropy = jax.jit(sequence_logprobs, static_argnums=0)(
        graphdef, jax.tree.map(jnp.asarray, params), jax.tree.map(jnp.asarray, padded))
    valid = padded["valid"]
    assert np.abs(want_logp * valid).sum() > 0
    np.testing.assert_allclose(logp, np.asarray(want_logp) * valid, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(entropy, np.asarray(want_entropy) * valid, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pack", ["tree", "flat"])
def test_first_update_after_rescoring_has_ratio_exactly_one(setup, tmp_path, pack):
    """`train.recompute_logp_old`: scoring uses the update's batch builder, layout and scorer on the
    first epoch's mini-batches, so the first update's log-ratio is exactly 0 on every policy token.

    Run in its own process with XLA:CPU's YNNPACK fusions off: on CPUs with AVX-512 / AMX they fuse the
    scorer program's and the update program's products differently, and the two then differ in float32
    rounding (approx_kl_old 2.7e-9 on a Sapphire Rapids machine) whatever the layout. Without them the
    two programs' kernels agree, so only what this test is about (builder, layout, scorer) can differ."""
    from tests.child_process import ran_in_child_process

    if ran_in_child_process(__file__, f"test_first_update_after_rescoring_has_ratio_exactly_one[{pack}]",
                            xla_flags="--xla_cpu_experimental_ynn_fusion_type="):
        return
    trainer = _trainer(setup, pack, tmp_path)
    try:
        assert trainer.config.train.recompute_logp_old
        metrics = trainer.train_step()
    finally:
        trainer.close()
    assert metrics["updates"] == 1.0
    assert metrics["approx_kl_old"] == 0.0 and metrics["approx_kl_old_k3"] == 0.0, metrics
    assert metrics["ratio_mean"] == 1.0
    assert metrics["clip_frac_upper"] == metrics["clip_frac_lower"] == 0.0


# One group of trajectories sharing a prompt, cut into parts of at most one row (T = 8): the count of
# micro-batches came from the uncut tree's slots, so two parts shared a micro-batch (two rows).
ONE_GROUP_CUT = (
    [[38, 46, 21, 22, 96, 59], [38, 46, 21, 22, 52, 70], [38, 46, 21, 22, 80, 67, 98, 79],
     [38, 46, 21, 22, 50, 72, 90, 87]],
    [[34, 20, 45, 28, 41, 58], [34, 20, 45, 28, 41, 86, 96], [34, 20, 45, 28, 41, 92], [34, 20, 45, 28, 41, 96, 69],
     [34, 20, 45, 28, 41, 59, 66, 95]],
    [[49, 31, 31, 93, 68, 70, 77], [49, 31, 31, 98, 58, 70], [49, 31, 31, 91, 77]],
)


@pytest.mark.parametrize("token_lists", ONE_GROUP_CUT)
def test_no_micro_batch_holds_more_packed_rows_than_its_cap(token_lists):
    """A micro-batch is sized at one row per device here, but two cut parts of one group shared one: two
    rows, hence twice the step's activation memory of the shape the memory plan compiles. Micro-batches are
    now added until each holds at most `micro_batch_rows_cap` rows; every token is still scored once."""
    from aepo_jax.training.packing.trainer_batches import micro_batch_rows_cap

    sequences = [{"tokens": t, "mask": [0] + [1] * (len(t) - 1), "logp_old": [0.0] * len(t),
                  "advantages": [1.0] * len(t)} for t in token_lists]
    raw, _ = pack_mini_batch(sequences, [0] * len(sequences), 8, micro_batch_size=1, data_parallel=1, bucket=False)
    assert micro_batch_rows_cap(1, 8, 8, 1) == 1
    assert raw["packed_ids"].shape[1] == 1
    assert int(raw["scored"].sum()) == sum(len(t) - 1 for t in token_lists)
