"""Check Terminal-Bench task folders on a sandbox backend: per task, build the environment, run the
oracle (the reference solution, then the verifier) and an empty episode (the verifier alone).

    python -m experiments.check_tasks --tasks_dir=../shared/terminal-bench-2 --backend=docker --jobs=2
    python -m experiments.check_tasks --tasks_dir=... --task=regex-chess,sqlite --backend=local

A healthy task builds, its oracle passes, and its empty episode fails with tests actually run. Each
problem gets a one-line cause, marked `outside` when it lies outside the project (the environment
or solution needs a source this machine cannot reach, e.g. a download from an unreachable host) and
`inside` otherwise (a bug of ours, or a task we mishandle); `local` marks a step the local backend
cannot replay (it installs software), which --backend=docker can. Prints the table; exits 1 if any oracle
fails for an inside cause. --out writes the rows as JSON lines.
"""
from __future__ import annotations

import dataclasses
import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("tasks_dir", None, "folder of Terminal-Bench task folders (or one task folder)")
flags.DEFINE_enum("backend", "docker", ["local", "docker"], "sandbox backend")
flags.DEFINE_list("task", [], "only tasks whose id contains one of these strings (default: all)")
flags.DEFINE_integer("jobs", 1, "tasks checked at once")
flags.DEFINE_bool("oracle_internet", True, "give the reference solution the machine's network, as Terminal-Bench "
                  "does (solutions may apt-get or pip install); the empty episode never has it")
flags.DEFINE_bool("verifier_network", False, "docker: give the verifier's container the machine's network, so "
                  "test scripts fetch their tools as in Terminal-Bench; off, the offline toolchain stands in")
flags.DEFINE_string("out", None, "also write one JSON line per task here")
flags.DEFINE_string("task_logs", None, "write each task's full build/solution/verifier output to <task_logs>/<task>.log")

# Output that means a source this machine cannot reach was needed (group 1, if any, names it).
_UNREACHABLE = [
    re.compile(r"Looking in indexes: (https?://[\w.-]+)(?=[\s\S]*Failed to establish a new connection)"),
    re.compile(r"unable to access '(https?://[^/']+)"),
    re.compile(r"Could not resolve host:? ?'?([\w.-]+)"),
    re.compile(r"Failed to connect to ([\w-]+(?:\.[\w-]+)+) port"),
    re.compile(r"Resolving ([\w.-]+)[^\n]*failed"),
    re.compile(r"Temporary failure in name resolution"),
    re.compile(r"Network is unreachable"),
    re.compile(r"HTTPSConnectionPool\(host='([\w.-]+)'"),
    re.compile(r"Max retries exceeded with url"),
    re.compile(r"failed to resolve source metadata for ([\w./:-]+)"),
    re.compile(r"The command '/bin/sh -c (?:[^']*\b)?(?:wget|curl|git clone)\b[^']*?(https?://[\w.-]+)"),
    re.compile(r"Couldn't find '[^']*' on the (Hugging Face Hub)"),
    re.compile(r"We couldn't connect to '(https?://[\w.-]+)'"),
    re.compile(r"curl failed: [^\n]* -- (https?://[\w.-]+)[^\n]* exited with code (?:6|7)\b"),  # opam
    re.compile(r"'Host': '([\w.-]+)'(?=[\s\S]*gaierror: \[Errno -[23]\])"),  # urllib in a test
]
# A solution's install step failing on the local backend (host /usr read-only, no apt state, no network).
_LOCAL_INSTALL = re.compile(r"/var/lib/apt/lists/partial is missing|Could not open lock file|"
                            r"externally-managed-environment|Read-only file system")
# A COPY source missing from the task folder (docker's message, then the local backend's).
_NO_SOURCE = re.compile(r"COPY failed: file not found in build context[^\n]*stat ([^:\s]+)|COPY source '([^']+)' not found")
# Output that means a package is missing from the reachable Debian archive or PyPI.
_NO_PACKAGE = [
    re.compile(r"Unable to locate package (\S+)"),
    re.compile(r"Package '?(\S+?)'? has no installation candidate"),
    re.compile(r"No matching distribution found for (\S+)"),
    re.compile(r"Version '([^']+)' for '([^']+)' was not found"),  # (version, package); apt may drop "E: "
]

# An installed package importing a name another installed package no longer has.
_DRIFT = re.compile(r"/(?:site|dist)-packages/[^\n]*\n[^\n]*\nImportError: cannot import name '(\w+)' from '([\w.]+)'")


