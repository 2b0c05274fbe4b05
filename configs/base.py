"""Shared defaults for every experiment; family files override what differs.

Numbers are the paper's released settings (spec §7) unless a comment says
otherwise; the tiny configs shrink sizes so a step runs on a CPU in seconds.
"""

from __future__ import annotations

import dataclasses
import typing

import ml_collections
from ml_collections import config_dict

from aepo_jax.agent.loop_config import LoopConfig
from aepo_jax.objectives import AlgorithmPreset, get_preset
from aepo_jax.tools.registry import DEFAULT_MAX_WORKERS


def objective_from_preset(algorithm: str) -> ml_collections.ConfigDict:
    """The preset's fields (except its name) as a ConfigDict. A field `AlgorithmPreset` types `X | None`
    (`dual_clip_c`, `overlong_buffer_len`) is a placeholder of type X holding the preset's value, so
    `--config.objective.dual_clip_c=None` turns it off and `--config.objective.overlong_buffer_len=16`
    sets an int (launch/config_args.py: a placeholder is what takes None on the command line)."""
    fields = dataclasses.asdict(get_preset(algorithm))
    fields.pop("name")
    fields.pop("rollout")  # lives in config.rollout.strategy
    hints = typing.get_type_hints(AlgorithmPreset)
    objective = ml_collections.ConfigDict()
    for key, value in fields.items():
        kinds = typing.get_args(hints[key])
        if type(None) in kinds:
            (kind,) = (k for k in kinds if k is not type(None))
            objective[key] = config_dict.placeholder(kind)
        objective[key] = value
    return objective


