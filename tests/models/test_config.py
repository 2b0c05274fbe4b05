"""ModelConfig validation, presets, and config.json import for the published model configs."""

import jax
import pytest
from flax import nnx

from aepo_jax.models import (
    PRESETS,
    Decoder,
    ModelConfig,
    config_from_hf,
    config_to_hf,
    get_preset,
)

# Abridged from the published config.json files (the keys we read).
LLAMA3_1_8B_JSON = {
    "model_type": "llama", "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_act": "silu",
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "tie_word_embeddings": False,
    "attention_bias": False, "mlp_bias": False,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
}
QWEN2_5_0_5B_JSON = {
    "model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864,
    "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2, "hidden_act": "silu",
    "max_position_embeddings": 32768, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "tie_word_embeddings": True,
    "use_sliding_window": False, "sliding_window": 32768, "rope_scaling": None,
}
QWEN3_0_6B_JSON = {
    "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 3072,
    "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
    "hidden_act": "silu", "max_position_embeddings": 40960, "rms_norm_eps": 1e-06, "rope_theta": 1000000,
    "tie_word_embeddings": True, "attention_bias": False, "use_sliding_window": False, "rope_scaling": None,
}


@pytest.mark.parametrize(
    ("config_json", "preset"),
    [(LLAMA3_1_8B_JSON, "llama3_1_8b"), (QWEN2_5_0_5B_JSON, "qwen2_5_0_5b"), (QWEN3_0_6B_JSON, "qwen3_0_6b")],
)
def test_published_config_json_gives_the_preset(config_json, preset):
    assert config_from_hf(config_json) == get_preset(preset)


def test_config_to_hf_round_trips_every_preset():
    for name, config in PRESETS.items():
        assert config_from_hf(config_to_hf(config)) == config.replace(max_seq_len=config.max_seq_len), name


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_builds_abstractly_with_consistent_shapes(name):
    config = get_preset(name, n_layers=2)  # every layer has the same shapes; two keep the test fast
    model = nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0)))
    attention = model.layers.attention  # parameters stacked along a leading layer axis
    assert attention.q_proj.shape == (2, config.d_model, config.n_heads, config.head_dim)
    assert attention.k_proj.shape == (2, config.d_model, config.n_kv_heads, config.head_dim)
    assert attention.q_proj.get_metadata("out_sharding") == ("layers", "embed", "heads", "head_dim")
    assert (model.lm_head is None) == config.tie_embeddings
    assert model.embed.shape == (config.vocab_size, config.d_model)


def test_presets_are_hashable_and_overridable():
    config = get_preset("llama3_1_8b", dtype="bfloat16")
    assert config.dtype == "bfloat16" and config.param_dtype == "float32"
    assert hash(config) == hash(get_preset("llama3_1_8b", dtype=jax.numpy.bfloat16))
    with pytest.raises(ValueError, match="unknown model preset 'gpt5'"):
        get_preset("gpt5")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"n_heads": 6, "n_kv_heads": 4}, "n_heads .6. must be a multiple of n_kv_heads .4."),
        ({"head_dim": 15}, "head_dim must be even"),
        ({"d_model": 0}, "d_model must be a positive int"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling type 'yarn' is not supported"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 4.0}}, "missing keys"),
        ({"dtype": "not_a_dtype"}, "dtype is not a dtype"),
    ],
)
def test_invalid_configs_raise_clear_errors(overrides, message):
    with pytest.raises(ValueError, match=message):
        get_preset("tiny", **overrides)


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"model_type": "mistral"}, r"unsupported model_type 'mistral'.*\['llama', 'qwen2', 'qwen3'\]"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
        ({"attention_bias": True}, "attention_bias=True"),
        ({"hidden_size": None}, "hidden_size"),
    ],
)
def test_unsupported_config_json_raises_naming_the_problem(patch, message):
    config_json = {**LLAMA3_1_8B_JSON, **patch}
    if patch.get("hidden_size", 1) is None:
        del config_json["hidden_size"]
    with pytest.raises(ValueError, match=message):
        config_from_hf(config_json)


def test_model_config_is_a_frozen_dataclass():
    config = ModelConfig(vocab_size=8, d_model=8, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=4, mlp_dim=16)
    with pytest.raises(AttributeError):
        config.d_model = 16


