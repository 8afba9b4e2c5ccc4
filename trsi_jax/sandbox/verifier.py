"""Verification after the agent is done, and cheap mid-episode progress probes.

`verify` stops every process the agent left, discards whatever sits at /tests and /logs/verifier,
copies the task's tests in, runs tests/test.sh (TB2) or run-tests.sh (TB1) with a python that has
pytest, and reads per-test results (junit xml, else pytest -rA lines) and TB2 reward files.
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

from trsi_jax.sandbox.base import TESTS_PATH, VERIFIER_LOGS, Sandbox
from trsi_jax.tasks import Task

JUNIT = f"{VERIFIER_LOGS}/junit.xml"
_RA_LINE = re.compile(r"^(PASSED|FAILED|ERROR|XPASS|XFAIL|SKIPPED)\s+(\S+)", re.MULTILINE)
_PASS = {"PASSED", "XFAIL"}


@dataclasses.dataclass(frozen=True)
class VerifyResult:
    strict: bool  # every test passed (or the reward is 1 when only a reward file exists)
    partial: float  # fraction of tests passed (or the reward, clipped to [0, 1])
    tests: dict[str, bool]
    log: str
    reward: float | None = None


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


# Every pytest run of the test script writes junit xml and an -rA summary, and no caches.
# Third-party plugin autoload is off: it costs seconds per run and task tests do not rely on it.
PYTEST_ENV = {"PYTEST_ADDOPTS": f"-rA -p no:cacheprovider --junitxml={JUNIT}", "TEST_DIR": TESTS_PATH,
              "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}


def _stage_tests(task: Task, staging: Path) -> str:
    """Copy tests/ (plus TB1's run-tests.sh) into `staging`; return the command that runs them."""
    if task.tests_dir.is_dir():
        shutil.copytree(task.tests_dir, staging, dirs_exist_ok=True)
    if task.fmt == "tb2":
        return f"bash {TESTS_PATH}/test.sh"
    shutil.copy(task.test_script, staging / "run-tests.sh")
    return f"bash {TESTS_PATH}/run-tests.sh"


def verify(sandbox: Sandbox, task: Task) -> VerifyResult:
    """Run the task's tests in `sandbox`; call only once the agent has finished (it stops its processes)."""
    sandbox.stop_processes()
    with tempfile.TemporaryDirectory() as tmp:
        cmd = _stage_tests(task, Path(tmp))
        sandbox.put_dir(Path(tmp), TESTS_PATH)
    sandbox.put_dir(None, VERIFIER_LOGS)
    res = sandbox.exec(cmd, timeout_sec=task.verifier_timeout_sec, env=PYTEST_ENV, with_pytest=True)
    # pytest's own junit xml is exact; the -rA summary in the output is the fallback (the output may
    # also hold text printed by the agent's programs under test, so it is second choice).
    tests = {}
    junit = sandbox.read_file(JUNIT, max_bytes=8 << 20)
    if junit:
        try:
            tests = parse_junit(junit)
        except ET.ParseError:
            tests = {}
    if not tests:
        tests = parse_pytest_ra(res.output)
    reward = _reward(sandbox)
    log = res.output + (f"\n[verifier timed out after {task.verifier_timeout_sec}s]" if res.timed_out else "")
    if tests:
        partial = sum(tests.values()) / len(tests)
        strict = all(tests.values()) and not res.timed_out and (reward is None or reward >= 1.0)
    elif reward is not None and math.isfinite(reward):
        partial = min(max(reward, 0.0), 1.0)
        strict = reward >= 1.0 and not res.timed_out
    else:
        partial, strict = 0.0, False
    return VerifyResult(strict=strict, partial=partial, tests=tests, log=log, reward=reward)


def probe_progress(sandbox: Sandbox, task: Task, timeout_sec: float = 30.0) -> float:
    """Fraction of `task.progress_tests` passing now, run out of the agent's view (0.0 if none)."""
    if not task.progress_tests:
        return 0.0
    nodes = [t if "::" in t else f"test_outputs.py::{t}" for t in task.progress_tests]

    def cmd(where: str) -> str:
        args = " ".join(shlex.quote(f"{where}/{n}") for n in nodes)
        return f"PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python3 -m pytest -q -rA -p no:cacheprovider {args}"

    res = sandbox.probe_exec(task.tests_dir, cmd, timeout_sec)
    results = parse_pytest_ra(res.output)
    wanted = [n.split("::", 1)[1] for n in nodes]
    return sum(bool(results.get(w)) for w in wanted) / len(wanted)
