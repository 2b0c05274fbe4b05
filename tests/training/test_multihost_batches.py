"""Two real CPU processes (`jax.distributed` on loopback, 2 fake devices each), each holding one group of a
two-group RL step on a mesh spanning both: what the trainer scores and the advantages it computes for a
process's own rows equal what one process holding the whole step computes (multihost_batches_worker.py)."""

import json

from tests.training.local_cluster import result_lines, start_processes

TIMEOUT_S = 300  # the run takes seconds; a process waiting on the other (a deadlock) fails here


def test_each_process_scores_and_advantages_its_rows_as_one_process_with_the_whole_step(tmp_path):
    procs = start_processes(["-m", "tests.training.multihost_batches_worker", str(tmp_path)], 2, 2)
    results = sorted((json.loads(line[len("RESULT "):]) for line in result_lines(procs, TIMEOUT_S)),
                     key=lambda r: r["process"])
    assert [r["process"] for r in results] == [0, 1]
    # With train.row_len = 2 T the processes pack rows of different lengths, agreed before placing them.
    assert [r["local_row_len"] for r in results] == [32, 16]
    for result in results:
        # Tree: every flat token scored from this process's packed rows, not the same rows of process 0's.
        # Flat: this process's rows of the scores, even for a scorer whose rows cannot follow the mesh.
        assert result["score_error"]["tree"] < 1e-4, result
        assert result["score_error"]["flat"] < 1e-4, result
        # Batch statistics (AEPO's entropy z-score, REINFORCE++ whitening) over both processes' tokens.
        for name, error in result["advantage_error"].items():
            assert error < 1e-5, (name, result)
