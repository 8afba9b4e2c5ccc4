"""Harness prompts: compact system prompt, hints derived from the task without test code, registry."""
import re
from pathlib import Path

import pytest

from sandboxes.suite import build_suite
from trsi_jax.agent import HARNESSES, CommonHarness, HintHarness, make_harness
from trsi_jax.agent.harness import SYSTEM_PROMPT
from trsi_jax.agent.privileged import first_oracle_step, milestone_names
from trsi_jax.agent.reply import parse_reply
from trsi_jax.tasks import load_task


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    root = tmp_path_factory.mktemp("suite")
    return [load_task(p) for p in build_suite(str(root), "heldout", per_family=1)]


def test_system_prompt_is_compact_and_its_example_parses():
    assert len(SYSTEM_PROMPT.encode()) < 500  # tiny byte-level models train on it
    example = SYSTEM_PROMPT.splitlines()[1].replace("\\\\n", "\\n")
    assert parse_reply(example).commands[0].keystrokes == "ls -la\n"


def test_hint_harness_adds_oracle_step_and_milestones_but_no_test_code(tasks):
    for task in tasks:
        common, hinted = CommonHarness().task_message(task), HintHarness().task_message(task)
        assert hinted.startswith(common) and "Hints:" in hinted
        step = first_oracle_step(task)
        assert step and step in hinted and not re.fullmatch(r"cd( \S+)?|set -.*|#.*", step)
        assert step in Path(task.solution_path).read_text()
        for name in milestone_names(task.progress_tests):
            assert name in hinted
        test_lines = {line.strip() for f in Path(task.tests_dir).rglob("*") if f.is_file()
                      for line in f.read_text(errors="replace").splitlines() if len(line.strip()) > 25}
        assert not [line for line in test_lines if line in hinted], task.task_id


def test_milestone_names():
    assert milestone_names(["test_outputs.py::test_sorted_file_exists", "test_b"]) == ["sorted file exists", "b"]


def test_registry():
    assert {name: cls.name for name, cls in HARNESSES.items()} == {n: n for n in HARNESSES}
    assert make_harness("retry", extra_turns=3).extra_turns == 3
    with pytest.raises(ValueError, match="unknown harness 'nope'"):
        make_harness("nope")
