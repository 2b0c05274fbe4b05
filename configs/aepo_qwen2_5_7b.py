"""AEPO on Qwen2.5-7B-Instruct for mathematical reasoning with a python tool (spec §7).

Paper: 10,000 RL rows, 128 prompts x k=16 per step, 2 epochs.

Hardware: 7.6B params x 12 bytes (float32 master + AdamW moments) ~ 91 GB
plus a bfloat16 copy (15 GB). Mesh: fsdp=8 x tensor=4 (32 devices), `data`
taking any extra devices. The train step, the scorer and a step's rollouts
(2048 trajectories, a ragged 8k-slot KV cache of 0.9 TiB) fit a v5p-64 slice
(32 chips; the per-chip figures, planned by `make memory-plan`, are in docs/scaling.md, "Meshes that fit").
No GPU plan was compiled.
Qwen2.5-7B has 28 query / 4 key-value heads, so tensor must divide 4 (a launch refuses other sizes).

One 8-GPU node cannot hold this config's rollout. Its KV cache is rows x slots x 56 KiB (28 layers x K and V
x 4 KV heads x 128 x 2 bytes of bfloat16): 128 prompts x 16 rollouts = 2048 rows x next_pow2(1536 + 4096)
= 8192 slots = 896 GiB (0.9 TiB), 112 GiB per GPU, more than an H100 (80 GB) or an H200 (141 GB, less the
~27 GB of weights each GPU holds: 11.4 GB of float32 state and AdamW over fsdp 8, a 15.2 GB bfloat16
sampler replica). On one node lower the rows or the slots: data.prompts_per_step=32 gives 512 rows, 224 GiB,
28 GiB per GPU; rollout.max_response_len=2560 (1536 + 2560 = 4096 slots) halves any of these. On a GPU the
decode window may hold up to twice the cache (rollout.layerwise_decode=off gives it back). On the config's
own 32 devices (4 nodes of 8) each node samples a quarter of the prompts: 512 rows, 28 GiB per GPU.

Variants (`--config configs/aepo_qwen2_5_7b.py:ARG`): no ARG is the paper's
method as AEPO_SPEC.md states it; `release` reproduces the authors' released script
setting for setting (`_release` below; docs/fidelity.md has the table).
"""

from __future__ import annotations

import ml_collections

from configs.base import apply_release_settings, get_base_config, select_variant

VARIANTS = ("release",)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    variant = select_variant(arg, VARIANTS, "configs/aepo_qwen2_5_7b.py")
    c = get_base_config("aepo")
    c.name = "aepo_qwen2_5_7b"
    c.mesh.shape = {"data": -1, "fsdp": 8, "tensor": 4}  # tensor 1 needed 112 GiB of temporaries per v5p chip with dense attention (memory_plan)
    c.model.preset = "qwen2_5_7b"
    c.model.checkpoint_dir = "/path/to/Qwen2.5-7B-Instruct"
    c.model.compute_dtype = "bfloat16"
    # Memory (docs/scaling.md, benchmarks/memory_plan.py): keep each scanned layer's weight-matmul outputs and
    # recompute the rest (attention scores included) in the backward pass; score tokens 1024 positions at a time.
    c.model.remat = "dots_with_no_batch_dims_saveable"
    c.model.logits_chunk_size = 1024
    # TPU v5p kernels (docs/attention.md): splash for flat rows, the tree kernel for tree-packed rows, the dense
    # path for the sampler's cached blocks. GPUs: --config.model.attention=cudnn; CPU: dense.
    c.model.attention = "splash"
    c.tokenizer.kind = "hf"
    c.tokenizer.path = "/path/to/Qwen2.5-7B-Instruct/tokenizer.json"
    # The tags as the checkpoint's own text pieces (the paper's SFT data writes them as plain text; registered
    # as new ids they would read untrained embedding rows): segments stop on the generated text.
    c.tokenizer.agent_tags = "text"

    c.data.name = "math_reasoning"
    c.data.path = "/path/to/aepo_reasoning_10k.jsonl"  # paper: 10,000 rows
    c.data.prompts_per_step = 128  # paper: 128
    c.reward.name = "math_equiv"

    c.rollout.strategy = "aepo"
    c.rollout.branch_width = 2  # paper: Z = 2
    c.rollout.branch_threshold = 0.5  # paper: tau = 0.5
    c.rollout.entropy_weight = 0.2  # paper: gamma = 0.2
    c.rollout.penalty_slope = 0.05  # paper: 0.05
    c.rollout.beta = 0.5  # paper: beta = 0.5
    c.rollout.k = 16  # paper: 16
    c.rollout.initial_rollouts = 8  # paper: m = 8 (recomputed per prompt by dynamic_budget; release: fixed)
    c.rollout.max_prompt_len = 1536  # paper: 1536
    c.rollout.max_response_len = 4096  # paper: 4096
    c.rollout.temperature = 1.0
    c.rollout.top_p = 1.0
    c.rollout.python_preload = ("numpy", "sympy")  # imported once per sandbox worker, not per call

    c.objective.surrogate = "aepo"  # stop-gradient clipping (spec §3.1)
    c.objective.advantage = "grpo"
    c.objective.entropy_advantage = True
    c.objective.entropy_advantage_coef = 0.2  # paper: a = 0.2
    c.objective.clip_low = 0.2  # paper: 0.2 / 0.2
    c.objective.clip_high = 0.2
    c.objective.dual_clip_c = 3.0  # paper: dual clip 3
    c.objective.loss_agg = "token_mean"
    c.objective.kl_coef = 0.0  # paper: no KL

    # 10,000 rows / 128 per step ~ 78 steps per epoch, x 2 epochs.
    c.train.total_steps = 156
    c.train.ppo_epochs = 1
    c.train.mini_batch_prompts = 16  # paper PPO mini-batch 16
    c.train.micro_batch_size = 4  # at least one row per data x fsdp device is taken (step_config_from)
    c.train.max_seq_len = 5632  # 1536 + 4096

    c.optim.lr = 1e-6
    c.optim.schedule = "constant"
    c.optim.weight_decay = 0.01
    c.optim.grad_clip_norm = 1.0
    return _release(c) if variant == "release" else c


# ----- the `release` variant: kept apart from the settings above (spec §7.1) -----


def _release(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The released script: pre-monitoring off with fixed m = 8, per-prompt penalty
    counter, top-10 entropy, no entropy-aware advantage, 156 steps (10,000 rows // 128 = 78
    full batches x 2 epochs), F1 reward."""
    c.name += "_release"
    return apply_release_settings(c, initial_rollouts=8, total_steps=156, reward="qa_f1")
