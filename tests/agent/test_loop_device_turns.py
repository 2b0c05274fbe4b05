"""The agent loop's hooks into `parallel.device_turns` (what a rollout running ahead of training does with
the turn it holds): it lets the turn go while its tools run, and before each decode but the first it offers
the turn to a thread waiting for it, in both schedules."""

from __future__ import annotations

import threading

import jax
import numpy as np
import pytest

from aepo_jax.agent.loop import AgentLoop, LoopConfig
from aepo_jax.agent.scripted import ScriptedGenerator
from aepo_jax.parallel.device_turns import DeviceTurns
from tests.agent.test_loop import TOK, RecordingTools, segments_script

TIMEOUT_S = 30
SCRIPT = ["<search>alpha</search>", "<python>print(1)</python>", "<search>beta</search>", "<answer>\\boxed{2}</answer>"]


@pytest.mark.parametrize("schedule", ["rounds", "continuous"])
def test_a_rollout_lets_the_turn_go_for_its_tools_and_offers_it_before_each_later_decode(schedule):
    turns = DeviceTurns(drain=lambda: None)
    rollout = threading.get_ident()
    decodes, tool_batches, trainer_turns, trainers = [], [], [], []

    def trainer(n: int) -> None:  # a trainer thread waiting for the turn once
        with turns.turn():
            trainer_turns.append(n)

    class Tools(RecordingTools):
        def run_many(self, calls):
            # The rounds schedule calls the tools on the rollout's thread, the continuous one on tool threads.
            tool_batches.append(turns._owner == rollout)
            return super().run_many(calls)

    class Generator(ScriptedGenerator):
        def generate(self, *args, **kwargs):
            decodes.append((turns.holds(), list(trainer_turns)))
            thread = threading.Thread(target=trainer, args=(len(decodes),), daemon=True)
            thread.start()  # queued before this decode ends, so the next decode's offer finds it waiting
            trainers.append(thread)
            while not turns.waiting():
                pass
            return super().generate(*args, **kwargs)

    config = LoopConfig(max_tool_calls=6, max_response_tokens=2000, max_context_len=4000, schedule=schedule)
    loop = AgentLoop(Generator(segments_script(SCRIPT)), TOK, Tools(), config)
    with turns.turn():
        trainers.append(threading.Thread(target=trainer, args=(0,), daemon=True))
        trainers[0].start()  # waiting before the rollout starts: it gets its turn after the first decode
        while not turns.waiting():
            pass
        result = loop.run([TOK.encode("q0")], 1, 1, rng=np.random.default_rng(0), key=jax.random.key(0))
    for thread in trainers:
        thread.join(TIMEOUT_S)
    assert result.groups[0][0].num_tool_calls == 3
    assert len(decodes) >= 4 and all(held for held, _ in decodes)  # decodes run in the rollout's turn
    assert decodes[0][1] == []  # the first decode went on: the waiting trainer took no turn before it
    # Trainer n queued during decode n (n = 0: before the rollout); each had its turn before the next decode.
    assert all(set(range(n + 1)) <= set(before) for n, (_, before) in enumerate(decodes) if n >= 1), decodes
    if schedule == "rounds":  # the rollout held no turn while its tools ran (the continuous schedule decodes
        assert tool_batches and not any(tool_batches)  # other rows meanwhile, in its turn)
    assert sorted(trainer_turns) == list(range(len(decodes) + 1))


def test_the_continuous_schedule_lets_the_turn_go_while_it_waits_for_tool_results():
    """With every row waiting on a tool, the continuous schedule waits for the results without the turn: a
    trainer thread that asks for the turn while a tool call runs gets it before that call returns."""
    turns = DeviceTurns(drain=lambda: None)
    got_turn_during_call = []

    def trainer() -> None:
        with turns.turn():
            pass

    class Tools(RecordingTools):
        def run_many(self, calls):  # on a tool thread, while the rollout's thread waits for the result
            thread = threading.Thread(target=trainer, daemon=True)
            thread.start()
            thread.join(5.0)
            got_turn_during_call.append(not thread.is_alive())
            return super().run_many(calls)

    config = LoopConfig(max_tool_calls=6, max_response_tokens=2000, max_context_len=4000, schedule="continuous")
    loop = AgentLoop(ScriptedGenerator(segments_script(SCRIPT)), TOK, Tools(), config)
    with turns.turn():
        result = loop.run([TOK.encode("q0")], 1, 1, rng=np.random.default_rng(0), key=jax.random.key(0))
    assert result.groups[0][0].num_tool_calls == 3
    assert got_turn_during_call == [True, True, True]
