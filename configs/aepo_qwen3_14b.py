"""AEPO on Qwen3-14B for deep search (the paper's headline setting, spec §7-8).

Paper: 1,071 RL rows, 64 prompts x k=12 per step, 5 epochs; GAIA 47.6 /
HLE 11.2 / WebWalkerQA 43.0 pass@1.

Hardware: float32 master weights + AdamW moments are 14.8B x 12 bytes
~ 178 GB, plus a bfloat16 compute copy (30 GB) and activations of 8k-token
sequences. Mesh: fsdp=8 x tensor=4 per replica and `data` taking the rest.
The train step, the scorer and a step's rollouts (768 trajectories, a ragged
8k-slot KV cache of 1.25 TiB) fit a TPU v5p-64 slice (32 chips, 95 GB HBM
each; the per-chip figures, planned by `make memory-plan`, are in
docs/scaling.md, "Meshes that fit"); a v5p-128 slice adds data parallelism.
On GPUs: the mesh's 32 devices are 4 nodes of 8 x H100/H200 (docs/scaling.md,
"Launch"). Qwen3-14B has 40 query / 8 key-value heads, so tensor must
divide 8.

Variants (`--config configs/aepo_qwen3_14b.py:ARG`): no ARG is the paper's
method as AEPO_SPEC.md states it; `release` reproduces the authors' released script
setting for setting (`_release` below; docs/fidelity.md has the table).
"""

from __future__ import annotations

import ml_collections

from configs.base import apply_release_settings, get_base_config, select_variant

VARIANTS = ("release",)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    variant = select_variant(arg, VARIANTS, "configs/aepo_qwen3_14b.py")
    c = get_base_config("aepo")
    c.name = "aepo_qwen3_14b"
    c.mesh.shape = {"data": -1, "fsdp": 8, "tensor": 4}
    c.model.preset = "qwen3_14b"
    c.model.checkpoint_dir = "/path/to/Qwen3-14B"  # HF safetensors (after the SFT cold start)
    c.model.compute_dtype = "bfloat16"
    # Memory (docs/scaling.md, benchmarks/memory_plan.py): keep each scanned layer's weight-matmul outputs and
    # recompute the rest (attention scores included) in the backward pass; score tokens 1024 positions at a time.
    c.model.remat = "dots_with_no_batch_dims_saveable"
    c.model.logits_chunk_size = 1024
    # TPU v5p kernels (docs/attention.md): splash for flat rows, the tree kernel for tree-packed rows, the dense
    # path for the sampler's cached blocks. GPUs: --config.model.attention=cudnn; CPU: dense.
    c.model.attention = "splash"
    c.tokenizer.kind = "hf"
    c.tokenizer.path = "/path/to/Qwen3-14B/tokenizer.json"
    # The tags as the checkpoint's own text pieces (the paper's SFT data writes them as plain text; registered
    # as new ids they would read untrained embedding rows): segments stop on the generated text.
    c.tokenizer.agent_tags = "text"

    c.data.name = "deep_search"
    c.data.path = "/path/to/aepo_deep_search_1k.jsonl"  # paper: 1,071 training rows
    c.data.prompts_per_step = 64  # paper: 64
    # The search tool: our BM25 server over this JSONL corpus ({"id", "contents"} per line), or a running
    # retrieval server given by --config.data.search_url=http://HOST:PORT (used instead when set).
    c.data.corpus_path = "/path/to/search_corpus.jsonl"
    c.reward.name = "qa_f1"  # released deep-research reward (spec §5)

    c.rollout.strategy = "aepo"
    c.rollout.branch_width = 2  # paper: Z = 2
    c.rollout.branch_threshold = 0.5  # paper: tau = 0.5
    c.rollout.entropy_weight = 0.2  # paper: gamma = 0.2
    c.rollout.penalty_slope = 0.05  # paper: 0.05
    c.rollout.beta = 0.5  # paper: beta = 0.5
    c.rollout.k = 12  # paper: 12 trajectories per prompt
    c.rollout.initial_rollouts = 6  # paper: m = 6 (recomputed per prompt by dynamic_budget)
    c.rollout.max_prompt_len = 2000  # paper: 2000
    c.rollout.max_response_len = 6192  # paper: 6192
    c.rollout.python_preload = ("numpy", "sympy")  # imported once per sandbox worker, not per call
    c.rollout.temperature = 1.0
    c.rollout.top_p = 1.0

    c.objective.surrogate = "aepo"  # stop-gradient clipping (spec §3.1)
    c.objective.advantage = "grpo"
    c.objective.entropy_advantage = True
    c.objective.entropy_advantage_coef = 0.2  # paper: a = 0.2
    c.objective.clip_low = 0.2  # paper: 0.2 / 0.2
    c.objective.clip_high = 0.2
    c.objective.dual_clip_c = 3.0  # paper: dual clip 3
    c.objective.loss_agg = "token_mean"
    c.objective.kl_coef = 0.0  # paper: no KL

    # 1,071 rows // 64 per step = 16 steps per epoch (the pipeline drops the last partial batch), x 5 epochs.
    c.train.total_steps = 80
    c.train.ppo_epochs = 1  # paper: one pass over each batch
    c.train.mini_batch_prompts = 8  # paper PPO mini-batch 8
    # Rows per forward/backward (a memory knob; exact accumulation): the step takes at least one row per
    # data x fsdp device (training.build.step_config_from), so on the 32-chip mesh (fsdp 8) it runs 8.
    c.train.micro_batch_size = 2
    c.train.max_seq_len = 8192  # 2000 prompt + 6192 response

    c.optim.lr = 1e-6  # paper
    c.optim.schedule = "constant"
    c.optim.warmup_steps = 0
    c.optim.weight_decay = 0.01
    c.optim.grad_clip_norm = 1.0
    c.checkpoint.every = 10
    c.checkpoint.keep = 3
    return _release(c) if variant == "release" else c


# ----- the `release` variant: kept apart from the settings above (spec §7.1) -----


def _release(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The released script: pre-monitoring off with fixed m = 6, per-prompt penalty
    counter, top-10 entropy, no entropy-aware advantage, 80 steps (1,071 rows // 64 = 16 full
    batches x 5 epochs), F1 reward."""
    c.name += "_release"
    return apply_release_settings(c, initial_rollouts=6, total_steps=80, reward="qa_f1")
