"""The composition root (DESIGN.md, "One direction, one place"): config -> objects.

Every entry point (`launch.train`, `launch.sft`, `launch.evaluate`,
`launch.demo`, `launch.compare`, the notebook) builds its run here and only
here; nothing below this module reads the config to build things.

    env = environment_from(cfg, workdir)           # task, tokenizer, tools, prompts, rewards
    graphdef, params = model_from(cfg, env)         # sized to the tokenizer (or the GGUF policy)
    trainer = rl_trainer_from(cfg, env, workdir, graphdef, params)   # or experiment_sft.sft_trainer_from
    metrics = evaluate_policy(cfg, env, graphdef, params, env.heldout_examples)

Three tasks come out of `environment_from`: the demo task of `configs/demo.py`
(a config with an `env` section: `envs.facts_task`, its short system prompt
and a tokenizer trained on it), the generated synthetic task of the base
configs (`data.name == "synthetic_facts"`), and any local JSONL (`data.path`).
A run directory gets the resolved config, the tokenizer and the task files
(`save_run_files`), so `launch.evaluate --checkpoint RUN_DIR` rebuilds it.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from aepo_jax.agent.loop import AgentLoop, LoopConfig
from aepo_jax.agent.prompts import (
    DEFAULT_SYSTEM_PROMPT,
    PromptConfig,
    render_prompt,
    response_text,
    system_prompt_for_tools,
)
from aepo_jax.atomic_write import write_json_atomically
from aepo_jax.experiment_checks import (
    PromptTooLong,
    require_judge,
    require_known_rewards,
    require_mesh_fits_model,
    require_prompts_fit,
)
from aepo_jax.experiment_tasks import demo_task
from aepo_jax.experiment_tokenizer import (
    agent_tags_registered,
    check_tokenizer_fits_checkpoint,
    copy_tokenizer_files,
    tokenizer_from,
)
from aepo_jax.experiment_tools import (  # noqa: F401  (re-exported: callers build tools through here)
    DETERMINISTIC_WALL_FACTOR,
    judge_from,
    sandbox_limits,
    tools_from,
)
from aepo_jax.parallel.host_rollout import HostRolloutPlacement, sampler_replicas
from aepo_jax.rewards import rewards_for
from aepo_jax.rollout.agent_sampler import agent_sampler
from aepo_jax.rollout.strategies import RolloutConfig, require_counter_schedule, rollout
from aepo_jax.sampling import Sampler, SamplingParams
from aepo_jax.tools.timing import TimedTools


# -- rollout pieces ------------------------------------------------------------
def start_runtime(cfg: ml_collections.ConfigDict) -> None:
    """Process-wide JAX settings of the run, before its first jit: the persistent
    compilation cache (`train.compilation_cache_dir`, "" = off)."""
    from aepo_jax.parallel.compilation_cache import enable_compilation_cache

    enable_compilation_cache(cfg.train.get("compilation_cache_dir") or None)


def loop_config_from(cfg: ml_collections.ConfigDict) -> LoopConfig:
    """The agent loop's limits (spec §4), entropy window (spec §1) and schedule from `cfg.rollout`.

    With `cfg.deterministic`, settings whose results depend on wall-clock timing are a ValueError
    naming them (a seeded run must repeat)."""
    r = cfg.rollout
    loop = LoopConfig(max_tool_calls=int(r.max_tool_calls), max_response_tokens=int(r.max_response_len),
                      max_context_len=int(r.max_prompt_len) + int(r.max_response_len),
                      entropy_tokens=int(r.entropy_tokens), entropy_measure=r.entropy_measure,
                      decision_entropy=str(r.get("decision_entropy", LoopConfig.decision_entropy)),
                      schedule=str(r.get("schedule", LoopConfig.schedule)),
                      chunk_tokens=int(r.get("chunk_tokens", LoopConfig.chunk_tokens)),
                      min_generating_fraction=float(r.get("min_generating_fraction", LoopConfig.min_generating_fraction)),
                      arrival_window_ms=float(r.get("arrival_window_ms", LoopConfig.arrival_window_ms)),
                      background_compile=str(r.get("background_compile", LoopConfig.background_compile)),
                      layerwise_decode=str(r.get("layerwise_decode", LoopConfig.layerwise_decode)))
    if cfg.get("deterministic", False) and loop.timing_dependent:
        raise ValueError("config.deterministic=True asks for rollouts that repeat bit for bit, but under rollout."
                         + " and rollout.".join(loop.timing_dependent) + " they depend on wall-clock timing; "
                         "use rollout.schedule='rounds' with rollout.background_compile='auto' or 'off', "
                         "or deterministic=False")
    return loop


def rollout_config_from(cfg: ml_collections.ConfigDict, strategy: str | None = None,
                        samples: int | None = None) -> RolloutConfig:
    """The rollout strategy of `cfg.rollout` (spec §2); `strategy` replaces the config's,
    and `samples` (an evaluation's n) caps the initial global rollouts."""
    r = cfg.rollout
    initial = int(r.initial_rollouts) if samples is None else min(int(r.initial_rollouts), int(samples))
    require_counter_schedule(str(r.get("counter_updates", RolloutConfig.counter_updates)),
                             str(r.get("schedule", LoopConfig.schedule)))
    return RolloutConfig(
        strategy=strategy or r.strategy, initial_rollouts=initial, entropy_weight=float(r.entropy_weight),
        branch_threshold=float(r.branch_threshold), branch_width=int(r.branch_width),
        entropy_tokens=int(r.entropy_tokens), entropy_measure=r.entropy_measure,
        dynamic_budget=bool(r.dynamic_budget), beta=float(r.beta), premonitor_reuse=bool(r.premonitor_reuse),
        premonitor_overlap=bool(r.premonitor_overlap),
        penalty_slope=float(r.penalty_slope), penalty_scope=r.penalty_scope,
        decision_entropy=str(r.get("decision_entropy", RolloutConfig.decision_entropy)),
        counter_updates=str(r.get("counter_updates", RolloutConfig.counter_updates)),
    )


def sampling_params_from(cfg: ml_collections.ConfigDict) -> SamplingParams:
    """The training rollouts' decoding (`rollout.temperature`, `top_k`, `top_p`); warns when they truncate."""
    r = cfg.rollout
    params = SamplingParams(temperature=float(r.temperature), top_k=int(r.top_k), top_p=float(r.top_p))
    if params.truncates:
        warnings.warn(
            f"rollout.top_k={params.top_k} / rollout.top_p={params.top_p:g} truncate the distribution tokens are "
            "drawn from, but logp_old and the trainer's log-probs are full-vocabulary ones (spec §1), so the "
            "importance ratio does not correct for the truncation (verl does the same); the paper samples "
            "with top-k off and top-p 1.0", stacklevel=2)
    return params


def sampler_from(cfg: ml_collections.ConfigDict, graphdef: Any, params: Any, tokenizer: Any, mesh: Any = None, *,
                 sampling: SamplingParams | None = None, seed: int | None = None) -> Sampler:
    """The rollout sampler over `params` (cache sized by `agent.loop.cache_slots`)."""
    return agent_sampler(graphdef, params, tokenizer, loop_config_from(cfg), sampling or sampling_params_from(cfg),
                         seed=int(cfg.seed) if seed is None else int(seed), mesh=mesh)


def agent_loop_from(cfg: ml_collections.ConfigDict, env: Environment, graphdef: Any, params: Any, *,
                    temperature: float | None = None, seed: int | None = None) -> AgentLoop:
    """An agent loop over the environment's tools with a sampler over `params` (for inspecting rollouts)."""
    sampling = sampling_params_from(cfg)
    if temperature is not None:
        sampling = SamplingParams(temperature=float(temperature), top_k=sampling.top_k, top_p=sampling.top_p)
    sampler = sampler_from(cfg, graphdef, params, env.tokenizer, sampling=sampling, seed=seed)
    return AgentLoop(sampler, env.tokenizer, env.tools, loop_config_from(cfg))


# -- the environment -----------------------------------------------------------
@dataclass
class Environment:
    """The host-side pieces of a run; `close()` stops the search server and the sandbox.

    Attributes:
      tokenizer: the run's tokenizer (trained SentencePiece, a file, or the GGUF's).
      examples: training examples (`{"id", "question", "answers", "data_source"}`).
      heldout: held-out examples of a generated task (empty for `data.path` runs).
      corpus_path: the search corpus JSONL, if any.
      prompt: the system prompt and chat layout every stage renders.
      reward_name: `aepo_jax.rewards` name deciding the reward.
      judge: the `llm_judge` reward's client (`judge_from`), or None.
      tools: the tool registry (`run_many`).
      task: the generated `FactsEnv` (None for `data.path` runs).
      pretrained: (graphdef, params) of a GGUF policy, else None.
    """

    tokenizer: Any
    examples: list[dict]
    heldout: list[dict]
    corpus_path: str | None
    prompt: PromptConfig
    max_prompt_len: int
    reward_name: str
    tools: Any
    closers: list[Callable[[], None]] = field(default_factory=list)
    task: Any = None
    task_dir: str | None = None
    pretrained: tuple[Any, Any] | None = None
    search_url: str = ""
    judge: Any = None

    @property
    def heldout_examples(self) -> list[dict]:
        return self.heldout

    def encode_prompt(self, example: dict) -> list[int]:
        """Example -> prompt token ids; a clear error when longer than `rollout.max_prompt_len`."""
        ids = render_prompt(self.tokenizer, example["question"], self.prompt)
        if len(ids) > self.max_prompt_len:
            raise PromptTooLong(example.get("id"), len(ids), self.max_prompt_len)
        return ids

    def reward_fn(self, example: dict, trajectory: Any) -> float:
        """The spec §5 reward of `trajectory`; its evaluation correctness goes to `trajectory.correct`
        (`evaluation.scoring.training_reward`: the bonus counts the calls the loop ran)."""
        from aepo_jax.evaluation.scoring import training_reward

        text = response_text(self.tokenizer, trajectory.response_ids)
        reward, trajectory.correct = training_reward(self.reward_name, text, example, trajectory, judge=self.judge)
        return reward

    def close(self) -> None:
        for close in reversed(self.closers):
            close()
        self.closers.clear()


def environment_from(cfg: ml_collections.ConfigDict, workdir: str) -> Environment:
    """Task, tokenizer, tools, prompt encoder and reward for `cfg` (see the module docstring)."""
    from aepo_jax.envs.facts_task import (
        DEMO_SYSTEM_PROMPT,
        question_example,
        tokenizer_texts,
    )

    os.makedirs(workdir, exist_ok=True)
    judge = judge_from(cfg)  # a misconfigured judge is refused before any tool starts
    task, task_dir, corpus_path, pretrained = None, None, None, None
    heldout: list[dict] = []
    prompt = PromptConfig()
    if cfg.get("env") is not None and cfg.env.get("task", "towns") == "multihop":  # configs/demo.py:multihop
        from aepo_jax.envs.multihop_task import setup_multihop_files

        task_dir = os.path.join(workdir, "task")
        files, system_prompt, multihop_texts = setup_multihop_files(cfg, task_dir)
        task, corpus_path = files.env, str(files.corpus)
        prompt = PromptConfig(system_prompt=system_prompt)
        texts = lambda: multihop_texts
    elif cfg.get("env") is not None:  # the demo task (configs/demo.py)
        task_dir = os.path.join(workdir, "task")
        files = demo_task(cfg, task_dir)
        task, corpus_path = files.env, str(files.corpus)
        system_prompt = cfg.env.system_prompt or DEMO_SYSTEM_PROMPT
        prompt = PromptConfig(system_prompt=system_prompt)
        texts = lambda: tokenizer_texts(files, system_prompt, int(cfg.env.get("seed", cfg.seed)),
                                        max_syllables=int(cfg.env.max_syllables))
    elif cfg.data.path:
        from aepo_jax.data import load_local_examples

        if not os.path.isfile(cfg.data.path):
            raise FileNotFoundError(f"data.path={cfg.data.path!r}: no such file (a JSONL of questions)")
        examples = load_local_examples(cfg.data.path, os.path.join(workdir, "tfds"), layout=cfg.data.get("layout", "auto"))
        corpus_path = cfg.data.get("corpus_path") or None
    elif cfg.data.name == "synthetic_facts":
        from aepo_jax.envs.synthetic_facts import build_env

        task_dir = os.path.join(workdir, "task")
        task = build_env(seed=int(cfg.seed), n_train=int(cfg.data.get("num_examples", 256)))
        corpus_path = str(task.write(task_dir)["corpus"])
    else:
        raise ValueError(f"data.name {cfg.data.name!r} needs data.path (only 'synthetic_facts' is generated)")
    if task is not None:
        examples = [question_example(q) for q in task.train]
        heldout = [question_example(q) for q in task.heldout]
    if cfg.get("env") is None:
        def texts() -> list[str]:
            out = [DEFAULT_SYSTEM_PROMPT] + [ex["question"] for ex in examples]
            if corpus_path:
                with open(corpus_path, encoding="utf-8") as f:
                    out += list(f)
            return out

    if cfg.tokenizer.get("kind") == "gguf":  # a pretrained policy brings its own tokenizer and chat template
        from aepo_jax.envs.pretrained import load_gguf_policy

        graphdef, params, tokenizer = load_gguf_policy(cfg.model.get("gguf_path", ""),
                                                       register_agent_tags=agent_tags_registered(cfg))
        pretrained = (graphdef, params)
    else:
        tokenizer = tokenizer_from(cfg, workdir, texts)
    tools, closers = tools_from(cfg, corpus_path, tokenizer)
    if judge is not None:
        closers.append(judge.close)
    if prompt.system_prompt == DEFAULT_SYSTEM_PROMPT:  # offer the tools this run has, and no other
        prompt = replace(prompt, system_prompt=system_prompt_for_tools(tools.tools))
    search = tools.tools.get("search")
    return Environment(tokenizer, list(examples), heldout, corpus_path, prompt, int(cfg.rollout.max_prompt_len),
                       cfg.reward.name, tools, closers, task, task_dir, pretrained,
                       search_url=search.url if search is not None else "", judge=judge)


def fit_model_to_tokenizer(cfg: ml_collections.ConfigDict, env: Environment) -> None:
    """A fresh model's vocabulary is the tokenizer's (`model.vocab_size`); a checkpoint keeps its own. A
    `model.vocab_size` the config sets must be it: fewer rows leave ids without an embedding, and more let
    the policy sample ids the tokenizer cannot decode."""
    if not cfg.model.get("checkpoint_dir") and env.pretrained is None:
        needed, given = int(env.tokenizer.vocab_size), cfg.model.get("vocab_size")
        if given is not None and int(given) != needed:
            raise ValueError(f"model.vocab_size={given} but the tokenizer has {needed} ids; leave it unset: a "
                             "fresh model is sized to its tokenizer (a trained one's size is tokenizer.vocab_size)")
        with cfg.unlocked():
            cfg.model.vocab_size = needed


def model_from(cfg: ml_collections.ConfigDict, env: Environment, mesh: Any = None) -> tuple[Any, Any]:
    """(graphdef, params): the GGUF policy, the parameters of the run checkpoint in
    `model.init_checkpoint` (an SFT stage's, for RL to start from: they are also its reference model),
    `model.checkpoint_dir`, or the config's seeded decoder (created on its shards of `mesh` when given).
    A `mesh` whose `tensor` axis does not divide the model's heads is refused first
    (`require_mesh_fits_model`)."""
    from aepo_jax.training.build import init_model, model_config_from

    if mesh is not None:
        require_mesh_fits_model(cfg, env, mesh)
    init_checkpoint = cfg.model.get("init_checkpoint")
    if env.pretrained is not None:
        if init_checkpoint:
            raise ValueError("model.init_checkpoint and a GGUF policy both give the starting weights; set one")
        return env.pretrained
    if cfg.model.get("checkpoint_dir"):
        check_tokenizer_fits_checkpoint(env.tokenizer, cfg.model.checkpoint_dir)
    fit_model_to_tokenizer(cfg, env)
    if init_checkpoint:
        from aepo_jax.evaluation.restore import restore_policy_params
        from aepo_jax.experiment_init import init_checkpoint_location

        graphdef, params, _ = restore_policy_params(init_checkpoint_location(cfg), cfg, model_config_from(cfg),
                                                    mesh=mesh)
        return graphdef, params
    return init_model(cfg, mesh=mesh)


def parameter_count(params: Any) -> int:
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))


