"""GGUF loading on small synthetic files: tensors are dequantised one at a time, the policy loader builds
its model once, and every bad file is refused before the model is built, with an error that names it."""

from __future__ import annotations

import re
import struct
import tracemalloc

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf_files import layer_shapes, write_gguf

import aepo_jax.models.gguf as gguf_module
from aepo_jax.models import hf_checkpoint
from aepo_jax.models.gguf import gguf_hf_config, gguf_hf_tensors, load_gguf, read_gguf
from aepo_jax.models.hf_checkpoint import LazyTensor

# Seven 256 KiB tensors in each of 8 layers: 14 MiB in float32, far more than what building a model
# holds on the host at once (one stacked parameter of 2 MiB, its copy on the way to the device, and
# one dequantised tensor); the old loader held all 14 MiB.
BIG = {"d_model": 256, "n_heads": 4, "n_kv": 4, "head_dim": 64, "mlp": 256, "layers": 8, "qtype": Q.Q8_0}


def _float32_bytes(arch: str = "llama", **sizes) -> int:
    shapes = layer_shapes(arch, sizes["d_model"], sizes["n_heads"], sizes["n_kv"], sizes["head_dim"], sizes["mlp"],
                          sizes["layers"])
    return 4 * sum(int(np.prod(s)) for s in shapes.values())


def _host_peak(fn):
    """(result of `fn()`, peak bytes numpy held on the host meanwhile: tracemalloc sees numpy's buffers).

    Run it once untraced first: first-time imports and caches are traced too."""
    fn()
    tracemalloc.start()
    try:
        out = fn()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _no_model_build(monkeypatch):
    """Make building a model (either import of it) or dequantising fail the test."""
    import gguf.quants

    def forbidden(*args, **kwargs):
        raise AssertionError("the model was built or a tensor dequantised before the file was refused")

    monkeypatch.setattr(hf_checkpoint, "model_from_hf_tensors", forbidden)
    monkeypatch.setattr(gguf_module, "model_from_hf_tensors", forbidden, raising=False)
    monkeypatch.setattr(gguf.quants, "dequantize", forbidden)


# --- 1. Memory: one tensor at a time ------------------------------------------------------------


def test_gguf_tensors_are_lazy_and_dequantise_when_read(tmp_path, monkeypatch):
    import gguf
    import gguf.quants

    path = write_gguf(tmp_path / "q8.gguf", qtype=Q.Q8_0, d_model=64, head_dim=16, mlp=96)
    reader = gguf.GGUFReader(path)
    hf_config = gguf_hf_config(reader, path)
    calls = []
    dequantize = gguf.quants.dequantize
    monkeypatch.setattr(gguf.quants, "dequantize", lambda data, qtype: calls.append(qtype) or dequantize(data, qtype))
    gguf_module._dequantisable.cache_clear()
    tensors = gguf_hf_tensors(reader, hf_config, path)
    probes = len(calls)  # one block of zeros per tensor type, to ask whether it can be dequantised
    assert probes <= 2 and all(isinstance(t, LazyTensor) for t in tensors.values())
    up = tensors["model.layers.1.mlp.up_proj.weight"]
    assert up.shape == (96, 64) and up.dtype == np.float32 and len(calls) == probes
    values = np.asarray(up)
    assert values.shape == (96, 64) and len(calls) == probes + 1
    raw = next(t for t in reader.tensors if t.name == "blk.1.ffn_up.weight")
    np.testing.assert_array_equal(values, dequantize(raw.data, raw.tensor_type))


def test_load_gguf_holds_one_tensor_at_a_time_not_the_float32_checkpoint(tmp_path):
    path = write_gguf(tmp_path / "big.gguf", **BIG)
    (model, _), peak = _host_peak(lambda: load_gguf(path))
    assert model.config.n_layers == 8
    total = _float32_bytes(**{k: v for k, v in BIG.items() if k != "qtype"})
    assert peak < 0.5 * total, (peak, total)


