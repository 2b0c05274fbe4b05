"""The tree-packed log-prob scorer: one forward over packed rows, flat per-token log-probs.

Per micro-batch: forward the packed rows under their ancestor mask
(`tree_mask(packed_subtree_end)`, which the splash backend runs through the
tree kernel; positions = depths), so every slot's logits equal the flat layout's logits at that token;
score each flat token with the hidden state of its parent's slot (`score_row`,
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

from aepo_jax.models.attention_mask import tree_mask
from aepo_jax.models.lm_head import head_token_scores
from aepo_jax.training.optimizer import cast_for_compute, resolve_dtype

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
    A slot with several children is scored once per child: the first child
    (`packed_next_ids`) by the chunked LM head, the others by their own
    logit (one dot product) minus the slot's log normaliser, so `[R, L, V]`
    logits never exist when `chunk_size` is set.
    """
    model = nnx.merge(graphdef, cast_for_compute(params, resolve_dtype(compute_dtype)))
    hidden = model(mb["packed_ids"], positions=mb["packed_positions"],
                   attention_mask=tree_mask(mb["packed_subtree_end"]), return_hidden=True)  # [R, L, D]
    head = model.head()  # [D, V]
    slot = head_token_scores(hidden, head, mb["packed_next_ids"], dtype=model.config.dtype,
                             temperature=temperature, chunk_size=chunk_size)  # [R, L] each, no [R, L, V]

    rows, cols, targets = mb["score_row"], mb["score_col"], mb["input_ids"]  # [B, T] each
    dtype = model.config.dtype
    parent_hidden = hidden[rows, cols].astype(dtype)  # [B, T, D]
    target_columns = jnp.take(head, targets, axis=1).astype(dtype)  # [D, B, T]
    target_logit = jnp.einsum("btd,dbt->bt", parent_hidden, target_columns,
                              preferred_element_type=jnp.float32) / temperature  # [B, T]
    is_first = mb["packed_next_ids"][rows, cols] == targets
    logp = jnp.where(is_first, slot.logp[rows, cols], target_logit - slot.log_norm[rows, cols])
    scored = mb["scored"] > 0
    return jnp.where(scored, logp, 0.0), jnp.where(scored, slot.entropy[rows, cols], 0.0)