# -- run directories -----------------------------------------------------------
def save_run_files(cfg: ml_collections.ConfigDict, run_dir: str, env: Environment, env_dir: str) -> None:
    """Write RUN_DIR/config.json (resolved, replaced whole) and copy the tokenizer and task files from
    `env_dir`, so the run can be rebuilt from RUN_DIR alone (`config_from_run`, `launch.evaluate`)."""
    os.makedirs(run_dir, exist_ok=True)
    write_json_atomically(os.path.join(run_dir, "config.json"), json.loads(cfg.to_json_best_effort()))
    if os.path.abspath(run_dir) == os.path.abspath(env_dir):
        return
    copy_tokenizer_files(env_dir, run_dir)
    if env.task_dir and os.path.isdir(env.task_dir):
        shutil.copytree(env.task_dir, os.path.join(run_dir, "task"), dirs_exist_ok=True)


def config_from_run(run_dir: str) -> ml_collections.ConfigDict:
    """The resolved config a run saved (RUN_DIR/config.json), as a ConfigDict."""
    path = os.path.join(run_dir, "config.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{run_dir} has no config.json; pass --config with the run's config file")
    with open(path, encoding="utf-8") as f:
        return ml_collections.ConfigDict(json.load(f))


# -- training --------------------------------------------------------------------
def pipeline_from(cfg: ml_collections.ConfigDict, examples: Sequence[dict], process_index: int = 0,
                  process_count: int = 1):
    """The prompt pipeline over this host's shard of `examples`."""
    from aepo_jax.data import PromptPipeline

    return PromptPipeline(list(examples), int(cfg.data.prompts_per_step), seed=int(cfg.seed),
                          process_index=process_index, process_count=process_count, shuffle=bool(cfg.data.shuffle))