def test_gguf_policy_builds_its_grown_model_once_and_one_tensor_at_a_time(tmp_path, monkeypatch):
    from flax import nnx

    from aepo_jax.envs.pretrained import load_gguf_policy

    path = write_gguf(tmp_path / "big.gguf", **BIG)
    model, tokenizer = load_gguf(path)
    load_gguf_policy(path)  # untraced and uncounted: first-time imports
    builds = []
    for module in (hf_checkpoint, gguf_module):
        build = module.model_from_hf_tensors
        monkeypatch.setattr(module, "model_from_hf_tensors",
                            lambda *args, _build=build, **kwargs: builds.append(1) or _build(*args, **kwargs))
    tracemalloc.start()
    try:
        graphdef, params, grown_tokenizer = load_gguf_policy(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(builds) == 1
    total = _float32_bytes(**{k: v for k, v in BIG.items() if k != "qtype"})
    assert peak < 0.5 * total, (peak, total)
    grown = nnx.merge(graphdef, params)
    rows = tokenizer.vocab_size
    assert grown.config.vocab_size == grown_tokenizer.vocab_size > rows
    embed, old = np.asarray(grown.embed[...]), np.asarray(model.embed[...])
    np.testing.assert_array_equal(embed[:rows], old)
    np.testing.assert_allclose(embed[rows:], np.broadcast_to(old.mean(0), embed[rows:].shape), rtol=1e-5, atol=1e-7)


# --- 2. The tokenizer is checked before the model is built -------------------------------------


def test_an_unsupported_pre_tokenizer_is_refused_by_path_before_the_model_is_built(tmp_path, monkeypatch):
    path = write_gguf(tmp_path / "falcon.gguf", pre="falcon")
    _no_model_build(monkeypatch)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(tmp_path / 'falcon.gguf'))}: .*pre-tokenizer 'falcon' is not supported "
                                         r"\(supported: .*smollm.*qwen2.*llama-bpe"):
        load_gguf(path)


# --- 3. Types, corrupt headers and metadata raise ValueError naming the file ---------------------


@pytest.mark.parametrize("qtype", [Q.I8, Q.I32, Q.Q8_1, Q.Q8_K], ids=lambda q: q.name)
def test_a_tensor_type_that_cannot_be_dequantised_is_refused_naming_tensor_type_and_file(tmp_path, monkeypatch,
                                                                                        qtype):
    path = write_gguf(tmp_path / "t.gguf", d_model=256, head_dim=64, mlp=256,
                      raw_types={"blk.1.ffn_up.weight": qtype})
    monkeypatch.setattr(hf_checkpoint, "model_from_hf_tensors", None)  # refused before any model is built
    monkeypatch.setattr(gguf_module, "model_from_hf_tensors", None, raising=False)
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}: tensor 'blk.1.ffn_up.weight' has type {qtype.name}, which cannot "
                                         r"be dequantised .*supported: F32, F16, .*Q4_1"):
        load_gguf(path)


def test_float64_tensors_load_as_float32(tmp_path):
    import gguf

    path = write_gguf(tmp_path / "f64.gguf", dtypes={"output_norm.weight": np.float64})
    model, _ = load_gguf(path)
    reader = gguf.GGUFReader(path)
    stored = next(t for t in reader.tensors if t.name == "output_norm.weight")
    assert stored.tensor_type == Q.F64
    np.testing.assert_array_equal(np.asarray(model.final_norm.scale[...]), stored.data.astype(np.float32))


@pytest.mark.parametrize("offset", [8, 16])  # the tensor count, then the metadata count, of the GGUF header
def test_corrupt_header_counts_are_refused_as_an_unreadable_file(tmp_path, offset):
    raw = bytearray(write_gguf(tmp_path / "good.gguf").read_bytes())
    raw[offset:offset + 8] = struct.pack("<Q", 2**40)
    (tmp_path / "bad.gguf").write_bytes(raw)
    with pytest.raises(ValueError, match=rf"{re.escape(str(tmp_path / 'bad.gguf'))}: not a readable GGUF file"):
        load_gguf(tmp_path / "bad.gguf")


def test_a_per_layer_metadata_array_loads_when_uniform_and_is_refused_by_key_when_not(tmp_path):
    path = write_gguf(tmp_path / "same.gguf", metadata=[("add_array", "llama.attention.head_count_kv", [2, 2])])
    assert load_gguf(path)[0].config.n_kv_heads == 2
    path = write_gguf(tmp_path / "differ.gguf", metadata=[("add_array", "llama.attention.head_count_kv", [2, 4])])
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}: GGUF metadata llama.attention.head_count_kv differs between "
                                         r"layers \(\[2, 4\]\)"):
        load_gguf(path)


