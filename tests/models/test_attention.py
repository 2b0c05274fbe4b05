"""The dense attention path against a numpy reference, structured masks against the rules written out slot
by slot, and the backend switch's errors (flash kernels themselves: test_attention_kernels.py)."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from attention_cases import (
    numpy_ancestor_mask,
    numpy_attention,
    random_qkv,
    random_subtree_ends,
)

from aepo_jax.models import Decoder, get_preset
from aepo_jax.models.attention import masked_attention as eager_masked_attention
from aepo_jax.models.attention import require_backend_runs_on
from aepo_jax.models.attention_flash import UnsupportedPlatformError
from aepo_jax.models.attention_mask import cached_mask, causal_mask, tree_mask

masked_attention = jax.jit(eager_masked_attention, static_argnames=("implementation", "interpret"))


def test_causal_mask_hides_padding_keys_anywhere_and_always_shows_a_query_its_own_token():
    valid = np.ones((3, 12), bool)
    valid[0, :4] = False  # left padding
    valid[1, 9:] = False  # right padding
    valid[2, 5:7] = False  # a hole
    got = causal_mask(jnp.asarray(valid)).to_dense(12)
    want = (np.tril(np.ones((12, 12), bool))[None] & valid[:, None, :]) | np.eye(12, dtype=bool)[None]
    np.testing.assert_array_equal(np.asarray(got), want)


@pytest.mark.parametrize("block, first_slot", [(1, 9), (4, 6), (4, 0)])
def test_cached_mask_shows_each_query_the_valid_slots_up_to_its_own_and_its_own(block, first_slot):
    rng = np.random.default_rng(block)
    slot_valid = rng.random((3, 16)) < 0.7  # per-row holes, as left-padded appends leave
    got = cached_mask(jnp.asarray(slot_valid), first_slot).to_dense(block)
    query_slots = first_slot + np.arange(block)[:, None]  # [T, 1]
    slots = np.arange(16)[None, :]  # [1, S]
    want = (slot_valid[:, None, :] & (slots <= query_slots)[None]) | (slots == query_slots)[None]
    np.testing.assert_array_equal(np.asarray(got), want)


def test_tree_mask_shows_each_key_to_its_subtree_only():
    ends = random_subtree_ends(np.random.default_rng(0), 3, 30, trees_end_at=(11, 20))
    got = tree_mask(jnp.asarray(ends)).to_dense(30)
    np.testing.assert_array_equal(np.asarray(got), numpy_ancestor_mask(ends))


def test_dense_causal_left_padded_gqa_matches_numpy():
    rng = np.random.default_rng(1)
    q, k, v = random_qkv(rng, 2, 10, 10, 6, 2, 8)
    valid = np.ones((2, 10), bool)
    valid[1, :3] = False
    mask = causal_mask(jnp.asarray(valid))
    dense = np.asarray(mask.to_dense(10))
    out = masked_attention(q, k, v, mask)
    np.testing.assert_allclose(np.asarray(out), numpy_attention(q, k, v, dense), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(masked_attention(q, k, v, jnp.asarray(dense))))


@pytest.mark.parametrize("block", [1, 5])
def test_dense_cached_decoding_with_per_row_valid_lengths_matches_numpy(block):
    rng = np.random.default_rng(block)
    n_slots, first_slot = 24, 11
    q, k, v = random_qkv(rng, 3, block, n_slots, 4, 1, 8)  # MQA: one kv head
    lengths = np.array([3, 11, 7])  # valid prefix per row before the new block
    slot_valid = np.arange(n_slots)[None, :] < lengths[:, None]
    slot_valid[:, first_slot:first_slot + block] = True
    mask = cached_mask(jnp.asarray(slot_valid), first_slot)
    out = masked_attention(q, k, v, mask)
    np.testing.assert_allclose(np.asarray(out), numpy_attention(q, k, v, mask.to_dense(block)), rtol=1e-5, atol=1e-5)


def test_dense_fully_masked_row_is_zero_not_nan():
    rng = np.random.default_rng(2)
    q, k, v = random_qkv(rng, 1, 3, 3, 2, 2, 4)
    mask = jnp.asarray(np.tril(np.ones((3, 3), bool))[None] & np.array([False, True, True])[None, :, None])
    out = np.asarray(masked_attention(q, k, v, mask))
    assert np.all(out[0, 0] == 0) and np.all(np.isfinite(out))


def test_dense_bfloat16_keeps_float32_softmax():
    rng = np.random.default_rng(3)
    q, k, v = random_qkv(rng, 1, 64, 64, 4, 2, 16)
    mask = causal_mask(jnp.ones((1, 64), bool))
    out = masked_attention(q.astype(jnp.bfloat16), k.astype(jnp.bfloat16), v.astype(jnp.bfloat16), mask)
    assert out.dtype == jnp.bfloat16
    want = numpy_attention(q.astype(jnp.bfloat16), k.astype(jnp.bfloat16), v.astype(jnp.bfloat16), mask.to_dense(64))
    np.testing.assert_allclose(np.asarray(out, np.float32), want, atol=2e-2)


def test_unknown_backend_is_refused_by_name():
    q, k, v = random_qkv(np.random.default_rng(4), 1, 2, 2, 2, 1, 4)
    with pytest.raises(ValueError, match="unknown attention backend 'flash'.*'dense', 'splash', 'cudnn'"):
        masked_attention(q, k, v, jnp.ones((1, 2, 2), bool), implementation="flash")
    with pytest.raises(ValueError, match="unknown attention backend"):
        Decoder(get_preset("tiny", attention="flash"))


def test_splash_refuses_a_dense_mask():
    q, k, v = random_qkv(np.random.default_rng(5), 1, 128, 128, 2, 1, 8)
    with pytest.raises(ValueError, match="splash backend needs an AttentionMask"):
        masked_attention(q, k, v, jnp.ones((1, 128, 128), bool), implementation="splash")


def test_decoder_with_splash_traces_its_own_mask_and_refuses_a_dense_one():
    from flax import nnx

    config = get_preset("tiny", attention="splash", n_layers=1)
    graphdef, state = nnx.split(nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0))))  # shapes only
    ids = jax.ShapeDtypeStruct((1, 8), jnp.int32)
    logits = jax.eval_shape(lambda state, ids: nnx.merge(graphdef, state)(ids), state, ids)  # causal AttentionMask
    assert logits.shape == (1, 8, config.vocab_size)
    with pytest.raises(ValueError, match="splash backend needs an AttentionMask"):
        jax.eval_shape(lambda state, ids: nnx.merge(graphdef, state)(ids, attention_mask=jnp.ones((1, 8, 8), bool)),
                       state, ids)


def test_cudnn_on_cpu_raises_naming_the_backend():
    q, k, v = (x.astype(jnp.bfloat16) for x in random_qkv(np.random.default_rng(6), 1, 4, 4, 2, 1, 8))
    mask = causal_mask(jnp.ones((1, 4), bool))
    with pytest.raises(UnsupportedPlatformError, match="'cudnn' needs a GPU"):
        masked_attention(q, k, v, mask, implementation="cudnn")
    with pytest.raises(ValueError, match="'cudnn' needs bfloat16 or float16 activations, got float32"):
        masked_attention(q.astype(jnp.float32), k, v, mask, implementation="cudnn")


def test_splash_run_on_cpu_raises_naming_the_backend():
    q, k, v = random_qkv(np.random.default_rng(7), 1, 128, 128, 2, 1, 8)
    mask = causal_mask(jnp.ones((1, 128), bool))
    with pytest.raises(Exception, match="'splash' needs a tpu device"):
        jax.block_until_ready(masked_attention(q, k, v, mask, implementation="splash"))


@pytest.mark.parametrize(("backend", "platform", "instead"), [
    ("splash", "gpu", "model.attention='cudnn' (with model.compute_dtype='bfloat16') or model.attention='dense'"),
    ("splash", "cpu", "model.attention='dense'"),
    ("cudnn", "tpu", "model.attention='splash' or model.attention='dense'"),
    ("cudnn", "cpu", "model.attention='dense'"),
])
def test_a_backend_the_platform_has_no_kernel_for_is_refused_naming_the_setting_to_use(backend, platform, instead):
    """The launch's early check: splash and cuDNN otherwise fail at the first program that runs."""
    with pytest.raises(ValueError, match=rf"model.attention='{backend}' runs only on .* this process runs on "
                                         rf"'{platform}': set {re.escape(instead)} "):
        require_backend_runs_on(backend, platform)


