"""The `trained_run` fixture of the evaluation tests: one run directory per module."""

import pytest

from tests.evaluation.trained_run import make_trained_run


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    return make_trained_run(tmp_path_factory.mktemp("run"))
