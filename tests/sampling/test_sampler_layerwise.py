"""The two decode-window programs (`Sampler(layerwise_decode=...)`) give the same rollout.

Layerwise windows (the CPU and GPU default) run on per-layer copies of the weights and of the cache's
live span, layers unrolled; stacked windows (the TPU default) scan the stacked layers every step. Every
other sampler test runs the default on this CPU, so this file is where the stacked program is
checked, against the layerwise one and on its own cache contents.
"""

import jax
import numpy as np
import pytest

from aepo_jax.sampling import Sampler, SamplingParams
from aepo_jax.sampling.program_runs import DECODE_WINDOW
from aepo_jax.sampling.sampler import default_layerwise_decode
from tests.sampling.conftest import random_prompts

SAMPLED = SamplingParams(temperature=1.0)


def _rollout(sampler: Sampler, prompts, stop_sequences_hit: bool = False):
    """prefill, a multi-window sampled generate, a ragged append, a second generate with top log-probs."""
    st, first = sampler.generate(sampler.prefill(prompts), [2 * DECODE_WINDOW + 3, 5, 0, 9],
                                 rng=jax.random.key(7))
    st = sampler.append(st, random_prompts(41, [0, 6, 3, 1]))
    st, second = sampler.generate(st, DECODE_WINDOW + 1, rng=jax.random.key(8), top_logprobs=3)
    return st, first, second


def test_default_is_layerwise_on_cpu_and_can_be_turned_off(tiny_model):
    _, graphdef, state = tiny_model
    assert Sampler(graphdef, state).layerwise_decode is (jax.default_backend() in ("cpu", "gpu"))
    assert Sampler(graphdef, state, layerwise_decode=False).layerwise_decode is False


def test_the_default_is_layerwise_on_cpus_and_gpus_only():
    """GPU joined the layerwise platforms after an H200 run (docs/rollout_engine.md, "On a GPU"); TPU keeps
    the stacked scan its memory plan compiles, and a mixed or empty set of platforms keeps it too."""
    assert default_layerwise_decode({"cpu"}) and default_layerwise_decode({"gpu"})
    assert default_layerwise_decode({"cpu", "gpu"})
    assert not default_layerwise_decode({"tpu"})
    assert not default_layerwise_decode({"gpu", "tpu"})
    assert not default_layerwise_decode(set())


def test_layerwise_and_stacked_windows_give_the_same_tokens_scores_and_cache(tiny_model):
    _, graphdef, state = tiny_model
    prompts = random_prompts(40, [3, 12, 7, 20])
    runs = {}
    for layerwise in (True, False):
        sampler = Sampler(graphdef, state, params=SAMPLED, layerwise_decode=layerwise)
        runs[layerwise] = _rollout(sampler, prompts)
    (st_a, first_a, second_a), (st_b, first_b, second_b) = runs[True], runs[False]
    for a, b in ((first_a, first_b), (second_a, second_b)):
        assert a.tokens.tolist() == b.tokens.tolist()
        assert a.num_tokens.tolist() == b.num_tokens.tolist()
        assert a.stop_reason == b.stop_reason
        for name in ("logp", "logp_truncated", "entropy"):
            np.testing.assert_allclose(getattr(a, name), getattr(b, name), rtol=1e-5, atol=1e-5, err_msg=name)
    np.testing.assert_allclose(second_a.top_logprobs, second_b.top_logprobs, rtol=1e-5, atol=1e-5)
    assert second_a.top_ids.tolist() == second_b.top_ids.tolist()
    assert first_a.num_tokens[0] == 2 * DECODE_WINDOW + 3  # three windows, the span growing between them
    # The layerwise window writes its span back into the stacked cache: same slots, same keys and values.
    a, b = st_a.arrays, st_b.arrays
    assert np.asarray(a.cursor).tolist() == np.asarray(b.cursor).tolist()
    assert np.array_equal(np.asarray(a.slot_valid), np.asarray(b.slot_valid))
    valid = np.asarray(a.slot_valid)[None, :, None, :, None]  # [1, B, 1, S, 1]
    for x, y in ((a.cache.k, b.cache.k), (a.cache.v, b.cache.v)):
        x, y = np.asarray(x), np.asarray(y)
        np.testing.assert_allclose(np.where(valid, x, 0), np.where(valid, y, 0), rtol=1e-5, atol=1e-5)
        assert not np.where(valid, 0, x).any(), "a window wrote slots that hold no token"


def test_layerwise_windows_on_a_sharded_mesh_match_stacked_ones(tiny_model):
    if jax.device_count() < 8:
        pytest.skip("needs the 8 fake CPU devices set in tests/conftest.py")
    from aepo_jax.parallel import make_mesh

    _, graphdef, state = tiny_model
    mesh = make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    prompts = random_prompts(42, [5, 9, 2, 14])
    outs = {}
    for layerwise in (True, False):
        sampler = Sampler(graphdef, state, params=SAMPLED, mesh=mesh, layerwise_decode=layerwise)
        st, _, second = _rollout(sampler, prompts)
        assert st.arrays.cache.k.sharding.is_equivalent_to(
            jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(None, ("data", "fsdp"), "tensor")), 5)
        outs[layerwise] = second
    assert outs[True].tokens.tolist() == outs[False].tokens.tolist()
    np.testing.assert_allclose(outs[True].logp, outs[False].logp, rtol=1e-5, atol=1e-5)


