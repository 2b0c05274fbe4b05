"""The stages of the embedded demo (DESIGN.md, "The embedded default"), as plain functions.

`launch.demo`, `launch.compare` and the notebook drive these:
`setup_task` (env files, tokenizer, search server, tools) ->
`run_sft` (cold start on executed scripted trajectories) ->
`run_rl` (the RL trainer from the SFT parameters, any algorithm preset) ->
`aepo_jax.envs.demo_eval.evaluate_policy` on held-out towns.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from aepo_jax.agent.prompts import render_prompt
from aepo_jax.envs.facts_sft import build_sft_sequences
from aepo_jax.envs.facts_task import (
    DEMO_SYSTEM_PROMPT,
    TaskFiles,
    demo_prompt_config,
    question_example,
    tokenizer_texts,
    write_task,
)


@dataclass
class DemoTask:
    """Everything host-side a demo stage needs; `close()` stops the server and the sandbox."""

    task: TaskFiles
    tokenizer: Any
    tools: Any
    encode_question: Callable[[str], list[int]]
    server_url: str
    closers: list[Callable[[], None]] = field(default_factory=list)
    pretrained: tuple[nnx.GraphDef, Any] | None = None  # (graphdef, params) when the policy is a GGUF checkpoint

    @property
    def train_examples(self) -> list[dict]:
        return [question_example(q) for q in self.task.env.train]

    @property
    def heldout_examples(self) -> list[dict]:
        return [question_example(q) for q in self.task.env.heldout]

    def encode_prompt(self, example: dict) -> list[int]:
        return self.encode_question(example["question"])

    def close(self) -> None:
        for close in reversed(self.closers):
            close()
        self.closers.clear()


def setup_task(cfg: ml_collections.ConfigDict, workdir: str, search_url: str = "") -> DemoTask:
    """Stage 1: write the env files, train the tokenizer, start the search server and the python sandbox.

    With `search_url` the search tool talks to that (already running) retrieval
    server instead of starting one over the generated corpus.
    """
    from aepo_jax.servers.process import start_search_server
    from aepo_jax.tokenizers.sentencepiece_tokenizer import train_sentencepiece
    from aepo_jax.tools import (
        PythonSandbox,
        PythonTool,
        SandboxLimits,
        SearchTool,
        ToolRegistry,
    )

    texts = None
    if cfg.env.get("task", "towns") == "multihop":  # aepo_jax.envs.multihop_task (configs/demo.py:multihop)
        from aepo_jax.envs.multihop_task import setup_multihop_files

        task, system_prompt, texts = setup_multihop_files(cfg, os.path.join(workdir, "task"))
    else:
        kinds = tuple(k.strip() for k in str(cfg.env.kinds).split(",") if k.strip())
        task = write_task(os.path.join(workdir, "task"), seed=int(cfg.seed), n_towns=int(cfg.env.n_towns),
                          n_train=int(cfg.env.n_train), n_heldout=int(cfg.env.n_heldout),
                          n_distractors=int(cfg.env.n_distractors), hops=int(cfg.env.hops), kinds=kinds,
                          heldout_fraction=float(cfg.env.heldout_fraction),
                          max_syllables=int(cfg.env.max_syllables))
        system_prompt = cfg.env.system_prompt or DEMO_SYSTEM_PROMPT
    pretrained = None
    if cfg.tokenizer.kind == "gguf":  # a pretrained policy brings its own tokenizer and chat template
        from aepo_jax.envs.pretrained import load_gguf_policy

        graphdef, params, tokenizer = load_gguf_policy(cfg.model.get("gguf_path", ""))
        pretrained = (graphdef, params)
    elif cfg.tokenizer.kind:
        raise ValueError(f"tokenizer.kind {cfg.tokenizer.kind!r} is not supported by the demo; use '' or 'gguf'")
    else:
        texts = texts or tokenizer_texts(task, system_prompt, int(cfg.seed), max_syllables=int(cfg.env.max_syllables))
        tokenizer = train_sentencepiece(texts,
                                        int(cfg.tokenizer.vocab_size), model_prefix=os.path.join(workdir, "tokenizer"))
    closers: list[Callable[[], None]] = []
    if not search_url:
        server = start_search_server(str(task.corpus))
        closers.append(server.stop)
        search_url = server.url
    sandbox = PythonSandbox(SandboxLimits(wall_seconds=float(cfg.rollout.tool_timeout_s)), pool_size=2)
    closers.append(sandbox.close)
    registry = ToolRegistry({
        "search": SearchTool(search_url, topk=int(cfg.env.search_topk), max_result_chars=int(cfg.rollout.max_result_chars)),
        "python": PythonTool(sandbox),
    })
    closers.append(registry.close)
    prompt_config = demo_prompt_config(system_prompt)

    def encode_question(question: str) -> list[int]:
        ids = render_prompt(tokenizer, question, prompt_config)
        if len(ids) > int(cfg.rollout.max_prompt_len):
            raise ValueError(f"prompt has {len(ids)} tokens > rollout.max_prompt_len={cfg.rollout.max_prompt_len}")
        return ids

    return DemoTask(task, tokenizer, registry, encode_question, search_url, closers, pretrained)


def demo_model(cfg: ml_collections.ConfigDict, vocab_size: int) -> tuple[nnx.GraphDef, Any]:
    """The seeded tiny decoder of `cfg.demo_model` (float32), split into (graphdef, params)."""
    from aepo_jax.models import Decoder, get_preset

    m = cfg.demo_model
    model_config = get_preset(
        "tiny", vocab_size=int(vocab_size), d_model=int(m.d_model), n_layers=int(m.n_layers),
        n_heads=int(m.n_heads), n_kv_heads=int(m.n_kv_heads), head_dim=int(m.d_model) // int(m.n_heads),
        mlp_dim=int(m.mlp_dim), max_seq_len=int(m.max_seq_len), param_dtype="float32", dtype="float32",
    )
    return nnx.split(Decoder(model_config, rngs=nnx.Rngs(int(cfg.seed))))


def parameter_count(params: Any) -> int:
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))


def run_sft(cfg: ml_collections.ConfigDict, demo: DemoTask, workdir: str, progress: bool = True,
            log: Callable[[str], None] = print) -> tuple[nnx.GraphDef, Any, list[dict]]:
    """Stage 2: SFT cold start on scripted trajectories executed with the real tools.

    Returns (graphdef, params, metric records); the final state is checkpointed
    under WORKDIR/checkpoints (orbax) and the records go to WORKDIR/metrics.jsonl.
    """
    from aepo_jax.training.batch import pad_sequences
    from aepo_jax.training.checkpoint import Checkpointer
    from aepo_jax.training.metrics_log import MetricsLogger
    from aepo_jax.training.optimizer import make_optimizer
    from aepo_jax.training.train_state import TrainState
    from aepo_jax.training.train_step import StepConfig, make_sft_train_step

    s = cfg.sft
    rng = np.random.default_rng(int(cfg.seed))
    t0 = time.perf_counter()
    sequences = build_sft_sequences(demo.task.env.train, demo.task.towns_by_name, demo.tokenizer, demo.tools,
                                    demo.encode_question, rng, float(cfg.env.skip_python_prob),
                                    script=getattr(demo.task.env, "script", None))
    failures = sum(seq.tool_failures for seq in sequences)
    log(f"  {len(sequences)} scripted trajectories executed with the real tools in {time.perf_counter() - t0:.1f}s "
        f"({sum(seq.used_python for seq in sequences)} use python, {failures} tool failures)")
    graphdef, params = demo.pretrained or demo_model(cfg, demo.tokenizer.vocab_size)
    log(f"  model: {parameter_count(params):,} parameters, vocabulary {demo.tokenizer.vocab_size}")
    tx, schedule = make_optimizer(float(s.lr), int(s.steps), warmup_steps=int(s.warmup_steps), schedule=s.schedule,
                                  final_lr_fraction=float(s.final_lr_fraction))
    state = TrainState.create(params, tx, seed=int(cfg.seed))
    step_fn = make_sft_train_step(graphdef, tx, StepConfig(), schedule)
    rows = [seq.as_row() for seq in sequences]
    batch_size = min(int(s.batch_size), len(rows))
    records = []
    bar = _progress(int(s.steps), "sft", progress)
    with MetricsLogger(workdir, tensorboard=False) as logger, Checkpointer(os.path.join(workdir, "checkpoints"), keep=1) as ckpt:
        for step in range(1, int(s.steps) + 1):
            chosen = rng.choice(len(rows), batch_size, replace=False)
            batch = pad_sequences([rows[i] for i in chosen], int(s.max_seq_len), demo.tokenizer.pad_id,
                                  length_multiple=int(s.length_bucket))
            state, metrics = step_fn(state, {k: jnp.asarray(v) for k, v in batch.items()})
            record = logger.log(step, {k: float(v) for k, v in jax.device_get(metrics).items()})
            records.append(record)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(nll=f"{record['nll']:.3f}", acc=f"{record['token_accuracy']:.3f}")
        if bar is not None:
            bar.close()
        ckpt.save(int(s.steps), state, {}, force=True)
    return graphdef, state.params, records


def _progress(total: int, desc: str, show: bool):
    if not show:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="step", dynamic_ncols=True)


def run_rl(cfg: ml_collections.ConfigDict, demo: DemoTask, graphdef: nnx.GraphDef, params: Any, workdir: str,
           progress: bool = True) -> tuple[Any, list[dict]]:
    """Stage 3: RL (the algorithm of `cfg`) from `params` with the project's RL trainer.

    Rewards are the math-equivalence of the boxed answer after the format gate
    (spec §5); rollouts run the real tools through the agent loop.
    """
    from aepo_jax.data import PromptPipeline
    from aepo_jax.envs.demo_eval import make_agent_loop, tree_rollout_config
    from aepo_jax.rewards import compute_reward
    from aepo_jax.rollout.strategies import rollout
    from aepo_jax.training.rl_trainer import RLTrainer

    tokenizer = demo.tokenizer
    params = jax.tree.map(jnp.copy, params)  # the train step donates its state; keep the caller's start intact

    def reward_fn(example: dict, trajectory: Any) -> float:
        return compute_reward(cfg.reward.name, tokenizer.decode(trajectory.response_ids), example["answers"])

    loop = make_agent_loop(cfg, demo, graphdef, params, float(cfg.rollout.temperature), int(cfg.seed))
    strategy = tree_rollout_config(cfg, cfg.rollout.strategy)

    def rollout_fn(prompts, k, current_params, key, rng):
        loop.generator.set_params(current_params)
        return rollout(prompts, k, loop=loop, config=strategy, rng=rng, key=key)

    pipeline = PromptPipeline(demo.train_examples, int(cfg.data.prompts_per_step), seed=int(cfg.seed),
                              shuffle=bool(cfg.data.shuffle))
    trainer = RLTrainer(cfg, workdir, rollout_fn=rollout_fn, pipeline=pipeline,
                        encode_prompt=demo.encode_prompt, reward_fn=reward_fn, graphdef=graphdef, params=params,
                        pad_id=int(tokenizer.pad_id))
    try:
        records = trainer.train(progress=progress)
        return trainer.state.params, records
    finally:
        trainer.close()
