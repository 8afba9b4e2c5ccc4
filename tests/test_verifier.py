"""The verifier's offline toolchain and result rules on the local backend: Terminal-Bench test.sh
forms run unchanged; a run without a result is an error (VerifyResult.error), never a zero."""
import dataclasses

import pytest

from tests.sandbox_tasks import write_tb2
from trsi_jax.agent.harness import Session, record_progress
from trsi_jax.sandbox import VerifyResult, make_sandbox, probe_progress, progress_from, verify
from trsi_jax.sandbox.verifier import parse_ctrf
from trsi_jax.tasks import load_task

TESTS = '''import subprocess
from pathlib import Path
def test_out():
    assert Path("/app/out.txt").read_text().strip() == "hello"
def test_sibling_import():  # a program the test starts imports its own sibling module
    assert subprocess.run(["python3", "/tests/prog.py"], capture_output=True, text=True).stdout == "sibling\\n"
'''
RESULT = '\nif [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n'


def _verify(tmp_path, test_sh: str, solve: str = "echo hello > /app/out.txt", timeout: int | None = None):
    d = write_tb2(tmp_path, tests=TESTS, test_sh="#!/bin/bash\n" + test_sh + RESULT)
    (d / "tests" / "prog.py").write_text("import mod\nprint(mod.WORD)\n")
    (d / "tests" / "mod.py").write_text("WORD = 'sibling'\n")
    if timeout:
        (d / "task.toml").write_text((d / "task.toml").read_text().replace("timeout_sec = 60", f"timeout_sec = {timeout}"))
    task = load_task(d)
    with make_sandbox(task) as sb:
        sb.exec(solve)
        return verify(sb, task)


@pytest.mark.parametrize("script", [
    "apt-get update && apt-get install -y curl\ncurl -LsSf https://astral.sh/uv/0.9.5/install.sh | sh\n"
    "source $HOME/.local/bin/env\nuvx -p 3.13 -w pytest==8.4.1 -w numpy==2.3.3 -w pytest-json-ctrf==0.3.5 "
    "pytest --ctrf /logs/verifier/ctrf.json /tests/test_outputs.py -rA",
    "pip install pytest==8.4.1 requests==2.32.5 pytest-json-ctrf==0.3.5\n"
    "pytest --ctrf /logs/verifier/ctrf.json /tests/test_outputs.py -rA",
    "python -m pytest --ctrf /logs/verifier/ctrf.json /tests/test_outputs.py -rA",
    "cd /tests && python3 -B -W ignore -m pytest test_outputs.py -rA",
    "curl -LsSf https://astral.sh/uv/0.9.5/install.sh | sh\nsource $HOME/.local/bin/env\nuv venv -p 3.12 .tb\n"
    "source .tb/bin/activate\nuv pip install pytest==8.4.1 pytest-json-ctrf==0.3.5\n"
    "uv run pytest --ctrf /logs/verifier/ctrf.json /tests/test_outputs.py -rA",
], ids=["uvx", "pip+pytest", "python-m-pytest", "python-flags-m-pytest", "uv-venv-run"])
def test_tb2_script_forms_run_offline(tmp_path, script):
    res = _verify(tmp_path, script)
    assert (res.tests, res.reward, res.strict, res.error) == ({"test_out": True, "test_sibling_import": True}, 1.0,
                                                              True, None), res.log[-3000:]
    empty = _verify(tmp_path, script, solve="true")
    assert (empty.tests, empty.reward, empty.strict, empty.error) == ({"test_out": False, "test_sibling_import": True},
                                                                      0.0, False, None)


@pytest.mark.parametrize("script, why", [
    ("uvx -w pytest==8.4.1 -w no-such-package-xyz==1.0 pytest /tests/test_outputs.py -rA", "no-such-package-xyz"),
    ("apt-get install -y no-such-host-package-xyz\npython3 -m pytest /tests/test_outputs.py -k nothing_matches -rA",
     "no-such-host-package-xyz"),
    ("python3 -m pytest /tests/test_outputs.py -k nothing_matches -rA", "pytest reported no test"),
    ("echo crashed before the tests; exit 3", "no test results and no reward file"),
    ("sleep 30", "timed out"),
])
def test_no_result_is_an_error_not_a_zero(tmp_path, script, why):
    res = _verify(tmp_path, script, timeout=3 if "sleep" in script else None)
    assert res.error is not None and why in res.error and (res.strict, res.partial) == (False, 0.0), res.error
    assert res.tests == {}


def test_missing_package_after_failing_tests_is_an_error(tmp_path):
    res = _verify(tmp_path, "apt-get install -y no-such-host-package-xyz\npython3 -m pytest /tests/test_outputs.py -rA",
                  solve="true")
    assert res.tests == {"test_out": False, "test_sibling_import": True}
    assert "no-such-host-package-xyz" in res.error


def test_parse_ctrf():
    raw = b'{"results": {"tests": [{"name": "tests/t.py::test_a", "status": "passed"}, ' \
          b'{"name": "tests/t.py::test_b", "status": "failed"}, {"name": "test_c", "status": "skipped"}]}}'
    assert parse_ctrf(raw) == {"test_a": True, "test_b": False}


def test_failed_probe_is_unmeasured_and_the_episode_goes_on(tmp_path):
    task = load_task(write_tb2(tmp_path))
    sb = make_sandbox(task)
    session = Session(task, sb, None, [], max_turns=5, turns=1)
    assert record_progress(session) == 0.0 and probe_progress(sb, task) == 0.0
    sb.close()  # from now on every probe fails
    session.turns, session.unprobed = 2, True
    assert record_progress(session) is None and session.progress == [0.0, None]


def test_progress_from_the_verifier_needs_every_progress_test(tmp_path):
    task = dataclasses.replace(load_task(write_tb2(tmp_path)), progress_tests=("test_a", "test_outputs.py::test_b"))
    run = lambda tests, error=None: VerifyResult(strict=False, partial=0.0, tests=tests, log="", error=error)
    assert progress_from(run({"test_a": True, "test_b": False, "test_c": True}), task) == 0.5
    assert progress_from(run({"test_a": True}), task) is None  # test_b not reported: unmeasured
    assert progress_from(run({"test_a": True, "test_b": True}, error="timed out"), task) is None
    assert progress_from(run({}), dataclasses.replace(task, progress_tests=())) == 0.0