class AgentRollout:
    """The RL trainer's rollout seam: `(prompts, k, params, key, rng) -> (groups, stats)`.

    Holds the sampler (on the run's mesh or this process's replica mesh), the agent
    loop and the strategy, so a caller can inspect what the rollouts run on. The
    sampler holds the step's parameters only while a rollout runs.
    """

    def __init__(self, sampler: Sampler, loop: AgentLoop, strategy: RolloutConfig, tools: TimedTools,
                 placement: HostRolloutPlacement | None = None):
        self.sampler, self.loop, self.strategy, self._tools = sampler, loop, strategy, tools
        self.placement = placement if placement is not None else HostRolloutPlacement(None)

    @property
    def samples_on_own_devices(self) -> bool:
        """Whether every program of a rollout runs on this process's devices (its sampler's mesh)."""
        return self.placement.per_host or jax.process_count() == 1

    def place_params(self, params: Any) -> Any:
        """`params` on the sampler's mesh: a copy to the weight replicas (a collective with several
        processes) or `params` themselves (`HostRolloutPlacement`)."""
        return self.placement(params)

    def __call__(self, prompts, k, current_params, key, rng):
        # A no-op when `place_params` placed them; otherwise (a caller without the trainer) the copy, which
        # refuses to run off the main thread with several processes.
        self.sampler.set_params(self.placement(current_params))
        try:
            groups, stats = rollout(prompts, k, loop=self.loop, config=self.strategy, rng=rng, key=key)
        finally:
            self.sampler.release_params()  # a replica of the weights must not stay beside the train step
        stats = stats.as_dict()
        tool_time = self._tools.take()
        stats["tool_seconds"] = tool_time.busy  # wall time with some tool call in flight
        stats["tool_call_seconds"] = tool_time.summed  # the calls' durations added up (they overlap)
        return groups, stats


