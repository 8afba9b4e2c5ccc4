"""Task loader (TB1 + TB2 folders) and the Dockerfile subset parser."""
from pathlib import Path

import pytest

from tests.sandbox_tasks import write_tb1, write_tb2
from trsi_jax.sandbox.dockerfile import DockerfileError, context_files, match_sources, parse_dockerfile
from trsi_jax.tasks import TaskError, load_task, load_tasks


def test_load_tb2_fields(tmp_path):
    d = write_tb2(tmp_path, toml_extra='workdir = "/work"\nallow_internet = true\n')
    t = load_task(d)
    assert (t.task_id, t.fmt, t.family, t.category, t.difficulty) == ("hello-tb2", "tb2", "file-ops", "file-ops", "easy")
    assert t.tags == ("files", "echo")
    assert (t.agent_timeout_sec, t.verifier_timeout_sec) == (120.0, 60.0)
    assert t.instruction == "Write the word hello into /app/out.txt.\n"
    assert t.environment.dockerfile == d / "environment" / "Dockerfile"
    assert t.environment.context_dir == d / "environment"
    assert (t.environment.workdir, t.environment.memory_mb, t.environment.cpus) == ("/work", 1024, 1.0)
    assert t.allow_internet is True
    assert t.tests_dir == d / "tests" and t.test_script == d / "tests" / "test.sh"
    assert t.solution_path == d / "solution" / "solve.sh"
    assert t.progress_tests == ("test_outputs.py::test_exists", "test_content")


def test_tb2_family_overrides_category(tmp_path):
    d = write_tb2(tmp_path)
    toml = (d / "task.toml").read_text().replace('category = "file-ops"', 'category = "file-ops"\nfamily = "fs-basic"')
    (d / "task.toml").write_text(toml)
    t = load_task(d)
    assert (t.family, t.category) == ("fs-basic", "file-ops")


def test_load_tb1_with_solution_sh_and_yaml(tmp_path):
    t = load_task(write_tb1(tmp_path, "a", solution="sh"))
    assert (t.fmt, t.family, t.difficulty, t.tags) == ("tb1", "text-processing", "medium", ("echo",))
    assert (t.agent_timeout_sec, t.verifier_timeout_sec) == (100.0, 50.0)
    assert t.solution_path.name == "solution.sh" and t.solution_steps == ()
    assert t.test_script.name == "run-tests.sh" and t.environment.workdir == "/app"
    t2 = load_task(write_tb1(tmp_path, "b", solution="yaml"))
    assert t2.solution_path.name == "solution.yaml"
    assert [s.command for s in t2.solution_steps] == ["echo hel > /app/out.txt", "sed -i s/hel/hello/ /app/out.txt"]
    assert t2.solution_steps[1].min_timeout_sec == 0.1


@pytest.mark.parametrize("mutate, file, field", [
    (lambda d: (d / "task.toml").write_text((d / "task.toml").read_text().replace("timeout_sec = 120", 'timeout_sec = "x"')),
     "task.toml", "agent.timeout_sec"),
    (lambda d: (d / "task.toml").write_text((d / "task.toml").read_text().replace('memory = "1G"', 'memory = "lots"')),
     "task.toml", "environment.memory"),
    (lambda d: (d / "task.toml").write_text((d / "task.toml").read_text().replace('tags = ["files", "echo"]', "tags = 3")),
     "task.toml", "metadata.tags"),
    (lambda d: (d / "task.toml").write_text((d / "task.toml").read_text().replace("cpus = 1", "cpus = -2")),
     "task.toml", "environment.cpus"),
    (lambda d: (d / "task.toml").write_text("[metadata\n"), "task.toml", "invalid TOML"),
    (lambda d: (d / "instruction.md").unlink(), "instruction.md", "missing"),
    (lambda d: (d / "tests" / "test.sh").unlink(), "tests/test.sh", "missing"),
    (lambda d: (d / "environment" / "Dockerfile").unlink(), "environment/Dockerfile", "missing"),
])
def test_malformed_tb2_names_file_and_field(tmp_path, mutate, file, field):
    d = write_tb2(tmp_path)
    mutate(d)
    with pytest.raises(TaskError) as e:
        load_task(d)
    assert str(d / file) in str(e.value) and field in str(e.value)


