"""The multi-turn agent loop: rounds of decode, tool calls, append, branch and top-up.

Two schedules (`LoopConfig.schedule`, docs/rollout_engine.md). `"rounds"`, the
lockstep baseline, runs the steps below once per round.
One round (DESIGN.md "Agent loop", spec sections 2 and 4):
1. decode every active row to a stop (a tool closing tag, EOS or its budget);
2. rows that were waiting on a branch decision for a tool result now know the
   entropy of the first K tokens after it (a segment paused with fewer waits
   another round): ask the branch policy, if the prompt has budget left, and
   fork the decode state of that row *as it was right after the tool result*
   (a snapshot taken then), so nothing is re-prefilled; a reused finished
   global (AEPO's pre-monitoring sample) is asked the same way, one tool
   result per round, and its branches are prefilled from the shared prefix;
3. parse the tool calls, run them concurrently through the tool registry,
   append the tokenised results (mask 0) with the generator's `append`;
4. drop finished rows, add the round's branches, and start one new global
   trajectory for each prompt that has no active trajectory and fewer than `k`
   (top-up); repeat until no row is active.
Token-in, token-out: trajectories hold exactly the sampled ids and the
tokenised tool results; nothing is re-tokenised.

`"continuous"` (`aepo_jax.agent.continuous`) takes tools off the critical path:
decode in chunks; a row waiting on its tool call stays in place, decoding
nothing, and its result is appended at the first chunk boundary after it
arrived. Step 2 lives in `aepo_jax.agent.branching`, the tool steps of step 3 in
`aepo_jax.agent.tool_steps`.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import jax
import numpy as np

from aepo_jax.agent.branching import PREFILL, BranchDecisions, MarkedRows, Replays
from aepo_jax.agent.continuous import TOOL_THREADS, ContinuousSchedule
from aepo_jax.agent.decision_rounds import DecisionRounds, RoundDecisions
from aepo_jax.agent.entropy import TOP_LOGPROBS, reported_logprobs
from aepo_jax.agent.generator import Generator, forward_tokens
from aepo_jax.agent.loop_config import (  # noqa: F401  (re-exported: the loop's public types live there)
    BRANCH_BY,
    SCHEDULES,
    BranchPolicy,
    LoopConfig,
    LoopResult,
    RolloutEvent,
    TextTokenizer,
    ToolRunner,
    agent_stop_sequences,
    cache_slots,
    next_power_of_two,
)
from aepo_jax.agent.prompt_rounds import PromptRounds
from aepo_jax.agent.segments import SegmentMeasures
from aepo_jax.agent.tool_steps import ToolSteps
from aepo_jax.agent.trajectory import END_CONTEXT, END_LENGTH, Trajectory
from aepo_jax.parallel.device_turns import offer_device_turn


class AgentLoop:
    """Drives a `Generator` and a tool registry through rounds; see the module docstring."""

    def __init__(
        self, generator: Generator, tokenizer: TextTokenizer, tools: ToolRunner, config: LoopConfig | None = None
    ) -> None:
        self.generator = generator
        self.tokenizer = tokenizer
        self.tools = tools
        self.config = config or LoopConfig()

    def run(
        self,
        prompts: Sequence[Sequence[int]],
        k: int | Sequence[int],
        initial: int | Sequence[int],
        *,
        rng: np.random.Generator,
        key: jax.Array,
        policy: BranchPolicy | None = None,
        existing: Sequence[Sequence[Trajectory]] | None = None,
        premonitor: Callable[[Trajectory], int] | None = None,
    ) -> LoopResult:
        """Roll out until every prompt has `k` finished trajectories.

        Args:
          prompts: token ids per prompt (already rendered with the chat template).
          k: group size per prompt (an int for all).
          initial: global trajectories to start per prompt before the first round.
          rng: numpy Generator for every branch decision (alpha draws).
          key: jax PRNG key, split once per generate call.
          policy: branch policy; None means no branching (independent sampling).
          existing: finished trajectories already in each group (AEPO's reused
            pre-monitoring sample); they count towards `k` and, with a policy,
            branch like the other globals: the decision at their j-th tool
            result is drawn in round j + 1, when a global started in round 1
            makes its own, and a branch is re-prefilled from the shared prefix
            (their decode state is gone).
          premonitor: AEPO's entropy pre-monitoring inside this run, per prompt (needs a policy,
            `initial` 1 and no `existing`): each prompt starts with one trajectory, which makes no
            branch decisions; once it finishes, `premonitor(it)` says how many more initial globals
            the prompt gets, started at once, and it stays in the group as a reused global that
            branches like `existing` ones (its first decision is drawn in the second round of the
            prompt's globals, as theirs can be at the earliest).
            A prompt's rollout so never waits for another prompt's pre-monitoring sample.
        """
        num = len(prompts)
        ks = _per_prompt(k, num, "k")
        inits = _per_prompt(initial, num, "initial")
        prompts = [list(map(int, p)) for p in prompts]
        for i, p in enumerate(prompts):
            if not p:
                raise ValueError(f"prompt {i} is empty")
            if len(p) >= self.config.max_context_len:
                raise ValueError(f"prompt {i} has {len(p)} tokens, no room under max_context_len={self.config.max_context_len}")
        groups: list[list[Trajectory]] = [list(g) for g in existing] if existing is not None else [[] for _ in range(num)]
        if len(groups) != num:
            raise ValueError(f"existing has {len(groups)} groups for {num} prompts")
        for i in range(num):
            if len(groups[i]) + inits[i] > ks[i]:
                raise ValueError(f"prompt {i}: {len(groups[i])} existing + {inits[i]} initial exceeds k={ks[i]}")
        if premonitor is not None and (policy is None or existing is not None or any(n != 1 for n in inits)):
            raise ValueError("premonitor needs a policy, initial=1 for every prompt and no existing trajectories")
        start_id = 1 + max((t.traj_id for g in groups for t in g), default=-1)
        run = _Run(self, prompts, ks, groups, policy, rng, key, itertools.count(start_id), premonitor)
        with self._compiles_held():
            return run.execute(inits)

    def _compiles_held(self) -> contextlib.AbstractContextManager:
        """The generator's `compiles_held()` block when the config holds compiles for a run, else nothing."""
        held = getattr(self.generator, "compiles_held", None)
        return held() if held is not None and self.config.compiles_after_run else contextlib.nullcontext()


def _per_prompt(value: int | Sequence[int], num: int, name: str) -> list[int]:
    values = [int(value)] * num if isinstance(value, int | np.integer) else [int(v) for v in value]
    if len(values) != num or any(v < 0 for v in values):
        raise ValueError(f"{name} must be a non-negative int or one per prompt ({num}), got {value}")
    return values


class _Run(ContinuousSchedule, RoundDecisions, BranchDecisions, ToolSteps, SegmentMeasures):
    """State of one `AgentLoop.run` call; the continuous schedule's methods come from `ContinuousSchedule`."""

    def __init__(self, loop, prompts, ks, groups, policy, rng, key, ids, premonitor=None) -> None:
        self.loop, self.gen, self.cfg = loop, loop.generator, loop.config
        self.prompts, self.ks, self.groups, self.policy = prompts, ks, groups, policy
        self.rng, self.key, self.ids = rng, key, ids
        self.events: list[RolloutEvent] = []
        self.round = 0
        self.rows: list[Trajectory] = []  # the live trajectories; rows[i] sits in row slots[i] of self.state
        self.slots: list[int] = []
        self.n_slots = 0  # rows of self.state; under `continuous` some are free (finished, not yet reused)
        self.state: Any = None
        # traj_id -> (snapshot right after a tool result, row in it, that tool step): awaiting a branch decision.
        # The snapshot is the generator's `mark` of the rows when it has one (the rows keep growing in
        # self.state; branches are forked from them as marked), else a `fork` (a copy of the rows). Under
        # `continuous` a row's later tool results queue their decisions behind it in `later` until it is
        # drawn (`decision_rounds`).
        self.pending: dict[int, tuple[Any, int, int]] = {}
        self.later: dict[int, list[tuple[Any, int, int]]] = {}
        self.snapshots_by_marks = callable(getattr(self.gen, "mark", None)) and callable(
            getattr(self.gen, "fork_marked", None))
        # Reused finished globals that still branch (only under a policy).
        self.replays = Replays([t for g in groups for t in g if t.tool_steps] if policy is not None else [])
        self.prompt_rounds = PromptRounds(len(prompts))  # each prompt's own rounds (`rounds`)
        # `continuous`: each prompt's rounds of branch decisions, the rows whose segment after their latest
        # tool result is measured, and the prompts whose round this tick drew.
        self.decision_rounds = DecisionRounds(len(prompts))
        self.measured: set[int] = set()
        self.rounds_drawn: list[int] = []
        # In-run pre-monitoring (`AgentLoop.run`'s premonitor): prompt -> its sample, until that finishes.
        self.premonitor = premonitor
        self.premonitoring: dict[int, Trajectory] = {}
        self.segment_tops: dict[int, np.ndarray] = {}  # top log-probs of segments shorter than K so far
        self.counters_start = dict(self.gen.counters)
        self.repacks = 0
        self.paused: set[int] = set()  # rows whose last generate stopped early, mid-segment
        self.generated_this_round: list[int] = []  # tokens each row generated in the current round
        # Continuous schedule: traj_id -> future (call, result text, ok) of a tool call not yet appended.
        # The rows waiting on them stay in the decode state (ragged rows: they decode nothing and write
        # no slots) until their result is appended in place.
        self.waiting: dict[int, Future] = {}
        self.pool: ThreadPoolExecutor | None = None
        self.tool_threads = TOOL_THREADS  # calls the tool runner runs at once (continuous)

    # ----- trajectory creation -------------------------------------------------------------
    def _active(self, prompt: int) -> int:
        """Unfinished trajectories of `prompt`, plus reused globals with tool results still to decide (and,
        under `continuous`, finished rows whose decision is still to be drawn)."""
        replaying = sum(1 for t in self.replays.trajs if t.prompt_index == prompt and self.replays.left(t))
        if self.cfg.schedule == "continuous":
            replaying += sum(1 for t in self.rows if t.finished and t.prompt_index == prompt and t.traj_id in self.pending)
        return replaying + sum(1 for t in self.groups[prompt] if not t.finished)

    def _depth(self, prompt: int) -> int:
        """The most tool results any trajectory of `prompt` that is not a reused sample has appended."""
        replaying = {t.traj_id for t in self.replays.trajs}
        return max((len(t.tool_steps) for t in self.groups[prompt] if t.traj_id not in replaying), default=0)

    def _prompt_round(self, prompt: int) -> int:
        """The round `prompt` is in (`PromptRounds`: without `max_segment_tokens`, the loop's under `rounds`;
        under `continuous`, its last round of drawn decisions, `DecisionRounds`)."""
        if self.cfg.schedule == "continuous":
            return self.decision_rounds.drawn[prompt]
        return self.prompt_rounds.index[prompt]

    def _new_globals(self, prompt_indices: list[int], kind: str) -> None:
        if not prompt_indices:
            return
        trajs = []
        for p in prompt_indices:
            tid = next(self.ids)
            self.events.append(RolloutEvent(self.round, p, tid, kind, self._active(p)))
            traj = Trajectory(traj_id=tid, prompt_index=p, prompt_ids=list(self.prompts[p]), root_id=tid)
            self.groups[p].append(traj)
            trajs.append(traj)
        self._reserve_rows(len(trajs))
        self._add_rows(self.gen.prefill([t.prompt_ids for t in trajs]), trajs, new_globals=True)

    def _reserve_rows(self, new_rows: int) -> None:
        """Grow the decode state's batch (`reserve`) before new rows are made when they will not fit in its
        free rows, so the old and the grown state are the only whole caches alive while it is copied."""
        reserve = getattr(self.gen, "reserve", None)
        if self.state is not None and reserve is not None and new_rows > self.n_slots - len(self.rows):
            self.state = reserve(self.state, self.n_slots + new_rows)

    def _add_rows(self, state: Any, trajs: list[Trajectory], rows: list[int] | None = None,
                  avoid: set[int] | frozenset[int] = frozenset(), new_globals: bool = False) -> None:
        """New rows (row rows[j] of `state`, default j, holds trajs[j]): copied straight into free rows
        of the decode state (none of `avoid`) when there are enough (continuous batching: `place`, the
        batch keeps its shape), else appended."""
        free = sorted(set(range(self.n_slots)) - set(self.slots) - set(avoid))
        in_order = list(range(len(trajs)))
        rows = in_order if rows is None else rows
        can_place = self.state is not None and len(trajs) <= len(free) and hasattr(self.gen, "place")
        if not can_place and (rows != in_order or state.num_rows != len(trajs)):
            state, rows = self.gen.fork(state, rows), in_order
        if self.state is None:
            self.state, new_slots, self.n_slots = state, in_order, len(trajs)
        elif can_place:
            new_slots = free[: len(trajs)]
            self.state = self.gen.place(self.state, new_slots, state, rows)
        else:
            extend = getattr(self.gen, "extend", None)  # consumes self.state: may reuse its spare batch rows
            self.state = extend(self.state, state) if extend else self.gen.concat([self.state, state])
            new_slots = list(range(self.n_slots, self.n_slots + len(trajs)))
            self.n_slots += len(trajs)
        self.rows.extend(trajs)
        self.slots.extend(new_slots)
        for traj in trajs:
            self.decision_rounds.join(traj, new_global=new_globals)

    def _add_children(self, children: list[tuple[Any, list[Trajectory], list[int] | None]]) -> list[Trajectory]:
        """Adds `_decide_branches`' (source, children, rows) to the decode state and returns the children.

        First, when the children will not fit in the free rows, the state's batch grows (`reserve`), so the
        old and the grown state are the only whole caches alive while it is copied. Then the sources are
        made one at a time, each placed before the next is made, so one child state is alive at once:
        children from marks (`MarkedRows`) are forked from their parents' rows and placed in free rows
        that no later source's parent holds (a finished parent's row is free, but its children are still
        to be copied from it); when those rows are too few, every remaining source is forked before any
        is placed. `PREFILL` children are prefilled. No child state outlives its copy into the decode state."""
        self._reserve_rows(sum(len(trajs) for _, trajs, _ in children))
        added = []
        while children:
            later_parents = {slot for source, _, _ in children[1:] if isinstance(source, MarkedRows)
                             for slot in source.parent_slots}
            free = set(range(self.n_slots)) - set(self.slots)
            if later_parents and len(free - later_parents) < len(children[0][1]):
                self._make_children(children, len(children))
                later_parents = set()
            else:
                self._make_children(children, 1)
            state, trajs, rows = children.pop(0)
            self._add_rows(state, trajs, rows, avoid=later_parents)
            added += trajs
            del state
        return added

    def _make_children(self, children: list[tuple[Any, list[Trajectory], list[int] | None]], count: int) -> None:
        """The first `count` sources of `children` made into states in place (forked from marks, prefilled)."""
        for i, (source, trajs, rows) in enumerate(children[:count]):
            if isinstance(source, MarkedRows):
                children[i] = (self.gen.fork_marked(self.state, source.parent_slots, source.marks, rows), trajs, None)
            elif isinstance(source, str) and source == PREFILL:
                children[i] = (self.gen.prefill([c.prompt_ids + c.response_ids for c in trajs]), trajs, None)

    def _by_slot(self, per_row: Sequence[Any], fill: Any) -> list[Any]:
        """A per-row list laid out over the decode state's rows (`fill` in free rows)."""
        out = [fill] * self.n_slots
        for slot, value in zip(self.slots, per_row, strict=True):
            out[slot] = value
        return out

    def _set_dense(self, state: Any) -> None:
        """self.state becomes `state`, whose row i holds self.rows[i] (a repack or a compaction)."""
        self.state, self.slots, self.n_slots = state, list(range(len(self.rows))), len(self.rows)

    # ----- one round -----------------------------------------------------------------------
    def execute(self, inits: list[int]) -> LoopResult:
        self._new_globals([p for p, n in enumerate(inits) for _ in range(n)],
                          "premonitor" if self.premonitor is not None else "initial")
        if self.premonitor is not None:
            self.premonitoring = {p: self.groups[p][0] for p in range(len(self.prompts))}
        self._top_up()
        if self.cfg.schedule == "continuous":
            # As many threads as the tool runner runs calls at once: its limit, not this pool, caps them.
            self.tool_threads = int(getattr(self.loop.tools, "max_workers", None) or TOOL_THREADS)
            self.pool = ThreadPoolExecutor(max_workers=self.tool_threads, thread_name_prefix="agent-tool")
            try:
                self._run_continuous()
            except BaseException:
                # Fail at once: queued calls are cancelled, and calls in flight finish on their own, unread
                # (leaving a `with` block would wait for every queued call to run first).
                self.pool.shutdown(wait=False, cancel_futures=True)
                raise
            self.pool.shutdown(wait=True)
        else:
            self._run_rounds()
        counters = {name: int(v - self.counters_start.get(name, 0)) for name, v in self.gen.counters.items()}
        counters["forward_tokens"] = forward_tokens(counters)
        return LoopResult(self.groups, self.events, self.round, counters, self.repacks)

    def _run_rounds(self) -> None:
        self.prompt_rounds.begin(self.rows)
        while self.rows or self.replays.any_left():
            self.round += 1
            outputs = self._decode() if self.rows else []
            if self.cfg.decision_entropy == "after_result":
                children = self._decide_branches(outputs)  # the results of the round before, now measured
                self._run_tools(outputs)
            else:  # the released code's order: this round's results, read by the segments that made the calls
                self._run_tools(outputs)
                children = self._decide_branches(outputs)
            new_per_prompt = [0] * len(self.prompts)
            # The children go into the rows finished rows free before any shrink: a shrink copies the
            # whole state, and no child state is then alive beside the two copies.
            self._compact(shrink=False)
            for t in self._add_children(children):
                new_per_prompt[t.prompt_index] += 1
            self._shrink()
            before = len(self.events)
            self._top_up()
            for e in self.events[before:]:
                new_per_prompt[e.prompt_index] += 1
            ended = self.prompt_rounds.end_tick(self.rows, new_per_prompt)
            if self.policy is not None:
                self.policy.end_round(ended)

    def _limit(self, traj: Trajectory) -> int:
        return min(self.cfg.max_response_tokens - len(traj.response_ids), self.cfg.max_context_len - traj.total_length)

    def _cache_room(self) -> list[int] | None:
        """Slots left in the generator's cache for each row, if it reports them: after each row's own
        cursor for ragged rows (the real Sampler's `cursors`), after the shared cursor otherwise."""
        capacity = getattr(self.gen, "max_cache_len", None)
        if capacity is None or self.state is None:
            return None
        cursors = getattr(self.state, "cursors", None)
        if cursors is not None:
            return [int(capacity) - int(cursors[slot]) for slot in self.slots]
        cursor = getattr(self.state, "cursor", None)
        return None if cursor is None else [int(capacity) - int(cursor)] * len(self.rows)

    def _repack_if_needed(self, needed: Sequence[int]) -> None:
        """Re-prefill the active rows when some row has no cache room for its `needed[i]` more slots.

        Only a generator whose rows share one write cursor gets there: that cursor
        only grows (concat aligns to the largest), so over many rounds it can
        outrun the cache even though every row is within its own context limit.
        Re-prefilling the rows' exact ids packs them again; its cost shows in the
        prefill counter. Ragged rows (the Sampler's) never need more room than
        their own length, so with `cache_slots` they never repack.
        """
        room = self._cache_room()
        if room is None or all(r >= n for r, n in zip(room, needed, strict=True)):
            return
        self._set_dense(self.gen.prefill([t.prompt_ids + t.response_ids for t in self.rows]))
        self.repacks += 1

    def _decode(self) -> list[tuple[list[int], str] | None]:
        """Generate one segment per row; record tokens, segments and H_init. Returns (ids, stop) per row,
        None for a row waiting on a tool result (it gets no budget)."""
        if self.round > 1:  # a rollout ahead of training: the trainer's waiting programs go first (the
            offer_device_turn()  # first decode goes on, so the first tool calls overlap the trainer's work)
        self.key, sub = jax.random.split(self.key)
        limits = [0 if t.traj_id in self.waiting or t.finished else self._limit(t) for t in self.rows]
        if self.cfg.max_segment_tokens is not None:
            limits = [min(n, self.cfg.max_segment_tokens) for n in limits]
        if self.cfg.schedule == "continuous":  # one chunk
            limits = [min(n, self.cfg.chunk_tokens) for n in limits]
        self._repack_if_needed(limits)
        room = self._cache_room()
        if room is not None:
            limits = [max(0, min(n, r)) for n, r in zip(limits, room, strict=True)]
        # The released measure reads vLLM-style top-10 log-probs; only it asks the sampler for them.
        top_k = {"top_logprobs": TOP_LOGPROBS} if self.cfg.entropy_measure == "top10_sum" else {}
        extra = dict(top_k)
        if getattr(self.gen, "continues_stops", False):  # a paused segment's stop (a tag) may be half written
            going_on = [self._paused_segment_ids(t) for t in self.rows]
            if any(going_on):
                extra["continue_ids"] = self._by_slot(going_on, [])
        self.state, out = self.gen.generate(self.state, self._by_slot(limits, 0), sub, **extra)
        self.generated_this_round = [int(out.num_tokens[slot]) for slot in self.slots]
        results = []
        top = None
        if getattr(out, "top_logprobs", None) is not None:
            top = reported_logprobs(out.top_logprobs, out.top_ids, out.tokens, out.logp)  # [B, N, 11]
        for traj, i in zip(self.rows, self.slots, strict=True):
            if traj.traj_id in self.waiting or traj.finished:  # (finished: awaits its decision, `continuous`)
                results.append(None)
                continue
            n = int(out.num_tokens[i])
            ids = [int(x) for x in out.tokens[i, :n]]
            start = len(traj.response_ids)
            traj.add_generated(ids, out.logp[i, :n].tolist(), out.entropy[i, :n].tolist())
            head_top = None if top is None else np.asarray(top[i, :n])
            last = traj.segments[-1] if traj.segments else None
            if n > 0 and traj.traj_id in self.paused and last is not None and last.end == start:
                self._continue_segment(traj, last, start + n, head_top)
            elif n > 0:
                self._open_segment(traj, start, start + n, head_top)
            segment_start = traj.segments[-1].start if traj.segments else start
            results.append((traj.response_ids[segment_start:], str(out.stop_reason[i])))
        self.paused = set()
        return results

    def _paused_segment_ids(self, traj: Trajectory) -> list[int]:
        """The ids of the segment a paused row goes on with ([] for any other row)."""
        last = traj.segments[-1] if traj.segments else None
        if traj.traj_id not in self.paused or traj.traj_id in self.waiting or last is None \
                or last.end != len(traj.response_ids):
            return []
        return traj.response_ids[last.start:]

    def _pauses(self, row: int, stop: str) -> bool:
        """True when row `row` stopped mid-segment (chunk or cache room) and continues next round."""
        return stop == "length" and self._limit(self.rows[row]) > 0 and self.generated_this_round[row] > 0

    def _compact(self, shrink: bool = True) -> None:
        """Drop finished rows (and rows with no budget left) from the decode state, and with `shrink`
        copy the rest into a smaller batch when that pays (`_shrink`). A row waiting on a tool result
        stays: appending the result decides whether it still fits (as in a round)."""
        for traj in self.rows:
            if not traj.finished and traj.traj_id not in self.waiting and self._limit(traj) <= 0:
                out_of_response = len(traj.response_ids) >= self.cfg.max_response_tokens
                traj.stop_reason = END_LENGTH if out_of_response else END_CONTEXT
        # A finished row whose branch decision is still to be drawn (`continuous`) keeps its row: its snapshot.
        keep = [i for i, t in enumerate(self.rows) if not t.finished or t.traj_id in self.pending]
        if len(keep) == len(self.rows):
            return
        self.rows, self.slots = [self.rows[i] for i in keep], [self.slots[i] for i in keep]
        if shrink:
            self._shrink()

    def _shrink(self) -> None:
        """Copy the live rows into a dense state of a smaller batch, when that halves the batch at least;
        otherwise ragged rows (the Sampler's) leave the free rows for the next branches and top-ups (a
        copy into the same batch bucket would cost a second cache in memory while it is made, and save
        no compute)."""
        if not self.rows:
            self.state, self.slots, self.n_slots = None, [], 0
            return
        if len(self.rows) == self.n_slots:
            return
        if self.cfg.schedule == "continuous" and 2 * len(self.rows) > self.n_slots:
            return
        ragged = getattr(self.state, "cursors", None) is not None  # (a shared-cursor generator stays dense)
        if ragged and next_power_of_two(len(self.rows)) >= next_power_of_two(self.n_slots):
            return
        self._set_dense(self.gen.fork(self.state, self.slots))

    def _top_up(self) -> None:
        """One new global per prompt with no active trajectory and fewer than k (spec 2.2 step 4)."""
        self._end_premonitoring()
        short = [p for p in range(len(self.prompts)) if self._active(p) == 0 and len(self.groups[p]) < self.ks[p]]
        self._new_globals(short, "topup")


    def _end_premonitoring(self) -> None:
        """Prompts whose pre-monitoring sample has finished get their initial globals (`premonitor`), and the
        sample replays its branch decisions from the next round on."""
        starts: list[int] = []
        for p, traj in list(self.premonitoring.items()):
            if not traj.finished:
                continue
            del self.premonitoring[p]
            more = int(self.premonitor(traj))
            if more < 0 or len(self.groups[p]) + more > self.ks[p]:
                raise ValueError(f"premonitor asked for {more} more globals for prompt {p} with k={self.ks[p]}")
            if traj.tool_steps:
                self.replays.add(traj, self._prompt_round(p) + 1)
            starts += [p] * more
        self._new_globals(starts, "initial")
