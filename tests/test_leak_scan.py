"""Deterministic leak scan on real built-in tasks: tests, solution, verifier paths, expected outputs."""
import re

import pytest

from sandboxes.suite import build_suite
from trsi_jax.rsr.leak_scan import LeakScanner
from trsi_jax.tasks import load_task


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    root = tmp_path_factory.mktemp("suite")
    return {p.split("/")[-1]: load_task(p) for p in build_suite(str(root), "train", 1, ["files", "text"])}


def _kinds(findings):
    return {f.kind for f in findings}


def test_public_text_is_clean(tasks):
    for task in tasks.values():
        scanner = LeakScanner(task)
        assert scanner.scan(task.instruction) == []
        assert scanner.scan(scanner.public_text) == []  # environment files are public too


def test_quoting_tests_or_solution_is_flagged_with_its_source(tasks):
    task = tasks["text-0"]
    scanner = LeakScanner(task)
    test_src = (task.tests_dir / "test_outputs.py").read_text()
    body = test_src[test_src.index("def test_"):][:400]
    found = scanner.scan(f"Milestone: {body}")
    assert "ngram" in _kinds(found)
    assert any(f.source == "tests/test_outputs.py" for f in found)
    solution_line = [ln for ln in task.solution_path.read_text().splitlines() if len(ln.split()) > 8][0]
    found = scanner.scan(f"Run this: {solution_line}")
    assert [f.source for f in found if f.kind == "ngram"][0].startswith("solution/")
    assert solution_line.split()[0] in found[0].span  # the span is the quoted text itself


def test_ngram_threshold(tasks):
    task = tasks["text-0"]
    words = re.findall(r"\w+", task.solution_path.read_text().split("\n")[-2])
    seven = " ".join(words[:7])
    assert not [f for f in LeakScanner(task, n=8).scan(seven) if f.kind == "ngram"]
    assert [f for f in LeakScanner(task, n=5).scan(seven) if f.kind == "ngram"]


@pytest.mark.parametrize("text, path", [
    ("then check /logs/verifier/reward.txt", "/logs/verifier"),
    ("read the grading file reward.json", "reward.json"),
    ("look at /tests/test_outputs.py first", "/tests"),
    ("bash /solution/solve.sh", "solve.sh"),
])
def test_verifier_paths_are_flagged(tasks, text, path):
    spans = [f.span for f in LeakScanner(tasks["files-0"]).scan(text) if f.kind == "verifier_path"]
    assert path in spans


def test_app_paths_that_merely_contain_tests_are_not_verifier_paths(tasks):
    assert LeakScanner(tasks["files-0"]).scan("ls /app/tests_backup and my_tests/ dir") == []


def test_expected_outputs_absent_from_the_instruction_are_flagged(tasks):
    task = tasks["files-0"]
    scanner = LeakScanner(task)
    secret = next(lit for lit in scanner.literals if lit.startswith("sorted/"))
    assert secret not in task.instruction
    found = scanner.scan(f"The result must contain {secret} at the end.")
    assert ("expected_output", secret) in {(f.kind, f.span) for f in found}
    # A literal the instruction already states is public and never a literal to flag.
    assert all(lit not in task.instruction for lit in scanner.literals)


def test_tb1_task_root_is_public_except_tests_and_solution(tmp_path):
    """TB1 builds its image from the task root; tests/, run-tests.sh and solution.sh there stay private."""
    root = tmp_path / "tb1-task"
    (root / "tests").mkdir(parents=True)
    (root / "task.yaml").write_text("instruction: Write the word hello into /app/out.txt please.\n"
                                    "category: files\n")
    (root / "Dockerfile").write_text("FROM python:3.11-slim-bookworm\nWORKDIR /app\n")
    (root / "run-tests.sh").write_text("#!/bin/bash\npytest $TEST_DIR/test_outputs.py -rA\n")
    (root / "solution.sh").write_text("#!/bin/bash\nprintf 'hello from the hidden reference answer\\n' > /app/out.txt\n")
    (root / "tests" / "test_outputs.py").write_text(
        "def test_out():\n    assert open('/app/out.txt').read() == 'hello from the hidden reference answer\\n'\n")
    task = load_task(root)
    scanner = LeakScanner(task)
    assert "reference answer" not in scanner.public_text and "FROM python" in scanner.public_text
    found = scanner.scan("then: printf 'hello from the hidden reference answer\\n' > /app/out.txt")
    assert ("ngram", "solution/solution.sh") in {(f.kind, f.source) for f in found}
    assert ("expected_output", "tests/test_outputs.py") in {(f.kind, f.source) for f in found}
    assert scanner.scan(task.instruction) == []
