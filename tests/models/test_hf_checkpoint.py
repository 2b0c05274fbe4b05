"""Logits parity with PyTorch `transformers` through real safetensors checkpoints, both directions.

Run with `-s` to see the parity figures (max abs logit difference per case).
"""


import jax
import jax.numpy as jnp
import numpy as np
import pytest
import transformers
from flax import nnx
from hf_reference import HF_CASES, hf_logits, make_hf_model

from aepo_jax.models import Decoder, get_preset, load_hf_checkpoint, save_hf_checkpoint
from aepo_jax.parallel import make_mesh

TOLERANCE = 1e-4


def _report(case: str, diff: float, scale: float) -> None:
    print(f"\n[parity] {case}: max|dlogit| = {diff:.2e} (max|logit| = {scale:.2f})")


@pytest.fixture(scope="module")
def input_ids():
    return np.random.default_rng(0).integers(0, 97, size=(2, 24)).astype(np.int32)


@pytest.mark.parametrize("case", sorted(HF_CASES))
def test_loaded_checkpoint_logits_match_transformers(case, tmp_path, input_ids):
    hf_model = make_hf_model(case)
    hf_model.save_pretrained(tmp_path, safe_serialization=True)
    model = load_hf_checkpoint(tmp_path, dtype=jnp.float32)
    expected = hf_logits(hf_model, input_ids)
    got = np.asarray(model(jnp.asarray(input_ids)))
    diff = float(np.abs(got - expected).max())
    _report(case, diff, float(np.abs(expected).max()))
    assert got.dtype == np.float32 and got.shape == expected.shape
    assert diff < TOLERANCE


def test_llama3_rope_scaling_is_exercised(tmp_path, input_ids):
    """The parity case would fail without the llama3 frequency scaling (so the comparison can catch it)."""
    hf_model = make_hf_model("llama_untied_gqa_rope_scaling")
    hf_model.save_pretrained(tmp_path)
    model = load_hf_checkpoint(tmp_path)
    _, state = nnx.split(model)
    unscaled_config = model.config.replace(rope_scaling=None)
    unscaled_graphdef, _ = nnx.split(nnx.eval_shape(lambda: Decoder(unscaled_config, rngs=nnx.Rngs(0))))
    unscaled = nnx.merge(unscaled_graphdef, state)  # same weights, no llama3 scaling
    diff = np.abs(np.asarray(unscaled(jnp.asarray(input_ids))) - hf_logits(hf_model, input_ids)).max()
    assert diff > 100 * TOLERANCE


def test_load_onto_8_device_mesh_places_shards_and_keeps_logits(tmp_path, input_ids):
    hf_model = make_hf_model("qwen3_qk_norm_head_dim")
    hf_model.save_pretrained(tmp_path)
    mesh = make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    model = load_hf_checkpoint(tmp_path, mesh=mesh)
    gate = model.layers.mlp.gate[...]  # [L, D, F]: the layer axis is never sharded
    assert gate.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor") and gate.shape[1:] == (64, 96)
    graphdef, state = nnx.split(model)
    with jax.set_mesh(mesh):
        got = jax.jit(lambda state, ids: nnx.merge(graphdef, state)(ids))(state, jnp.asarray(input_ids))
    expected = hf_logits(hf_model, input_ids)
    diff = float(np.abs(np.asarray(got) - expected).max())
    _report("qwen3 loaded onto data=2,fsdp=2,tensor=2 mesh", diff, float(np.abs(expected).max()))
    assert diff < TOLERANCE


def test_left_padded_batch_with_positions_and_mask_matches_transformers(tmp_path):
    hf_model = make_hf_model("qwen2_bias_gqa", seed=1)
    hf_model.save_pretrained(tmp_path)
    model = load_hf_checkpoint(tmp_path)
    rng = np.random.default_rng(1)
    lengths = np.array([12, 7, 3])
    batch, length = len(lengths), 12
    valid = np.arange(length)[None, :] >= (length - lengths)[:, None]  # left padding, [B, T]
    ids = np.where(valid, rng.integers(1, 97, size=(batch, length)), 0).astype(np.int32)
    positions = np.maximum(np.cumsum(valid, axis=1) - 1, 0).astype(np.int32)
    causal = np.tril(np.ones((length, length), bool))
    mask = causal[None] & valid[:, None, :]  # [B, T, S]
    got = np.asarray(model(jnp.asarray(ids), positions=jnp.asarray(positions), attention_mask=jnp.asarray(mask)))
    expected = hf_logits(hf_model, ids, attention_mask=valid, position_ids=positions)
    diff = float(np.abs(got - expected)[valid].max())
    _report("qwen2 left-padded batch", diff, float(np.abs(expected[valid]).max()))
    assert diff < TOLERANCE
    assert np.isfinite(got).all()  # padded query rows are finite too


