"""A pytest plugin for the suite's `-n 2 --dist loadfile` runs: a test whose worker process dies (a signal, not
a failure) runs once more on the replacement worker, and the run no longer hangs after a crash.

Why: XLA:CPU segfaulted a suite worker three times on 2026-12-05 (about 1 run in 6), always while compiling
the sampler's decode program, never alone (README, "Tests"). pytest-xdist 3.8.0 then
- reported the test failed although its file's scheduler ran it again on the replacement worker, and
- could hang for good (`LoadScopeScheduling.remove_node` puts a crashed worker's finished files back on the
  queue as empty work, and hands a replacement a last file with one test, which a worker never starts
  without a next one or a shutdown; pytest-xdist issues 1323, 1327, 1378).

Here the scheduler re-queues only the files with tests left (the crashed test first) and tells a worker
to finish once the queue is empty; the first crash of a test is reported as `rerun` (an `R`, and "1 rerun"
in the summary line, with the crash in the log), a second crash of the same test fails it. Registered by
tests/conftest.py (`register_under_xdist`).
"""

from __future__ import annotations

import pytest
from xdist.scheduler import LoadFileScheduling

RERUNS_ON_CRASH = 1


class CrashSafeLoadFileScheduling(LoadFileScheduling):
    """`--dist loadfile` that survives a worker crash (see the module docstring)."""

    def __init__(self, config, log=None) -> None:
        super().__init__(config, log)
        self.crashes: dict[str, int] = {}  # node id -> how many workers died running it

    def remove_node(self, node):
        workload = self.assigned_work.pop(node)
        crashitem = next((nodeid for unit in workload.values() for nodeid, done in unit.items() if not done), None)
        if crashitem is None:
            return None
        self.crashes[crashitem] = self.crashes.get(crashitem, 0) + 1
        if self.crashes[crashitem] > RERUNS_ON_CRASH:
            workload[self._split_scope(crashitem)][crashitem] = True  # failed for good: not run again
        unfinished = [(scope, unit) for scope, unit in workload.items() if not all(unit.values())]
        for scope, unit in reversed(unfinished):  # in their order, ahead of the queue
            self.workqueue[scope] = unit
            self.workqueue.move_to_end(scope, last=False)
        for other in self.assigned_work:
            self._reschedule(other)
        return crashitem

    def _reschedule(self, node) -> None:
        if node.shutting_down:
            return
        while self.workqueue and self._pending_of(self.assigned_work[node]) <= 2:
            self._assign_work_unit(node)
        if not self.workqueue:
            node.shutdown()  # the worker runs what it holds, its last test included, then finishes


class CrashRerunPlugin:
    """The scheduler above, and a test's first crash reported as a rerun."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.rerun: set[str] = set()  # crashed tests reported as reruns and not yet run to the end again

    @pytest.hookimpl(tryfirst=True)
    def pytest_xdist_make_scheduler(self, config, log):
        if config.getvalue("dist") == "loadfile":
            return CrashSafeLoadFileScheduling(config, log)
        return None

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem, report, sched) -> None:
        if (isinstance(sched, CrashSafeLoadFileScheduling) and sched.crashes.get(crashitem, 0) <= RERUNS_ON_CRASH
                and self._replacement_will_start()):
            report.outcome = "rerun"  # the scheduler has put it back on the queue: it runs again
            self.rerun.add(crashitem)
            self._say(f"{report.longrepr}: running it again on a new worker")

    def _replacement_will_start(self) -> bool:
        """Whether xdist starts a worker in place of the one that died (it counts that death after this hook):
        with its restarts spent the run stops, and the crashed test would never run again."""
        session = self.config.pluginmanager.get_plugin("dsession")
        limit = getattr(session, "_max_worker_restart", None)
        return limit is None or getattr(session, "_failed_nodes_count", 0) + 1 <= limit

    def pytest_runtest_logreport(self, report) -> None:
        if report.when == "teardown" and report.outcome != "rerun":
            self.rerun.discard(report.nodeid)  # it ran again to the end

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session) -> None:
        """A test reported as a rerun that never ran again fails the run (the run stopped first)."""
        if self.rerun and session.exitstatus == 0:
            self._say(f"crashed tests never run again: {sorted(self.rerun)}")
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def _say(self, line: str) -> None:
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(line, yellow=True)

    def pytest_report_teststatus(self, report, config):
        if report.outcome == "rerun":
            return "rerun", "R", ("RERUN", {"yellow": True})
        return None


def register_under_xdist(config: pytest.Config) -> None:
    """Register the plugin when pytest-xdist is loaded (call from a conftest's `pytest_configure`)."""
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(CrashRerunPlugin(config), "crash-rerun")