@dataclasses.dataclass
class Row:
    task: str
    built: str = "-"
    oracle: str = "-"
    empty: str = "-"
    seconds: float = 0.0
    where: str = ""  # "" (healthy), "outside" or "inside"
    cause: str = ""


def classify(text: str) -> tuple[str, str]:
    """(where, one-line cause) of a failure from its output: `outside` when it names an unreachable
    source or a package the reachable archives lack, else `inside` with the last telling line."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)  # docker build logs colour stderr
    if "could not find bridge docker0" in text:
        return "inside", "the docker engine's bridge network (docker0) is gone: restart dockerd, then re-run"
    m = re.search(r"HTTPSConnectionPool\(host='([\w.-]+)'[^\n]*Read timed out", text)
    if m:  # reachable, but slow under load: a re-run usually gets through
        return "outside", f"download from {m.group(1)} timed out (a reachable source: re-run)"
    m = _NO_SOURCE.search(text)
    if m:
        return "outside", f"the task folder lacks {m.group(1) or m.group(2)}, which the Dockerfile copies"
    for pat in _UNREACHABLE:
        m = pat.search(text)
        if m:
            what = m.group(1) if m.groups() else "a network source"
            return "outside", f"needs {what}, which this machine cannot reach"
    for pat in _NO_PACKAGE:
        m = pat.search(text)
        if m:
            name = f"{m.group(2)}={m.group(1)}" if len(m.groups()) == 2 else m.group(1)
            return "outside", (f"package {name} is not in the reachable archives (Debian, PyPI; "
                               "ubuntu:24.04 stands in as Debian trixie)")
    m = _DRIFT.search(text)
    if m:
        return "outside", (f"installed packages do not fit together ({m.group(1)} from {m.group(2)}): the "
                           "Dockerfile leaves versions unpinned and today's PyPI has moved on")
    return "inside", telling_line(text)


def telling_line(text: str) -> str:
    """The line that best says why: what the verifier lacked, else the first failed test of pytest's
    summary, else the last line that looks like an error, else the last line."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    for pick in ([ln for ln in lines if ln.startswith("trsi-verifier-missing:")],
                 [ln for ln in lines if ln.startswith("FAILED ")][:1],
                 [ln for ln in lines if _TELLING.search(ln) and not ln.startswith("=")], lines, ["no output"]):
        if pick:
            return pick[-1][:200]


_TELLING = re.compile(r"local backend:|externally-managed|Read-only file system|\berror\b|^E: |not found|failed|"
                      r"No such file", re.IGNORECASE)


def _result_cell(res) -> str:
    """`pass`, `fail k/n`, `reward r`, or `no result` for a VerifyResult."""
    if getattr(res, "error", None) or (not res.tests and res.reward is None):
        return "no result"
    if res.tests:
        return "pass" if res.strict else f"fail {sum(res.tests.values())}/{len(res.tests)}"
    return "pass" if res.strict else f"reward {res.reward:g}"


def _why(res, extra: str = "") -> str:
    return "\n".join(x for x in (extra, getattr(res, "error", None) or "", res.log) if x)


def _save(log_dir: str | None, task_id: str, **parts: str) -> None:
    if log_dir:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        text = "".join(f"===== {name}\n{value}\n" for name, value in parts.items())
        (Path(log_dir) / f"{task_id}.log").write_text(text)


