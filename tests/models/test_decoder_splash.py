"""The decoder with `attention="splash"` (Pallas interpret mode on CPU) equals the dense decoder through
each caller's structured mask: padded training rows (`causal_mask`), tree-packed rows through the packed
scorer (`tree_mask`, the tree kernel) and the sampler's cached blocks (`cached_mask`, the dense fallback).
Only real query positions are compared: padding queries see different keys per backend, unread."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from aepo_jax.models import Decoder, get_preset
from aepo_jax.sampling import Sampler, SamplingParams
from aepo_jax.training.batch import pad_sequences
from aepo_jax.training.packing import packed_logprobs
from aepo_jax.training.packing.packed_batch import build_packed_batch, unpack_flat
from aepo_jax.training.train_step import forward_logits, sequence_logprobs

VOCAB = 64
ATOL = 1e-5


@pytest.fixture(scope="module")
def models():
    """(dense graphdef, splash graphdef, params): the same weights under both backends."""
    dense = get_preset("tiny", vocab_size=VOCAB)
    graphdef, params = nnx.split(Decoder(dense, rngs=nnx.Rngs(0)))
    splash = dense.replace(attention="splash", attention_interpret=True)
    splash_graphdef, _ = nnx.split(nnx.eval_shape(lambda: Decoder(splash, rngs=nnx.Rngs(0))))
    return graphdef, splash_graphdef, params


def test_splash_decoder_equals_dense_on_padded_training_rows(models):
    graphdef, splash_graphdef, params = models
    rng = np.random.default_rng(0)
    valid = np.ones((2, 24), bool)
    valid[0, :5] = False  # left padding
    valid[1, 10:13] = False  # a hole (a tool result's padding)
    valid[1, 20:] = False  # right padding
    positions = np.maximum(np.cumsum(valid, axis=1) - 1, 0).astype(np.int32)
    batch = {"input_ids": jnp.asarray(rng.integers(1, VOCAB, size=(2, 24)), jnp.int32),
             "positions": jnp.asarray(positions), "valid": jnp.asarray(valid)}
    forward = jax.jit(forward_logits, static_argnums=0)
    traced = forward.trace(splash_graphdef, params, batch)
    assert "splash_mqa_fwd" in traced.jaxpr.pretty_print()  # the splash kernel, not the dense path
    want = np.asarray(forward(graphdef, params, batch))  # [B, T, V]
    got = np.asarray(traced.lower().compile()(params, batch))
    np.testing.assert_allclose(got[valid], want[valid], rtol=0, atol=ATOL)


def test_splash_scorer_equals_dense_on_right_padded_rows(models):
    graphdef, splash_graphdef, params = models
    rng = np.random.default_rng(1)
    sequences = [{"tokens": rng.integers(1, VOCAB, size=n).tolist(), "mask": np.ones(n, np.float32)} for n in (9, 16)]
    batch = jax.tree.map(jnp.asarray, pad_sequences(sequences, max_len=16))
    score = jax.jit(sequence_logprobs, static_argnums=0)
    valid = np.asarray(batch["valid"]) > 0
    for got, want in zip(score(splash_graphdef, params, batch), score(graphdef, params, batch), strict=True):
        np.testing.assert_allclose(np.asarray(got)[valid], np.asarray(want)[valid], rtol=0, atol=ATOL)


def test_splash_packed_scorer_runs_the_tree_kernel_and_equals_dense(models):
    graphdef, splash_graphdef, params = models
    rng = np.random.default_rng(2)
    prompt = rng.integers(1, VOCAB, size=5).tolist()
    trajectories = [prompt + rng.integers(1, VOCAB, size=n).tolist() for n in (7, 3, 9)]
    other = [rng.integers(1, VOCAB, size=6).tolist()]
    sequences = [{"tokens": t, "mask": np.ones(len(t), np.float32)} for t in trajectories + other]
    packed_np, stats = build_packed_batch(sequences, 32, group_ids=[0, 0, 0, 1])
    assert stats.unique_tokens < stats.flat_tokens  # the prompt is shared
    micro = {k: jnp.asarray(v[0]) for k, v in packed_np.items()}  # the one micro-batch
    score = jax.jit(packed_logprobs, static_argnums=0)
    traced = score.trace(splash_graphdef, params, micro)
    assert "tree_attention_forward" in traced.jaxpr.pretty_print()  # the tree kernel, not the dense path
    got, want = traced.lower().compile()(params, micro), score(graphdef, params, micro)
    for got_x, want_x in zip(got, want, strict=True):
        got_flat = unpack_flat(np.asarray(got_x)[None], packed_np, len(sequences))
        want_flat = unpack_flat(np.asarray(want_x)[None], packed_np, len(sequences))
        for i, seq in enumerate(sequences):
            n = len(seq["tokens"])
            np.testing.assert_allclose(got_flat[i, :n], want_flat[i, :n], rtol=0, atol=ATOL)


def test_splash_sampler_prefill_and_decode_equal_dense(models):
    """Cached blocks (S != T) take the dense path under splash (docs/attention.md): same tokens and scores."""
    graphdef, splash_graphdef, params = models
    prompts = [[3, 9, 27, 14, 5], [7, 2]]

    def run(graph):
        sampler = Sampler(graph, params, params=SamplingParams(greedy=True))
        state = sampler.prefill(prompts)
        prefill_logits = np.asarray(state.last_logits)
        _, out = sampler.generate(state, 4)
        return prefill_logits, out

    want_logits, want = run(graphdef)
    got_logits, got = run(splash_graphdef)
    np.testing.assert_allclose(got_logits, want_logits, rtol=0, atol=ATOL)
    for row in range(len(prompts)):
        assert got.row_tokens(row) == want.row_tokens(row)
        np.testing.assert_allclose(got.logp[row], want.logp[row], rtol=0, atol=ATOL)
        np.testing.assert_allclose(got.entropy[row], want.entropy[row], rtol=0, atol=ATOL)


def test_splash_on_a_mesh_runs_per_device_and_equals_dense(models):
    """On a mesh (data 2 x fsdp 2 x tensor 2) splash runs inside `shard_map` (Mosaic kernels cannot be
    partitioned by the compiler): rows split over data x fsdp, kv heads over tensor; the flat scorer
    (`make_logprob_fn`, traced under its batch sharding's mesh) and the tree kernel equal the dense path."""
    from aepo_jax.parallel import batch_sharding, make_mesh
    from aepo_jax.training.train_step import StepConfig, make_logprob_fn

    graphdef, splash_graphdef, params = models
    mesh = make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    rng = np.random.default_rng(3)
    sequences = [{"tokens": rng.integers(1, VOCAB, size=n).tolist(), "mask": np.ones(n, np.float32)}
                 for n in (9, 16, 12, 5)]
    host = pad_sequences(sequences, max_len=16)
    sharding = {k: batch_sharding(mesh, np.ndim(v)) for k, v in host.items() if k in ("input_ids", "positions", "valid")}
    batch = {k: jax.device_put(host[k], s) for k, s in sharding.items()}
    step_config = StepConfig(micro_batch_size=4)
    score = make_logprob_fn(splash_graphdef, step_config, sharding)
    lowered = score.lower(params, batch).as_text()
    assert "shard_map" in lowered or "sdy.manual_computation" in lowered
    got = score(params, batch)
    want = make_logprob_fn(graphdef, step_config, sharding)(params, batch)
    valid = np.asarray(host["valid"]) > 0
    for got_x, want_x in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(got_x)[valid], np.asarray(want_x)[valid], rtol=0, atol=ATOL)

    trajectories = [rng.integers(1, VOCAB, size=n).tolist() for n in (7, 3, 9, 6)]
    packed_np, _ = build_packed_batch([{"tokens": t, "mask": np.ones(len(t), np.float32)} for t in trajectories],
                                      16, group_ids=[0, 1, 2, 3])
    micro = {k: jnp.asarray(v[0]) for k, v in packed_np.items()}
    packed = jax.jit(packed_logprobs, static_argnums=0)
    with jax.set_mesh(mesh):
        got = packed(splash_graphdef, params, micro)
    want = packed(graphdef, params, micro)
    for got_x, want_x in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(got_x), np.asarray(want_x), rtol=0, atol=ATOL)
