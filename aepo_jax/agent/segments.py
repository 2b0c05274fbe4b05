"""Segments of the agent loop: where a row's generated text starts and stops between tool calls, and the
entropy each is measured by (spec 1; its first K tokens, across chunk boundaries)."""

from __future__ import annotations

import numpy as np

from aepo_jax.agent.entropy import segment_entropy, top10_sum_entropy
from aepo_jax.agent.trajectory import Segment, Trajectory


class SegmentMeasures:
    """The segment methods of the loop's per-run state (`loop._Run`), which provides cfg, loop and
    segment_tops."""

    def _open_segment(self, traj: Trajectory, start: int, end: int, top: np.ndarray | None) -> None:
        """A new segment; the first one of a lineage root sets `H_init`."""
        h = self._segment_entropy(traj.entropy[start:end], top)
        after_tool = bool(traj.tool_steps) and traj.tool_steps[-1].result_end == start
        traj.segments.append(Segment(start, end, h, after_tool))
        if traj.h_init is None:
            traj.h_init = h
        self.segment_tops.pop(traj.traj_id, None)
        if end - start < self.cfg.entropy_tokens and top is not None:
            self.segment_tops[traj.traj_id] = top

    def _continue_segment(self, traj: Trajectory, segment: Segment, end: int, top: np.ndarray | None) -> None:
        """A paused segment goes on; while it holds fewer than K tokens its entropy is re-measured.

        A chunk can stop short of K tokens (cache room, budget), so the first
        measurement may average fewer; the segment's entropy is then taken
        again over its first K tokens across the chunk boundary (and `H_init`
        with it when this is the root's first segment).
        """
        measured = segment.end - segment.start
        segment.end = end
        if measured >= self.cfg.entropy_tokens:
            return  # its first K tokens are already measured
        earlier = self.segment_tops.pop(traj.traj_id, None)
        head = top if earlier is None or top is None else np.concatenate([earlier, top])
        segment.entropy = self._segment_entropy(traj.entropy[segment.start:end], head)
        if segment.start == 0:  # the lineage root's first segment: branches only copy complete ones
            traj.h_init = segment.entropy
        if end - segment.start < self.cfg.entropy_tokens and head is not None:
            self.segment_tops[traj.traj_id] = head

    def _segment_entropy(self, token_entropy: list[float], top_logprobs: np.ndarray | None) -> float:
        if self.cfg.entropy_measure == "exact_mean":
            return segment_entropy(token_entropy, self.cfg.entropy_tokens)
        if top_logprobs is None:
            raise ValueError("entropy_measure='top10_sum' needs the generator to return top_logprobs [B, N, 10] "
                             "(and top_ids) from generate(..., top_logprobs=10)")
        return top10_sum_entropy(top_logprobs, self.loop.tokenizer.vocab_size, self.cfg.entropy_tokens)
