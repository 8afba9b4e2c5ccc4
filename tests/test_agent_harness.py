"""Harness prompts: compact system prompt, hints derived from the task without test code, registry."""
import json
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
        oracle = json.loads((Path(task.solution_path).parent / "commands.json").read_text())
        commands = [c["keystrokes"].strip() for c in oracle if not re.fullmatch(r"cd( \S+)?\s*", c["keystrokes"])]
        assert step == commands[0]  # whole, even when its quotes span lines (inline Python scripts)
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


def test_first_oracle_step_reads_a_command_whose_quotes_span_lines(tmp_path):
    script = tmp_path / "solve.sh"
    task = type("T", (), {"solution_path": str(script)})()
    script.write_text("#!/bin/bash\nset -e\ncd /app\npython3 -c 'import re\nprint(\"a # b\")\n'\necho done\n")
    assert first_oracle_step(task) == "python3 -c 'import re\nprint(\"a # b\")\n'"
    script.write_text("cd /app\nsort -u a \\\n  -o b\necho done\n")
    assert first_oracle_step(task) == "sort -u a \\\n  -o b"
    script.write_text("echo 'never closed\necho more\n")  # no complete command: its first line
    assert first_oracle_step(task) == "echo 'never closed"
