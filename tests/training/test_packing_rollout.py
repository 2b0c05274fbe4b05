"""Tree-packed == flat on trees from the real rollout engine: the tiny model, the real
sampler and agent loop, ARPO branching at every tool result (so trees share whole
turns), tool calls answered by the real registry (no tool registered: each call
gets the registry's failure text as its result, mask 0)."""

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
from aepo_jax.objectives import loss_config, loss_denominator
from aepo_jax.rollout.strategies import RolloutConfig, rollout
from aepo_jax.sampling import Sampler
from aepo_jax.tokenizers import train_sentencepiece
from aepo_jax.tools import ToolRegistry
from aepo_jax.training.packing import build_train_batch
from aepo_jax.training.train_step import StepConfig, rl_loss_fn
from tests.training.fixtures import packed_loss_and_grads

QUESTIONS = ["How many people live in Brindle?", "When was the Ostwick bridge built?"]
SYSTEM = "Think, then use <search>query</search> or <python>code</python>; answer as <answer>\\boxed{x}</answer>."


@pytest.fixture(scope="module")
def rollout_sequences():
    texts = QUESTIONS + [SYSTEM, "Brindle river town people Ostwick bridge print(6 * 7) the a of in is to"] * 3
    tok = train_sentencepiece(texts, vocab_size=400, special_tokens=AGENT_SPECIAL_TOKENS)
    model = Decoder(get_preset("tiny", vocab_size=tok.vocab_size), rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    sampler = Sampler(graphdef, params, eos_ids=[tok.eos_id], pad_id=tok.pad_id,
                      stop_sequences=agent_stop_sequences(tok), max_cache_len=512, seed=0)
    plan = [tok.encode("<search>Brindle people</search>"), tok.encode("<python>print(6 * 7)</python>"),
            tok.encode("<answer>\\boxed{42}</answer>")]
    generator = ToolForcingGenerator(sampler, plan, free_tokens=4)
    registry = ToolRegistry({}, max_workers=2)
    loop = AgentLoop(generator, tok, registry, LoopConfig(max_tool_calls=3, max_response_tokens=120,
                                                          max_context_len=256))
    prompts = render_prompts(tok, QUESTIONS, PromptConfig(system_prompt=SYSTEM))
    config = RolloutConfig(strategy="arpo", initial_rollouts=1, branch_threshold=0.0)  # every decision branches
    groups, _ = rollout(prompts, 4, loop=loop, config=config, rng=np.random.default_rng(0), key=jax.random.key(0))
    registry.close()
    rng = np.random.default_rng(1)
    sequences, group_ids, branches = [], [], 0
    for g, trajs in enumerate(groups):
        for t in trajs:
            prompt = len(t.prompt_ids)
            sequences.append({
                "tokens": t.prompt_ids + t.response_ids,
                "mask": [0] * prompt + t.mask,
                # the sampler's logp_old, shifted so some ratios leave the clip range
                "logp_old": np.asarray([0.0] * prompt + t.logp_old, np.float32)
                + rng.normal(scale=0.3, size=prompt + len(t.mask)).astype(np.float32),
                "advantages": np.float32(rng.normal()),
            })
            group_ids.append(g)
            branches += not t.is_global
    assert branches > 0
    return graphdef, params, sequences, group_ids


def test_rollout_trees_tree_packed_loss_and_gradients_equal_flat(rollout_sequences):
    graphdef, params, sequences, group_ids = rollout_sequences
    max_len = max(len(s["tokens"]) for s in sequences)
    flat, _ = build_train_batch(sequences, "flat", group_ids=group_ids, length=max_len)
    # micro-batches as large as the mini-batch: whole groups, whatever their trees' size
    packed, stats = build_train_batch(sequences, "tree", group_ids=group_ids, length=max_len,
                                      micro_batch_size=len(sequences))
    first = {}
    response_tokens = 0
    for s, g in zip(sequences, group_ids, strict=True):
        prompt = int(np.argmax(np.asarray(s["mask"]) > 0))
        first.setdefault(g, prompt)
        response_tokens += len(s["tokens"]) - prompt
    # Branches share whole turns: fewer nodes than one prompt per group plus every response token.
    assert stats.unique_tokens < sum(first.values()) + response_tokens
    cfgs = {"aepo": StepConfig(loss=loss_config("aepo")),
            "gspo": StepConfig(loss=loss_config("gspo", loss_agg="seq_mean_token_mean"))}

    @jax.jit
    def both(params, flat, packed):
        out = {}
        for name, cfg in cfgs.items():
            denominator = loss_denominator(flat["mask"], cfg.loss.loss_agg)
            (loss, _), grads = jax.value_and_grad(rl_loss_fn(graphdef, cfg), has_aux=True)(params, flat, denominator)
            out[name] = ((loss, grads), packed_loss_and_grads(graphdef, cfg, params, packed)[:2])
        return out

    out = both(params, jax.tree.map(jnp.asarray, flat), jax.tree.map(jnp.asarray, packed))
    for name, ((want_loss, want_grads), (loss, grads)) in out.items():
        np.testing.assert_allclose(float(loss), float(want_loss), rtol=1e-5, atol=1e-7, err_msg=name)
        for x, y in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads), strict=True):
            scale = max(float(np.abs(y).max()), 1e-12)
            np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=2e-5, atol=2e-5 * scale, err_msg=name)
        assert float(sum(np.abs(np.asarray(g)).sum() for g in jax.tree.leaves(want_grads))) > 0


def test_a_group_larger_than_a_micro_batch_is_cut_and_its_loss_and_gradients_stay_flat(rollout_sequences):
    """Micro-batches of one flat row (`micro_batch_size=1`, one device): a group's tree is larger than that,
    so it is cut into parts of at most one row each (whole, a group went into one micro-batch of several
    rows: 12 rows of 8192 per device at the 14B config); the loss and gradients are still the flat ones."""
    graphdef, params, sequences, group_ids = rollout_sequences
    max_len = max(len(s["tokens"]) for s in sequences)
    flat, _ = build_train_batch(sequences, "flat", group_ids=group_ids, length=max_len)
    packed, _ = build_train_batch(sequences, "tree", group_ids=group_ids, length=max_len, micro_batch_size=1,
                                      bucket=False)
    whole, _ = build_train_batch(sequences, "tree", group_ids=group_ids, length=max_len,
                                 micro_batch_size=len(sequences), bucket=False)
    assert whole["packed_ids"].shape[1] > 1  # (a micro-batch as large as the group keeps it whole: several rows)
    m, rows, row_len = packed["packed_ids"].shape
    assert rows == 1 and row_len == max_len and m > len(set(group_ids)), (m, rows, row_len)
    cfg = StepConfig(loss=loss_config("aepo"))

    @jax.jit
    def both(params, flat, packed):  # (one program, as the step runs it)
        denominator = loss_denominator(flat["mask"], cfg.loss.loss_agg)
        (want_loss, _), want_grads = jax.value_and_grad(rl_loss_fn(graphdef, cfg), has_aux=True)(
            params, flat, denominator)
        return (want_loss, want_grads), packed_loss_and_grads(graphdef, cfg, params, packed)[:2]

    (want_loss, want_grads), (loss, grads) = both(params, jax.tree.map(jnp.asarray, flat),
                                                  jax.tree.map(jnp.asarray, packed))
    np.testing.assert_allclose(float(loss), float(want_loss), rtol=1e-5, atol=1e-7)
    for x, y in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads), strict=True):
        scale = max(float(np.abs(y).max()), 1e-12)
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=2e-5, atol=2e-5 * scale)
