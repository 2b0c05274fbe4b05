"""`Sampler(compile_in_background=True)`: a shape not compiled yet runs as a compiled larger variant
while the exact one compiles on a background thread, which the next call then uses without compiling.

Each test builds its own model (a fresh graphdef), so no program it needs was compiled by another test.
"""

import os
import sys
import threading

import jax
import numpy as np
import pytest
from flax import nnx

from aepo_jax.models import Decoder, get_preset
from aepo_jax.sampling import Sampler, SamplingParams
from aepo_jax.sampling.compile_ahead import COMPILE_THREAD_NICENESS, BackgroundCompiler
from aepo_jax.sampling.program_runs import DECODE_WINDOW, MIN_SPAN
from tests.sampling.conftest import random_prompts

GREEDY = SamplingParams(greedy=True)
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_COMPILES: list[float] = []


def _count(event: str, seconds: float, **_) -> None:
    """Records the compiles a call waits for (those on the calling thread, not the background one)."""
    if event == BACKEND_COMPILE_EVENT and not threading.current_thread().name.startswith("sampler-compile"):
        _COMPILES.append(seconds)


jax.monitoring.register_event_duration_secs_listener(_count)


def _fresh_model(seed: int):
    """A tiny decoder of its own (a graphdef no other test compiled programs for)."""
    model = Decoder(get_preset("tiny", d_model=64 + 16 * seed), rngs=nnx.Rngs(seed))
    return nnx.split(model)


def _samplers(seed: int, mesh=None):
    graphdef, state = _fresh_model(seed)
    make = lambda background: Sampler(graphdef, state, params=GREEDY, max_cache_len=512, min_cache_len=512,
                                      compile_in_background=background, mesh=mesh)
    return make(True), make(False)


