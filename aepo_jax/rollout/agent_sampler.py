"""The sampler an agent loop drives: the one place a `Sampler` is built (DESIGN.md, Sampler).

It stops at EOS and at the agent's closing tags, and its KV cache is sized by
`cache_slots`, the single cache-sizing rule, so training rollouts, the demo
and evaluation cannot disagree about how much room a rollout needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aepo_jax.agent.loop import LoopConfig, cache_slots
from aepo_jax.agent.loop_config import agent_stops
from aepo_jax.sampling import Sampler, SamplingParams
from aepo_jax.tokenizers import end_of_generation_ids, token_bytes

# A rollout's decode states hold at least this many rows: its last few trajectories (and small
# branch groups) run the programs compiled for this batch instead of compiling batches of 1, 2 and 4.
ROLLOUT_MIN_BATCH = 8


def agent_sampler(graphdef: Any, params: Any, tokenizer: Any, loop: LoopConfig, sampling: SamplingParams, *,
                  seed: int, mesh: Any = None, prompts: Sequence[Sequence[int]] = ()) -> Sampler:
    """A `Sampler` over `params` for agent rollouts within `loop`'s limits.

    Args:
      graphdef, params: the policy (`nnx.split` of the decoder).
      tokenizer: gives the end-of-generation ids, `pad_id` and the agent tags (stops by id when
        they are registered tokens, else as strings on the generated text: `agent_stops`).
      loop: the loop's limits; every decode state gets `cache_slots(loop, prompts)` slots from its
        prefill on (a fixed length, so a rollout compiles each program for one cache length and
        never grows a cache; prefills, appends and decode windows still read only the span their
        rows fill).
        `loop.background_compile` says whether new shapes compile in the background, and
        `loop.layerwise_decode` how decode windows hold the layers.
      sampling: temperature, top-k, top-p, greedy.
      seed: base of the sampler's PRNG keys.
      mesh: shard the cache's rows over this mesh (None: one device).
      prompts: prompts known in advance; a longer one than `loop.max_context_len` lengthens the cache.
    """
    slots = cache_slots(loop, prompts)
    stop_sequences, stop_strings = agent_stops(tokenizer)
    return Sampler(graphdef, params, eos_ids=end_of_generation_ids(tokenizer), pad_id=tokenizer.pad_id,
                   stop_sequences=stop_sequences, stop_strings=stop_strings,
                   token_bytes=token_bytes(tokenizer) if stop_strings else None, params=sampling,
                   max_cache_len=slots, mesh=mesh, seed=seed, min_batch=ROLLOUT_MIN_BATCH, min_cache_len=slots,
                   compile_in_background=loop.compiles_in_background, layerwise_decode=loop.decode_layerwise)