def test_qwen3_config_json_without_head_dim_takes_transformers_default_128():
    import transformers

    config_json = {**QWEN3_0_6B_JSON, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2}
    del config_json["head_dim"]
    assert transformers.Qwen3Config(**config_json).head_dim == 128  # the reference we follow
    assert config_from_hf(config_json).head_dim == 128  # not hidden_size // heads = 16
    llama_json = {key: value for key, value in LLAMA3_1_8B_JSON.items() if key != "head_dim"}
    assert config_from_hf(llama_json).head_dim == 4096 // 32  # other types keep hidden_size // heads


_SMALL_LLAMA = {"model_type": "llama", "vocab_size": 97, "hidden_size": 64, "num_hidden_layers": 2,
                "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2,
                "max_position_embeddings": 128}
_LLAMA3_FACTORS = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}


@pytest.mark.parametrize("rope", [
    # the legacy `type` key inside transformers 5's `rope_parameters` (was read as no scaling: logits off by 3.7)
    {"rope_parameters": {"type": "llama3", "rope_theta": 5e5, **_LLAMA3_FACTORS,
                         "original_max_position_embeddings": 16}},
    # a `rope_theta` inside the legacy `rope_scaling` (was ignored for the top level's default 10000)
    {"rope_scaling": {"rope_type": "llama3", "rope_theta": 5e5, **_LLAMA3_FACTORS,
                      "original_max_position_embeddings": 16}},
    # llama3 without original_max_position_embeddings: transformers 5 takes max_position_embeddings (was refused)
    {"rope_scaling": {"rope_type": "llama3", **_LLAMA3_FACTORS}, "rope_theta": 5e5},
    {"rope_scaling": {}, "rope_theta": 1234.0},  # an empty dict is default rope (was refused)
    {"rope_parameters": {"rope_type": "default", "rope_theta": 777.0}},
    {"rope_theta": 1234.0},
])
def test_rope_settings_are_read_as_transformers_reads_them(rope):
    """The reference is transformers' own reading of the same config.json (`LlamaConfig(...).rope_parameters`)."""
    import copy

    import transformers

    config_json = {**_SMALL_LLAMA, **rope}
    # (a copy: transformers fills the rope dict it is given in place)
    reference = dict(transformers.LlamaConfig(**{k: v for k, v in copy.deepcopy(config_json).items()
                                                 if k != "model_type"}).rope_parameters)
    ours = config_from_hf(config_json)
    assert ours.rope_theta == reference.pop("rope_theta")
    reference.pop("type", None)
    if reference.pop("rope_type") == "default":
        assert ours.rope_scaling is None
    else:
        assert ours.rope_scaling == {"rope_type": "llama3", **reference}


def test_options_transformers_computes_like_the_plain_model_are_accepted():
    """`swish` is transformers' other name for silu, and a sliding window that starts past the last layer
    (`max_window_layers` >= the layer count) slides in none; both were refused."""
    assert config_from_hf({**_SMALL_LLAMA, "hidden_act": "swish"}).n_layers == 2
    qwen2 = {**_SMALL_LLAMA, "model_type": "qwen2", "use_sliding_window": True, "sliding_window": 4}
    assert config_from_hf({**qwen2, "max_window_layers": 2}).n_layers == 2
    with pytest.raises(ValueError, match=r"use_sliding_window=True .*layers 1 to 1 would attend through a window of 4"):
        config_from_hf({**qwen2, "max_window_layers": 1})


def test_an_eager_call_refuses_token_ids_outside_the_vocabulary():
    """Outside jit an out-of-range id is an error naming it: it embedded as NaN (its row's later logits all
    NaN), and a negative id as a row from the end of the table."""
    import jax.numpy as jnp

    model = Decoder(get_preset("tiny", vocab_size=32), rngs=nnx.Rngs(0))
    assert model(jnp.array([[0, 31]])).shape == (1, 2, 32)
    for ids, bad in (([[1, 32]], "32"), ([[-1, 2]], "-1")):
        with pytest.raises(ValueError, match=rf"token ids \[{bad}\] are outside the vocabulary \[0, 32\)"):
            model(jnp.array(ids))