def _assert_same_scored_appends(ours, plain, token_lists) -> None:
    """Two samplers' (logp, entropy, cursors, last logits) after the same `score_append` agree, with one
    score per appended token."""
    for a, b in zip(ours[0] + ours[1], plain[0] + plain[1], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert [len(x) for x in ours[0]] == [len(x) for x in token_lists]
    assert ours[2].tolist() == plain[2].tolist()
    np.testing.assert_allclose(ours[3], plain[3], rtol=1e-5, atol=1e-5)


def test_a_new_decode_span_runs_as_a_compiled_longer_one_then_as_its_own_once_compiled():
    sampler, plain = _samplers(1)
    long_prompts, short_prompts = random_prompts(1, [150, 9]), random_prompts(2, [5, 12])
    sampler.generate(sampler.prefill(long_prompts), 20)  # compiles a window of 32 steps over 192 slots
    assert sampler.last_decode_spans == [192]
    _, out = sampler.generate(sampler.prefill(short_prompts), 20)  # needs 64 slots: not compiled yet
    assert sampler.last_decode_spans == [192]
    assert sampler.compile_counters["fallback_calls"] >= 1
    _, expected = plain.generate(plain.prefill(short_prompts), 20)
    assert out.tokens.tolist() == expected.tokens.tolist()
    np.testing.assert_allclose(out.logp, expected.logp, rtol=1e-5, atol=1e-6)
    sampler.wait_for_compiles()
    before = len(_COMPILES)
    _, again = sampler.generate(sampler.prefill(short_prompts), 20)
    assert sampler.last_decode_spans == [MIN_SPAN]
    assert len(_COMPILES) == before, "the background compile was not the program the call then ran"
    assert sampler.compile_counters["background_compiles"] >= 1
    assert again.tokens.tolist() == expected.tokens.tolist()


def test_without_the_option_every_window_runs_its_exact_span():
    _, plain = _samplers(2)
    plain.generate(plain.prefill(random_prompts(3, [150])), 20)
    plain.generate(plain.prefill(random_prompts(4, [5])), 20)
    assert plain.last_decode_spans == [MIN_SPAN]
    assert plain.compile_counters == {"fallback_calls": 0, "background_compiles": 0, "held_compiles": 0}


def test_a_new_block_length_runs_as_a_compiled_longer_block_with_the_same_scores():
    sampler, plain = _samplers(3)
    prompts = random_prompts(5, [6, 3, 9])
    long_results, short_results = random_prompts(6, [40, 2, 17]), random_prompts(7, [5, 0, 3])
    outputs = []
    for s in (sampler, plain):
        st = s.prefill(prompts)
        st, _, _ = s.score_append(st, long_results)  # a 64-token block
        st, logp, entropy = s.score_append(st, short_results)  # an 8-token block: runs as 64 in the first
        st, out = s.generate(st, DECODE_WINDOW // 2)
        outputs.append((logp, entropy, out, np.asarray(st.cursors)))
    (logp_a, entropy_a, out_a, cursors_a), (logp_b, entropy_b, out_b, cursors_b) = outputs
    assert sampler.compile_counters["fallback_calls"] >= 1
    assert [len(x) for x in logp_a] == [5, 0, 3]
    for a, b in zip(logp_a + entropy_a, logp_b + entropy_b, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert cursors_a.tolist() == cursors_b.tolist()
    assert out_a.tokens.tolist() == out_b.tokens.tolist()


def test_an_append_to_a_few_rows_runs_over_the_whole_batch_while_its_sub_batch_program_compiles():
    """Two of 16 rows receive tokens: that is a sub-batch append (a quarter of the batch), whose program
    no call compiled yet; it runs as the compiled whole-batch block, with the same scores, and once
    the sub-batch program is compiled in the background the next such append runs it, compiling nothing."""
    sampler, plain = _samplers(5)
    prompts = random_prompts(12, [6 + r % 5 for r in range(16)])
    few = [random_prompts(13, [5])[0] if r in (3, 11) else [] for r in range(16)]
    outputs = []
    for s in (sampler, plain):
        st = s.prefill(prompts)
        st, _, _ = s.score_append(st, random_prompts(14, [40] * 16))  # every row: the whole-batch 64-token block
        st, logp, entropy = s.score_append(st, few)
        outputs.append((logp, entropy, np.asarray(st.cursors), np.asarray(st.last_logits[:16])))
    assert sampler.compile_counters["fallback_calls"] == 1
    _assert_same_scored_appends(*outputs, few)
    sampler.wait_for_compiles()
    before = len(_COMPILES)
    st = sampler.prefill(prompts)
    st, _, _ = sampler.score_append(st, random_prompts(14, [40] * 16))
    sampler.score_append(st, few)
    assert len(_COMPILES) == before, "the sub-batch append compiled on the spot"
    assert sampler.compile_counters["fallback_calls"] == 1


def test_a_call_does_not_wait_behind_background_compiles_queued_before_its_own():
    """The compile thread is busy with one program and another's compile is queued behind it; a call
    that needs the queued one drops it from the queue and goes on (compiling on the spot) instead of
    waiting for the busy one to finish first."""
    gate = threading.Event()

    @jax.jit
    def busy(x):
        gate.wait(30)  # holds the compile thread while it traces
        return x * 2

    @jax.jit
    def queued(x):
        return x + 3

    compiler = BackgroundCompiler(True)
    compiler.compile_later("busy", busy, (np.ones(2, np.float32),), {})
    compiler.compile_later("queued", queued, (np.ones(2, np.float32),), {})
    assert compiler.choose(["queued"]) == 0
    assert compiler.background_compiles == 0 and not gate.is_set()  # it did not wait for "busy"
    gate.set()
    compiler.wait()
    assert compiler.background_compiles == 1  # "busy" only: "queued" left the queue


def _traced_program(traces: list[str], name: str):
    """A jitted program that records `name` each time it is traced (so each time it is compiled)."""

    @jax.jit
    def program(x):
        traces.append(name)
        return x * 2

    return program


def test_compiles_asked_for_inside_held_start_when_the_outermost_block_ends():
    traces: list[str] = []
    compiler = BackgroundCompiler(True)
    compiler.ran("larger")
    with compiler.held():
        compiler.compile_later("a", _traced_program(traces, "a"), (np.ones(2, np.float32),), {})
        with compiler.held():
            compiler.compile_later("b", _traced_program(traces, "b"), (np.ones(3, np.float32),), {})
        compiler.wait()  # nothing is under way: both wait in the queue
        assert traces == [] and compiler.background_compiles == 0 and compiler.held_compiles == 0
        assert compiler.choose(["a", "larger"]) == 1  # the compiled larger variant runs meanwhile
    compiler.wait()
    assert sorted(traces) == ["a", "b"]
    assert (compiler.background_compiles, compiler.held_compiles) == (2, 2)
    assert compiler.choose(["a", "larger"]) == 0 and compiler.fallback_calls == 1


def test_a_held_compile_that_a_call_compiles_on_the_spot_leaves_the_queue():
    """No compiled variant holds "a": the call compiles it on the spot, so the end of the block does
    not compile it a second time."""
    traces: list[str] = []
    compiler = BackgroundCompiler(True)
    with compiler.held():
        compiler.compile_later("a", _traced_program(traces, "a"), (np.ones(2, np.float32),), {})
        assert compiler.choose(["a", "a-larger"]) == 0
        compiler.ran("a")
    compiler.wait()
    assert traces == [] and compiler.background_compiles == 0 and compiler.held_compiles == 0


def test_a_held_block_ends_its_queue_even_when_it_raises():
    traces: list[str] = []
    compiler = BackgroundCompiler(True)
    with pytest.raises(RuntimeError, match="rollout failed"), compiler.held():
        compiler.compile_later("a", _traced_program(traces, "a"), (np.ones(2, np.float32),), {})
        raise RuntimeError("rollout failed")
    compiler.wait()
    assert traces == ["a"] and compiler.held_compiles == 1


def test_a_sampler_holds_a_new_spans_compile_until_the_block_ends_then_runs_it():
    """Inside `compiles_held()` a new decode span runs as the compiled longer one and nothing compiles;
    after the block its own program compiles in the background, and the next call runs it."""
    sampler, _ = _samplers(6)
    sampler.generate(sampler.prefill(random_prompts(15, [150, 9])), 20)  # a window over 192 slots
    sampler.wait_for_compiles()  # (and the whole-cache window it queued)
    done = sampler.compile_counters["background_compiles"]
    short = random_prompts(16, [5, 12])
    with sampler.compiles_held():
        before = len(_COMPILES)
        sampler.generate(sampler.prefill(short), 20)  # needs 64 slots: runs over 192
        assert sampler.last_decode_spans == [192]
        sampler.wait_for_compiles()
        assert sampler.compile_counters["background_compiles"] == done
        assert len(_COMPILES) == before, "the call compiled on the spot instead of running the longer span"
    sampler.wait_for_compiles()
    assert sampler.compile_counters["background_compiles"] > done and sampler.compile_counters["held_compiles"] >= 1
    before = len(_COMPILES)
    sampler.generate(sampler.prefill(short), 20)
    assert sampler.last_decode_spans == [MIN_SPAN]
    assert len(_COMPILES) == before, "the held compile was not the program the call then ran"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread niceness is Linux's")
def test_the_compile_thread_runs_at_a_lower_priority_and_the_process_does_not():
    def niceness() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    seen = []

    @jax.jit
    def probe(x):
        seen.append(niceness())  # runs while the program is traced: on the compiling thread
        return x + 1

    main_before, process_before = niceness(), os.getpriority(os.PRIO_PROCESS, 0)
    compiler = BackgroundCompiler(True)
    compiler.compile_later("probe", probe, (np.ones(3, np.float32),), {})
    compiler.wait()
    assert seen == [COMPILE_THREAD_NICENESS] and COMPILE_THREAD_NICENESS > main_before
    assert compiler.background_compiles == 1
    assert (niceness(), os.getpriority(os.PRIO_PROCESS, 0)) == (main_before, process_before)


def test_background_compiles_on_a_mesh_are_the_programs_the_calls_then_run():
    if jax.device_count() < 8:
        pytest.skip("needs the 8 fake CPU devices set in tests/conftest.py")
    from aepo_jax.parallel import make_mesh

    mesh = make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    sampler, _ = _samplers(4, mesh=mesh)
    prompts = random_prompts(8, [7, 3, 11, 5])
    st = sampler.prefill(prompts)
    st, _, _ = sampler.score_append(st, random_prompts(9, [40, 1, 9, 2]))
    sampler.generate(sampler.prefill(random_prompts(10, [150])), 20)
    st = sampler.prefill(prompts)
    st, _, _ = sampler.score_append(st, random_prompts(11, [3, 1, 2, 4]))  # falls back to the 64-token block
    sampler.generate(st, 20)  # falls back to the 192-slot window
    assert sampler.compile_counters["fallback_calls"] >= 2
    sampler.wait_for_compiles()
    before = len(_COMPILES)
    st = sampler.prefill(prompts)
    st, _, _ = sampler.score_append(st, random_prompts(12, [2, 3, 1, 4]))
    sampler.generate(st, 20)
    assert sampler.last_decode_spans == [MIN_SPAN]
    assert len(_COMPILES) == before


SINGLE_DEVICE_SCRIPT = """
import json
from tests.sampling.test_compile_ahead import _COMPILES, _samplers, random_prompts
sampler, _ = _samplers(5)
sampler.generate(sampler.prefill(random_prompts(1, [150, 9])), 20)
short = random_prompts(2, [5, 12])
sampler.generate(sampler.prefill(short), 20)
fell_back = sampler.last_decode_spans
sampler.wait_for_compiles()
before = len(_COMPILES)
sampler.generate(sampler.prefill(short), 20)
print(json.dumps({"fell_back": fell_back, "exact": sampler.last_decode_spans, "compiles": len(_COMPILES) - before}))
"""


def test_on_one_device_without_a_compile_cache_the_background_compile_is_the_one_the_call_runs():
    """As a user runs it: one CPU device and no persistent compile cache (which would hide a program the
    call lowers differently from the background compile and then compiles again)."""
    import json
    import subprocess
    import sys

    from tests.child_process import child_env

    done = subprocess.run([sys.executable, "-c", SINGLE_DEVICE_SCRIPT], capture_output=True, text=True, timeout=300,
                          env=child_env(1, JAX_ENABLE_COMPILATION_CACHE="false"), check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"fell_back": [192], "exact": [MIN_SPAN], "compiles": 0}


def test_a_decode_over_most_of_a_batch_with_no_program_runs_in_two_halves_until_its_own_compiles():
    """Sixteen rows, twelve with a budget, and no decode program at batch 16 compiled (only the half-batch
    decode of 16 rows ran). The twelve decode in two compiled half batches, drawing what one decode
    draws, and the batch-16 decode compiles in the background; the next such call runs it."""
    sampler, plain = _samplers(7)
    prompts = random_prompts(17, [5 + r % 7 for r in range(16)])
    few = [8 if r < 6 else 0 for r in range(16)]
    many = [8 if r % 4 else 0 for r in range(16)]  # 12 rows
    sampler.generate(sampler.prefill(prompts), few)  # a half-batch decode: take, decode at 8, place
    before = len(_COMPILES)
    key = jax.random.key(3)
    _, out = sampler.generate(sampler.prefill(prompts), many, rng=key)
    assert len(_COMPILES) == before, "the decode compiled on the spot"
    assert sampler.compile_counters["fallback_calls"] == 1
    _, expected = plain.generate(plain.prefill(prompts), many, rng=key)
    assert out.tokens.shape == expected.tokens.shape
    assert out.tokens.tolist() == expected.tokens.tolist()
    assert out.num_tokens.tolist() == expected.num_tokens.tolist() == many
    assert out.stop_reason == expected.stop_reason
    for name in ("logp", "logp_truncated", "entropy"):
        np.testing.assert_allclose(getattr(out, name), getattr(expected, name), rtol=1e-5, atol=1e-6)
    sampler.wait_for_compiles()
    assert sampler.compile_counters["background_compiles"] >= 1
    before = len(_COMPILES)
    _, again = sampler.generate(sampler.prefill(prompts), many, rng=key)
    assert len(_COMPILES) == before, "the background compile was not the program the call then ran"
    assert sampler.compile_counters["fallback_calls"] == 1  # the whole-batch decode ran this time
    assert again.tokens.tolist() == expected.tokens.tolist()


def test_sample_outputs_merge_rows_of_another_padding_the_shorter_token_axis():
    from aepo_jax.sampling.state import SampleOutput

    def output(width, value, rows):
        tokens = np.full((3, width), -1, np.int32)
        tokens[rows] = value
        return SampleOutput(tokens=tokens, logp=tokens.astype(np.float32), logp_truncated=tokens.astype(np.float32),
                            entropy=tokens.astype(np.float32), num_tokens=np.asarray([width if r in rows else 0 for r in range(3)]),
                            stop_reason=["eos" if r in rows else "length" for r in range(3)],
                            stop_sequence_index=np.full((3,), -1))

    merged = output(2, 7, [0]).with_rows_of(output(4, 9, [2]), [2], pad_id=-1)
    assert merged.tokens.tolist() == [[7, 7, -1, -1], [-1, -1, -1, -1], [9, 9, 9, 9]]
    assert merged.logp[:, 2:].tolist() == [[0.0, 0.0], [0.0, 0.0], [9.0, 9.0]]
    assert merged.num_tokens.tolist() == [2, 0, 4] and merged.stop_reason == ["eos", "length", "eos"]
    assert merged.top_logprobs is None


def test_a_decode_queues_the_whole_cache_window_that_later_windows_of_its_batch_fall_back_to():
    """The first decode at a batch queues the longest window over the whole cache. A later window at that
    batch whose own span and every longer span but the whole cache are not compiled runs as it, compiling
    nothing on the spot, with the plain sampler's tokens."""
    sampler, plain = _samplers(8)
    short, long = random_prompts(18, [5, 9]), random_prompts(19, [300, 7])
    sampler.generate(sampler.prefill(short), 20)  # a window over 64 slots; queues the 32-step window over 512
    sampler.wait_for_compiles()
    state = sampler.prefill(long)
    before = len(_COMPILES)
    _, out = sampler.generate(state, 20)  # needs 384 slots: of the compiled windows, only the whole cache holds it
    assert sampler.last_decode_spans == [512]
    assert len(_COMPILES) == before, "a window compiled on the spot"
    _, expected = plain.generate(plain.prefill(long), 20)
    assert out.tokens.tolist() == expected.tokens.tolist()
    np.testing.assert_allclose(out.logp, expected.logp, rtol=1e-5, atol=1e-6)


def test_an_append_to_most_rows_runs_as_compiled_sub_batches_while_its_whole_batch_program_compiles():
    """Twelve of 16 rows receive tokens: a whole-batch append, whose program (this block, this span) no
    call compiled yet, while the quarter-batch program of the same block and span is. It runs as three
    quarter-batch pieces instead of compiling on the spot, with the tokens, scores and cursors of a plain
    sampler; once the whole-batch program is compiled in the background, the next such append runs it."""
    from aepo_jax.sampling.jitted import rows_scored_block_program, scored_block_program

    sampler, plain = _samplers(9)
    prompts = random_prompts(40, [6 + r % 5 for r in range(16)])
    few = [random_prompts(41, [5])[0] if r in (3, 11) else [] for r in range(16)]
    most = [random_prompts(42 + r, [3 + r % 4])[0] if r % 4 else [] for r in range(16)]  # rows 1-3, 5-7, ...
    calls, call = [], sampler._call

    def spy(kind, program, *args, **kwargs):
        calls.append(program)
        return call(kind, program, *args, **kwargs)

    outputs = []
    for s in (sampler, plain):
        st = s.prefill(prompts)
        st, _, _ = s.score_append(st, few)  # compiles the quarter-batch program of an 8-token block
        if s is sampler:
            sampler.wait_for_compiles()
            before, sampler._call = len(_COMPILES), spy
        st, logp, entropy = s.score_append(st, most)
        if s is sampler:
            sampler._call = call
            assert len(_COMPILES) == before, "the append compiled on the spot"
            assert calls == [rows_scored_block_program] * 3
        outputs.append((logp, entropy, np.asarray(st.cursors), np.asarray(st.last_logits[:16])))
    _assert_same_scored_appends(*outputs, most)
    sampler.wait_for_compiles()
    st = sampler.score_append(sampler.prefill(prompts), few)[0]
    calls.clear()
    sampler._call = spy
    before = len(_COMPILES)
    sampler.score_append(st, most)
    sampler._call = call
    assert len(_COMPILES) == before and calls == [scored_block_program]
