"""Compile buckets of tree batches: mini-batches of different sizes in one bucket share
one compiled packed step, and the bucket padding (empty rows, flat rows and micro-batches)
leaves loss, gradients and metrics equal to the unpadded batch and to the flat step."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from aepo_jax.objectives import get_preset, loss_config, loss_denominator
from aepo_jax.training.batch import pad_sequences
from aepo_jax.training.packing import (
    PackingTally,
    bucket_size,
    build_packed_batch,
    make_train_step_for_pack,
    pack_mini_batch,
    pad_to_buckets,
    unpack_flat,
)
from aepo_jax.training.train_state import TrainState
from aepo_jax.training.train_step import StepConfig, rl_loss_fn, sequence_logprobs
from tests.training.fixtures import packed_loss_and_grads, tiny_model

T = 32


def _groups(seed: int, num_groups: int, k: int) -> tuple[list[dict], list[int]]:
    """GRPO-style groups: a shared prompt (mask 0) and `k` random responses each."""
    rng = np.random.default_rng(seed)
    sequences, group_ids = [], []
    for g in range(num_groups):
        prompt = rng.integers(1, 64, size=int(rng.integers(6, 12))).tolist()
        for _ in range(k):
            tokens = prompt + rng.integers(1, 64, size=int(rng.integers(3, T - len(prompt)))).tolist()
            mask = np.zeros(len(tokens), np.float32)
            mask[len(prompt):] = 1.0
            sequences.append({"tokens": tokens, "mask": mask, "advantages": np.float32(rng.normal())})
            group_ids.append(g)
    return sequences, group_ids


def _with_logp(graphdef, params, sequences, seed=1):
    """logp_old / logp_ref = current log-probs plus jitter (clipping and KL are exercised)."""
    rng = np.random.default_rng(seed)
    flat = pad_sequences(sequences, max_len=T, length_multiple=8)
    logp = np.asarray(sequence_logprobs(graphdef, params, jax.tree.map(jnp.asarray, flat))[0])
    out = []
    for i, s in enumerate(sequences):
        n = len(s["tokens"])
        out.append(dict(s, logp_old=logp[i, :n] + rng.normal(scale=0.3, size=n).astype(np.float32),
                        logp_ref=logp[i, :n] + rng.normal(scale=0.1, size=n).astype(np.float32)))
    return out


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def test_bucket_size_ladder_and_multiples():
    assert [bucket_size(n) for n in range(1, 14)] == [1, 2, 3, 4, 6, 6, 8, 8, 12, 12, 12, 12, 16]
    assert [bucket_size(n, 2) for n in (1, 2, 3, 5, 7, 9, 13)] == [2, 2, 4, 6, 8, 12, 16]
    assert [bucket_size(n, 3) for n in (1, 4, 7, 10, 19)] == [3, 6, 9, 12, 24]
    for n in range(1, 200):
        b = bucket_size(n, 4)
        assert b >= n and b % 4 == 0 and b < 1.5 * n + 4  # at most a third of the slots is padding
    with pytest.raises(ValueError, match="n >= 1"):
        bucket_size(0)
    with pytest.raises(ValueError, match="multiple must be >= 1"):
        bucket_size(3, 0)


def test_pad_to_buckets_pads_every_axis_with_inert_slots():
    sequences, group_ids = _groups(0, 7, 5)
    raw, stats = build_packed_batch(sequences, T, group_ids, max_len=T, length_multiple=T, micro_batches=5)
    assert raw["packed_ids"].shape == (5, 9, T) and raw["mask"].shape == (5, 10, T)
    batch, padded = pad_to_buckets(raw, stats)
    assert batch.keys() == raw.keys()
    assert batch["packed_ids"].shape == (6, 12, T) and batch["mask"].shape == (6, 12, T)
    assert batch["sequence_index"].shape == (6, 12)
    for key, value in raw.items():  # real content unchanged, in the leading corner
        np.testing.assert_array_equal(batch[key][tuple(slice(0, n) for n in value.shape)], value, err_msg=key)
    pad_row = batch["packed_subtree_end"][5, 9]  # a padding slot attends only to itself
    np.testing.assert_array_equal(pad_row, np.arange(1, T + 1))
    np.testing.assert_array_equal(batch["packed_subtree_end"][:5, 9], np.broadcast_to(np.arange(1, T + 1), (5, T)))
    assert not batch["mask"][5].any() and not batch["scored"][5].any() and not batch["mask"][:, 10:].any()
    assert (batch["sequence_index"][5] == -1).all() and (batch["sequence_index"][:, 10:] == -1).all()
    assert padded.bucket_slots == (6 * 12 - 5 * 9) * T
    assert padded.packed_slots == stats.packed_slots + padded.bucket_slots == 6 * 12 * T
    assert padded.rows == 6 * 12 and padded.packed_tokens == stats.packed_tokens
    values = np.arange(np.prod(batch["mask"].shape), dtype=np.float32).reshape(batch["mask"].shape)
    np.testing.assert_array_equal(unpack_flat(values, batch, len(sequences)),
                                  unpack_flat(values[:5, :10], raw, len(sequences)))
    tally = PackingTally()
    tally.add_tree(padded, 0, 6)
    metrics = tally.metrics()
    assert metrics["pack/computed_slots"] == 6 * 12 * T and metrics["pack/bucket_slots"] == padded.bucket_slots
    with pytest.raises(ValueError, match="row_multiple=2"):
        pad_to_buckets(raw, stats, row_multiple=2)


def _cfg(objective, **overrides):
    """The preset's surrogate, clips and aggregation (no KL or entropy term unless overridden); `overrides`
    are loss fields or step fields (temperature)."""
    p = get_preset(objective)
    step = {k: overrides.pop(k) for k in ("temperature", "micro_batch_size") if k in overrides}
    loss = loss_config(p.surrogate, **({"clip_low": p.clip_low, "clip_high": p.clip_high, "dual_clip_c": p.dual_clip_c,
                                        "loss_agg": p.loss_agg} | overrides))
    return StepConfig(loss=loss, **step)


CONFIGS = {
    "aepo_dr_grpo_kl_entropy": _cfg("aepo", loss_agg="seq_mean_token_sum_norm", kl_coef=0.1, entropy_coef=0.01),
    "grpo_seq_mean": _cfg("grpo", loss_agg="seq_mean_token_mean"),
    "gspo": _cfg("gspo"),
    "cispo_token_mean": _cfg("cispo", loss_agg="token_mean"),
}


def test_bucket_padding_keeps_loss_and_gradients_exact(model):
    """M 5 -> 6, R 9 -> 12, B 10 -> 12: loss and gradients equal the unpadded batch's and the flat step's."""
    graphdef, params = model
    sequences, group_ids = _groups(0, 7, 5)
    sequences = _with_logp(graphdef, params, sequences)
    raw, stats = build_packed_batch(sequences, T, group_ids, max_len=T, length_multiple=T, micro_batches=5)
    padded, _ = pad_to_buckets(raw, stats)
    flat = {k: jnp.asarray(v) for k, v in pad_sequences(sequences, max_len=T, length_multiple=T).items()}

    @jax.jit
    def packed_side(params, batch):
        return {name: packed_loss_and_grads(graphdef, cfg, params, batch) for name, cfg in CONFIGS.items()}

    @jax.jit
    def flat_side(params, flat):
        out = {}
        for name, cfg in CONFIGS.items():
            denominator = loss_denominator(flat["mask"], cfg.loss.loss_agg)
            out[name] = jax.value_and_grad(rl_loss_fn(graphdef, cfg), has_aux=True)(params, flat, denominator)
        return out

    got = packed_side(params, jax.tree.map(jnp.asarray, padded))
    unpadded = packed_side(params, jax.tree.map(jnp.asarray, raw))
    reference = flat_side(params, flat)
    for name in CONFIGS:
        (loss, grads, metrics), (want_loss, want_grads, want_metrics) = got[name], unpadded[name]
        (flat_loss, _), flat_grads = reference[name]
        assert float(optax.tree.norm(want_grads)) > 0
        assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves((loss, grads, metrics))), name
        np.testing.assert_allclose(float(loss), float(want_loss), rtol=1e-6, atol=1e-7, err_msg=name)
        np.testing.assert_allclose(float(loss), float(flat_loss), rtol=1e-5, atol=1e-7, err_msg=name)
        for key in want_metrics:
            np.testing.assert_allclose(metrics[key], want_metrics[key], rtol=1e-6, atol=1e-7, err_msg=key)
        for x, y, z in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads), jax.tree.leaves(flat_grads),
                           strict=True):
            x, y, z = np.asarray(x), np.asarray(y), np.asarray(z)
            scale = max(np.abs(y).max(), 1e-12)
            np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6 * scale, err_msg=name)
            np.testing.assert_allclose(x, z, rtol=2e-5, atol=2e-5 * scale, err_msg=name)


def test_mini_batches_in_one_bucket_reuse_the_compiled_step(model):
    """Five and six groups (one micro-batch each, rows over 2 devices): different raw shapes,
    one bucket, one compiled program (`jax.jit`'s cache) for both steps."""
    graphdef, params = model
    cfg = CONFIGS["aepo_dr_grpo_kl_entropy"]
    sgd = optax.sgd(1.0)
    batches = []
    for seed, num_groups in ((2, 5), (3, 6)):
        sequences, group_ids = _groups(seed, num_groups, 3)
        sequences = _with_logp(graphdef, params, sequences, seed)
        kwargs = {"micro_batch_size": 1, "data_parallel": 2}
        raw, _ = pack_mini_batch(sequences, group_ids, T, bucket=False, **kwargs)
        batch, stats = pack_mini_batch(sequences, group_ids, T, **kwargs)
        batches.append((raw, batch, stats))
    (raw_a, a, stats_a), (raw_b, b, stats_b) = batches
    assert raw_a["packed_ids"].shape != raw_b["packed_ids"].shape  # unbucketed: a recompile
    assert stats_a.bucket_slots > 0 and stats_b.bucket_slots == 0
    for key in a:
        assert a[key].shape == b[key].shape and a[key].dtype == b[key].dtype, key
    assert a["packed_ids"].shape == (6, 4, T)

    step = make_train_step_for_pack(graphdef, sgd, cfg, "tree")
    metrics = []
    for batch in (a, b):
        state = TrainState.create(jax.tree.map(jnp.array, params), sgd, seed=0)
        _, m = step(state, jax.tree.map(jnp.asarray, batch))
        metrics.append(jax.tree.map(np.asarray, m))
        assert step._cache_size() == 1  # the second mini-batch reused the first one's program
    for m, batch in zip(metrics, (a, b), strict=True):
        assert np.isfinite(m["loss"]) and m["train_tokens"] == batch["mask"].sum() > 0
