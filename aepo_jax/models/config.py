"""Decoder hyper-parameters (`ModelConfig`), published presets, and `config.json` import.

One frozen dataclass describes every supported family (Llama-3, SmolLM2, Qwen2.5,
Qwen3); the family differences are three switches: `qkv_bias` (Qwen2.5),
`qk_norm` (Qwen3) and `rope_scaling` (Llama-3.1).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp

from aepo_jax.models.remat import check_remat

LLAMA3_ROPE_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shape and numerics of a decoder-only transformer.

    `head_dim` is independent of `d_model / n_heads` (Qwen3 uses 128 with
    d_model 1024 and 16 heads). `dtype` is the activation dtype and
    `param_dtype` the storage dtype of the weights; both are kept as dtype
    names ("float32", "bfloat16") so the config stays hashable.
    """

    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    mlp_dim: int
    rope_theta: float = 10_000.0
    rope_scaling: Mapping[str, Any] | None = None
    rms_eps: float = 1e-6
    tie_embeddings: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    max_seq_len: int = 4096
    dtype: Any = "float32"
    param_dtype: Any = "float32"
    attention: str = "dense"  # attention backend (models/attention.py): "dense", "splash" (TPU), "cudnn" (GPU)
    # Run the Pallas kernels behind `attention="splash"` in interpret mode, on any
    # platform (CPU tests of the kernels inside the model); no effect on other backends.
    attention_interpret: bool = False
    # Activation rematerialisation of each scanned layer: "none", "block" or a
    # `jax.checkpoint_policies` name (aepo_jax.models.remat). Numerics are unchanged.
    remat: str = "none"

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "mlp_dim", "max_seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"ModelConfig.n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads}) "
                "for grouped-query attention"
            )
        if self.head_dim % 2:
            raise ValueError(f"ModelConfig.head_dim must be even for rotary embeddings, got {self.head_dim}")
        if self.rope_theta <= 0 or self.rms_eps <= 0:
            raise ValueError(f"rope_theta and rms_eps must be positive, got {self.rope_theta}, {self.rms_eps}")
        if self.rope_scaling is not None:
            scaling = dict(self.rope_scaling)
            rope_type = scaling.get("rope_type", scaling.get("type"))
            if rope_type != "llama3":
                raise ValueError(f"rope_scaling type {rope_type!r} is not supported; only 'llama3' is")
            missing = [k for k in LLAMA3_ROPE_KEYS if k not in scaling]
            if missing:
                raise ValueError(f"llama3 rope_scaling is missing keys {missing}")
            object.__setattr__(self, "rope_scaling", {"rope_type": "llama3", **{k: scaling[k] for k in LLAMA3_ROPE_KEYS}})
        check_remat(self.remat)
        for name in ("dtype", "param_dtype"):
            try:
                object.__setattr__(self, name, jnp.dtype(getattr(self, name)).name)
            except TypeError as err:
                raise ValueError(f"ModelConfig.{name} is not a dtype: {getattr(self, name)!r}") from err

    def __hash__(self) -> int:
        scaling = None if self.rope_scaling is None else tuple(sorted(self.rope_scaling.items()))
        fields = tuple(getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "rope_scaling")
        return hash((fields, scaling))

    @property
    def n_groups(self) -> int:
        """Query heads per key/value head (GQA group size)."""
        return self.n_heads // self.n_kv_heads

    def replace(self, **overrides: Any) -> ModelConfig:
        return dataclasses.replace(self, **overrides)


