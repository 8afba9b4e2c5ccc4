"""Verification after the agent is done, and cheap mid-episode progress probes.

`verify` stops every process the agent left (on docker, an agent container still holding a listening
server is kept apart instead and the tests reach it over localhost only: services.py), places the
task's tests at /tests and an empty /logs/verifier, makes every agent symlink that resolves into them
dangle, and runs tests/test.sh (TB2) or run-tests.sh (TB1) unchanged with the verifier toolchain
(toolchain.py) first on PATH: its own interpreter, pytest pinned to the tests, offline
uv/uvx/pip/curl stand-ins. Results come from the CTRF report, else junit xml, else pytest's -rA
lines, and the TB2 reward files. A run that yields no result (nothing collected, a crash, a
timeout, no reward file, a package the toolchain lacks) is an error (`VerifyResult.error`), never a
zero: callers exclude it from training.
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
import shlex
import shutil
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

from trsi_jax.sandbox.base import TESTS_PATH, VERIFIER_LOGS, Sandbox, SandboxError
from trsi_jax.sandbox.toolchain import MISSING_MARK, MOUNT, PYTHON
from trsi_jax.tasks import Task

JUNIT = f"{VERIFIER_LOGS}/junit.xml"
CTRF = f"{VERIFIER_LOGS}/ctrf.json"
_RA_LINE = re.compile(r"^(PASSED|FAILED|ERROR|XPASS|XFAIL|SKIPPED)\s+(\S+)", re.MULTILINE)
_PASS = {"PASSED", "XFAIL"}
_SESSION = re.compile(r"^=+ test session starts =+$", re.MULTILINE)
# Every pytest run of the test script also writes junit xml and an -rA summary.
PYTEST_ENV = {"PYTEST_ADDOPTS": f"-rA --junitxml={JUNIT}", "TEST_DIR": TESTS_PATH}
SANITIZE = f"{PYTHON} -I {MOUNT}/shim.py sanitize"


@dataclasses.dataclass(frozen=True)
class VerifyResult:
    strict: bool  # every test passed (or the reward is 1 when only a reward file exists)
    partial: float  # fraction of tests passed (or the reward, clipped to [0, 1])
    tests: dict[str, bool]
    log: str
    reward: float | None = None
    error: str | None = None  # set when the verifier produced no result: the episode is not a failure


def parse_pytest_ra(output: str) -> dict[str, bool]:
    """Per-test outcomes from pytest's `-rA` short summary (`PASSED tests/test_x.py::test_a`)."""
    out: dict[str, bool] = {}
    for status, node in _RA_LINE.findall(output):
        if status == "SKIPPED":
            continue
        name = node.split("::", 1)[1] if "::" in node else node
        out[name] = out.get(name, True) and status in _PASS
    return out


def parse_junit(xml_bytes: bytes) -> dict[str, bool]:
    """Per-test outcomes from a pytest junit xml (skipped tests are left out)."""
    root = ET.fromstring(xml_bytes)
    out: dict[str, bool] = {}
    for case in root.iter("testcase"):
        kinds = {child.tag for child in case}
        if "skipped" in kinds:
            continue
        name = case.get("name", "?")
        out[name] = out.get(name, True) and not (kinds & {"failure", "error"})
    return out


def parse_ctrf(raw: bytes) -> dict[str, bool]:
    """Per-test outcomes from a CTRF report (pytest-json-ctrf); skipped/pending tests are left out."""
    out: dict[str, bool] = {}
    for t in json.loads(raw)["results"]["tests"]:
        if t.get("status") in ("skipped", "pending"):
            continue
        name = str(t["name"]).split("::")[-1]
        out[name] = out.get(name, True) and t.get("status") == "passed"
    return out


def _reward(sandbox: Sandbox) -> float | None:
    raw = sandbox.read_file(f"{VERIFIER_LOGS}/reward.txt")
    try:
        if raw is not None:
            return float(raw.decode().strip())
        raw = sandbox.read_file(f"{VERIFIER_LOGS}/reward.json")
        if raw is not None:
            data = json.loads(raw)
            if isinstance(data, dict) and data:
                vals = [float(v) for v in data.values()]
                return float(data["reward"]) if "reward" in data else sum(vals) / len(vals)
    except (ValueError, TypeError, UnicodeDecodeError):
        return None
    return None


def _tests(sandbox: Sandbox, output: str) -> dict[str, bool]:
    """CTRF, else junit, else the -rA lines (the output may also hold text from the agent's programs)."""
    for path, parse, errors in ((CTRF, parse_ctrf, (ValueError, KeyError, TypeError)),
                                (JUNIT, parse_junit, (ET.ParseError,))):
        raw = sandbox.read_file(path, max_bytes=8 << 20)
        if raw:
            try:
                tests = parse(raw)
            except errors:
                tests = {}
            if tests:
                return tests
    return parse_pytest_ra(output)


