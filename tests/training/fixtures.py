"""Shared helpers for the training tests: the real tiny decoder and a synthetic batch."""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from aepo_jax.models import Decoder, get_preset
from aepo_jax.training.batch import pad_sequences


def tiny_model(seed: int = 0, **overrides):
    """(graphdef, float32 params) of the `tiny` preset with a small vocabulary."""
    config = get_preset("tiny", **({"vocab_size": 64} | overrides))
    return nnx.split(Decoder(config, rngs=nnx.Rngs(seed)))


def synthetic_rl_batch(rows: int = 8, max_len: int = 16, vocab: int = 64, seed: int = 0,
                       logp_jitter: float = 0.3) -> dict[str, np.ndarray]:
    """Variable-length rows: a prompt (mask 0), a response (mask 1) with a tool
    result (mask 0) in the middle, random advantages, and `logp_old` = `logp_base`
    plus jitter so that some ratios leave the clip range."""
    rng = np.random.default_rng(seed)
    sequences = []
    for _ in range(rows):
        n = int(rng.integers(max_len // 2, max_len + 1))
        prompt = int(rng.integers(2, 5))
        mask = np.zeros(n, np.float32)
        mask[prompt:] = 1.0
        tool = int(rng.integers(prompt, n))
        mask[tool:tool + 2] = 0.0
        sequences.append({
            "tokens": rng.integers(1, vocab, size=n).tolist(),
            "mask": mask,
            "advantages": np.float32(rng.normal()),
            "logp_old": rng.normal(scale=logp_jitter, size=n).astype(np.float32),
        })
    return pad_sequences(sequences, max_len=max_len, length_multiple=max_len)


def with_logp_old_near_current(graphdef, params, batch, temperature=1.0):
    """Replace `logp_old` by the model's own log-probs plus the stored jitter."""
    from aepo_jax.training.train_step import sequence_logprobs

    score = jax.jit(sequence_logprobs, static_argnums=(0, 3))
    logp, _ = score(graphdef, params, jax.tree.map(np.asarray, batch), temperature)
    out = dict(batch)
    out["logp_old"] = (np.asarray(logp) + batch["logp_old"]) * batch["valid"]
    return out


def packed_loss_and_grads(graphdef, cfg, params, batch):
    """Loss, gradients and metrics of a tree batch (leading `[M]` axis): the tree-packed
    step without its optimiser update, for comparing against the flat loss."""
    from aepo_jax.objectives import loss_denominator
    from aepo_jax.training.packing import packed_logprobs
    from aepo_jax.training.train_step import (
        accumulate_gradients,
        flat_denominator,
        rl_loss_fn,
    )

    denominator = flat_denominator(batch["mask"], lambda mask: loss_denominator(mask, cfg.loss.loss_agg))
    return accumulate_gradients(rl_loss_fn(graphdef, cfg, packed_logprobs), params, batch, denominator)
