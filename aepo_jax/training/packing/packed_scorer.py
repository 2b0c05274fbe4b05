"""The tree-packed log-prob scorer: one forward over packed rows, flat per-token log-probs.

Per micro-batch: forward the packed rows under their ancestor mask (positions =
depths), so every slot's logits equal the flat layout's logits at that token;
score each flat token with the logits of its parent's slot (`score_row`,
`score_col`). The train step (`train_step.make_rl_train_step(...,
logprobs=packed_logprobs)`) then applies exactly the flat `rl_loss_fn` to the
`[B, T]` arrays. A node shared by several trajectories is computed once and the
gradient of the gather sums the per-trajectory weights (advantage, mask,
aggregation denominator), so loss and gradient equal the flat step's for every
surrogate and aggregation, GSPO's sequence ratio included (docs/packing.md).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from aepo_jax.objectives.logprobs import token_logprobs_and_entropy
from aepo_jax.training.packing.ancestor_mask import ancestor_mask
from aepo_jax.training.train_step import forward_logits

Batch = dict[str, jax.Array]


def packed_logprobs(
    graphdef: nnx.GraphDef,
    params: Any,
    mb: Batch,
    temperature: float = 1.0,
    compute_dtype: str | None = None,
    chunk_size: int | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Flat `(logp, entropy)`, float32 `[B, T]`, of one micro-batch computed on its packed rows.

    Token `t` of flat row `b` is scored at slot `(score_row, score_col)[b, t]`,
    its parent's slot; column 0 and padding are 0, as in the flat step.
    A slot with several children is scored once per child: the slot's log
    normaliser comes from the first child's log-prob (`packed_next_ids`),
    which is also exactly the value used when the scored child is the first.
    """
    packed = {"input_ids": mb["packed_ids"], "positions": mb["packed_positions"],
              "attention_mask": ancestor_mask(mb["packed_subtree_end"])}
    logits = forward_logits(graphdef, params, packed, compute_dtype)  # [R, L, V]
    first_logp, slot_entropy = token_logprobs_and_entropy(
        logits, mb["packed_next_ids"], temperature=temperature, chunk_size=chunk_size)  # [R, L] each
    first_logit = jnp.take_along_axis(logits, mb["packed_next_ids"][..., None], axis=-1)[..., 0]  # [R, L]
    log_norm = first_logit.astype(jnp.float32) / temperature - first_logp  # [R, L]

    rows, cols, targets = mb["score_row"], mb["score_col"], mb["input_ids"]  # [B, T] each
    target_logit = logits[rows, cols, targets].astype(jnp.float32) / temperature  # [B, T]
    is_first = mb["packed_next_ids"][rows, cols] == targets
    logp = jnp.where(is_first, first_logp[rows, cols], target_logit - log_norm[rows, cols])
    scored = mb["scored"] > 0
    return jnp.where(scored, logp, 0.0), jnp.where(scored, slot_entropy[rows, cols], 0.0)