def _missing(output: str) -> list[str]:
    """What the toolchain's shims said the script needed and lacked, before pytest started (later
    lines may come from the agent's programs)."""
    m = _SESSION.search(output)
    head = output[:m.start()] if m else output
    return [line.strip() for line in head.splitlines() if line.startswith(MISSING_MARK)]


def _stage_tests(task: Task, staging: Path) -> str:
    """Copy tests/ (plus TB1's run-tests.sh) into `staging`; return the script path inside the sandbox."""
    if task.tests_dir.is_dir():
        shutil.copytree(task.tests_dir, staging, dirs_exist_ok=True)
    if task.fmt == "tb2":
        return f"{TESTS_PATH}/test.sh"
    shutil.copy(task.test_script, staging / "run-tests.sh")
    return f"{TESTS_PATH}/run-tests.sh"


def verify(sandbox: Sandbox, task: Task) -> VerifyResult:
    """Run the task's tests in `sandbox`; call only once the agent has finished (it stops its processes)."""
    sandbox.stop_processes()
    with tempfile.TemporaryDirectory() as tmp:
        script = _stage_tests(task, Path(tmp))
        sandbox.put_dir(Path(tmp), TESTS_PATH)
    sandbox.put_dir(None, VERIFIER_LOGS)
    res = sandbox.exec(f"{SANITIZE} && exec /bin/bash {script}", timeout_sec=task.verifier_timeout_sec,
                       env=PYTEST_ENV, with_pytest=True)
    tests, reward = _tests(sandbox, res.output), _reward(sandbox)
    log = res.output + (f"\n[verifier timed out after {task.verifier_timeout_sec}s]" if res.timed_out else "")
    missing = _missing(res.output)
    script_text = (task.tests_dir / "test.sh" if task.fmt == "tb2" else task.test_script).read_text(errors="replace")
    wants_pytest = "pytest" in script_text or bool(_SESSION.search(res.output))
    error = None
    if tests:
        partial = sum(tests.values()) / len(tests)
        strict = all(tests.values()) and not res.timed_out and (reward is None or reward >= 1.0)
        if missing:  # passed or not, the tests ran without it: the agent's files may have stood in for it
            strict, error = False, "the test script needed what the offline verifier lacks: " + "; ".join(missing)
    elif reward is not None and math.isfinite(reward) and not wants_pytest and not missing and not res.timed_out:
        partial, strict = min(max(reward, 0.0), 1.0), reward >= 1.0
    else:
        partial, strict = 0.0, False
        why = ("timed out" if res.timed_out else "; ".join(missing) if missing else
               "pytest reported no test" if wants_pytest else "no test results and no reward file")
        error = f"verifier produced no result ({why}, exit {res.exit_code}); output tail:\n{res.output[-2000:]}"
    return VerifyResult(strict=strict, partial=partial, tests=tests, log=log, reward=reward, error=error)


def _progress_nodes(task: Task) -> list[str]:
    """The progress tests' pytest node ids, relative to tests/."""
    return [t if "::" in t else f"test_outputs.py::{t}" for t in task.progress_tests]


def _progress_names(task: Task) -> list[str]:
    """The progress tests as the result parsers name them (the node id after the file)."""
    return [n.split("::", 1)[1] for n in _progress_nodes(task)]


def progress_from(result: VerifyResult, task: Task) -> float | None:
    """The final state's progress read from the verifier's run: the fraction of `task.progress_tests`
    it passed, when it reported every one of them; None (unmeasured) otherwise or on a verifier error."""
    if not task.progress_tests:
        return 0.0
    wanted = _progress_names(task)
    if result.error is not None or not all(w in result.tests for w in wanted):
        return None
    return sum(result.tests[w] for w in wanted) / len(wanted)


def probe_progress(sandbox: Sandbox, task: Task, timeout_sec: float = 30.0) -> float | None:
    """Fraction of `task.progress_tests` passing now, run out of the agent's view; None when it could
    not be measured (the probe failed or pytest reported none of them). 0.0 for a task without any."""
    if not task.progress_tests:
        return 0.0
    nodes = _progress_nodes(task)

    def cmd(where: str) -> str:
        args = " ".join(shlex.quote(f"{where}/{n}") for n in nodes)
        return f"TRSI_TEST_DIR={shlex.quote(where)} {PYTHON} -I {MOUNT}/shim.py pytest -q -rA {args}"

    try:
        res = sandbox.probe_exec(task.tests_dir, cmd, timeout_sec)
    except SandboxError:
        return None
    results = parse_pytest_ra(res.output)
    if not results or res.timed_out:
        return None
    wanted = _progress_names(task)
    return sum(bool(results.get(w)) for w in wanted) / len(wanted)
