"""tests/xdist_crash_rerun.py on real `pytest -n 2 --dist loadfile` runs of small test folders: a test that
kills its worker once runs again and the run passes with "1 rerun"; one that kills it every time fails the
run; neither hangs. Without the plugin, pytest-xdist 3.8.0 hung for good on the first folder (a crash in
the last test of a file run late) and failed a test that passed on its second run."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFTEST = ("from tests.xdist_crash_rerun import register_under_xdist\n\n\n"
            "def pytest_configure(config):\n    register_under_xdist(config)\n")
CRASHING = '''import os

MARK = os.path.join(os.path.dirname(__file__), "crashes")


def test_first():
    pass


def test_crashing():  # {count}: how many of its runs kill the worker
    runs = len(open(MARK).read()) if os.path.exists(MARK) else 0
    with open(MARK, "a") as f:
        f.write("x")
    if runs < {count}:
        os.abort()
'''


def _run_folder(folder, crashes: int, *options: str) -> subprocess.CompletedProcess:
    (folder / "conftest.py").write_text(CONFTEST)
    for name in "abcdefgh":  # files the workers finish before the crashing one, which runs last
        (folder / f"test_{name}.py").write_text(f"def test_{name}1():\n    pass\n\n\ndef test_{name}2():\n    pass\n")
    (folder / "test_z.py").write_text(CRASHING.format(count=crashes))
    env = dict(os.environ, PYTHONPATH=REPO)
    try:
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadfile", "-p",
                               "no:cacheprovider", *options, str(folder)], check=False, cwd=folder, env=env,
                              capture_output=True, text=True, timeout=90)
    except subprocess.TimeoutExpired as hung:
        pytest.fail(f"the run hung after the crash:\n{hung.stdout}")


def test_a_test_that_kills_its_worker_once_runs_again_and_the_run_passes(tmp_path):
    out = _run_folder(tmp_path, crashes=1)
    assert out.returncode == 0, out.stdout[-3000:]
    assert "18 passed, 1 rerun" in out.stdout, out.stdout[-3000:]
    assert "crashed while running 'test_z.py::test_crashing': running it again on a new worker" in out.stdout
    assert (tmp_path / "crashes").read_text() == "xx"


def test_a_test_that_kills_its_worker_twice_fails_the_run(tmp_path):
    out = _run_folder(tmp_path, crashes=2)
    assert out.returncode == 1, out.stdout[-3000:]
    assert "FAILED test_z.py::test_crashing" in out.stdout and "17 passed, 1 rerun" in out.stdout, out.stdout[-3000:]


def test_a_crash_with_no_worker_restart_left_fails_the_run(tmp_path):
    """With xdist's worker restarts spent (here: none allowed) no replacement starts and the run stops: the
    crash was reported as a rerun all the same, and the run passed without running the test again."""
    out = _run_folder(tmp_path, 1, "--max-worker-restart", "0")
    assert out.returncode != 0, out.stdout[-3000:]
    assert "FAILED test_z.py::test_crashing" in out.stdout, out.stdout[-3000:]
