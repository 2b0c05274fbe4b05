"""Shared defaults for every experiment; family files override what differs.

Numbers are the paper's released settings (spec §7) unless a comment says
otherwise; the tiny configs shrink sizes so a step runs on a CPU in seconds.
"""

from __future__ import annotations

import ml_collections
from ml_collections import config_dict


def get_base_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.name = "base"
    c.seed = 0
    # "auto": jax.distributed.initialize() when the environment shows several hosts.
    c.distributed = "auto"

    # Mesh axes (data, fsdp, tensor); -1 takes the remaining devices.
    c.mesh = ml_collections.ConfigDict({"shape": {"data": -1, "fsdp": 1, "tensor": 1}})

    c.model = ml_collections.ConfigDict()
    c.model.preset = "tiny"  # aepo_jax.models.get_preset name
    c.model.vocab_size = config_dict.placeholder(int)  # override the preset's vocabulary (demo tokenizer)
    c.model.checkpoint_dir = ""  # HF safetensors directory to start from ("" = random init)
    c.model.compute_dtype = "float32"  # "bfloat16" casts params inside the step; masters stay float32
    c.model.remat = False

    c.tokenizer = ml_collections.ConfigDict({"kind": "", "path": ""})  # "" = built by the data pipeline

    c.data = ml_collections.ConfigDict()
    c.data.name = "synthetic_facts"
    c.data.path = ""  # local JSONL; "" = the embedded synthetic task
    c.data.split = "train"
    c.data.prompts_per_step = 64  # paper: 64 (Qwen3-14B) / 128 (Qwen2.5-7B)
    c.data.shuffle = True
    c.data.epochs = 5  # paper: 5 (deep search) / 2 (reasoning) epochs over the data

    c.rollout = ml_collections.ConfigDict()
    c.rollout.strategy = "aepo"  # "independent" | "arpo" | "aepo" (spec §2)
    c.rollout.k = 12  # trajectories per prompt (group size); paper 12 / 16
    c.rollout.initial_rollouts = 6  # m global samples (paper 6 / 8); AEPO recomputes it when dynamic_budget
    c.rollout.dynamic_budget = True  # AEPO entropy pre-monitoring (§2.3)
    c.rollout.premonitor_reuse = True
    c.rollout.branch_width = 2  # Z
    c.rollout.branch_threshold = 0.5  # tau
    c.rollout.entropy_weight = 0.2  # gamma
    c.rollout.penalty_slope = 0.05  # consecutive-branch penalty
    c.rollout.penalty_scope = "lineage"  # released code: "prompt"
    c.rollout.beta = 0.5  # budget sigmoid sharpness
    c.rollout.entropy_tokens = 20  # K
    c.rollout.entropy_measure = "exact_mean"
    c.rollout.temperature = 1.0
    c.rollout.top_p = 1.0
    c.rollout.top_k = 0
    c.rollout.max_prompt_len = 2000
    c.rollout.max_response_len = 6192
    c.rollout.max_tool_calls = 6
    c.rollout.tool_timeout_s = 120.0
    c.rollout.max_result_chars = 1000

    c.reward = ml_collections.ConfigDict({"name": "qa_f1"})

    c.objective = ml_collections.ConfigDict()
    c.objective.surrogate = "aepo"  # aepo_jax.objectives policy-loss registry name
    c.objective.advantage = "grpo"  # advantage estimator name
    c.objective.entropy_adv_coef = 0.2  # a, AEPO entropy-aware advantage (0 disables)
    c.objective.entropy_adv_scope = "batch"
    c.objective.clip_low = 0.2
    c.objective.clip_high = 0.2
    c.objective.dual_clip_c = 3.0
    c.objective.loss_agg = "token_mean"
    c.objective.kl_coef = 0.0  # paper: 0; the reference model runs only when > 0 or log_kl
    c.objective.kl_estimator = "k3"
    c.objective.kl_in_reward = False  # REINFORCE++: KL penalty folded into the token rewards
    c.objective.log_kl = False
    c.objective.entropy_coef = 0.0
    # DAPO dynamic sampling: resample groups whose rewards are all equal (bounded).
    c.objective.dynamic_sampling = False
    c.objective.max_resample_rounds = 3
    c.objective.overlong_buffer_len = 0  # DAPO overlong shaping buffer L_c (0 = off)
    c.objective.gigpo_step_weight = 1.0  # GiGPO omega
    c.objective.gigpo_gamma = 0.95  # GiGPO step-return discount

    c.train = ml_collections.ConfigDict()
    c.train.total_steps = 100
    c.train.ppo_epochs = 1  # paper: one epoch over each batch
    c.train.mini_batch_prompts = 8  # PPO mini-batch in prompts (paper 8 / 16)
    c.train.micro_batch_size = 4  # sequences per forward/backward (memory knob; exact accumulation)
    c.train.max_seq_len = 8192  # padded training length (prompt + response)

    c.optim = ml_collections.ConfigDict()
    c.optim.lr = 1e-6  # paper: AdamW lr 1e-6, constant
    c.optim.warmup_steps = 0
    c.optim.schedule = "constant"
    c.optim.final_lr_fraction = 0.0
    c.optim.weight_decay = 0.01
    c.optim.grad_clip_norm = 1.0
    c.optim.b1 = 0.9
    c.optim.b2 = 0.999
    c.optim.eps = 1e-8

    c.checkpoint = ml_collections.ConfigDict({"every": 10, "keep": 3, "async_save": True})
    c.log = ml_collections.ConfigDict({"tensorboard": True, "progress_bar": True})
    return c


def shrink_to_tiny(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Sizes for a CPU run in minutes: tiny model, few prompts, short sequences."""
    c.model.preset = "tiny"
    c.data.prompts_per_step = 4
    c.rollout.k = 4
    c.rollout.initial_rollouts = 2
    c.rollout.max_prompt_len = 96
    c.rollout.max_response_len = 32
    c.rollout.max_tool_calls = 2
    c.rollout.tool_timeout_s = 10.0
    c.train.total_steps = 20
    c.train.mini_batch_prompts = 2
    c.train.micro_batch_size = 4
    c.train.max_seq_len = 128
    c.optim.lr = 1e-3  # tiny random model: a visible signal in a few steps
    c.optim.warmup_steps = 2
    c.checkpoint.every = 5
    c.checkpoint.keep = 2
    c.mesh.shape = {"data": -1, "fsdp": 1, "tensor": 1}
    return c