def test_an_untied_head_decodes_alike_in_layerwise_and_stacked_windows():
    """The other tests use the tied `tiny` preset; a model with its own `[D, V]` head gives the same
    tokens and scores in both window programs too."""
    import dataclasses

    from flax import nnx

    from aepo_jax.models import Decoder, get_preset

    model = Decoder(dataclasses.replace(get_preset("tiny"), tie_embeddings=False), rngs=nnx.Rngs(3))
    assert model.lm_head is not None
    graphdef, state = nnx.split(model)
    prompts = random_prompts(43, [4, 11, 2, 8])
    outs = [_rollout(Sampler(graphdef, state, params=SAMPLED, layerwise_decode=lw), prompts)[1:] for lw in (True, False)]
    for a, b in zip(outs[0], outs[1], strict=True):
        assert a.tokens.tolist() == b.tokens.tolist()
        np.testing.assert_allclose(a.logp, b.logp, rtol=1e-5, atol=1e-5)


def test_float32_weights_are_split_in_the_compute_dtype_without_changing_a_token(monkeypatch):
    """A float32 state with bfloat16 compute (training weights a rollout samples with): the layerwise copy
    holds the blocks' parameters in bfloat16 (half the memory, half the bytes a step reads), and the
    rollout is bit-identical to one on a float32 copy, since every block casts its parameters to the
    compute dtype before use."""
    import dataclasses

    from flax import nnx

    from aepo_jax.models import Decoder, get_preset
    from aepo_jax.models.decoder import split_layer_params
    from aepo_jax.sampling import sampler as sampler_module

    # Every kind of block parameter there is: q/k/v biases and q/k norms (the untied head is not a block
    # parameter: both runs read it from the float32 state).
    config = dataclasses.replace(get_preset("tiny"), dtype="bfloat16", param_dtype="float32", qkv_bias=True,
                                 qk_norm=True, tie_embeddings=False)
    graphdef, state = nnx.split(Decoder(config, rngs=nnx.Rngs(5)))
    # Every weight (the norms' unit scales too) off the bfloat16 grid, so a block that used a float32
    # parameter at float32 would compute with other values than the bfloat16 copy holds.
    leaves, treedef = jax.tree.flatten(state)
    keys = jax.random.split(jax.random.key(6), len(leaves))
    state = jax.tree.unflatten(treedef, [x * (1 + 0.05 * jax.random.normal(k, x.shape)) for x, k in zip(leaves, keys)])
    prompts = random_prompts(44, [6, 13, 3, 9])
    cast = Sampler(graphdef, state, params=SAMPLED, layerwise_decode=True)
    runs = {"cast": _rollout(cast, prompts)}
    dtypes = {x.dtype for layer in cast._layerwise_weights() for x in jax.tree.leaves(layer)}
    assert dtypes == {jax.numpy.dtype("bfloat16")}, dtypes
    # The same rollout on an uncast float32 copy.
    monkeypatch.setattr(sampler_module, "split_layers_program",
                        jax.jit(lambda params, dtype: split_layer_params(params), static_argnums=(1,)))
    uncast = Sampler(graphdef, state, params=SAMPLED, layerwise_decode=True)
    runs["float32"] = _rollout(uncast, prompts)
    assert {x.dtype for layer in uncast._layerwise_weights() for x in jax.tree.leaves(layer)} == {
        jax.numpy.dtype("float32")}
    for a, b in zip(runs["cast"][1:], runs["float32"][1:], strict=True):
        assert a.tokens.tolist() == b.tokens.tolist()
        for name in ("logp", "logp_truncated", "entropy"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    # And the stacked scan, which reads the float32 stack (prefill, append and scoring always do). In
    # bfloat16 the two programs round differently, so a sampled token can flip where two neighbours are
    # nearly tied, and the rows diverge from there: until then they agree to bfloat16 precision.
    monkeypatch.undo()
    stacked = _rollout(Sampler(graphdef, state, params=SAMPLED, layerwise_decode=False), prompts)
    # A row's second generate is compared only where its first one agreed throughout (else its context differs).
    agreeing, same_context = 0, [True] * len(prompts)
    for a, b in zip(runs["cast"][1:], stacked[1:], strict=True):
        for row in range(len(prompts)):
            if not same_context[row]:
                continue
            real = int(a.num_tokens[row])
            assert int(b.num_tokens[row]) == real
            x, y = np.asarray(a.tokens[row])[:real], np.asarray(b.tokens[row])[:real]
            n = int(np.argmax(x != y)) if np.any(x != y) else real
            same_context[row] = n == real
            agreeing += n
            for name in ("logp", "entropy"):
                np.testing.assert_allclose(np.asarray(getattr(a, name)[row])[:n], np.asarray(getattr(b, name)[row])[:n],
                                           atol=0.05, err_msg=name)
    # 38 of the 213 real tokens here: a random model's near-uniform distributions flip a sampled token soon.
    assert agreeing >= 30, agreeing


def test_the_split_only_narrows_floating_point_parameters():
    """A bfloat16 state under float32 compute keeps its bfloat16 copy (a cast would double it), and
    integer leaves are never cast."""
    import jax.numpy as jnp

    from aepo_jax.models.decoder import split_layer_params

    state = {"layers": {"w32": jnp.ones((2, 3), jnp.float32), "w16": jnp.ones((2, 3), jnp.bfloat16),
                        "ids": jnp.arange(6, dtype=jnp.int32).reshape(2, 3)}}
    narrowed = split_layer_params(state, "bfloat16")
    assert [{k: v.dtype.name for k, v in layer.items()} for layer in narrowed] == [
        {"w32": "bfloat16", "w16": "bfloat16", "ids": "int32"}] * 2
    widened = split_layer_params(state, "float32")
    assert {k: v.dtype.name for k, v in widened[1].items()} == {"w32": "float32", "w16": "bfloat16", "ids": "int32"}
    assert np.asarray(widened[1]["ids"]).tolist() == [3, 4, 5]
    assert {k: v.dtype.name for k, v in split_layer_params(state)[0].items()} == {
        "w32": "float32", "w16": "bfloat16", "ids": "int32"}