def check(task, backend: str, oracle_internet: bool, log_dir: str | None = None,
          verifier_network: bool = False) -> Row:
    """Build, oracle and empty episode for one task (each in a fresh sandbox)."""
    from trsi_jax.sandbox import Limits, SandboxError, make_sandbox, verify
    from trsi_jax.sandbox.oracle import run_solution

    def sandbox(t):
        return make_sandbox(t, backend, Limits.for_task(t, verifier_network=verifier_network))

    row, start = Row(task.task_id), time.monotonic()
    try:
        try:
            sb = sandbox(task)
        except SandboxError as e:
            row.built = "no"
            header, _, output = str(e).partition(" Output: ")
            row.where, row.cause = classify(output or header)
            if backend == "local" and row.where == "inside" and "use --backend=docker" in header:
                row.where = "local"  # the local backend cannot replay this step: a limit, not a bug
            step = re.match(r"(\S+Dockerfile:\d+)", header)
            row.cause = f"build ({step.group(1).rsplit('/', 1)[-1] if step else 'Dockerfile'}): {row.cause}"
            _save(log_dir, task.task_id, build=str(e))
            return row
        row.built = "yes"
        solve_task = dataclasses.replace(task, allow_internet=True) if oracle_internet else task
        if solve_task is not task:
            sb.close()
            sb = sandbox(solve_task)
        with sb:
            out = run_solution(sb, solve_task) if task.solution_path else ""
            oracle = verify(sb, solve_task) if task.solution_path else None
        row.oracle = "no solution" if oracle is None else _result_cell(oracle)
        with sandbox(task) as esb:
            empty = verify(esb, task)
        row.empty = _result_cell(empty)
        _save(log_dir, task.task_id, solution=out, oracle=_why(oracle) if oracle else "", empty=_why(empty))
        if oracle is not None and row.oracle != "pass":
            where, cause = classify(_why(oracle, out))
            if re.search(r"^Setting up \S+", out, re.MULTILINE):
                cause += " (the solution apt-installed packages; does the verifier see them?)"
            if backend == "local" and where == "inside" and _LOCAL_INSTALL.search(out):
                where, cause = "local", f"the solution installs software, which the local backend cannot ({cause})"
            row.where, row.cause = where, f"oracle: {cause}"
        elif row.empty in ("pass", "no result"):
            where, cause = classify(_why(empty))
            row.where = "inside"
            row.cause = f"empty episode {'passes' if row.empty == 'pass' else 'ran no tests'}: {cause}"
    except Exception as e:  # noqa: BLE001 (one task's crash is a row, not the end of the check)
        row.where, row.cause = "inside", f"{type(e).__name__}: {str(e).strip().splitlines()[-1:]}"
    finally:
        row.seconds = time.monotonic() - start
    return row


def table(rows: list[Row]) -> str:
    head = ("task", "built", "oracle", "empty", "seconds", "cause of failure")
    cells = [head] + [(r.task, r.built, r.oracle, r.empty, f"{r.seconds:.0f}",
                       f"[{r.where}] {r.cause}" if r.cause else "") for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(5)]
    return "\n".join("  ".join(c[i].ljust(widths[i]) for i in range(5)) + "  " + c[5] for c in cells)


def summary(rows: list[Row]) -> str:
    ok = sum(r.oracle == "pass" and not r.cause for r in rows)
    inside = sum(r.where == "inside" for r in rows)
    outside = sum(r.where == "outside" for r in rows)
    local = sum(r.where == "local" for r in rows)
    return (f"{len(rows)} tasks: {ok} healthy, {outside} with an outside cause, {inside} with an inside cause"
            + (f", {local} the local backend cannot build (use --backend=docker)" if local else ""))


def main(argv):
    del argv
    if not FLAGS.tasks_dir:
        raise app.UsageError("--tasks_dir is required")
    from trsi_jax.tasks import load_tasks

    tasks, rejected = load_tasks(FLAGS.tasks_dir)
    keep = lambda name: not FLAGS.task or any(s in name for s in FLAGS.task)  # noqa: E731
    tasks = [t for t in tasks if keep(t.task_id)]
    rows = [Row(Path(p).name, built="rejected", where="inside", cause=f"load: {why}") for p, why in rejected
            if keep(Path(p).name)]
    print(f"checking {len(tasks)} tasks on {FLAGS.backend} (jobs={FLAGS.jobs}, oracle_internet={FLAGS.oracle_internet})",
          flush=True)
    out = open(FLAGS.out, "a") if FLAGS.out else None  # noqa: SIM115 (closed below)
    with ThreadPoolExecutor(max(1, FLAGS.jobs)) as pool:
        for row in pool.map(lambda t: check(t, FLAGS.backend, FLAGS.oracle_internet, FLAGS.task_logs,
                                        FLAGS.verifier_network), tasks):
            rows.append(row)
            print(f"{row.task}: built={row.built} oracle={row.oracle} empty={row.empty} {row.seconds:.0f}s "
                  f"{row.where} {row.cause}", flush=True)
            if out:
                out.write(json.dumps(dataclasses.asdict(row)) + "\n")
                out.flush()
    if out:
        out.close()
    rows.sort(key=lambda r: r.task)
    print(table(rows))
    print(summary(rows))
    bad = [r.task for r in rows if r.where == "inside" and r.oracle != "pass"]
    if bad:
        print(f"oracle fails for an inside cause: {', '.join(bad)}")
    return 1 if bad else 0


if __name__ == "__main__":
    app.run(main)
