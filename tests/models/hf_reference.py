"""Small random Hugging Face `transformers` models used as the independent reference in parity tests."""

import numpy as np
import torch
import transformers

LLAMA3_SCALING = {
    "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}
COMMON = {
    "vocab_size": 97, "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 96, "rms_norm_eps": 1e-5,
    "max_position_embeddings": 128,
}
HF_CASES = {
    "llama_untied_gqa_rope_scaling": (transformers.LlamaConfig, {
        "num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": False, "rope_theta": 500000.0,
        "rope_scaling": LLAMA3_SCALING}),
    "llama_tied_mha": (transformers.LlamaConfig, {
        "num_attention_heads": 4, "num_key_value_heads": 4, "tie_word_embeddings": True, "rope_theta": 10000.0}),
    "qwen2_bias_gqa": (transformers.Qwen2Config, {
        "num_attention_heads": 4, "num_key_value_heads": 1, "tie_word_embeddings": True, "rope_theta": 1e6, "rms_norm_eps": 1e-6}),
    "qwen3_qk_norm_head_dim": (transformers.Qwen3Config, {
        "num_attention_heads": 6, "num_key_value_heads": 2, "head_dim": 24, "tie_word_embeddings": False, "rope_theta": 1e6}),
}
MODEL_CLASSES = {
    transformers.LlamaConfig: transformers.LlamaForCausalLM,
    transformers.Qwen2Config: transformers.Qwen2ForCausalLM,
    transformers.Qwen3Config: transformers.Qwen3ForCausalLM,
}


def make_hf_model(case: str, seed: int = 0) -> transformers.PreTrainedModel:
    """A float32 HF model of `case` whose every weight (norms and biases included) is random and O(1)-scaled."""
    config_class, kwargs = HF_CASES[case]
    config = config_class(**{**COMMON, **kwargs}, attn_implementation="eager")
    torch.manual_seed(seed)
    model = MODEL_CLASSES[config_class](config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.2 * torch.randn_like(param))
            elif param.ndim == 1:  # biases
                param.copy_(0.2 * torch.randn_like(param))
            else:
                param.copy_(torch.randn_like(param) / np.sqrt(param.shape[-1]))
    return model


def hf_logits(model, input_ids: np.ndarray, attention_mask=None, position_ids=None) -> np.ndarray:
    """float32 logits [B, T, V] from the reference model."""
    kwargs = {"input_ids": torch.from_numpy(np.asarray(input_ids, np.int64))}
    if attention_mask is not None:
        kwargs["attention_mask"] = torch.from_numpy(np.asarray(attention_mask, np.int64))
    if position_ids is not None:
        kwargs["position_ids"] = torch.from_numpy(np.asarray(position_ids, np.int64))
    with torch.no_grad():
        return model(**kwargs).logits.float().numpy()