def rollout_placement_from(cfg: ml_collections.ConfigDict, mesh: Any = None) -> HostRolloutPlacement:
    """Where rollouts (training's and evaluation's) sample (`rollout.sampler_weights`): on replicas of the
    weights in the compute dtype, each process on its own devices (always with several processes, and by
    default when `mesh` splits the weights over fsdp), or on `mesh` itself (`parallel.host_rollout`)."""
    from aepo_jax.training.build import model_config_from

    return HostRolloutPlacement(mesh, dtype=model_config_from(cfg).dtype, replicas=sampler_replicas(cfg))


def rollout_fn_from(cfg: ml_collections.ConfigDict, env: Environment, graphdef: Any, params: Any,
                    mesh: Any = None) -> AgentRollout:
    """The RL trainer's rollout function. Its sampler's KV cache lives on `mesh` (the trainer's), or, on
    weight replicas (`rollout_placement_from`), each process samples its own prompts on its own devices
    with the parameters copied there once per rollout (`parallel.host_rollout`)."""
    placement = rollout_placement_from(cfg, mesh)
    sampler = sampler_from(cfg, graphdef, placement(params), env.tokenizer, placement.mesh)
    sampler.release_params()  # every rollout sets the step's parameters
    timed_tools = TimedTools(env.tools)
    loop = AgentLoop(sampler, env.tokenizer, timed_tools, loop_config_from(cfg))
    return AgentRollout(sampler, loop, rollout_config_from(cfg), timed_tools, placement)


