"""The agent loop's configuration, result types and the interfaces it drives (tokenizer, tools, branch policy).

Kept apart from the loop itself (`aepo_jax.agent.loop`, which re-exports
these names) so that the sampler's builder, evaluation and benchmarks can
size caches and stop sequences without the loop's machinery.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from aepo_jax.agent import tags
from aepo_jax.agent.entropy import ENTROPY_MEASURES
from aepo_jax.agent.protocol import ToolCall
from aepo_jax.agent.trajectory import Trajectory

BRANCH_BY = ("fork", "prefill")
SCHEDULES = ("rounds", "continuous")
# Which segment a branch decision after a tool result reads: the one generated after the result (spec 2.2
# step 3, the paper's) or the one that ended with the call (the released code, spec 7.1).
DECISION_ENTROPY = ("after_result", "before_call")
BACKGROUND_COMPILE = ("auto", "on", "after_run", "off")
# `LoopConfig.layerwise_decode` -> the rollout Sampler's `layerwise_decode` (None: its default for the backend).
LAYERWISE_DECODE = {"auto": None, "on": True, "off": False}


class TextTokenizer(Protocol):
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def token_to_id(self, piece: str) -> int | None: ...


class ToolRunner(Protocol):
    def run_many(self, calls: Sequence[ToolCall]) -> list[Any]: ...  # objects with .text and .ok


class BranchPolicy(Protocol):
    """What a tree strategy tells the loop (implemented in `aepo_jax.rollout`)."""

    def branch_count(self, traj: Trajectory, entropy_now: float, rng: np.random.Generator) -> int:
        """New trajectories to fork at `traj`'s latest tool result (0: no branch)."""
        ...

    def end_round(self, new_trajectories: Sequence[int | None]) -> None:
        """Told at the end of every loop round (under `continuous`, every tick), per prompt, how many
        trajectories the prompt's own round that just ended created; None where that round goes on
        (`agent.prompt_rounds`: it ends when the prompt's rows have all reached a tool result or finished)."""
        ...