def get_base_config(algorithm: str = "aepo") -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.name = "base"
    c.seed = 0
    # True: no result may depend on wall-clock time. Seeded runs already repeat (sampler keys,
    # data order, XLA CPU programs and tool results are fixed by the seed; see
    # tests/launch/test_train_cli.py); what remains are wall-clock limits that a
    # loaded machine can hit in one run and not the next. With True the python tool is bounded
    # by CPU time (rollout.tool_timeout_s of it) and its wall-clock limit becomes a far backstop
    # (aepo_jax.experiment.sandbox_limits). Loop settings whose results depend on timing
    # (rollout.schedule="continuous", background compiles) are refused with it.
    c.deterministic = False
    # "auto": jax.distributed.initialize() when the environment shows several hosts.
    c.distributed = "auto"
    # True: the libraries' INFO logs (orbax reports every checkpoint step; a launch otherwise sets absl to
    # WARNING unless --verbosity is given) and the traceback of a configuration error, which a launch
    # otherwise reports as one `error: ...` line.
    c.verbose_logs = False

    # Mesh axes (data, fsdp, tensor); -1 takes the remaining devices.
    c.mesh = ml_collections.ConfigDict({"shape": {"data": -1, "fsdp": 1, "tensor": 1}})

    c.model = ml_collections.ConfigDict()
    c.model.preset = "tiny"  # aepo_jax.models.get_preset name, or "checkpoint": checkpoint_dir's config.json
    c.model.vocab_size = config_dict.placeholder(int)  # override the preset's vocabulary (demo tokenizer)
    c.model.checkpoint_dir = ""  # HF safetensors directory to start from ("" = random init)
    # A run's workdir (or its checkpoints/ or one step folder) whose parameters this run starts from, as
    # policy and reference: how RL starts after an SFT stage (a fresh step count, optimiser and data order).
    c.model.init_checkpoint = ""
    # Its step: None takes the newest complete one when the run starts, and the run's config.json keeps
    # that step, so a resumed run rebuilds the same reference model even after the init run saved more.
    c.model.init_checkpoint_step = config_dict.placeholder(int)
    c.model.compute_dtype = "float32"  # "bfloat16" casts params inside the step; masters stay float32
    c.model.attention = "dense"  # attention backend: "dense" (XLA, CPU, the reference), "splash" (TPU), "cudnn" (GPU); docs/attention.md
    # Activation rematerialisation per scanned layer: "none" | "block" (keep only each layer's input) |
    # a jax.checkpoint_policies name, e.g. "dots_with_no_batch_dims_saveable" (aepo_jax/models/remat.py).
    c.model.remat = "none"
    # Positions per chunk of the LM head when scoring tokens: [B, chunk, V] float32 logits instead of
    # [B, T, V] in training, scoring and SFT (aepo_jax/models/lm_head.py); None = all of T at once.
    c.model.logits_chunk_size = config_dict.placeholder(int)

    # kind "": `path` by its file type (.model, .gguf, tokenizer.json or its folder), or with path "" a
    # SentencePiece BPE of `vocab_size` trained on the task's text (kept in WORKDIR/tokenizer.model);
    # "hf": `path` is a Hugging Face tokenizer.json or its folder (the paper configs); "gguf": the tokenizer
    # inside model.gguf_path.
    # agent_tags "special": the agent tags (<search>, </answer>, ...) are registered as one token each (added
    # to HF and GGUF tokenizers past their vocabulary, in the trained SentencePiece), for a policy trained with
    # them; a segment stops on the tag's id. "text": they stay ordinary text in the tokenizer's own pieces, as
    # a checkpoint fine-tuned with plain-text tags (the released ARPO/AEPO SFT models) writes them; a segment
    # stops when the generated text completes a closing tag, however it is split into tokens.
    c.tokenizer = ml_collections.ConfigDict({"kind": "", "path": "", "vocab_size": 512, "agent_tags": "special"})

    c.data = ml_collections.ConfigDict()
    c.data.name = "synthetic_facts"
    c.data.path = ""  # local JSONL; "" = the embedded synthetic task
    # data.path's row layout (aepo_jax.data.records.LAYOUTS): "auto" guesses each row's; a file of one
    # dataset set to its own ("gsm8k", ...) refuses a row that does not fit it, naming its line.
    c.data.layout = "auto"
    c.data.corpus_path = ""  # search corpus JSONL for data.path runs ("" = no search tool)
    # A running Search-R1-style retrieval server (POST /retrieve) to use instead of starting ours.
    c.data.search_url = ""
    c.data.num_examples = 256  # size of the generated synthetic task
    c.data.prompts_per_step = 64  # paper: 64 (Qwen3-14B) / 128 (Qwen2.5-7B)
    c.data.shuffle = True

    c.rollout = ml_collections.ConfigDict()
    # strategy: "independent" | "arpo" | "aepo" (spec §2), set from the preset below
    c.rollout.k = 12  # trajectories per prompt (group size); paper 12 / 16
    c.rollout.initial_rollouts = 6  # m global samples (paper 6 / 8); AEPO recomputes it when dynamic_budget
    c.rollout.dynamic_budget = True  # AEPO entropy pre-monitoring (§2.3)
    c.rollout.premonitor_reuse = True
    # Continuous schedule: each prompt's rollout starts once its own pre-monitoring sample ends (with reuse).
    c.rollout.premonitor_overlap = True
    c.rollout.branch_width = 2  # Z
    c.rollout.branch_threshold = 0.5  # tau
    c.rollout.entropy_weight = 0.2  # gamma
    c.rollout.penalty_slope = 0.05  # consecutive-branch penalty
    c.rollout.penalty_scope = "lineage"  # released code: "prompt"
    c.rollout.beta = 0.5  # budget sigmoid sharpness
    c.rollout.entropy_tokens = 20  # K
    c.rollout.entropy_measure = "exact_mean"
    # The segment a branch decision reads: "after_result" (spec 2.2) or "before_call" (released code, rounds).
    c.rollout.decision_entropy = "after_result"
    # Prompt-scope counters move after "every_round", or "batch_branched" (released code, rounds only).
    c.rollout.counter_updates = "every_round"
    c.rollout.temperature = 1.0
    c.rollout.top_p = 1.0
    c.rollout.top_k = 0
    c.rollout.max_prompt_len = 2000
    c.rollout.max_response_len = 6192
    c.rollout.max_tool_calls = 6
    c.rollout.tool_timeout_s = 120.0
    c.rollout.tool_latency_ms = 0.0  # benchmarks: started search server and sandbox answer after >= this (0 = off)
    c.rollout.tool_concurrency = DEFAULT_MAX_WORKERS  # tool calls in flight at once (the registry's threads)
    # Modules every python sandbox worker imports before it gets code (e.g. ("numpy", "sympy")): a call that
    # imports them then takes milliseconds instead of most of a second, for ~43 MiB more per idle worker.
    c.rollout.python_preload = ()
    # Spec §4: 1000 characters per search hit (each passage); the same cap is the whole result of a python
    # or browse call (their classes' own defaults are 2000 / 3000; the spec gives none for them).
    c.rollout.max_result_chars = 1000
    c.rollout.search_topk = 2  # passages per search call
    # <browse> reads a corpus document by id from the search server; True also fetches http(s) URLs (internet).
    c.rollout.browse_urls = False
    # Agent-loop schedule (docs/rollout_engine.md): "rounds" = lockstep rounds (decode every row to a stop,
    # then run all tools); "continuous" = tool calls run while the other rows decode in chunks of chunk_tokens.
    c.rollout.schedule = LoopConfig.schedule
    c.rollout.chunk_tokens = LoopConfig.chunk_tokens
    # continuous: wait for tool results while fewer rows generate
    c.rollout.min_generating_fraction = LoopConfig.min_generating_fraction
    # continuous: results arriving within this many ms of each other resume together
    c.rollout.arrival_window_ms = LoopConfig.arrival_window_ms
    # compile a rollout's new shapes off its critical path: "on" (at once), "after_run" (when the loop run
    # ends), "off", or "auto" ("after_run" under continuous, "off" under rounds)
    c.rollout.background_compile = LoopConfig.background_compile
    # how the rollout sampler's decode windows hold the layers: "auto" (per-layer copies of the weights and
    # of the live cache span on CPU and GPU, a scan of the stacked layers on TPU), "on", "off" (GPU: saves
    # a copy of the weights, at 1.6x the decode step measured on an H200; docs/rollout_engine.md)
    c.rollout.layerwise_decode = LoopConfig.layerwise_decode
    # The weights the rollout sampler reads (aepo_jax/parallel/host_rollout.py): "auto" = replicas in the
    # compute dtype, copied once per rollout, with several processes or a mesh with fsdp > 1 (the decode
    # loop would gather fsdp shards at every token), else the run's mesh; "replicas"; "run_mesh" (one
    # process only: for weights too large to hold whole on a tensor group).
    c.rollout.sampler_weights = "auto"

    c.reward = ml_collections.ConfigDict({"name": "qa_f1"})  # aepo_jax.rewards name, or "auto" (by data_source)
    # The LLM judge of the llm_judge reward (gaia, hle, webwalker, xbench, browsecomp sources under "auto"):
    # an OpenAI-compatible /v1/chat/completions server ("" = none), the model it serves, and the NAME of the
    # environment variable holding its API key ("" = no key); the key itself never goes in a config.
    c.reward.judge_url = ""
    c.reward.judge_model = ""
    c.reward.judge_api_key_env = ""
    # the judge's reply ceiling: room for a reasoning judge's <think> block before its yes/no
    c.reward.judge_max_tokens = 1024

    # Objective: every field of aepo_jax.objectives.AlgorithmPreset, filled from
    # the preset named `algorithm` so a family file only states what it changes.
    c.algorithm = algorithm
    c.objective = objective_from_preset(algorithm)
    c.objective.log_kl = False  # run the reference model to log KL even when kl_coef == 0
    c.objective.max_resample_rounds = 3  # DAPO dynamic sampling: extra rollout rounds per step at most
    c.rollout.strategy = get_preset(algorithm).rollout

    c.train = ml_collections.ConfigDict()
    # Run length in RL (or SFT) steps; `--config.total_steps=N` and
    # `--config.train.total_steps=N` set the same value (a shared reference).
    c.total_steps = 100
    c.train.total_steps = c.get_ref("total_steps")
    c.train.ppo_epochs = 1  # paper: one epoch over each batch
    c.train.mini_batch_prompts = 8  # PPO mini-batch in prompts (paper 8 / 16)
    c.train.micro_batch_size = 4  # rows per forward/backward, at least one per data x fsdp device (memory knob; exact accumulation)
    c.train.max_seq_len = 8192  # padded training length (prompt + response)
    # JAX persistent compilation cache directory ("" = off); applied once at start-up
    # (aepo_jax.parallel.compilation_cache.enable_compilation_cache).
    c.train.compilation_cache_dir = ""
    c.train.length_bucket = 256  # pad T up to a multiple of this: few compiled shapes
    c.train.recompute_logp_old = True  # score rollouts with the training forward (ratio exactly 1 at start)
    # Roll out step s + 1 on a background thread while step s trains, with the parameters step s started
    # from: every rollout after the first is one update round stale (aepo_jax/training/rollout_ahead.py).
    # Holds up to two extra copies of the parameters (float32, on the run's mesh) and, while its rollout
    # runs beside the train step, the rollout's weight replicas when it samples on them. Needs
    # train.recompute_logp_old=False: the ratio's denominator must be the policy that sampled.
    c.train.rollout_ahead = False
    # "tree": each shared prefix token (a group's prompt, AEPO/ARPO shared turns) is computed once in the
    # update (docs/packing.md); "flat": every trajectory padded to T. Loss and gradients are the same.
    c.train.pack = "tree"
    c.train.row_len = config_dict.placeholder(int)  # packed row length; None: the flat T of the step

    c.optim = ml_collections.ConfigDict()
    c.optim.lr = 1e-6  # paper: AdamW lr 1e-6, constant
    # Counted in optimiser updates (train.ppo_epochs x mini-batches per RL step, as the schedule's whole
    # horizon is: total_steps x updates per step), not in RL steps. A step that keeps fewer groups (DAPO's
    # dynamic sampling after its resample rounds) makes fewer updates, so a decaying schedule then ends
    # above final_lr_fraction; "constant" (the paper's) does not depend on it.
    c.optim.warmup_steps = 0
    c.optim.schedule = "constant"
    c.optim.final_lr_fraction = 0.0
    c.optim.weight_decay = 0.01
    c.optim.grad_clip_norm = 1.0
    c.optim.b1 = 0.9
    c.optim.b2 = 0.999
    c.optim.eps = 1e-8

    # Cold-start SFT (`python -m launch.sft`, the demo's SFT stage): scripted tool-using
    # trajectories executed with the real tools, or a JSONL of {"question", "response"} texts. A response
    # holds each tool call's output as a `<result>...</result>` block right after the call (not trained; encoded
    # as RL appends it), and nothing else after a call; under a chat template whose generation prompt opens
    # `<think>`, the response's own leading `<think>` is dropped (`training.sft_trainer.text_record_to_tokens`).
    # The optimiser and length keys left None take the RL run's value (train.* / optim.*);
    # `aepo_jax.experiment_sft.sft_config_from` resolves them.
    c.sft = ml_collections.ConfigDict()
    c.sft.path = ""
    c.sft.num_sequences = 256  # scripted questions used (at most the task's training questions)
    c.sft.batch_size = 8
    c.sft.skip_python_prob = 0.3  # the scripts' deliberate flaw, for RL to remove
    c.sft.steps = config_dict.placeholder(int)  # None: train.total_steps
    c.sft.lr = config_dict.placeholder(float)  # None: optim.lr
    c.sft.warmup_steps = config_dict.placeholder(int)  # None: optim.warmup_steps
    c.sft.schedule = config_dict.placeholder(str)  # None: optim.schedule
    c.sft.final_lr_fraction = config_dict.placeholder(float)  # None: optim.final_lr_fraction
    c.sft.max_seq_len = config_dict.placeholder(int)  # None: train.max_seq_len
    c.sft.length_bucket = config_dict.placeholder(int)  # None: train.length_bucket

    # Held-out validation during RL (spec §6: greedy): after every `every` steps (0: off) and the run's last,
    # one greedy sample of each of the first `questions` held-out questions (`data_path`, else the generated
    # task's held-out split), `batch_questions` at a time (0: data.prompts_per_step); val/* in metrics.jsonl.
    c.validation = ml_collections.ConfigDict({"every": 0, "data_path": "", "questions": 64, "batch_questions": 0})

    # A checkpoint after every `every` steps and at the run's last step; 0: only at the last step and on a
    # preemption notice (as validation.every=0 is off). `keep` newest ones are kept.
    c.checkpoint = ml_collections.ConfigDict({"every": 10, "keep": 3, "async_save": True})
    # The console shows the progress bar (headline metrics as its postfix) and a plain metrics line
    # every `console_every` steps and at the last one; metrics.jsonl gets every step. TensorBoard
    # event files go to WORKDIR/tensorboard when a writer imports (the `tensorboard` extra).
    c.log = ml_collections.ConfigDict({"tensorboard": True, "progress_bar": True, "console_every": 10})
    return c