def rl_trainer_from(cfg: ml_collections.ConfigDict, env: Environment, workdir: str, graphdef: Any = None,
                    params: Any = None, process_index: int = 0, process_count: int = 1):
    """An `RLTrainer` over the environment's real agentic rollout (default model: `model_from`).

    One mesh (`cfg.mesh`) serves the train step and the rollout sampler: on it, its KV cache split
    over the batch axes and KV heads, or on weight replicas over its devices, each process on its
    own (`rollout_fn_from`, `rollout.sampler_weights`)."""
    from aepo_jax.training.build import make_mesh_from
    from aepo_jax.training.rl_trainer import RLTrainer

    rewards = rewards_for(cfg.reward.name, [ex.get("data_source", "") for ex in env.examples])
    require_known_rewards(rewards, "training")
    require_judge(rewards, env, "training")
    require_prompts_fit(env.examples, env.encode_prompt, "training")
    mesh = make_mesh_from(cfg)
    if graphdef is None:
        graphdef, params = model_from(cfg, env, mesh)
    return RLTrainer(cfg, workdir, rollout_fn=rollout_fn_from(cfg, env, graphdef, params, mesh), mesh=mesh,
                     pipeline=pipeline_from(cfg, env.examples, process_index, process_count),
                     encode_prompt=env.encode_prompt, reward_fn=env.reward_fn, graphdef=graphdef, params=params,
                     pad_id=int(env.tokenizer.pad_id), process_index=process_index)


