"""Each prompt's own rounds of the agent loop: what a lockstep round is to one prompt.

A reused sample's branch decisions and the prompt-scope consecutive-branch counter count rounds (spec
2.3). Under `continuous` a tick decodes one chunk and a prompt's rows reach their tool results ticks
apart; under `rounds` with `max_segment_tokens`, a round can end with rows mid-segment. Counted per
prompt as here, a round means the same in both: every row the prompt had live has taken its next step.
"""

from __future__ import annotations

from aepo_jax.agent.trajectory import Trajectory


class PromptRounds:
    """A prompt's round ends once every row it had live when the round began has reached a tool result
    (appended) or finished, as a lockstep round without `max_segment_tokens` ends for all rows at once
    (so there a prompt's rounds are the loop's). Rows that start during a round (branches, top-ups)
    join the next."""

    def __init__(self, num_prompts: int) -> None:
        self.index = [1] * num_prompts  # the round each prompt is in
        self._members: list[list[tuple[Trajectory, int]]] = [[] for _ in range(num_prompts)]
        self._new = [0] * num_prompts  # trajectories each prompt got in its current round

    def begin(self, live: list[Trajectory]) -> None:
        """Round 1 of every prompt holds the rows live when the run starts."""
        for p in range(len(self.index)):
            self._members[p] = self._live_of(live, p)

    def end_tick(self, live: list[Trajectory], new: list[int]) -> list[int | None]:
        """Counts the loop round's (or tick's) `new` trajectories per prompt and ends the prompts' rounds
        that are over. Returns, per prompt, the trajectories its round got if it ended now, else None."""
        ended: list[int | None] = []
        for p, members in enumerate(self._members):
            self._new[p] += new[p]
            if not all(t.finished or len(t.tool_steps) > steps for t, steps in members):
                ended.append(None)
                continue
            ended.append(self._new[p])
            self._new[p] = 0
            self.index[p] += 1
            self._members[p] = self._live_of(live, p)
        return ended

    @staticmethod
    def _live_of(live: list[Trajectory], prompt: int) -> list[tuple[Trajectory, int]]:
        return [(t, len(t.tool_steps)) for t in live if t.prompt_index == prompt and not t.finished]
