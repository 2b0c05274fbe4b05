"""The evaluation driver: sample `n` answers per question through the real agent loop and score them (spec §6).

    result = evaluate(examples, graphdef=g, params=p, tokenizer=tok, tools=registry,
                      encode_prompt=encode, config=EvalConfig(n=4))
    print(format_report_table(result.reports))

Each batch of questions goes through `aepo_jax.rollout.strategies.rollout`
with `k = n`: the independent strategy by default (n i.i.d. samples, what
pass@k assumes), or ARPO/AEPO to evaluate a tree strategy, in which case the
tree statistics of spec §2.4 come back too. Decoding is the paper's
evaluation setting (temperature 0.6, top-p 0.95) or greedy with `n = 1`.
Every trajectory is decoded to text and scored by `score_question` (the
reward registry picks exact match, math equivalence, F1 or the judge by data
source). Keys derive from `seed` and the batch index only (and, on several
processes, the process index), so a run is reproducible with the same
`questions_per_batch` and process count. Sampled results depend on both: the
agent loop draws a batch's rows together, so another batching gives a question
other (equally distributed) samples; greedy results do not change.
`launch.evaluate` records both in eval_config.json.

On a mesh (`placement`, built by `aepo_jax.experiment.rollout_placement_from`)
the sampler samples where the training rollout does: on the mesh, or on
weight replicas over its devices; when the mesh spans several processes, each
samples its contiguous share of every batch of questions on its own devices,
and every process returns the whole, equal result.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np

from aepo_jax.agent.loop import AgentLoop, LoopConfig
from aepo_jax.agent.prompts import response_text
from aepo_jax.agent.trajectory import Trajectory
from aepo_jax.evaluation.metrics import DatasetReport, QuestionResult, build_reports
from aepo_jax.evaluation.scoring import score_question
from aepo_jax.parallel.host_rollout import HostRolloutPlacement
from aepo_jax.parallel.multihost import gather_objects, share_bounds
from aepo_jax.rewards.answer_rewards import executed_tool_calls
from aepo_jax.rollout.agent_sampler import agent_sampler
from aepo_jax.rollout.stats import RolloutStats, compute_stats
from aepo_jax.rollout.strategies import INDEPENDENT, RolloutConfig, rollout
from aepo_jax.sampling import Sampler, SamplingParams

# RolloutStats fields that are counts over rollout calls: summed over batches (and processes).
_SUMMED_STATS = ("branch_decisions", "rounds", "repacks", "prefill_tokens", "append_tokens", "decode_tokens",
                 "forward_tokens", "num_topups", "tool_calls")
# Fields that only the rollout calls know (groups alone give 0 or None): left out of the per-source rows.
_RUN_STATS = (*_SUMMED_STATS, "serial_tool_calls", "forward_to_trajectory_ratio", "global_budgets")


@dataclass(frozen=True)
class EvalConfig:
    """How to evaluate: samples per question, decoding, batching, limits and scoring.

    Attributes:
      n: samples per question (pass@k is reported for every k <= n).
      greedy: argmax decoding; needs `n == 1` (greedy samples are all equal).
      temperature, top_p, top_k: sampling settings (paper §6: 0.6 / 0.95 / off).
      seed: base of every PRNG key of the run.
      questions_per_batch: questions rolled out together (rows = this x n).
      loop: tool-call, response and context limits of the agent loop (spec §4).
      rollout: the rollout strategy; "independent" unless a tree strategy is evaluated.
      reward: reward family deciding correctness (None: by data source).
      require_format: apply the spec §5 format gate before grading an answer.
    """

    n: int = 1
    greedy: bool = False
    temperature: float = 0.6
    top_p: float = 0.95
    top_k: int = 0
    seed: int = 0
    questions_per_batch: int = 8
    loop: LoopConfig = field(default_factory=LoopConfig)
    rollout: RolloutConfig = INDEPENDENT
    reward: str | None = None
    require_format: bool = True

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"EvalConfig.n must be >= 1, got {self.n}")
        _ = self.sampling_params  # SamplingParams checks temperature / top_p / top_k now, not at the first rollout
        if self.greedy and self.n != 1:
            raise ValueError(f"greedy decoding gives {self.n} identical samples: use n=1 with greedy, "
                             "or sampling (greedy=False) for n > 1")
        if self.questions_per_batch < 1:
            raise ValueError(f"EvalConfig.questions_per_batch must be >= 1, got {self.questions_per_batch}")

    @property
    def sampling_params(self) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, greedy=self.greedy)

    @property
    def tree_strategy(self) -> bool:
        return self.rollout.strategy != "independent"


@dataclass
class EvalResult:
    """Everything one evaluation produced.

    Attributes:
      reports: one `DatasetReport` per data source, plus `all` when there are several.
      questions: the scored `QuestionResult` of each question, in input order.
      samples: one JSON-able dict per sample (question id, text, correct, f1, ...).
      tree_stats: per data source (and `all`), the spec §2.4 statistics as dicts; only `all` has
        the rollout calls' counters (tokens, tool calls made, rounds). None for the independent strategy.
    """

    reports: list[DatasetReport]
    questions: list[QuestionResult]
    samples: list[dict[str, Any]]
    tree_stats: dict[str, dict[str, Any]] | None = None

    @property
    def math_timeouts(self) -> int:
        """Sympy checks that ran out of time over the whole evaluation (each scored as wrong)."""
        return sum(q.math_timeouts for q in self.questions)


def check_examples(examples: Sequence[dict]) -> None:
    """Refuse examples without the keys scoring reads, or sharing an id (each copy would count in pass@k)."""
    if not examples:
        raise ValueError("evaluate needs at least one example")
    for i, ex in enumerate(examples):
        missing = [key for key in ("id", "question", "answers", "data_source") if key not in ex]
        if missing:
            raise ValueError(f"example {i} ({ex.get('id', '?')!r}) lacks {missing}")
    repeated = [qid for qid, count in Counter(str(ex["id"]) for ex in examples).items() if count > 1]
    if repeated:
        raise ValueError(f"{len(repeated)} question id(s) occur more than once, e.g. {repeated[:5]}: every copy "
                         "would be sampled and counted in pass@k; drop the duplicates or give each question its "
                         "own id")


def batch_keys(seed: int, batch_index: int, part: int | None = None) -> tuple[jax.Array, np.random.Generator]:
    """The jax key and numpy Generator of one batch, or of one process's `part` of it: a pure function of
    (seed, batch index, part)."""
    key, entropy = jax.random.fold_in(jax.random.key(seed), batch_index), [seed, batch_index]
    if part is not None:
        key, entropy = jax.random.fold_in(key, part), entropy + [part]
    return key, np.random.default_rng(entropy)


def _sample_record(example: dict, index: int, traj: Trajectory, text: str, result: QuestionResult) -> dict[str, Any]:
    return {
        "question_id": example["id"],
        "data_source": example["data_source"],
        "sample": index,
        "traj_id": traj.traj_id,
        "is_global": traj.is_global,
        "correct": result.correct[index],
        "f1": result.f1[index],
        "tool_calls": result.tool_calls[index],
        "python_calls": executed_tool_calls(traj).get("python", 0),
        "response_length": result.response_length[index],
        "stop_reason": traj.stop_reason,
        "response": text,
    }


def _tree_stats(
    examples: Sequence[dict], groups: Sequence[Sequence[Trajectory]],
    batch_stats: Sequence[tuple[int, int, RolloutStats]],
) -> dict[str, dict[str, Any]]:
    """Spec §2.4 statistics per data source (structure only: the rollout calls' counters are left out)
    and over all questions (with the counters of every (batch index, process part, stats) of `batch_stats`)."""
    by_source: dict[str, list[Sequence[Trajectory]]] = {}
    for ex, group in zip(examples, groups, strict=True):
        by_source.setdefault(ex["data_source"], []).append(group)
    out = {name: _structure_only(compute_stats(by_source[name]).as_dict()) for name in sorted(by_source)}
    stats = [s for _, _, s in batch_stats]
    budgets = [m for s in stats for m in (s.global_budgets or [])]
    overall = compute_stats(groups, global_budgets=budgets or None)
    overall = dataclasses.replace(overall, serial_tool_calls=_serial_tool_calls(batch_stats),
                                  **{name: sum(getattr(s, name) for s in stats) for name in _SUMMED_STATS})
    out["all"] = overall.as_dict()
    return out


def _structure_only(row: dict[str, Any]) -> dict[str, Any]:
    """A per-source row without the counters of the rollout calls, which hold every source's questions."""
    return {key: value for key, value in row.items() if key not in _RUN_STATS}


def _serial_tool_calls(batch_stats: Sequence[tuple[int, int, RolloutStats]]) -> int:
    """Calls that must run one after another: batches run in turn, the processes' parts of a batch at once."""
    longest: dict[int, int] = {}
    for batch, _, stats in batch_stats:
        longest[batch] = max(longest.get(batch, 0), stats.serial_tool_calls)
    return sum(longest.values())


def evaluate(
    examples: Sequence[dict],
    *,
    graphdef: Any,
    params: Any,
    tokenizer: Any,
    tools: Any,
    encode_prompt: Callable[[dict], list[int]],
    config: EvalConfig,
    progress: bool = True,
    make_generator: Callable[[Sampler], Any] | None = None,
    placement: HostRolloutPlacement | None = None,
    **reward_kw: Any,
) -> EvalResult:
    """Roll out `config.n` samples per example with the agent loop and score them per data source.

    Args:
      examples: `{"id", "question", "answers", "data_source"}` dicts.
      graphdef, params: the policy (`nnx.split` of the decoder).
      tokenizer: the run's tokenizer (encode/decode, eos_id, pad_id).
      tools: a tool registry (`run_many`), e.g. search over a local server and the python sandbox.
      encode_prompt: example -> prompt token ids (chat template applied).
      config: samples, decoding, batching, limits and scoring (`EvalConfig`).
      progress: show a progress bar over questions (on the first process).
      make_generator: wraps the sampler into the generator the loop drives (default:
        the sampler itself); tests use `aepo_jax.agent.forcing.ToolForcingGenerator`.
      placement: the sampler's mesh and how `params` get there (None: one device). With a mesh
        over several processes, every process must call `evaluate` with the same arguments: each
        rolls out its share of every batch (`share_bounds`) on its own devices.
      **reward_kw: passed to the reward (e.g. `pool=`, `judge=`).
    """
    check_examples(examples)
    placement = placement if placement is not None else HostRolloutPlacement(None)
    part, parts = (jax.process_index(), jax.process_count()) if placement.per_host else (0, 1)
    prompts = [list(map(int, encode_prompt(ex))) for ex in examples]
    if parts > 1:
        _check_same_questions(examples, prompts)
    sampler = agent_sampler(graphdef, placement(params), tokenizer, config.loop, config.sampling_params,
                            seed=config.seed, mesh=placement.mesh, prompts=prompts)
    generator = make_generator(sampler) if make_generator is not None else sampler
    loop = AgentLoop(generator, tokenizer, tools, config.loop)
    starts = range(0, len(examples), config.questions_per_batch)
    shares = [share_bounds(min(config.questions_per_batch, len(examples) - start), part, parts) for start in starts]
    scored: list[_Scored] = []
    batch_stats: list[tuple[int, int, RolloutStats]] = []  # (batch index, part, stats)
    bar = _progress_bar(sum(hi - lo for lo, hi in shares), progress and part == 0)
    error: Exception | None = None
    try:
        for batch_index, (start, (lo, hi)) in enumerate(zip(starts, shares, strict=True)):
            if lo == hi:
                continue  # a short last batch leaves some processes without questions
            first = start + lo
            key, rng = batch_keys(config.seed, batch_index, part if parts > 1 else None)
            groups, stats = rollout(prompts[first:start + hi], config.n, loop=loop, config=config.rollout, rng=rng,
                                    key=key)
            batch_stats.append((batch_index, part, stats))
            for index, group in enumerate(groups, start=first):
                ex = examples[index]
                texts = [response_text(tokenizer, t.response_ids) for t in group]
                # Calls the loop ran: a malformed closing it answered itself is a tool step, not a call.
                result = score_question(
                    ex, texts, [int(sum(t.mask)) for t in group],
                    tool_calls=[sum(executed_tool_calls(t).values()) for t in group],
                    reward=config.reward, require_format=config.require_format, **reward_kw,
                )
                records = [_sample_record(ex, i, t, text, result) for i, (t, text) in enumerate(zip(group, texts))]
                # Trajectories are kept only for the tree statistics.
                scored.append((index, result, records, list(group) if config.tree_strategy else []))
            bar.update(hi - lo)
    except Exception as err:
        if parts == 1:
            raise
        error = err  # reported to every process below, so none waits for this one forever
    finally:
        bar.close()
    if parts > 1:
        del sampler, generator, loop  # the KV cache and the weight replicas go before the exchange
        scored, batch_stats = _exchange(scored, batch_stats, error, len(examples))
    questions = [result for _, result, _, _ in scored]
    samples = [record for _, _, records, _ in scored for record in records]
    tree = _tree_stats(examples, [group for *_, group in scored], batch_stats) if config.tree_strategy else None
    result = EvalResult(build_reports(questions), questions, samples, tree)
    if result.math_timeouts and part == 0:
        warnings.warn(f"{result.math_timeouts} sympy equivalence check(s) ran out of time in this evaluation and "
                      "counted as wrong, so math pass@k may be too low (per data source: the reports' "
                      "math_timeouts); pass a SympyWorkerPool with a longer timeout_s as pool=", stacklevel=2)
    return result


# One scored question: (index in the input, its result, its sample records, its trajectories or []).
_Scored = tuple[int, QuestionResult, list[dict[str, Any]], list[Trajectory]]


def _check_same_questions(examples: Sequence[dict], prompts: Sequence[Sequence[int]]) -> None:
    """Every process must split the same questions with the same prompts (a collective)."""
    text = json.dumps([[str(ex["id"]) for ex in examples], [list(p) for p in prompts]])
    digests = gather_objects(hashlib.sha256(text.encode()).hexdigest()[:16])
    if len(set(digests)) > 1:
        raise ValueError(f"the processes hold different questions or prompts (digest per process: {digests}); "
                         "every process must evaluate the same examples with the same tokenizer")


def _exchange(scored: list[_Scored], batch_stats: list[tuple[int, int, RolloutStats]], error: Exception | None,
              count: int) -> tuple[list[_Scored], list[tuple[int, int, RolloutStats]]]:
    """Every process's scored questions in input order and rollout stats in (batch, part) order, on every
    process; raises on every process when any of them failed."""
    mine = (None, None, f"{type(error).__name__}: {error}") if error is not None else (scored, batch_stats, None)
    gathered = gather_objects(mine)
    failures = [f"process {p}: {message}" for p, (_, _, message) in enumerate(gathered) if message]
    if error is not None:
        raise error
    if failures:
        raise RuntimeError(f"evaluation failed on another process ({'; '.join(failures)})")
    merged = sorted((item for items, _, _ in gathered for item in items), key=lambda item: item[0])
    if [index for index, *_ in merged] != list(range(count)):
        raise RuntimeError(f"the processes' shares do not cover the {count} questions once each")
    stats = sorted((item for _, part_stats, _ in gathered for item in part_stats), key=lambda item: item[:2])
    return merged, stats


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _progress_bar(total: int, enabled: bool) -> Any:
    if not enabled:
        return _NoBar()
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="evaluate", unit="question", dynamic_ncols=True)