def train_rl(cfg: ml_collections.ConfigDict, env: Environment, graphdef: Any, params: Any, env_dir: str,
             run_dir: str, progress: bool = True) -> tuple[Any, list[dict]]:
    """RL (the algorithm of `cfg`) from `params`, which stay intact; returns (params, records). A `run_dir`
    that already holds checkpoints is refused before anything runs (`require_no_checkpoints`)."""
    from aepo_jax.training.checkpoint import require_no_checkpoints

    require_no_checkpoints(run_dir)
    fit_model_to_tokenizer(cfg, env)
    save_run_files(cfg, run_dir, env, env_dir)
    params = jax.tree.map(jnp.copy, params)  # the train step donates its state
    trainer = rl_trainer_from(cfg, env, run_dir, graphdef, params)
    try:
        records = trainer.train(progress=progress)
        return trainer.state.params, records
    finally:
        trainer.close()


# -- evaluation ------------------------------------------------------------------
def eval_config_from(cfg: ml_collections.ConfigDict, *, n: int, temperature: float, seed: int,
                     questions_per_batch: int, strategy: str = "independent", greedy: bool = False,
                     top_p: float = 1.0, reward: str | None = None):
    """`EvalConfig` from the config's rollout limits and strategy settings plus the evaluation's decoding."""
    from aepo_jax.evaluation.driver import EvalConfig

    return EvalConfig(n=n, greedy=greedy, temperature=temperature, top_p=top_p, seed=seed,
                      questions_per_batch=questions_per_batch, loop=loop_config_from(cfg),
                      rollout=rollout_config_from(cfg, strategy, samples=n), reward=reward)


def evaluate_policy(cfg: ml_collections.ConfigDict, env: Environment, graphdef: Any, params: Any,
                    examples: Sequence[dict], *, seed: int = 0, progress: bool = True,
                    tree_strategy: str = "aepo") -> dict[str, float]:
    """The demo's held-out metrics (`envs.demo_eval.policy_metrics`): `eval.samples` independent samples
    per question, plus one `tree_strategy` rollout over `eval.tree_questions` questions."""
    from aepo_jax.envs.demo_eval import policy_metrics
    from aepo_jax.evaluation.driver import evaluate

    e = cfg.eval
    common = {"temperature": float(e.temperature), "top_p": float(e.get("top_p", 1.0)), "seed": seed,
              "reward": cfg.reward.name, "questions_per_batch": max(1, int(e.batch_questions))}
    parts = {"graphdef": graphdef, "params": params, "tokenizer": env.tokenizer, "tools": env.tools,
             "encode_prompt": env.encode_prompt, "judge": env.judge}
    result = evaluate(list(examples), config=eval_config_from(cfg, n=int(e.samples), **common), progress=progress,
                      **parts)
    tree, tree_questions = None, min(int(e.tree_questions), len(examples))
    if tree_questions > 0:
        # The tree rollout's own budget (k) is the config's group size, not the evaluation's n.
        config = eval_config_from(cfg, n=int(cfg.rollout.k), strategy=tree_strategy, **common)
        tree = evaluate(list(examples[:tree_questions]), config=config, progress=False, **parts)
    metrics = policy_metrics(result, int(e.samples), len(examples), tree, tree_questions)
    return {k: (math.nan if v is None else v) for k, v in metrics.items()}