def test_bfloat16_checkpoint_reads_exactly_and_loads_in_either_dtype(tmp_path, input_ids):
    """bfloat16 safetensors (most released checkpoints) are read without torch, bit-exact."""
    import torch

    bf16_model = make_hf_model("qwen2_bias_gqa", seed=4).to(torch.bfloat16)
    bf16_model.save_pretrained(tmp_path)
    # The same bf16-rounded weights computed in float32 (a fresh model: `.to` would also round rotary buffers).
    hf_model = make_hf_model("qwen2_bias_gqa", seed=4)
    hf_model.load_state_dict({k: v.float() for k, v in bf16_model.state_dict().items()})
    model = load_hf_checkpoint(tmp_path, dtype=jnp.float32)
    diff = float(np.abs(np.asarray(model(jnp.asarray(input_ids))) - hf_logits(hf_model, input_ids)).max())
    _report("qwen2 from a bfloat16 checkpoint", diff, float(np.abs(hf_logits(hf_model, input_ids)).max()))
    assert diff < TOLERANCE
    model_bf16 = load_hf_checkpoint(tmp_path, dtype=jnp.bfloat16)
    assert model_bf16.embed[...].dtype == jnp.bfloat16 and model_bf16.config.dtype == "bfloat16"
    np.testing.assert_array_equal(
        np.asarray(model_bf16.embed[...], np.float32), np.asarray(model.embed[...])
    )


def test_sharded_checkpoint_with_index_file_loads(tmp_path, input_ids):
    hf_model = make_hf_model("llama_untied_gqa_rope_scaling", seed=2)
    hf_model.save_pretrained(tmp_path, max_shard_size="40KB")
    shards = sorted(p.name for p in tmp_path.glob("*.safetensors"))
    assert (tmp_path / "model.safetensors.index.json").is_file() and len(shards) > 1
    model = load_hf_checkpoint(tmp_path)
    diff = float(np.abs(np.asarray(model(jnp.asarray(input_ids))) - hf_logits(hf_model, input_ids)).max())
    _report(f"llama sharded into {len(shards)} files", diff, float(np.abs(hf_logits(hf_model, input_ids)).max()))
    assert diff < TOLERANCE


@pytest.mark.parametrize(
    "overrides",
    [
        {"tie_embeddings": True},
        {"tie_embeddings": False, "qkv_bias": True, "n_kv_heads": 1},
        {"qk_norm": True, "head_dim": 24, "rope_scaling": {"rope_type": "llama3", "factor": 4.0,
                                                          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                          "original_max_position_embeddings": 16}},
    ],
    ids=["llama_tied", "qwen2_untied", "qwen3_rope_scaling"],
)
def test_saved_checkpoint_loads_in_transformers_with_same_logits(overrides, tmp_path, input_ids):
    config = get_preset("tiny", vocab_size=97, **overrides)
    model = Decoder(config, rngs=nnx.Rngs(3))
    save_hf_checkpoint(model, tmp_path)
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    expected = hf_logits(hf_model, input_ids)
    got = np.asarray(model(jnp.asarray(input_ids)))
    diff = float(np.abs(got - expected).max())
    _report(f"round trip {hf_model.config.model_type} {overrides}", diff, float(np.abs(expected).max()))
    assert diff < TOLERANCE
    # And back: our loader reads what we wrote.
    reloaded = load_hf_checkpoint(tmp_path)
    np.testing.assert_array_equal(np.asarray(reloaded(jnp.asarray(input_ids))), got)