PRESETS: dict[str, ModelConfig] = {
    # Test-size model; the demo overrides vocab_size to its SentencePiece vocabulary.
    "tiny": ModelConfig(
        vocab_size=512, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, mlp_dim=128,
        rope_theta=10_000.0, rms_eps=1e-6, tie_embeddings=True, max_seq_len=1024,
    ),
    # HuggingFaceTB/SmolLM2-135M(-Instruct): Llama architecture.
    "smollm2_135m": ModelConfig(
        vocab_size=49152, d_model=576, n_layers=30, n_heads=9, n_kv_heads=3, head_dim=64, mlp_dim=1536,
        rope_theta=100_000.0, rms_eps=1e-5, tie_embeddings=True, max_seq_len=8192,
    ),
    # Qwen/Qwen2.5-0.5B(-Instruct).
    "qwen2_5_0_5b": ModelConfig(
        vocab_size=151936, d_model=896, n_layers=24, n_heads=14, n_kv_heads=2, head_dim=64, mlp_dim=4864,
        rope_theta=1_000_000.0, rms_eps=1e-6, tie_embeddings=True, qkv_bias=True, max_seq_len=32768,
    ),
    # Qwen/Qwen2.5-7B(-Instruct).
    "qwen2_5_7b": ModelConfig(
        vocab_size=152064, d_model=3584, n_layers=28, n_heads=28, n_kv_heads=4, head_dim=128, mlp_dim=18944,
        rope_theta=1_000_000.0, rms_eps=1e-6, tie_embeddings=False, qkv_bias=True, max_seq_len=32768,
    ),
    # Qwen/Qwen3-0.6B.
    "qwen3_0_6b": ModelConfig(
        vocab_size=151936, d_model=1024, n_layers=28, n_heads=16, n_kv_heads=8, head_dim=128, mlp_dim=3072,
        rope_theta=1_000_000.0, rms_eps=1e-6, tie_embeddings=True, qk_norm=True, max_seq_len=40960,
    ),
    # Qwen/Qwen3-8B.
    "qwen3_8b": ModelConfig(
        vocab_size=151936, d_model=4096, n_layers=36, n_heads=32, n_kv_heads=8, head_dim=128, mlp_dim=12288,
        rope_theta=1_000_000.0, rms_eps=1e-6, tie_embeddings=False, qk_norm=True, max_seq_len=40960,
    ),
    # Qwen/Qwen3-14B.
    "qwen3_14b": ModelConfig(
        vocab_size=151936, d_model=5120, n_layers=40, n_heads=40, n_kv_heads=8, head_dim=128, mlp_dim=17408,
        rope_theta=1_000_000.0, rms_eps=1e-6, tie_embeddings=False, qk_norm=True, max_seq_len=40960,
    ),
    # meta-llama/Llama-3.1-8B(-Instruct).
    "llama3_1_8b": ModelConfig(
        vocab_size=128256, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128, mlp_dim=14336,
        rope_theta=500_000.0, rms_eps=1e-5, tie_embeddings=False, max_seq_len=131072,
        rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    ),
}


def get_preset(name: str, **overrides: Any) -> ModelConfig:
    """Returns the named preset with `overrides` applied (e.g. `dtype="bfloat16"`)."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; known presets: {sorted(PRESETS)}")
    return PRESETS[name].replace(**overrides) if overrides else PRESETS[name]


def _reject_unsupported(config_json: Mapping[str, Any], model_type: str) -> None:
    """Raises for HF options that change the architecture in ways we do not implement."""
    if config_json.get("hidden_act", "silu") not in ("silu", "swish"):  # transformers: swish is silu
        raise ValueError(f"hidden_act {config_json['hidden_act']!r} is not supported (only 'silu' / SwiGLU)")
    if config_json.get("mlp_bias", False):
        raise ValueError("mlp_bias=True is not supported")
    # transformers slides the window in layers max_window_layers and up only: none when it is past the last
    n_layers = int(config_json.get("num_hidden_layers", 0))
    if config_json.get("use_sliding_window", False) and config_json.get("sliding_window") is not None and \
            int(config_json.get("max_window_layers", 0) or 0) < n_layers:
        raise ValueError(f"use_sliding_window=True is not supported for model_type {model_type!r} (layers "
                         f"{config_json.get('max_window_layers', 0)} to {n_layers - 1} would attend through a "
                         f"window of {config_json['sliding_window']})")
    if model_type in ("llama", "qwen3") and config_json.get("attention_bias", False):
        raise ValueError(f"attention_bias=True (bias on q/k/v/o) is not supported for model_type {model_type!r}")


# transformers' Qwen3Config defaults head_dim to 128, not hidden_size // num_attention_heads.
QWEN3_DEFAULT_HEAD_DIM = 128


def _hf_head_dim(config_json: Mapping[str, Any], model_type: str, d_model: int, n_heads: int) -> int:
    """`head_dim` as transformers reads it: the field when set, else the model type's default."""
    if config_json.get("head_dim"):
        return int(config_json["head_dim"])
    if model_type == "qwen3" and "head_dim" not in config_json:
        return QWEN3_DEFAULT_HEAD_DIM
    return d_model // n_heads


