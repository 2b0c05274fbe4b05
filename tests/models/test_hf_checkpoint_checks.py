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


def test_a_mesh_that_cannot_split_the_weights_is_warned_before_any_tensor_is_read(tmp_path):
    """fsdp=3 cannot split the 64-wide embedding: the loader placed every weight replicated and the
    `UnsplitAxisWarning` came only later, from the trainer's state. It now comes before the first read."""
    import jax

    from aepo_jax.parallel import make_mesh
    from aepo_jax.parallel.sharding import UnsplitAxisWarning

    weights = _save_untied_llama(tmp_path)
    tensors = load_file(weights)

    class Unread(dict):  # the checkpoint's tensors; reading any of them stops the load
        def __getitem__(self, name):
            raise LookupError(f"read {name}")

    from aepo_jax.models import model_from_hf_tensors
    from aepo_jax.models.hf_checkpoint import checkpoint_config

    config = checkpoint_config(tmp_path)
    assert config.d_model % 3 != 0
    mesh = make_mesh({"fsdp": 3}, devices=jax.devices()[:3])
    with pytest.warns(UnsplitAxisWarning, match="fsdp"), pytest.raises(LookupError, match="read "):
        model_from_hf_tensors(config, Unread(tensors), mesh=mesh)


_SAVE_ON_TWO_PROCESSES = """
import sys

import jax
import numpy as np
from flax import nnx

from aepo_jax.models import Decoder, ModelConfig, save_hf_checkpoint
from aepo_jax.parallel import make_mesh
from aepo_jax.parallel.distributed import maybe_initialize_distributed
from aepo_jax.parallel.sharding import state_shardings

maybe_initialize_distributed()
config = ModelConfig(vocab_size=96, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, mlp_dim=64)
mesh = make_mesh({"data": 1, "fsdp": 4, "tensor": 2})  # 8 devices, 4 on each process: fsdp spans both
graphdef, state = nnx.split(Decoder(config, rngs=nnx.Rngs(0)))  # on this process's first device
sharded = jax.tree.map(lambda x, s: jax.make_array_from_callback(x.shape, s, lambda i: np.asarray(x)[i]),
                       state, state_shardings(state, mesh))
model = nnx.merge(graphdef, sharded)
try:  # no process holds the whole of a weight
    np.asarray(model.layers.mlp.gate[...])
    raise SystemExit("the gate weight is whole on one process: nothing to gather")
except RuntimeError as err:
    assert "non-addressable" in str(err)
save_hf_checkpoint(model, sys.argv[1], bos_id=1, eos_ids=[2])
print("SAVED", jax.process_index())
"""


def test_a_model_sharded_over_two_processes_is_saved_whole_by_the_first(tmp_path):
    """`save_hf_checkpoint` read every weight with `jax.device_get`, which cannot fetch another process's
    shards: on several hosts it failed. Now the weights are gathered and the first process writes them."""
    from tests.training.local_cluster import outputs, start_processes

    out = tmp_path / "hf"
    texts = outputs(start_processes(["-c", _SAVE_ON_TWO_PROCESSES, str(out)], 2, 4), 300)
    assert [t.split()[-2:] for t in texts] == [["SAVED", "0"], ["SAVED", "1"]]
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "generation_config.json", "model.safetensors"]
    config = ModelConfig(vocab_size=96, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, mlp_dim=64)
    expected = hf_tensors_from_model(Decoder(config, rngs=nnx.Rngs(0)))  # the same seeded model, one process
    saved = load_file(out / "model.safetensors")
    assert sorted(saved) == sorted(expected)
    for name, value in expected.items():
        np.testing.assert_array_equal(saved[name], value, err_msg=name)


def test_a_save_cut_short_leaves_no_file_that_looks_like_a_checkpoint(tmp_path, monkeypatch):
    """config.json was written first and model.safetensors in place: a save that failed part way (disk
    full, killed) left a config beside a half-written weights file. Now each file is renamed into place
    when whole, config.json last."""
    from aepo_jax.models import hf_export

    def fails_half_way(tensors, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"\0" * 1000)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(hf_export, "save_file", fails_half_way)
    config = ModelConfig(vocab_size=96, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, mlp_dim=64)
    with pytest.raises(OSError, match="No space left"):
        hf_export.save_hf_checkpoint(Decoder(config, rngs=nnx.Rngs(0)), tmp_path / "hf")
    assert list((tmp_path / "hf").iterdir()) == []