def shrink_to_tiny(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Sizes for a CPU run in minutes: tiny model, few prompts, short sequences."""
    c.model.preset = "tiny"
    c.data.prompts_per_step = 4
    c.rollout.k = 4
    c.rollout.initial_rollouts = 2
    c.rollout.max_prompt_len = 448  # system prompt + question take ~330 tokens of the 512-piece vocabulary
    c.rollout.max_response_len = 64
    c.rollout.max_tool_calls = 2
    c.rollout.tool_timeout_s = 10.0
    c.total_steps = 20
    c.train.mini_batch_prompts = 2
    c.train.micro_batch_size = 4
    c.train.max_seq_len = 1024  # a cap, not a padding length: scripted SFT trajectories of the tiny task reach ~590 tokens
    c.train.length_bucket = 64
    c.optim.lr = 1e-3  # tiny random model: a visible signal in a few steps
    c.optim.warmup_steps = 2
    c.checkpoint.every = 5
    c.checkpoint.keep = 2
    c.mesh.shape = {"data": -1, "fsdp": 1, "tensor": 1}
    return c


def select_variant(arg: str | None, variants: tuple[str, ...], config_file: str) -> str | None:
    """The named variant `arg` of `config_file` (None or "" for the default), or a clear error."""
    if not arg:
        return None
    if arg not in variants:
        raise ValueError(f"{config_file}: unknown variant {arg!r}; choose from {variants} or give no argument "
                         "for the paper's method")
    return arg


def apply_release_settings(c: ml_collections.ConfigDict, *, initial_rollouts: int, total_steps: int,
                           reward: str) -> ml_collections.ConfigDict:
    """What the authors' released AEPO scripts and code run (spec §7.1; table in docs/fidelity.md).

    Args:
      c: a paper config (its defaults follow the spec's sections 1-3).
      initial_rollouts: the scripts' fixed m (INITIAL_ROLLOUTS).
      total_steps: steps the released loader gives (it drops the last partial batch).
      reward: the reward the released script scores with.
    """
    c.rollout.dynamic_budget = False  # ENABLE_DYNAMIC_ROLLOUTS=False
    c.rollout.premonitor_reuse = False  # moot with pre-monitoring off; the release discards the sample
    c.rollout.initial_rollouts = initial_rollouts
    c.rollout.penalty_scope = "prompt"  # one consecutive-branch counter per prompt
    c.rollout.entropy_measure = "top10_sum"  # vLLM top-10 log-probs, summed over 20 tokens, / ln V
    # A decision after a tool result reads the segment that made the call (`current_entropy_dict`, measured in
    # the same generate call) and is drawn in that round.
    c.rollout.decision_entropy = "before_call"
    c.rollout.counter_updates = "batch_branched"  # counters move only after rounds that gave the batch a trajectory
    # ENABLE_ENTROPY_BALANCED_ADVANTAGE=True, but with entropy_coeff = 0 the actor never computes the
    # entropy the reshape needs, so the advantage is plain GRPO in the released runs.
    c.objective.entropy_advantage = False
    c.train.total_steps = total_steps
    c.reward.name = reward
    return c