def test_each_backend_passes_on_its_platforms():
    for backend, platform in [("dense", "cpu"), ("dense", "gpu"), ("dense", "tpu"), ("splash", "tpu"),
                              ("cudnn", "gpu")]:
        require_backend_runs_on(backend, platform)
    with pytest.raises(ValueError, match="unknown attention backend 'flash'"):
        require_backend_runs_on("flash", "tpu")


def test_splash_lowers_for_tpu_from_a_cpu_process():
    q, k, v = random_qkv(np.random.default_rng(8), 2, 256, 256, 4, 2, 128)
    valid = jnp.ones((2, 256), bool).at[0, :17].set(False)

    def loss(q, k, v):
        return masked_attention(q, k, v, causal_mask(valid), implementation="splash").sum()

    lowered = jax.jit(jax.grad(loss, (0, 1, 2))).trace(q, k, v).lower(lowering_platforms=("tpu",))
    assert lowered.as_text().count("tpu_custom_call") >= 3  # forward, dq and dkv kernels


@pytest.mark.parametrize("budget_rows, batch", [(1, 8), (2, 8), (3, 6), (8, 8)])
def test_cached_blocks_attend_groups_of_rows_in_turn_and_equal_one_pass(monkeypatch, budget_rows, batch):
    """A cached block whose scores exceed CACHED_SCORES_CHUNK_BYTES runs groups of rows one after another
    (strided groups: rows j, j + n, ...); every row equals the float64 reference and the one-pass result."""
    from aepo_jax.models import attention as attention_module

    rng = np.random.default_rng(budget_rows)
    length, n_keys, n_heads, n_kv_heads, head_dim = 4, 24, 4, 2, 8
    q, k, v = random_qkv(rng, batch, length, n_keys, n_heads, n_kv_heads, head_dim)
    valid = rng.random((batch, n_keys)) < 0.8
    mask = cached_mask(jnp.asarray(valid), 16).to_dense(length)  # queries at slots 16..19
    k_hm, v_hm = jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)  # the cache's head-major layout
    one_pass = jax.jit(lambda *a: eager_masked_attention(*a, head_major_kv=True))(q, k_hm, v_hm, mask)
    monkeypatch.setattr(attention_module, "CACHED_SCORES_CHUNK_BYTES", budget_rows * 4 * n_heads * length * n_keys)
    traced = []
    real_map = jax.lax.map
    monkeypatch.setattr(jax.lax, "map", lambda f, xs: traced.append(xs[0].shape) or real_map(f, xs))
    chunked = jax.jit(lambda *a: eager_masked_attention(*a, head_major_kv=True))(q, k_hm, v_hm, mask)
    if budget_rows < batch:
        rows = max(r for r in range(1, budget_rows + 1) if batch % r == 0)
        assert traced == [(batch // rows, rows, length, n_heads, head_dim)]  # groups x rows per group
    else:
        assert traced == []
    np.testing.assert_allclose(np.asarray(chunked), numpy_attention(q, k, v, np.asarray(mask)), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(chunked), np.asarray(one_pass), rtol=1e-6, atol=1e-6)


def test_cached_block_past_the_cache_end_raises_instead_of_overwriting_the_last_slots():
    """dynamic_update_slice would clamp the write of slots 6..9 into 8 slots onto slots 4..7."""
    from flax import nnx

    from aepo_jax.models import KVCache

    model = Decoder(get_preset("tiny", vocab_size=32, n_layers=1), rngs=nnx.Rngs(0))
    ids = jnp.arange(10, dtype=jnp.int32)[None] % 32  # [1, 10]
    _, cache = model(ids[:, :6], kv_cache=KVCache.init(model.config, 1, 8))
    with pytest.raises(ValueError, match=r"KV cache overflow: writing 4 token\(s\) at slot 6 needs 10 slots.*has 8"):
        model(ids[:, 6:10], kv_cache=cache)
    _, cache = model(ids[:, 6:8], kv_cache=cache)  # exactly filling the cache is fine
    assert int(cache.index) == 8