def _hf_rope(config_json: Mapping[str, Any]) -> tuple[float | None, dict[str, Any] | None]:
    """(rope_theta, rope_scaling) as transformers reads them: the rope dict is `rope_parameters`
    (transformers >= 5) or else the legacy `rope_scaling`, and a `rope_theta` inside it wins over the top
    level's; its type is `rope_type` or the legacy `type`, and "default" (or an empty dict) means no
    scaling. A llama3 dict without `original_max_position_embeddings` takes `max_position_embeddings`."""
    rope = dict(config_json.get("rope_parameters") or config_json.get("rope_scaling") or {})
    rope_theta = rope.pop("rope_theta", config_json.get("rope_theta"))
    rope_type = rope.pop("rope_type", rope.pop("type", "default"))
    if rope_type == "default":
        return rope_theta, None
    if rope_type == "llama3" and "original_max_position_embeddings" not in rope and \
            "max_position_embeddings" in config_json:
        rope["original_max_position_embeddings"] = config_json["max_position_embeddings"]
    return rope_theta, {"rope_type": rope_type, **rope}


def config_from_hf(config_json: Mapping[str, Any]) -> ModelConfig:
    """Builds a `ModelConfig` from a Hugging Face `config.json` dict (llama / qwen2 / qwen3)."""
    model_type = config_json.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"unsupported model_type {model_type!r} in config.json; supported model types: {list(SUPPORTED_MODEL_TYPES)}"
        )
    _reject_unsupported(config_json, model_type)
    try:
        n_heads = int(config_json["num_attention_heads"])
        d_model = int(config_json["hidden_size"])
        head_dim = _hf_head_dim(config_json, model_type, d_model, n_heads)
        rope_theta, rope_scaling = _hf_rope(config_json)
        return ModelConfig(
            vocab_size=int(config_json["vocab_size"]),
            d_model=d_model,
            n_layers=int(config_json["num_hidden_layers"]),
            n_heads=n_heads,
            n_kv_heads=int(config_json.get("num_key_value_heads") or n_heads),
            head_dim=int(head_dim),
            mlp_dim=int(config_json["intermediate_size"]),
            rope_theta=float(rope_theta if rope_theta is not None else 10_000.0),
            rope_scaling=rope_scaling,
            rms_eps=float(config_json.get("rms_norm_eps", 1e-6)),
            tie_embeddings=bool(config_json.get("tie_word_embeddings", False)),
            qkv_bias=model_type == "qwen2",
            qk_norm=model_type == "qwen3",
            max_seq_len=int(config_json.get("max_position_embeddings", 4096)),
        )
    except KeyError as err:
        raise ValueError(f"config.json for model_type {model_type!r} lacks required key {err.args[0]!r}") from err


def hf_model_type(config: ModelConfig) -> str:
    """The HF `model_type` that reproduces `config` exactly."""
    if config.qk_norm and config.qkv_bias:
        raise ValueError("no Hugging Face architecture has both q/k/v bias (qwen2) and q/k norm (qwen3)")
    if config.qk_norm:
        return "qwen3"
    if config.qkv_bias:
        return "qwen2"
    return "llama"


def config_to_hf(config: ModelConfig) -> dict[str, Any]:
    """The `config.json` dict that `transformers` turns back into the same architecture."""
    model_type = hf_model_type(config)
    architectures = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
    out: dict[str, Any] = {
        "architectures": [architectures[model_type]],
        "model_type": model_type,
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.n_kv_heads,
        "head_dim": config.head_dim,
        "intermediate_size": config.mlp_dim,
        "hidden_act": "silu",
        "rope_theta": config.rope_theta,
        "rope_scaling": None if config.rope_scaling is None else dict(config.rope_scaling),
        "rms_norm_eps": config.rms_eps,
        "tie_word_embeddings": config.tie_embeddings,
        "max_position_embeddings": config.max_seq_len,
        "attention_dropout": 0.0,
        "torch_dtype": config.param_dtype,
    }
    if model_type == "llama":
        out.update(attention_bias=False, mlp_bias=False)
    elif model_type == "qwen3":
        out.update(attention_bias=False, use_sliding_window=False)
    else:
        out.update(use_sliding_window=False)
    return out