@dataclass(frozen=True)
class LoopConfig:
    """Limits of spec section 4 and the entropy window of section 1."""

    max_tool_calls: int = 6
    max_response_tokens: int = 4096
    max_context_len: int = 8192
    entropy_tokens: int = 20
    entropy_measure: str = "exact_mean"
    decision_entropy: str = "after_result"  # DECISION_ENTROPY; "before_call" needs schedule="rounds"
    branch_by: str = "fork"  # "prefill" re-prefills each branch (benchmark baseline only)
    # Decode at most this many tokens per row per round (None: the whole remaining budget). Smaller
    # chunks need less cache room past the shared cursor, so fewer repacks; must be >= entropy_tokens.
    max_segment_tokens: int | None = None
    # "rounds": lockstep rounds (decode all, then all tools); "continuous": tools run while other rows decode.
    schedule: str = "rounds"
    chunk_tokens: int = 64  # continuous: tokens a row decodes between two looks at the arrived tool results
    # continuous: decode a chunk only while at least this fraction of the live rows is generating (not
    # waiting on a tool), or while the tool runner has idle workers (fewer calls in flight than it runs
    # at once: the rows that decode may fill them); otherwise wait for results first, so a chunk is not
    # a full-batch forward for a few rows. 0 decodes whenever any row can.
    min_generating_fraction: float = 0.5
    # continuous: once a tool result arrives while the loop waits, it keeps collecting the results that
    # follow within this many milliseconds of the previous one before it decodes. Calls started together
    # finish a few ms apart; folding them in one tick keeps their rows in one chunk instead of splitting
    # them into groups that then take turns. 0 decodes as soon as enough rows can.
    arrival_window_ms: float = 10.0
    # The rollout sampler's `compile_in_background` (a shape not compiled yet runs as a compiled larger
    # variant while its own compiles on a background thread): "on" (its compile starts at once),
    # "after_run" (its compile starts when the loop run ends: XLA's compiles run at normal priority and
    # would take the run's cores), "off", or "auto" = "after_run" under the continuous schedule, whose
    # results already depend on timing, "off" under rounds (bit-reproducible).
    background_compile: str = "auto"
    # The rollout sampler's `layerwise_decode`: decode windows on per-layer copies of the block weights (a
    # second copy, in the compute dtype) and of the cache's live span, layers unrolled, or a scan of the
    # stacked layers. "auto" = the
    # Sampler's default for the backend (layerwise on CPU and GPU, stacked on TPU), "on", "off".
    layerwise_decode: str = "auto"

    @property
    def decode_layerwise(self) -> bool | None:
        """The rollout Sampler's `layerwise_decode` (`layerwise_decode`; None lets the Sampler decide)."""
        return LAYERWISE_DECODE[self.layerwise_decode]

    @property
    def compiles_in_background(self) -> bool:
        """Whether the rollout sampler compiles new shapes in the background (`background_compile`)."""
        return self.background_compile in ("on", "after_run") or (
            self.background_compile == "auto" and self.schedule == "continuous")

    @property
    def timing_dependent(self) -> list[str]:
        """The settings under which a rollout's result depends on wall-clock timing (empty: a seeded
        rollout repeats bit for bit): which tick a tool result is folded in at (`continuous`), or which
        compiled variant a call meets (`background_compile`)."""
        found = []
        if self.schedule == "continuous":
            found.append("schedule='continuous' (which tick a tool result is folded in at)")
        if self.compiles_in_background:
            found.append(f"background_compile={self.background_compile!r} under rollout.schedule={self.schedule!r} "
                         "(a shape runs as a larger variant until its own compile is ready)")
        return found

    @property
    def compiles_after_run(self) -> bool:
        """Whether a loop run holds its background compiles until it ends (`background_compile`)."""
        return self.background_compile == "after_run" or (
            self.background_compile == "auto" and self.schedule == "continuous")

    def __post_init__(self) -> None:
        for name in ("max_response_tokens", "max_context_len", "entropy_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"LoopConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_tool_calls < 0:
            raise ValueError(f"LoopConfig.max_tool_calls must be >= 0, got {self.max_tool_calls}")
        if self.entropy_measure not in ENTROPY_MEASURES:
            raise ValueError(f"unknown entropy_measure {self.entropy_measure!r}; choose from {ENTROPY_MEASURES}")
        if self.max_segment_tokens is not None and self.max_segment_tokens < self.entropy_tokens:
            raise ValueError(f"max_segment_tokens={self.max_segment_tokens} must be >= entropy_tokens={self.entropy_tokens}")
        if self.decision_entropy not in DECISION_ENTROPY:
            raise ValueError(f"unknown decision_entropy {self.decision_entropy!r}; choose from {DECISION_ENTROPY}")
        if self.decision_entropy == "before_call" and self.schedule != "rounds":
            raise ValueError("decision_entropy='before_call' (the released code's decisions, drawn in the round of "
                             "the call) runs under schedule='rounds' only; the continuous schedule draws a "
                             f"decision once the segment after the result is measured (schedule={self.schedule!r})")
        if self.branch_by not in BRANCH_BY:
            raise ValueError(f"unknown branch_by {self.branch_by!r}; choose from {BRANCH_BY}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.schedule!r}; choose from {SCHEDULES}")
        if not 0.0 <= self.min_generating_fraction <= 1.0:
            raise ValueError(f"min_generating_fraction must be in [0, 1], got {self.min_generating_fraction}")
        if self.arrival_window_ms < 0:
            raise ValueError(f"arrival_window_ms must be >= 0, got {self.arrival_window_ms}")
        if self.background_compile not in BACKGROUND_COMPILE:
            raise ValueError(f"unknown background_compile {self.background_compile!r}; choose from {BACKGROUND_COMPILE}")
        if self.layerwise_decode not in LAYERWISE_DECODE:
            raise ValueError(f"unknown layerwise_decode {self.layerwise_decode!r}; choose from {sorted(LAYERWISE_DECODE)}")
        if self.chunk_tokens < self.entropy_tokens:
            raise ValueError(f"chunk_tokens={self.chunk_tokens} must be >= entropy_tokens={self.entropy_tokens}")


@dataclass
class RolloutEvent:
    """A trajectory coming into existence: for the budget invariants and statistics."""

    round: int
    prompt_index: int
    traj_id: int
    kind: str  # "premonitor" (AEPO's sample, in-run pre-monitoring), "initial", "branch" or "topup"
    active_before: int  # active trajectories of that prompt when it was created


@dataclass
class LoopResult:
    groups: list[list[Trajectory]]
    events: list[RolloutEvent] = field(default_factory=list)
    rounds: int = 0
    counters: dict[str, int] = field(default_factory=dict)  # forward tokens computed during this run
    repacks: int = 0  # times the active rows were re-prefilled to make cache room


def cache_slots(loop: LoopConfig, prompts: Sequence[Sequence[int]] = ()) -> int:
    """KV-cache slots for the sampler: the power-of-two bucket of the longest context.

    The Sampler's rows are ragged: each row writes only its own tokens, from
    slot 0 on, so a row never needs more slots than its own length, which the
    loop keeps within `max_context_len`; the cache grows by buckets, so unused
    slots cost nothing. (Before ragged rows, a shared write cursor needed twice
    this.)
    """
    longest = max(loop.max_context_len, max((len(p) for p in prompts), default=0))
    return next_power_of_two(longest)


def next_power_of_two(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def agent_stops(tokenizer: TextTokenizer) -> tuple[list[list[int]], list[str]]:
    """(stop id sequences, stop strings) that end a segment at every tool closing tag and `</answer>`.

    Tags registered as special tokens (one id each, the tiny and SFT-from-scratch runs) stop by id.
    Otherwise the model writes them as ordinary text in whatever pieces its tokenizer splits them into
    (a Hugging Face checkpoint fine-tuned with plain-text tags), and they stop as strings matched on
    the generated bytes.
    """
    closes = list(tags.TOOL_CLOSE_TAGS) + [tags.ANSWER_CLOSE]
    sequences = agent_stop_sequences(tokenizer)
    registered = all(len(ids) == 1 and tokenizer.token_to_id(text) == ids[0]
                     for text, ids in zip(closes, sequences, strict=True))
    return (sequences, []) if registered else ([], closes)


def agent_stop_sequences(tokenizer: TextTokenizer, include_answer: bool = True) -> list[list[int]]:
    """Token ids of every tool closing tag (and `</answer>`): the sampler's stop sequences (spec section 4)."""
    closes = list(tags.TOOL_CLOSE_TAGS) + ([tags.ANSWER_CLOSE] if include_answer else [])
    sequences = [list(tokenizer.encode(text)) for text in closes]
    empty = [text for text, ids in zip(closes, sequences, strict=True) if not ids]
    if empty:
        raise ValueError(f"the tokenizer encodes {empty} to no ids")
    return sequences
