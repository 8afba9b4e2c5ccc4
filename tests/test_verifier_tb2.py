"""Real Terminal-Bench 2 tasks (../shared/terminal-bench-2) verified offline with their own test.sh,
unchanged, through the verifier toolchain: the oracle passes and the empty episode fails with the
tests actually run (exact per-test outcomes), on both backends."""
from pathlib import Path

import pytest

from trsi_jax.sandbox import make_sandbox, run_oracle, verify
from trsi_jax.tasks import load_task

TB2 = Path(__file__).resolve().parents[2] / "shared" / "terminal-bench-2"
# (task, backend, per-test outcomes of the empty episode)
CASES = [
    pytest.param("sparql-university", "local", {"test_sparql_file_exists": False, "test_sparql_runs_without_error": False,
                                                "test_sparql_query_results": False}, id="sparql-local"),
    pytest.param("cobol-modernization", "docker", {"test_required_files_exist": False, "test_data_files_exist": True,
                                                   "test_program_output": False},
                 marks=pytest.mark.docker, id="cobol-docker"),
]


@pytest.mark.slow
@pytest.mark.parametrize("name, backend, empty_tests", CASES)
def test_real_tb2_oracle_passes_and_empty_episode_fails(name, backend, empty_tests):
    if not (TB2 / name).is_dir():
        pytest.skip(f"{TB2 / name} is not here")
    task = load_task(TB2 / name)
    oracle = run_oracle(task, backend)
    assert (oracle.strict, oracle.reward, oracle.error) == (True, 1.0, None), oracle.log[-3000:]
    assert oracle.tests == dict.fromkeys(empty_tests, True)
    with make_sandbox(task, backend) as sb:
        empty = verify(sb, task)
    assert (empty.strict, empty.reward, empty.error, empty.tests) == (False, 0.0, None, empty_tests), empty.log[-3000:]
