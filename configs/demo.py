"""The embedded default (`make demo`, DESIGN.md): a tiny tool-using agent trained with AEPO on 2 CPU cores.

    python -m launch.demo [--config configs/demo.py[:smoke]] [--workdir runs/demo] [--config.key=value]

Stages: generate the synthetic-facts task and a SentencePiece tokenizer, start
the search server; SFT cold start on scripted trajectories executed with the
real tools (some skip the python step on purpose); AEPO from the SFT
checkpoint; evaluate both on held-out towns. Everything is seeded.

`arg`: "" (the demo, ~10 minutes on 2 busy CPU cores), "smoke" (a tiny
end-to-end run for tests and the notebook's smallest setting, about a minute)
or "multihop" (the multi-step path task of `aepo_jax.envs.multihop_task`:
2-4 searches per question, for `launch.compare`).
The paper's numbers do not apply at this scale; comments give the reasoning.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import ml_collections

from configs.base import get_base_config, shrink_to_tiny


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = shrink_to_tiny(get_base_config("aepo"))
    c.name = "demo"
    c.seed = 0

    # The generated environment (aepo_jax.envs.synthetic_facts): towns split into
    # disjoint train / held-out sets; every question needs two searches and a python step.
    c.env = ml_collections.ConfigDict()
    # The task's seed; launch.compare varies the RL seed (`seed`) over one fixed task.
    c.env.seed = c.get_ref("seed")
    # Many towns, about one question each: a small model cannot memorise the facts
    # and has to copy them from the search results, which is what transfers to held-out towns.
    # 3600 is close to the most distinct one-syllable names (3724). With 2000 towns the SFT
    # stage saw each name ~5 times and learned to write remembered training names instead of
    # copying the question's (held-out searches named the right town 7 of 394 times, pass@1
    # 0.003); with 3600 towns, 3200 questions and lr 3e-3 it copies (docs/demo.md).
    c.env.n_towns = 3600
    c.env.heldout_fraction = 0.1
    c.env.n_train = 3200
    c.env.n_heldout = 100
    c.env.n_distractors = 200
    c.env.max_syllables = 1  # one-syllable names ("Kraiford"): 2-3 pieces to copy into a query
    c.env.hops = 2
    # Comma-separated question kinds. "years_since" (one search, then `print(2000 - year)`) is
    # what a 0.2M-parameter model learns in minutes; "years_between" needs two searches and
    # two copied numbers, the population kinds 6-digit numbers (harder, for bigger runs).
    c.env.kinds = "years_since"
    c.env.system_prompt = ""  # "" = aepo_jax.envs.facts_task.DEMO_SYSTEM_PROMPT

    c.rollout.search_topk = 1  # passages per search; top-1 is the right town on this corpus
    c.tokenizer.vocab_size = 768  # an upper bound; town names are kept out of the pieces

    # A ~0.2M-parameter decoder (Llama/Qwen layout of aepo_jax.models): two layers are enough
    # for the copy (induction) heads the task needs, and it trains ~6x faster per step
    # than a 1M-parameter 4-layer one on a busy 2-core machine.
    c.model.update({
        "d_model": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 4, "head_dim": 16, "mlp_dim": 256,
        "max_seq_len": 512,
    })

    # SFT cold start (next-token loss on generated segments only), on every training question.
    c.sft.update({
        # lr 1e-2 left the late SFT nll at 0.37-0.38 on both seeds tried, 3e-3 at 0.14-0.20.
        "steps": 600, "batch_size": 16, "lr": 3e-3, "warmup_steps": 20, "schedule": "cosine",
        "final_lr_fraction": 0.1, "max_seq_len": 512, "length_bucket": 32,
        "skip_python_prob": 0.5,  # the scripts' flaw: answer with the first retrieved number
    })
    c.sft.num_sequences = c.env.get_ref("n_train")

    # AEPO from the SFT checkpoint. Small groups, many prompts: the signal RL has
    # to find (use python instead of guessing) shows up within a group of 8.
    c.data.prompts_per_step = 8
    c.rollout.k = 8
    c.rollout.initial_rollouts = 4
    c.rollout.max_prompt_len = 128
    c.rollout.max_response_len = 384  # prompt + response = 512: the sampler cache buckets by powers of two
    c.rollout.max_tool_calls = 4
    c.rollout.temperature = 0.7  # a 0.2M-parameter model at T=1 misspells names; 0.7 keeps it on track
    c.reward.name = "math_equiv"  # boxed answer vs gold; invalid format scores -1 (spec §5)
    c.train.total_steps = 15
    c.train.mini_batch_prompts = 4
    c.train.micro_batch_size = 16
    c.train.max_seq_len = 512
    c.train.length_bucket = 64
    # From the SFT start of the 3600-town task (seed 0, held-out pass@1 0.142), lr 1e-3 drove the
    # policy into long answers that hit the tool limit (train reward 0.20 -> -0.58, held-out pass@1
    # 0.025); 3e-4 moves the tool decision within 15 steps and keeps the copy (pass@1 0.23).
    c.optim.lr = 3e-4
    c.optim.warmup_steps = 0
    c.checkpoint.every = 10
    c.checkpoint.keep = 1
    c.log.tensorboard = False

    # Evaluation on held-out towns: `samples` independent samples per question
    # at the paper's evaluation temperature 0.6 (pass@1 is their mean, pass@k the
    # unbiased estimate), plus one AEPO tree
    # rollout over `tree_questions` questions for branch concentration. top_p 1.0
    # (the whole distribution: docs/demo.md's figures were measured so), not the
    # paper's 0.95 that `launch.evaluate` defaults to: the two differ.
    c.eval = ml_collections.ConfigDict({
        "questions": 100, "samples": 4, "temperature": 0.6, "top_p": 1.0, "tree_questions": 16,
        "batch_questions": 50,
    })

    if arg == "smoke":
        c.env.n_towns = 60
        c.env.heldout_fraction = 0.2
        c.env.n_train = 48
        c.env.n_heldout = 8
        c.env.n_distractors = 10
        c.model.update({"d_model": 32, "n_layers": 1, "n_heads": 2, "n_kv_heads": 2, "head_dim": 16, "mlp_dim": 64})
        c.sft.steps = 3
        c.sft.batch_size = 8
        c.data.prompts_per_step = 2
        c.rollout.k = 2
        c.rollout.initial_rollouts = 1
        c.rollout.max_response_len = 64  # an untrained model never stops: every sample decodes to the cap
        c.train.total_steps = 2
        c.train.mini_batch_prompts = 2
        c.train.micro_batch_size = 8
        c.eval.questions = 4
        c.eval.samples = 2
        c.eval.tree_questions = 2
    elif arg == "multihop":
        _multihop(c)
    elif arg:
        raise ValueError(f"unknown demo config argument {arg!r}; expected '', 'smoke' or 'multihop'")
    return c


def _multihop(c: ml_collections.ConfigDict) -> None:
    """The multi-step task: follow a town's path of 2-4 words, one search per step (envs/multihop_task.py).

    Every step is a tool result after which the policy decides to search on or
    answer, so the tree strategies have several places to branch (the towns
    task has one). Sized for `launch.compare` over 3 seeds x 3 algorithms on
    the busy 2-core machine.
    """
    c.name = "demo_multihop"
    c.env.task = "multihop"
    c.env.min_steps = 2
    c.env.max_steps = 4
    c.env.n_train = 600  # one question per town; train and held-out towns are disjoint
    c.env.n_heldout = 100
    # The scripts' flaw: answer right after the first search with the word it leads to (right only for
    # 2-step paths). SFT copies it, RL can remove it.
    c.env.early_answer_prob = 0.3
    # The SFT stage's name for the flaw rate: a reference, so `--config.env.early_answer_prob` sets both.
    c.sft.skip_python_prob = c.env.get_ref("early_answer_prob")
    c.reward.name = "exact_match"  # the answer is one word
    c.rollout.max_tool_calls = 6
    c.rollout.max_response_len = 192  # 4 searches with their results and an answer take ~120 tokens
    c.rollout.max_result_chars = 200
    # Sized for 9 runs (3 algorithms x 3 seeds) in ~40 minutes on the shared 2-core machine (load ~20):
    # a short SFT, 3 RL steps of 4 prompts x k=8, 24 held-out questions x 2 samples.
    c.sft.steps = 200
    c.sft.batch_size = 8
    c.sft.lr = 1e-2  # this and optim.lr: the settings of the table in docs/demo.md (measured before
    c.optim.lr = 1e-3  # the towns demo moved to 3e-3 / 3e-4)
    c.sft.max_seq_len = 320
    c.data.prompts_per_step = 4
    c.train.mini_batch_prompts = 4
    c.train.max_seq_len = 320
    c.train.total_steps = 3
    c.eval.questions = 24
    c.eval.samples = 2
    c.eval.tree_questions = 4
    c.eval.batch_questions = 24


# What `with_algorithm` takes from the preset and a comparison varies: no override may fix them.
ALGORITHM_KEYS = ("algorithm", "rollout.strategy")


def with_algorithm(c: ml_collections.ConfigDict, algorithm: str,
                   overrides: Mapping[str, Any] | None = None) -> ml_collections.ConfigDict:
    """The same demo run with another algorithm preset (objective and rollout strategy); used by launch.compare.

    `overrides` are the command line's `--config.KEY=VALUE` (flattened keys, as
    `config_flags.get_override_values` gives them): the preset replaces `objective`, so its `objective.*`
    ones are set again on top of it, and every algorithm compared runs with them (the others are in `c`
    already). `algorithm` and `rollout.strategy` are what defines each algorithm compared: a ValueError.
    """
    from aepo_jax.objectives import get_preset
    from configs.base import objective_from_preset

    overrides = dict(overrides or {})
    fixed = [key for key in ALGORITHM_KEYS if key in overrides]
    if fixed:
        raise ValueError(f"--config.{fixed[0]}={overrides[fixed[0]]} cannot be overridden in a comparison: each "
                         "algorithm compared brings its own (its preset's rollout strategy: aepo -> aepo, arpo -> "
                         "arpo, grpo -> independent, ...); choose the algorithms with --algorithms")
    c = c.copy_and_resolve_references()
    kept = {key: c.objective[key] for key in ("log_kl", "max_resample_rounds")}
    c.algorithm = algorithm
    c.objective = objective_from_preset(algorithm)
    c.objective.update(kept)
    c.rollout.strategy = get_preset(algorithm).rollout
    for key, value in overrides.items():
        if key.startswith("objective."):
            c.objective[key.split(".", 1)[1]] = value
    return c
