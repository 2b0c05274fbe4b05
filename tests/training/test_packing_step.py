"""Tree-packed step == flat step: per-token log-probs, loss and gradients (float32),
on hand-made trees (deep chain, wide fan, single trajectory, a tree overflowing a
row) and GRPO-style groups, for aepo, grpo, gppo, cispo and gspo."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from aepo_jax.objectives import get_preset, loss_config, loss_denominator
from aepo_jax.training.batch import pad_sequences
from aepo_jax.training.packing import make_logprob_fn_for_pack, make_train_step_for_pack
from aepo_jax.training.packing.packed_batch import build_packed_batch, unpack_flat
from aepo_jax.training.train_state import TrainState
from aepo_jax.training.train_step import (
    StepConfig,
    make_rl_train_step,
    rl_loss_fn,
    sequence_logprobs,
)
from tests.training.fixtures import packed_loss_and_grads, tiny_model

ROW_LEN = 32
OBJECTIVES = ("aepo", "grpo", "gppo", "cispo", "gspo")


def _traj(tokens, prompt_len, tool_spans=()):
    mask = np.zeros(len(tokens), np.float32)
    mask[prompt_len:] = 1.0
    for a, b in tool_spans:
        mask[a:b] = 0.0
    return {"tokens": list(tokens), "mask": mask}


def _shapes(rng):
    """name -> trajectories of one group (token ids from a 64-token vocabulary)."""
    def fresh(n):
        return rng.integers(1, 64, size=n).tolist()

    shapes = {}
    prompt = fresh(4)
    chain = [prompt + fresh(26)]  # each branch forks its predecessor further down
    for cut in (8, 14, 20, 25):
        chain.append(chain[-1][:cut] + fresh(30 - cut))
    shapes["deep_chain"] = [_traj(t, 4, [(6, 8)]) for t in chain]
    prompt = fresh(5)
    shapes["wide_fan"] = [_traj(prompt + [first] + fresh(int(rng.integers(0, 3))), 5)
                          for first in rng.permutation(np.arange(1, 64))[:12].tolist()]
    shapes["single"] = [_traj(fresh(20), 6, [(10, 13)])]
    prompt = fresh(12)
    base = prompt + fresh(18)
    over = [base] + [base[:cut] + fresh(30 - cut) for cut in (12, 12, 16, 22, 27)]
    shapes["overflow"] = [_traj(t, 12, [(14, 16)]) for t in over]  # 12 + 18 + 4 * 18 + ... nodes > ROW_LEN
    return shapes


def _grpo_groups(rng, groups=3, k=4):
    out = []
    for _ in range(groups):
        prompt = rng.integers(1, 64, size=int(rng.integers(6, 12))).tolist()
        out.append([_traj(prompt + rng.integers(1, 64, size=int(rng.integers(3, 14))).tolist(), len(prompt))
                    for _ in range(k)])
    return out


def _with_loss_inputs(graphdef, params, groups, rng):
    """Flatten groups, add a per-trajectory advantage and logp_old = current logp + jitter
    (so clipping and dual clipping are exercised)."""
    sequences, group_ids = [], []
    for g, trajs in enumerate(groups):
        for t in trajs:
            sequences.append(dict(t, advantages=np.float32(rng.normal())))
            group_ids.append(g)
    flat = pad_sequences(sequences, max_len=ROW_LEN, length_multiple=8)
    logp, _ = sequence_logprobs(graphdef, params, jax.tree.map(jnp.asarray, flat))
    for i, s in enumerate(sequences):
        n = len(s["tokens"])
        s["logp_old"] = np.asarray(logp)[i, :n] + rng.normal(scale=0.3, size=n).astype(np.float32)
        s["logp_ref"] = np.asarray(logp)[i, :n] + rng.normal(scale=0.1, size=n).astype(np.float32)
    return sequences, group_ids


@pytest.fixture(scope="module")
def setup():
    graphdef, params = tiny_model()
    rng = np.random.default_rng(0)
    shapes = _shapes(rng)
    groups = list(shapes.values()) + _grpo_groups(rng)
    sequences, group_ids = _with_loss_inputs(graphdef, params, groups, rng)
    names = list(shapes) + ["grpo_groups"] * (len(groups) - len(shapes))
    return graphdef, params, sequences, group_ids, names


def _assert_trees_close(a, b, rtol=2e-5):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        x, y = np.asarray(x), np.asarray(y)
        scale = max(np.abs(y).max(), 1e-12)
        np.testing.assert_allclose(x, y, rtol=rtol, atol=rtol * scale)


def _cfg(objective, **overrides):
    """The preset's surrogate, clips and aggregation (no KL or entropy term unless overridden); `overrides`
    are loss fields or step fields (temperature)."""
    p = get_preset(objective)
    step = {k: overrides.pop(k) for k in ("temperature", "micro_batch_size") if k in overrides}
    loss = loss_config(p.surrogate, **({"clip_low": p.clip_low, "clip_high": p.clip_high, "dual_clip_c": p.dual_clip_c,
                                        "loss_agg": p.loss_agg} | overrides))
    return StepConfig(loss=loss, **step)


@pytest.fixture(scope="module")
def all_objectives(setup):
    """Loss and gradients of every objective, flat and packed, each side in one compiled program."""
    graphdef, params, sequences, group_ids, _ = setup
    packed_np, stats = build_packed_batch(sequences, ROW_LEN, group_ids)
    packed = {k: jnp.asarray(v) for k, v in packed_np.items()}
    flat = {k: jnp.asarray(v) for k, v in pad_sequences(sequences, max_len=ROW_LEN, length_multiple=8).items()}
    cfgs = {name: _cfg(name) for name in OBJECTIVES}

    @jax.jit
    def flat_side(params, flat):
        out = {"logprobs": sequence_logprobs(graphdef, params, flat)}
        for name, cfg in cfgs.items():
            denominator = loss_denominator(flat["mask"], cfg.loss.loss_agg)
            (loss, _), grads = jax.value_and_grad(rl_loss_fn(graphdef, cfg), has_aux=True)(params, flat, denominator)
            out[name] = (loss, grads)
        return out

    @jax.jit
    def packed_side(params, packed):
        out = {name: packed_loss_and_grads(graphdef, cfg, params, packed)[:2] for name, cfg in cfgs.items()}
        out["logprobs"] = make_logprob_fn_for_pack(graphdef, StepConfig(), "tree")(params, packed)  # inlined into this jit
        return out

    return flat_side(params, flat), packed_side(params, packed), packed_np, stats


def test_packed_logprobs_and_entropies_equal_flat_for_every_tree_shape(setup, all_objectives):
    _, _, sequences, group_ids, names = setup
    flat, packed, batch, stats = all_objectives
    assert stats.copied_tokens > 0  # the overflowing trees were split
    assert stats.rows < stats.pieces  # several pieces share rows (bin packing)
    assert stats.unique_tokens < stats.flat_tokens
    want_logp, want_entropy = (np.asarray(x) for x in flat["logprobs"])
    got_logp, got_entropy = (unpack_flat(x, batch, len(sequences)) for x in packed["logprobs"])
    for i, seq in enumerate(sequences):
        n, name = len(seq["tokens"]), names[group_ids[i]]
        np.testing.assert_allclose(got_logp[i, :n], want_logp[i, :n], rtol=1e-5, atol=2e-5,
                                   err_msg=f"{name}: trajectory {i}")
        np.testing.assert_allclose(got_entropy[i, :n], want_entropy[i, :n], rtol=1e-5, atol=2e-5,
                                   err_msg=f"{name}: trajectory {i}")


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_packed_loss_and_gradients_equal_flat(all_objectives, objective):
    flat, packed, _, _ = all_objectives
    (want_loss, want_grads), (loss, grads) = flat[objective], packed[objective]
    np.testing.assert_allclose(float(loss), float(want_loss), rtol=1e-5, atol=1e-7)
    assert float(optax.tree.norm(want_grads)) > 0
    _assert_trees_close(grads, want_grads)


def _run(step_fn, params, tx, batch):
    state = TrainState.create(jax.tree.map(jnp.array, params), tx, seed=0)
    new_state, metrics = step_fn(state, {k: jnp.asarray(v) for k, v in batch.items()})
    return new_state, jax.tree.map(np.asarray, metrics)


def test_packed_train_step_with_micro_batches_kl_and_entropy_equals_flat_step(setup):
    """The whole jitted step (SGD lr 1: the update is the gradient), Dr. GRPO aggregation,
    KL and entropy terms, two micro-batches of whole groups."""
    graphdef, params, sequences, group_ids, _ = setup
    sgd = optax.sgd(1.0)
    cfg = _cfg("aepo", loss_agg="seq_mean_token_sum_norm", kl_coef=0.1, entropy_coef=0.01, temperature=0.9)
    flat = pad_sequences(sequences, max_len=ROW_LEN, length_multiple=8)
    want, want_m = _run(make_rl_train_step(graphdef, sgd, cfg), params, sgd, flat)
    packed, _ = build_packed_batch(sequences, ROW_LEN, group_ids, micro_batches=2)
    assert packed["mask"].shape[0] == 2
    got, got_m = _run(make_train_step_for_pack(graphdef, sgd, cfg, "tree"), params, sgd, packed)
    for key in ("loss", "grad_norm", "clip_frac_upper", "clip_frac_lower", "ratio_mean", "kl_ref", "entropy_mean",
                "train_tokens"):
        np.testing.assert_allclose(got_m[key], want_m[key], rtol=1e-5, atol=1e-7, err_msg=key)
    assert 0 < want_m["clip_frac_upper"] + want_m["clip_frac_lower"] < 1
    _assert_trees_close(jax.tree.map(lambda a, p: a - p, got.params, params),
                        jax.tree.map(lambda a, p: a - p, want.params, params))


def test_bad_inputs_raise_clear_errors(setup):
    _, _, sequences, group_ids, _ = setup
    with pytest.raises(ValueError, match="longer than row_len=8"):
        build_packed_batch(sequences, 8, group_ids)
    with pytest.raises(ValueError, match="group_ids has 2 entries"):
        build_packed_batch(sequences, ROW_LEN, [0, 1])
    with pytest.raises(ValueError, match="micro_batches=99 exceeds the number of groups"):
        build_packed_batch(sequences, ROW_LEN, group_ids, micro_batches=99)
