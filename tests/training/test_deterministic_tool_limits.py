"""`deterministic=True` (issue 17): the python tool is bounded by CPU time, not wall clock.

The two seeded runs of `python -m launch.train` that must write identical
metrics are in tests/launch/test_train_cli.py (the second one reuses the CLI
test's run).
"""

from __future__ import annotations


def test_deterministic_bounds_the_python_tool_by_cpu_time_not_wall_clock():
    """A call that sleeps past `tool_timeout_s` but uses almost no CPU: the default
    wall-clock limit stops it (on a slow enough machine any call could be stopped
    so), `deterministic=True` lets it finish; a CPU-bound loop is stopped either way."""
    from aepo_jax.experiment import DETERMINISTIC_WALL_FACTOR, sandbox_limits
    from aepo_jax.tools import PythonSandbox
    from configs.base import get_base_config

    cfg = get_base_config()
    cfg.rollout.tool_timeout_s = 1.0
    assert sandbox_limits(cfg).wall_seconds == 1.0
    sleeper, spinner = "import time\ntime.sleep(1.5)\nprint('done')", "while True:\n    pass"
    with PythonSandbox(sandbox_limits(cfg), pool_size=1) as sandbox:
        assert sandbox.run(sleeper).status == "timeout"
    cfg.deterministic = True
    limits = sandbox_limits(cfg)
    assert (limits.cpu_seconds, limits.wall_seconds) == (1, DETERMINISTIC_WALL_FACTOR * 1.0)
    with PythonSandbox(limits, pool_size=1) as sandbox:
        slept = sandbox.run(sleeper)
        assert (slept.status, slept.stdout) == ("ok", "done\n")
        spun = sandbox.run(spinner)
        assert spun.status == "timeout" and "CPU-time limit" in spun.traceback


def test_the_registry_deadline_waits_past_the_sandboxs_wall_clock_backstop():
    """With `deterministic=True` the sandbox may run a call for DETERMINISTIC_WALL_FACTOR x `tool_timeout_s` of
    wall clock, but the registry abandoned it at `tool_timeout_s` + 30 s (at 4 s: a sleep of 36 s timed out at
    34 s), so a call within its CPU time could time out on a loaded machine after all."""
    from aepo_jax.experiment import sandbox_limits, tools_from
    from configs.base import get_base_config

    cfg = get_base_config()
    cfg.rollout.tool_timeout_s = 4.0
    cfg.rollout.tool_concurrency = 1
    for deterministic in (False, True):
        cfg.deterministic = deterministic
        registry, closers = tools_from(cfg, None)
        try:
            assert registry.deadline_s > sandbox_limits(cfg).wall_seconds >= 4.0
        finally:
            for close in closers:
                close()


def test_deterministic_refuses_loop_settings_whose_results_depend_on_timing():
    """`deterministic=True` promises a seeded run repeats; the continuous schedule (which tick a tool
    result is folded in at) and background compiles (a larger compiled variant until the exact one is
    ready) break that, so the composition root refuses them by name. `rounds` with the default stays."""
    import pytest

    from aepo_jax.experiment import loop_config_from
    from configs.base import get_base_config

    cfg = get_base_config()
    cfg.deterministic = True
    assert loop_config_from(cfg).timing_dependent == []  # rounds, background_compile "auto" -> off
    cfg.rollout.background_compile = "off"
    assert loop_config_from(cfg).schedule == "rounds"
    cfg.rollout.schedule = "continuous"
    with pytest.raises(ValueError, match=r"deterministic=True .* rollout\.schedule='continuous'"):
        loop_config_from(cfg)
    cfg.rollout.schedule = "rounds"
    cfg.rollout.background_compile = "on"
    with pytest.raises(ValueError, match=r"rollout\.background_compile='on' under rollout\.schedule='rounds'"):
        loop_config_from(cfg)
    cfg.deterministic = False  # without the promise every setting is allowed
    cfg.rollout.schedule = "continuous"
    assert len(loop_config_from(cfg).timing_dependent) == 2
