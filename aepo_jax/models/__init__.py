"""Decoder-only transformers (Llama-3, SmolLM2, Qwen2.5, Qwen3), their configs, KV cache and checkpoint I/O."""

from aepo_jax.models.config import (
    PRESETS,
    ModelConfig,
    config_from_hf,
    config_to_hf,
    get_preset,
)
from aepo_jax.models.decoder import Decoder, DecoderBlock
from aepo_jax.models.hf_checkpoint import (
    load_hf_checkpoint,
    model_from_hf_tensors,
    read_safetensors,
)
from aepo_jax.models.hf_export import hf_tensors_from_model, save_hf_checkpoint
from aepo_jax.models.kv_cache import KVCache

__all__ = [
    "PRESETS",
    "Decoder",
    "DecoderBlock",
    "KVCache",
    "ModelConfig",
    "config_from_hf",
    "config_to_hf",
    "get_preset",
    "hf_tensors_from_model",
    "load_gguf",
    "load_hf_checkpoint",
    "model_from_hf_tensors",
    "read_safetensors",
    "save_hf_checkpoint",
]


def __getattr__(name: str):
    # `load_gguf` pulls in the tokenizers package (which imports aepo_jax.agent);
    # resolving it lazily keeps `import aepo_jax.models` free of import cycles.
    if name == "load_gguf":
        from aepo_jax.models.gguf import load_gguf

        return load_gguf
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
