"""`python -m launch.serve_search` with a corpus it cannot read says so in one line (it was a traceback)."""

from __future__ import annotations

import pytest

from launch.serve_search import main


def test_a_missing_corpus_is_one_line_naming_it(tmp_path):
    missing = tmp_path / "no_corpus.jsonl"
    with pytest.raises(SystemExit, match=rf"^error: No such file or directory: {missing}$"):
        main(["--corpus", str(missing), "--port", "0"])