@pytest.mark.parametrize(("method", "key", "value", "wanted"), [
    ("add_string", "llama.block_count", "two", "a positive integer"),
    ("add_uint32", "llama.attention.head_count", 0, "a positive integer"),
    ("add_float32", "llama.embedding_length", 32.0, "a positive integer"),
    ("add_string", "llama.attention.layer_norm_rms_epsilon", "1e-6", "a number"),
])
def test_metadata_of_the_wrong_kind_is_refused_naming_file_and_key(tmp_path, method, key, value, wanted):
    path = write_gguf(tmp_path / "meta.gguf", metadata=[(method, key, value)])
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}: GGUF metadata {key} = .* is not {wanted}"):
        load_gguf(path)


def test_partial_rotary_is_refused(tmp_path):
    path = write_gguf(tmp_path / "rot.gguf", metadata=[("add_uint32", "llama.rope.dimension_count", 4)])
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}: .*rope.dimension_count = 4 rotates part of each head of 8"):
        load_gguf(path)


def test_ask_reports_a_bad_gguf_and_exits_2(tmp_path, capsys):
    from launch.ask import main

    raw = bytearray(write_gguf(tmp_path / "good.gguf").read_bytes())
    raw[16:24] = struct.pack("<Q", 2**40)
    (tmp_path / "counts.gguf").write_bytes(raw)
    write_gguf(tmp_path / "q8k.gguf", d_model=256, head_dim=64, mlp=256, raw_types={"blk.0.ffn_gate.weight": Q.Q8_K})
    for bad in (tmp_path / "counts.gguf", tmp_path / "q8k.gguf", tmp_path):
        assert main(["--gguf", str(bad), "--max-new-tokens", "1"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"cannot load {bad}: ") and "Traceback" not in err, err
    # A file that loads but whose vocabulary has no chat format (no ChatML markers, no template).
    assert main(["--gguf", str(tmp_path / "good.gguf"), "--max-new-tokens", "1"]) == 2
    assert capsys.readouterr().err.startswith(f"cannot ask {tmp_path / 'good.gguf'}: this tokenizer has no chat")


# --- 4. Every token needs an embedding row ------------------------------------------------------


def test_a_tokenizer_with_more_tokens_than_embedding_rows_is_refused_before_agent_tags(tmp_path, monkeypatch):
    from gguf_files import byte_level_tokens

    from aepo_jax.envs.pretrained import load_gguf_policy

    tokens = byte_level_tokens() + [f"<x{i}>" for i in range(5)]  # 262 tokens, 257 embedding rows
    path = write_gguf(tmp_path / "short.gguf", tokens=tokens, token_types=[1] * 256 + [3] + [1] * 5, embed_rows=257)
    _no_model_build(monkeypatch)
    message = rf"^{re.escape(str(path))}: the tokenizer has 262 tokens but token_embd.weight has 257 rows"
    for load in (lambda: load_gguf(path), lambda: load_gguf(path, add_agent_tokens=True),
                 lambda: load_gguf_policy(path, register_agent_tags=False)):
        with pytest.raises(ValueError, match=message):
            load()


def test_an_embedding_with_spare_rows_is_accepted(tmp_path):
    config, _, tokenizer = read_gguf(write_gguf(tmp_path / "spare.gguf", embed_rows=300))
    assert (config.vocab_size, tokenizer.vocab_size) == (300, 257)


# --- 5. Shape and missing-tensor errors name the file -------------------------------------------


def test_shape_and_missing_tensor_errors_name_the_file(tmp_path):
    path = write_gguf(tmp_path / "shape.gguf", shapes={"blk.1.ffn_up.weight": (40, 32)})
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}: tensor 'model.layers.1.mlp.up_proj.weight' has shape \(40, 32\)"):
        load_gguf(path)
    path = write_gguf(tmp_path / "missing.gguf", drop=("blk.1.ffn_up.weight",))
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))} is missing 1 tensor\(s\) .*model.layers.1.mlp.up_proj.weight"):
        load_gguf(path)
