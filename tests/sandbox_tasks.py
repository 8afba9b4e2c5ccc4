"""Writers of small TB1/TB2 task folders for the sandbox and loader tests (not a test module)."""
from pathlib import Path

SECRET = "SECRET-7f3a9c-expected-answer"

TEST_OUTPUTS = f'''from pathlib import Path
# {SECRET}
def test_exists():
    assert Path("/app/out.txt").exists()
def test_content():
    assert Path("/app/out.txt").read_text().strip() == "hello"
def test_seed():
    assert Path("/app/seed.txt").read_text().strip() == "seeded"
'''
DOCKERFILE = """FROM python:3.11-slim
WORKDIR /app
ENV GREETING=seeded \\
    OTHER="two words"
COPY data.txt /app/
RUN echo "$GREETING" > /app/seed.txt && mkdir -p /srv/x
"""
SOLVE = "#!/bin/bash\n# " + SECRET + "\necho hello > /app/out.txt\n"


def write_tb2(root: Path, name: str = "hello-tb2", toml_extra: str = "", dockerfile: str = DOCKERFILE,
              tests: str = TEST_OUTPUTS, test_sh: str | None = None) -> Path:
    d = Path(root) / name
    for sub in ("environment", "solution", "tests"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    (d / "task.toml").write_text(f"""[metadata]
difficulty = "easy"
category = "file-ops"
tags = ["files", "echo"]
[agent]
timeout_sec = 120
[verifier]
timeout_sec = 60
progress_tests = ["test_outputs.py::test_exists", "test_content"]
[environment]
memory = "1G"
cpus = 1
{toml_extra}""")
    (d / "instruction.md").write_text("Write the word hello into /app/out.txt.\n")
    (d / "environment" / "Dockerfile").write_text(dockerfile)
    (d / "environment" / "data.txt").write_text("data\n")
    (d / "solution" / "solve.sh").write_text(SOLVE)
    (d / "tests" / "test_outputs.py").write_text(tests)
    (d / "tests" / "test.sh").write_text(test_sh or (
        "#!/bin/bash\ncd /tests\npython3 -m pytest test_outputs.py -rA\n"
        'if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n'))
    return d


def write_tb1(root: Path, name: str = "hello-tb1", solution: str = "sh") -> Path:
    d = Path(root) / name
    (d / "tests").mkdir(parents=True, exist_ok=True)
    (d / "task.yaml").write_text("""instruction: |
  Write the word hello into /app/out.txt.
difficulty: medium
category: text-processing
tags: [echo]
max_agent_timeout_sec: 100
max_test_timeout_sec: 50
parser_name: pytest
""")
    (d / "Dockerfile").write_text(DOCKERFILE)
    (d / "data.txt").write_text("data\n")
    (d / "run-tests.sh").write_text("#!/bin/bash\npython3 -m pytest $TEST_DIR/test_outputs.py -rA\n")
    (d / "tests" / "test_outputs.py").write_text(TEST_OUTPUTS)
    if solution == "sh":
        (d / "solution.sh").write_text(SOLVE)
    else:
        (d / "solution.yaml").write_text("- command: echo hel > /app/out.txt\n"
                                         "- command: sed -i s/hel/hello/ /app/out.txt\n  min_timeout_sec: 0.1\n")
    return d
