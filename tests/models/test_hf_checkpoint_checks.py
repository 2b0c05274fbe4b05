"""The checkpoint loader refuses weights that disagree with their config or with themselves.

Each case is a real `save_pretrained` checkpoint of a tiny random HF model,
edited the way released or half-downloaded checkpoints go wrong; the loader
must raise naming the file or tensor rather than load something else.
"""

import json
import tracemalloc

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hf_reference import make_hf_model
from safetensors.numpy import load_file, save_file

from aepo_jax.models import (
    Decoder,
    ModelConfig,
    config_to_hf,
    hf_tensors_from_model,
    load_hf_checkpoint,
)


def _save_untied_llama(directory, **config_edits):
    """A 2-layer untied llama checkpoint; `config_edits` are written into its config.json."""
    make_hf_model("llama_untied_gqa_rope_scaling").save_pretrained(directory)
    config_path = directory / "config.json"
    config_json = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config_json, **config_edits}))
    return directory / "model.safetensors"


def _edit_tensors(weights, edit):
    tensors = load_file(weights)
    edit(tensors)
    save_file(tensors, weights, metadata={"format": "pt"})


def test_tied_config_with_a_different_lm_head_is_refused(tmp_path):
    """transformers then unties and uses the file's head; taking the embedding would change the logits."""
    _save_untied_llama(tmp_path, tie_word_embeddings=True)
    with pytest.raises(ValueError, match=r"tie_word_embeddings=true.*lm_head\.weight.*differs from "
                                         r"model\.embed_tokens\.weight"):
        load_hf_checkpoint(tmp_path)


def test_tied_config_with_an_lm_head_equal_to_the_embedding_loads(tmp_path):
    weights = _save_untied_llama(tmp_path, tie_word_embeddings=True)
    _edit_tensors(weights, lambda t: t.__setitem__("lm_head.weight", t["model.embed_tokens.weight"].copy()))
    model = load_hf_checkpoint(tmp_path)
    assert model.config.tie_embeddings


@pytest.mark.parametrize(
    ("config_edits", "extra", "message"),
    [
        ({"num_hidden_layers": 1}, {}, r"9 tensor\(s\) the config does not use.*model\.layers\.1\."),
        ({}, {"model.layers.0.self_attn.q_proj.bias": np.ones(64, np.float32)},
         r"1 tensor\(s\) the config does not use.*model\.layers\.0\.self_attn\.q_proj\.bias"),
    ],
    ids=["more_layers_than_the_config", "bias_the_architecture_lacks"],
)
def test_tensors_the_config_does_not_use_are_refused_by_name(config_edits, extra, message, tmp_path):
    weights = _save_untied_llama(tmp_path, **config_edits)
    _edit_tensors(weights, lambda t: t.update(extra))
    with pytest.raises(ValueError, match=f"{tmp_path}.*{message}"):
        load_hf_checkpoint(tmp_path)


def test_rotary_inverse_frequencies_in_the_file_are_ignored(tmp_path):
    weights = _save_untied_llama(tmp_path)
    _edit_tensors(weights, lambda t: t.__setitem__("model.rotary_emb.inv_freq", np.ones(8, np.float32)))
    load_hf_checkpoint(tmp_path)


def test_integer_weights_are_refused_by_name(tmp_path):
    weights = _save_untied_llama(tmp_path)
    _edit_tensors(weights, lambda t: t.__setitem__("model.embed_tokens.weight",
                                                   t["model.embed_tokens.weight"].astype(np.int32)))
    with pytest.raises(ValueError, match=r"non-float dtype: model\.embed_tokens\.weight \(int32\)"):
        load_hf_checkpoint(tmp_path)


def test_truncated_file_raises_naming_the_file_and_the_first_cut_tensor(tmp_path):
    weights = _save_untied_llama(tmp_path)
    weights.write_bytes(weights.read_bytes()[:-5000])  # a partly downloaded file
    with pytest.raises(ValueError, match=rf"{weights}: tensor '[\w.]+' ends at data byte \d+ .*truncated"):
        load_hf_checkpoint(tmp_path)


def test_unindexed_files_defining_the_same_tensor_are_refused(tmp_path):
    weights = _save_untied_llama(tmp_path)
    weights.rename(tmp_path / "consolidated.safetensors")  # no model.safetensors: every *.safetensors is read
    embed = load_file(tmp_path / "consolidated.safetensors")["model.embed_tokens.weight"]
    save_file({"model.embed_tokens.weight": np.zeros_like(embed)}, tmp_path / "zz_adapter.safetensors")
    with pytest.raises(ValueError, match=r"defined in more than one.*model\.embed_tokens\.weight "
                                         r"\(consolidated\.safetensors and zz_adapter\.safetensors\)"):
        load_hf_checkpoint(tmp_path)


def _sharded_checkpoint(directory):
    """A llama checkpoint in several shards with an index; returns its weight_map."""
    make_hf_model("llama_untied_gqa_rope_scaling").save_pretrained(directory, max_shard_size="40KB")
    return json.loads((directory / "model.safetensors.index.json").read_text())["weight_map"]


def test_index_reads_each_tensor_only_from_the_shard_it_names(tmp_path):
    weight_map = _sharded_checkpoint(tmp_path)
    name = "model.embed_tokens.weight"
    expected = load_file(tmp_path / weight_map[name])[name]
    other = max(set(weight_map.values()))  # read after the embedding's own shard
    assert other != weight_map[name]
    _edit_tensors(tmp_path / other, lambda t: t.__setitem__(name, np.zeros_like(expected)))
    np.testing.assert_array_equal(np.asarray(load_hf_checkpoint(tmp_path).embed[...]), expected)


def test_index_naming_a_shard_that_lacks_the_tensor_raises_naming_both(tmp_path):
    weight_map = _sharded_checkpoint(tmp_path)
    name = "model.norm.weight"
    _edit_tensors(tmp_path / weight_map[name], lambda t: t.pop(name))
    with pytest.raises(ValueError, match=rf"index\.json places 1 tensor\(s\) in {weight_map[name]}.*{name}"):
        load_hf_checkpoint(tmp_path)


def test_host_memory_peaks_near_one_copy_of_the_largest_parameter(tmp_path):
    """Each stacked parameter is filled in place: not per-layer casts, their list, and a stacked copy (3x)."""
    config = ModelConfig(vocab_size=64, d_model=128, n_layers=4, n_heads=2, n_kv_heads=1, head_dim=64,
                         mlp_dim=4096)
    tensors = hf_tensors_from_model(Decoder(config, rngs=nnx.Rngs(0)))
    save_file({k: v.astype(np.float16) for k, v in tensors.items()}, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps(config_to_hf(config)))
    largest = 4 * 128 * 4096 * 4  # float32 [L, D, F] gate, up (and down)
    tracemalloc.start()
    try:
        load_hf_checkpoint(tmp_path, dtype=jnp.float32)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1.5 * largest, f"host peak {peak / largest:.2f}x the largest parameter"
