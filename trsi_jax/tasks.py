"""Terminal-Bench task folders (TB2/harbor `task.toml` and TB1 `task.yaml`) loaded into one `Task` record.

A malformed folder raises `TaskError` naming the file and the field; `load_tasks` collects those as
rejections instead of skipping them silently.
"""
from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path

import yaml

TB1_DEFAULT_AGENT_TIMEOUT_SEC = 360.0
TB1_DEFAULT_TEST_TIMEOUT_SEC = 60.0
TB2_DEFAULT_TIMEOUT_SEC = 600.0
DEFAULT_WORKDIR = "/app"
DEFAULT_MEMORY_MB = 2048
DEFAULT_CPUS = 1.0


class TaskError(ValueError):
    """A task folder is malformed; the message names the file and the field."""


@dataclasses.dataclass(frozen=True)
class Environment:
    """How to build the task's machine: Dockerfile (+ build context) and resource limits."""
    dockerfile: Path | None
    context_dir: Path
    workdir: str = DEFAULT_WORKDIR
    docker_image: str | None = None
    cpus: float = DEFAULT_CPUS
    memory_mb: int = DEFAULT_MEMORY_MB


@dataclasses.dataclass(frozen=True)
class SolutionStep:
    """One TB1 `solution.yaml` entry: keystrokes for the terminal."""
    command: str
    min_timeout_sec: float = 0.0
    block: bool = False
    append_enter: bool = True


@dataclasses.dataclass(frozen=True)
class Task:
    """One Terminal-Bench task, whatever its on-disk format (`fmt` is "tb1" or "tb2")."""
    task_id: str
    path: Path
    fmt: str
    instruction: str
    family: str
    category: str
    difficulty: str
    tags: tuple[str, ...]
    agent_timeout_sec: float
    verifier_timeout_sec: float
    environment: Environment
    tests_dir: Path
    test_script: Path  # TB2 tests/test.sh, TB1 run-tests.sh
    solution_path: Path | None  # solve.sh / solution.sh / solution.yaml
    solution_steps: tuple[SolutionStep, ...] = ()  # parsed solution.yaml (TB1) else empty
    progress_tests: tuple[str, ...] = ()  # pytest node ids relative to tests/ (cheap, safe mid-episode)
    allow_internet: bool = False
    parser_name: str = "pytest"


def _err(path: Path, field: str, msg: str) -> TaskError:
    return TaskError(f"{path}: field '{field}': {msg}")


def _get(table: dict, key: str, kind, default, path: Path, prefix: str):
    """Typed lookup: missing -> default; wrong type -> TaskError naming `prefix.key`."""
    if key not in table or table[key] is None:
        return default
    value = table[key]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise _err(path, f"{prefix}{key}", f"expected {getattr(kind, '__name__', kind)}, got {value!r}")
    if kind is float and value <= 0:
        raise _err(path, f"{prefix}{key}", f"must be > 0, got {value!r}")
    return value