@pytest.mark.parametrize("mutate, file, field", [
    (lambda d: (d / "task.yaml").write_text("difficulty: easy\n"), "task.yaml", "instruction"),
    (lambda d: (d / "task.yaml").write_text((d / "task.yaml").read_text() + "max_test_timeout_sec: soon\n"),
     "task.yaml", "max_test_timeout_sec"),
    (lambda d: (d / "task.yaml").write_text((d / "task.yaml").read_text().replace("parser_name: pytest", "parser_name: sweb")),
     "task.yaml", "parser_name"),
    (lambda d: (d / "solution.yaml").write_text("- {cmd: ls}\n"), "solution.yaml", "[0].command"),
    (lambda d: (d / "run-tests.sh").unlink(), "run-tests.sh", "missing"),
])
def test_malformed_tb1_names_file_and_field(tmp_path, mutate, file, field):
    d = write_tb1(tmp_path, solution="yaml")
    mutate(d)
    with pytest.raises(TaskError) as e:
        load_task(d)
    assert str(d / file) in str(e.value) and field in str(e.value)


def test_load_tasks_reports_every_rejection(tmp_path):
    write_tb2(tmp_path, "good2")
    write_tb1(tmp_path, "good1")
    bad = write_tb2(tmp_path, "bad")
    (bad / "instruction.md").write_text("  \n")
    (tmp_path / "empty").mkdir()
    tasks, rejected = load_tasks(tmp_path)
    assert [t.task_id for t in tasks] == ["good1", "good2"]
    assert [p.name for p, _ in rejected] == ["bad", "empty"]
    assert "instruction" in rejected[0][1] and "neither task.toml" in rejected[1][1]


def test_dockerfile_subset(tmp_path):
    f = tmp_path / "Dockerfile"
    f.write_text("ARG V=3.11\nFROM python:${V}-slim\n# comment\nENV A=1 B=\"two words\"\nENV C legacy value\n"
                 "WORKDIR /app\nWORKDIR sub\nCOPY --chown=root:root a.txt b/ /app/\n"
                 "RUN echo one \\\n    && echo two\nRUN [\"python3\", \"-c\", \"print(1)\"]\nCMD [\"bash\"]\n")
    spec = parse_dockerfile(f)
    assert spec.base_image == "python:3.11-slim"
    assert spec.env == {"A": "1", "B": "two words", "C": "legacy value"}
    assert spec.workdir == "/app/sub"
    kinds = [(s.kind, s.args) for s in spec.steps if s.kind in ("copy", "run")]
    assert kinds == [("copy", (("a.txt", "b"), "/app/")), ("run", ("echo one && echo two",)),
                     ("run", ("python3 -c 'print(1)'",))]


@pytest.mark.parametrize("text, msg", [
    ("FROM x\nFROBNICATE y\n", ":2: unsupported instruction FROBNICATE"),
    ("FROM x\nADD https://example.com/f /f\n", ":2: ADD from a URL"),
    ("FROM x\nCOPY ../secret /s\n", ":2: COPY source must stay inside"),
    ("FROM a\nFROM b\n", ":2: multi-stage"),
    ("FROM --platform=linux/s390x a\n", ":1: FROM --platform=linux/s390x: only this host's platform"),
    ("FROM --squash a\n", ":1: FROM flag --squash is not supported"),
    ("RUN ls\n", ":1: RUN before FROM"),
    ("FROM x\nCOPY --from=build /a /b\n", ":2: COPY flag --from=build .*use --backend=docker"),
])
def test_dockerfile_errors_name_line(tmp_path, text, msg):
    f = tmp_path / "Dockerfile"
    f.write_text(text)
    with pytest.raises(DockerfileError, match=msg.replace("(", r"\(")) as e:
        parse_dockerfile(f)
    assert str(f) in str(e.value)


def test_build_context_never_holds_tests_or_solution(tmp_path):
    d = write_tb1(tmp_path)  # TB1: the task folder itself is the build context
    files = {str(p) for p in context_files(d)}
    assert files == {"Dockerfile", "data.txt"}
    assert match_sources(d, "tests") == [] and match_sources(d, "solution.sh") == []
    assert match_sources(d, "*.txt") == [Path("data.txt")]