def test_a_saved_checkpoint_stops_transformers_generate_on_our_eos_ids(tmp_path):
    """An export carried no BOS/EOS: transformers filled in Llama's class defaults (1, 2) and its
    `generate` never stopped on the tokenizer's end-of-turn ids."""
    model = Decoder(get_preset("tiny", vocab_size=97), rngs=nnx.Rngs(0))
    save_hf_checkpoint(model, tmp_path / "ids", bos_id=95, eos_ids=[96, 94])
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ids")
    assert (hf_model.config.bos_token_id, hf_model.config.eos_token_id) == (95, [96, 94])
    assert (hf_model.generation_config.bos_token_id, hf_model.generation_config.eos_token_id) == (95, [96, 94])
    save_hf_checkpoint(model, tmp_path / "none")
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "none")
    assert (hf_model.config.bos_token_id, hf_model.config.eos_token_id) == (None, None)  # not Llama's 1 and 2
    with pytest.raises(ValueError, match=r"special token ids \[97\] are outside the model's 97 ids"):
        save_hf_checkpoint(model, tmp_path / "bad", eos_ids=[97])


def test_a_config_json_that_is_not_json_is_an_error_naming_it(tmp_path):
    (tmp_path / "config.json").write_text('{"hidden_size": 64, model_type: "llama"}')
    with pytest.raises(ValueError, match=f"{tmp_path / 'config.json'} is not valid JSON"):
        load_hf_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="holds a list, not a JSON object"):
        load_hf_checkpoint(tmp_path)


def test_a_file_instead_of_the_directory_raises_naming_both(tmp_path):
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"not read")
    with pytest.raises(NotADirectoryError, match=f"{weights} is a file.*model directory.*{tmp_path}"):
        load_hf_checkpoint(weights)
    with pytest.raises(FileNotFoundError, match="checkpoint directory does not exist"):
        load_hf_checkpoint(tmp_path / "absent")


def test_directory_without_weights_raises_naming_the_directory(tmp_path):
    make_hf_model("llama_tied_mha").config.save_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match="no weights in .*model.safetensors"):
        load_hf_checkpoint(tmp_path)


def test_unsupported_model_type_raises_naming_it(tmp_path):
    transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=97)).save_pretrained(
        tmp_path
    )
    with pytest.raises(ValueError, match=r"unsupported model_type 'gpt2'.*llama.*qwen2.*qwen3"):
        load_hf_checkpoint(tmp_path)


def test_checkpoint_missing_a_tensor_raises_listing_it(tmp_path):
    from safetensors.numpy import load_file, save_file

    hf_model = make_hf_model("qwen3_qk_norm_head_dim")
    hf_model.save_pretrained(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    del tensors["model.layers.1.self_attn.k_norm.weight"]
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"missing 1 tensor.*model\.layers\.1\.self_attn\.k_norm\.weight"):
        load_hf_checkpoint(tmp_path)


@pytest.mark.parametrize(("remat", "chunk_size"), [("none", None), ("block", 5), ("dots_with_no_batch_dims_saveable", 8)])
def test_token_logprobs_and_entropy_match_transformers_with_remat_and_chunking(remat, chunk_size, tmp_path, input_ids):
    """Scanned layers, remat and the chunked LM head give transformers' next-token log-probs and entropies."""
    from aepo_jax.models.lm_head import next_token_scores

    hf_model = make_hf_model("qwen3_qk_norm_head_dim")
    hf_model.save_pretrained(tmp_path)
    graphdef, state = nnx.split(load_hf_checkpoint(tmp_path, remat=remat))
    ids = jnp.asarray(input_ids)
    positions = jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape)
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((ids.shape[1],) * 2, bool)), (ids.shape[0],) + (ids.shape[1],) * 2)

    @jax.jit
    def scores(state):
        return next_token_scores(nnx.merge(graphdef, state), ids, positions, mask, chunk_size=chunk_size)

    got = scores(state)
    logits = hf_logits(hf_model, input_ids).astype(np.float64)[:, :-1]  # [B, T-1, V]: position t-1 scores token t
    log_probs = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
        - logits.max(-1, keepdims=True)
    expected_logp = np.take_along_axis(log_probs, input_ids[:, 1:, None], axis=-1)[..., 0]
    expected_entropy = -(np.exp(log_probs) * log_probs).sum(-1)
    np.testing.assert_allclose(np.asarray(got.logp)[:, 1:], expected_logp, atol=TOLERANCE)
    np.testing.assert_allclose(np.asarray(got.entropy)[:, 1:], expected_entropy, atol=TOLERANCE)
    assert float(jnp.abs(got.logp[:, 0]).max()) == 0.0