def _tags(value, path: Path, field: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise _err(path, field, f"expected a list of strings, got {value!r}")
    return tuple(value)


def parse_memory_mb(value, path: Path, field: str) -> int:
    """'2G', '512M', '1024' (MB) or an int (MB) -> megabytes."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*", str(value), re.IGNORECASE)
    if not m or isinstance(value, bool):
        raise _err(path, field, f"expected a size like '2G' or '512M', got {value!r}")
    scale = {"": 1, "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}[m.group(2).upper()]
    mb = int(float(m.group(1)) * scale)
    if mb <= 0:
        raise _err(path, field, f"must be positive, got {value!r}")
    return mb


def _require_file(path: Path, what: str) -> Path:
    if not path.is_file():
        raise TaskError(f"{path}: missing {what}")
    return path


def _progress_tests(value, path: Path, field: str) -> tuple[str, ...]:
    tests = _tags(value, path, field)
    for t in tests:
        if t.startswith("/") or ".." in t.split("::")[0].split("/"):
            raise _err(path, field, f"progress test {t!r} must be a node id relative to tests/")
    return tests


def _load_tb2(root: Path) -> Task:
    toml_path = root / "task.toml"
    try:
        cfg = tomllib.loads(toml_path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise TaskError(f"{toml_path}: invalid TOML: {e}") from None
    sections = {}
    for name in ("metadata", "agent", "verifier", "environment"):
        sec = cfg.get(name, {})
        if not isinstance(sec, dict):
            raise _err(toml_path, name, f"expected a table, got {sec!r}")
        sections[name] = sec
    meta, agent, verifier, env = (sections[k] for k in ("metadata", "agent", "verifier", "environment"))
    instruction_path = _require_file(root / "instruction.md", "instruction.md")
    instruction = instruction_path.read_text()
    if not instruction.strip():
        raise _err(instruction_path, "instruction", "is empty")
    category = _get(meta, "category", str, "uncategorized", toml_path, "metadata.")
    dockerfile = root / "environment" / "Dockerfile"
    docker_image = _get(env, "docker_image", str, None, toml_path, "environment.")
    if not dockerfile.is_file():
        if docker_image is None:
            raise TaskError(f"{dockerfile}: missing (and no environment.docker_image in {toml_path})")
        dockerfile = None
    if "memory_mb" in env:
        memory_mb = parse_memory_mb(env["memory_mb"], toml_path, "environment.memory_mb")
    else:
        memory_mb = parse_memory_mb(env.get("memory", DEFAULT_MEMORY_MB), toml_path, "environment.memory")
    cpus = env.get("cpus", DEFAULT_CPUS)
    if isinstance(cpus, bool) or not isinstance(cpus, (int, float)) or cpus <= 0:
        raise _err(toml_path, "environment.cpus", f"expected a positive number, got {cpus!r}")
    workdir = _get(env, "workdir", str, DEFAULT_WORKDIR, toml_path, "environment.")
    if not workdir.startswith("/"):
        raise _err(toml_path, "environment.workdir", f"must be absolute, got {workdir!r}")
    tests_dir = root / "tests"
    solve = root / "solution" / "solve.sh"
    return Task(
        task_id=root.name,
        path=root,
        fmt="tb2",
        instruction=instruction,
        category=category,
        family=_get(meta, "family", str, category, toml_path, "metadata."),
        difficulty=_get(meta, "difficulty", str, "unknown", toml_path, "metadata."),
        tags=_tags(meta.get("tags"), toml_path, "metadata.tags"),
        agent_timeout_sec=_get(agent, "timeout_sec", float, TB2_DEFAULT_TIMEOUT_SEC, toml_path, "agent."),
        verifier_timeout_sec=_get(verifier, "timeout_sec", float, TB2_DEFAULT_TIMEOUT_SEC, toml_path, "verifier."),
        environment=Environment(dockerfile=dockerfile, context_dir=root / "environment", workdir=workdir,
                                docker_image=docker_image, cpus=float(cpus), memory_mb=memory_mb),
        tests_dir=tests_dir,
        test_script=_require_file(tests_dir / "test.sh", "tests/test.sh"),
        solution_path=solve if solve.is_file() else None,
        progress_tests=_progress_tests(verifier.get("progress_tests"), toml_path, "verifier.progress_tests"),
        allow_internet=_get(env, "allow_internet", bool, False, toml_path, "environment."),
    )


def _solution_steps(path: Path) -> tuple[SolutionStep, ...]:
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise TaskError(f"{path}: invalid YAML: {e}") from None
    if not isinstance(data, list) or not data:
        raise _err(path, "<root>", "expected a non-empty list of {command: ...} entries")
    steps = []
    for i, entry in enumerate(data):
        if not isinstance(entry, dict) or not isinstance(entry.get("command"), str):
            raise _err(path, f"[{i}].command", f"expected a string command, got {entry!r}")
        steps.append(SolutionStep(
            command=entry["command"],
            min_timeout_sec=float(_get(entry, "min_timeout_sec", (int, float), 0.0, path, f"[{i}].")),
            block=_get(entry, "block", bool, False, path, f"[{i}]."),
            append_enter=_get(entry, "append_enter", bool, True, path, f"[{i}]."),
        ))
    return tuple(steps)


def _load_tb1(root: Path) -> Task:
    yaml_path = root / "task.yaml"
    try:
        cfg = yaml.safe_load(yaml_path.read_text())
    except yaml.YAMLError as e:
        raise TaskError(f"{yaml_path}: invalid YAML: {e}") from None
    if not isinstance(cfg, dict):
        raise _err(yaml_path, "<root>", f"expected a mapping, got {type(cfg).__name__}")
    instruction = cfg.get("instruction")
    if not isinstance(instruction, str) or not instruction.strip():
        raise _err(yaml_path, "instruction", f"expected a non-empty string, got {instruction!r}")
    category = _get(cfg, "category", str, "uncategorized", yaml_path, "")
    solution_sh, solution_yaml = root / "solution.sh", root / "solution.yaml"
    solution_path, steps = None, ()
    if solution_sh.is_file():
        solution_path = solution_sh
    elif solution_yaml.is_file():
        solution_path, steps = solution_yaml, _solution_steps(solution_yaml)
    parser = _get(cfg, "parser_name", str, "pytest", yaml_path, "")
    if parser != "pytest":
        raise _err(yaml_path, "parser_name", f"only 'pytest' is supported, got {parser!r}")
    return Task(
        task_id=root.name,
        path=root,
        fmt="tb1",
        instruction=instruction,
        category=category,
        family=_get(cfg, "family", str, category, yaml_path, ""),
        difficulty=_get(cfg, "difficulty", str, "unknown", yaml_path, ""),
        tags=_tags(cfg.get("tags"), yaml_path, "tags"),
        agent_timeout_sec=_get(cfg, "max_agent_timeout_sec", float, TB1_DEFAULT_AGENT_TIMEOUT_SEC, yaml_path, ""),
        verifier_timeout_sec=_get(cfg, "max_test_timeout_sec", float, TB1_DEFAULT_TEST_TIMEOUT_SEC, yaml_path, ""),
        environment=Environment(dockerfile=_require_file(root / "Dockerfile", "Dockerfile"), context_dir=root),
        tests_dir=root / "tests",
        test_script=_require_file(root / "run-tests.sh", "run-tests.sh"),
        solution_path=solution_path,
        solution_steps=steps,
        progress_tests=_progress_tests(cfg.get("progress_tests"), yaml_path, "progress_tests"),
        allow_internet=_get(cfg, "allow_internet", bool, False, yaml_path, ""),
        parser_name=parser,
    )


def load_task(path: str | Path) -> Task:
    """Load one task folder (TB2 if it has task.toml, TB1 if it has task.yaml)."""
    root = Path(path).resolve()
    if not root.is_dir():
        raise TaskError(f"{root}: not a directory")
    if (root / "task.toml").is_file():
        return _load_tb2(root)
    if (root / "task.yaml").is_file():
        return _load_tb1(root)
    raise TaskError(f"{root}: neither task.toml (TB2) nor task.yaml (TB1) found")


def load_tasks(root: str | Path) -> tuple[list[Task], list[tuple[Path, str]]]:
    """Load every task folder directly under `root` (or `root` itself if it is one).

    Returns (tasks sorted by id, rejected [(path, reason)]); every subdirectory is one or the other.
    """
    root = Path(root).resolve()
    if (root / "task.toml").is_file() or (root / "task.yaml").is_file():
        return [load_task(root)], []
    if not root.is_dir():
        raise TaskError(f"{root}: not a directory")
    tasks, rejected = [], []
    for sub in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        try:
            tasks.append(load_task(sub))
        except TaskError as e:
            rejected.append((sub, str(e)))
    return tasks, rejected
