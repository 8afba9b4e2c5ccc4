"""The built-in task suite: determinism, splits, variety, TB2 folder structure, and (slow) real local sandboxes
running every family's oracle, its keystroke form, and an empty episode."""
import ast
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib

import pytest

from sandboxes.suite import FAMILIES, HELDOUT_OFFSET, TaskSpec, build_suite, make_task, split_seeds, write_task
from sandboxes.suite import build as build_cli
from sandboxes.suite.spec import AGENT_TIMEOUT_SEC
from trsi_jax.tasks import load_task

# Commands RUN lines may start with (what the local backend's host has): python3, coreutils, bash, git, sqlite3,
# tar, gzip.
RUN_OK = {"python3", "bash", "git", "sqlite3", "tar", "gzip", "cd", "mkdir", "printf", "chmod", "cp", "mv", "rm",
          "touch", "ln", "echo", "cat"}


def _tree(root):
    """{relative path: (bytes, mode)} of every file under root."""
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            out[os.path.relpath(p, root)] = (open(p, "rb").read(), os.stat(p).st_mode)
    return out


def _run_commands(shell: str) -> set[str]:
    """The program names a shell line runs (first word of each pipeline stage, after VAR=value prefixes)."""
    lex = shlex.shlex(shell, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    names, start = set(), True
    for tok in lex:
        if tok in ("&&", "||", ";", "|"):
            start = True
        elif start and not re.fullmatch(r"[A-Za-z_]\w*=.*", tok):
            names.add(tok)
            start = False
    return names


def test_run_commands_parser():
    assert _run_commands("cd repo && A='x y' git commit -m 'a | b; c' | tee f; sqlite3 db < s.sql") == {
        "cd", "git", "tee", "sqlite3"}


def _fingerprint(spec):
    """What makes two tasks the same task: instruction, environment and expectations (not the seed)."""
    return (spec.instruction, spec.tests, repr(sorted(spec.constants.items())), repr(sorted(spec.files.items())),
            spec.setup)


def test_deterministic(tmp_path):
    """Same seeds -> byte-identical folders, also across processes with different string-hash seeds."""
    a = build_suite(str(tmp_path / "a"), "train", 3)
    assert len(a) == 3 * len(FAMILIES)
    for hash_seed in ("1", "2"):
        out = tmp_path / f"b{hash_seed}"
        subprocess.run([sys.executable, "-m", "sandboxes.suite.build", "--out", str(out), "--per_family", "3"],
                       check=True, capture_output=True, env={**os.environ, "PYTHONHASHSEED": hash_seed},
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        assert _tree(tmp_path / "a") == _tree(out)


def test_splits_disjoint(tmp_path):
    train, held = set(split_seeds("train", 5000)), set(split_seeds("heldout", 5000))
    assert not train & held and min(held) >= HELDOUT_OFFSET > max(train)
    names = [os.path.basename(p) for p in build_suite(str(tmp_path), "heldout", 2, ["files", "git"])]
    assert names == ["files-1000000", "files-1000001", "git-1000000", "git-1000001"]
    seen = {_fingerprint(make_task(f, s)) for f in FAMILIES for s in range(40)}
    assert not seen & {_fingerprint(make_task(f, s)) for f in FAMILIES for s in range(HELDOUT_OFFSET, HELDOUT_OFFSET + 40)}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_variety(family):
    specs = [make_task(family, s) for s in range(60)]
    templates = {s.template for s in specs}
    assert len(templates) >= 3, f"{family} has only templates {templates}"
    fingerprints = {_fingerprint(s) for s in specs}
    assert len(fingerprints) == len(specs), f"{family}: only {len(fingerprints)} distinct tasks in 60 seeds"


def test_folders_load_and_follow_the_format(tmp_path):
    for path in build_suite(str(tmp_path), "train", 6):
        task = load_task(path)
        spec = make_task(task.family, int(path.rsplit("-", 1)[1]))
        cfg = tomllib.loads(open(os.path.join(path, "task.toml")).read())
        assert task.task_id == spec.name and task.category == task.family == spec.family
        assert task.difficulty in ("easy", "medium", "hard")
        assert cfg["environment"]["docker_image"] == "python:3.11-slim-bookworm"
        assert task.environment.workdir == "/app" and not task.allow_internet
        assert task.agent_timeout_sec == AGENT_TIMEOUT_SEC[task.difficulty] and task.verifier_timeout_sec > 0
        assert task.tags == (spec.family, spec.template)
        # Dockerfile: only FROM/WORKDIR/ENV/COPY/RUN; RUN lines use only the allowed tools.
        for line in open(os.path.join(path, "environment", "Dockerfile")).read().splitlines():
            op, _, arg = line.partition(" ")
            assert op in ("FROM", "WORKDIR", "ENV", "COPY", "RUN"), (path, line)
            if op == "RUN":
                assert _run_commands(arg) <= RUN_OK, (path, arg)
        # Tests: 3-6 test functions; progress tests are among them.
        src = open(os.path.join(path, "tests", "test_outputs.py")).read()
        names = [n.name for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]
        assert 3 <= len(names) <= 6 and set(task.progress_tests) <= set(names), (path, names)
        assert "/logs/verifier/reward.txt" in open(os.path.join(path, "tests", "test.sh")).read()
        # The keystroke form of the oracle is the same commands as solve.sh.
        keys = json.load(open(os.path.join(path, "solution", "commands.json")))
        assert [k["keystrokes"] for k in keys] == ["cd /app\n"] + [c + "\n" for c in spec.oracle_commands]
        assert open(os.path.join(path, "solution", "solve.sh")).read().endswith("\n".join(spec.oracle_commands) + "\n")
        assert os.access(os.path.join(path, "solution", "solve.sh"), os.X_OK)


def _spec(**over):
    base = dict(family="files", seed=0, template="t", difficulty="easy", instruction="do it", files={}, setup=(),
                oracle_commands=("true",), tests="def test_a():\n    pass\n\n\ndef test_b():\n    pass\n\n\ndef test_c():\n    pass\n",
                constants={}, progress_tests=("test_a",))
    return TaskSpec(**{**base, **over})


def test_bad_input_is_named(tmp_path):
    with pytest.raises(ValueError, match="needs 3-6 tests"):
        _spec(tests="def test_a():\n    pass\n").validate()
    with pytest.raises(ValueError, match="progress_tests"):
        _spec(progress_tests=("test_zzz",)).validate()
    with pytest.raises(ValueError, match="difficulty 'trivial'"):
        _spec(difficulty="trivial").validate()
    with pytest.raises(ValueError, match="'../x'"):
        _spec(files={"../x": "y"}).validate()
    with pytest.raises(ValueError, match=r"unknown families \['nope'\]"):
        build_suite(str(tmp_path), "train", 1, ["nope"])
    with pytest.raises(ValueError, match="split 'test'"):
        build_suite(str(tmp_path), "test", 1)
    write_task(_spec(), str(tmp_path))
    with pytest.raises(FileExistsError, match="files-0"):
        write_task(_spec(), str(tmp_path))


def test_cli(tmp_path, capsys):
    assert build_cli.main(["--out", str(tmp_path), "--split", "heldout", "--per_family", "2", "--families",
                           "archives,debugging", "--start", "5"]) == 0
    assert sorted(os.listdir(tmp_path)) == ["archives-1000005", "archives-1000006", "debugging-1000005",
                                            "debugging-1000006"]
    assert "wrote 4 tasks" in capsys.readouterr().out


# ---- real sandboxes (local bubblewrap backend) ----------------------------------------------------------------

needs_local = pytest.mark.skipif(shutil.which("bwrap") is None or shutil.which("tmux") is None,
                                 reason="local backend needs bubblewrap and tmux (installed by .ci/run)")

@pytest.mark.slow
@needs_local
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_oracle_passes_and_empty_episode_fails(family, tmp_path):
    from trsi_jax.sandbox import make_sandbox, probe_progress, run_oracle, verify
    paths = build_suite(str(tmp_path / "train"), "train", 1, [family])
    paths += build_suite(str(tmp_path / "heldout"), "heldout", 1, [family], start=1)
    for path in paths:
        task = load_task(path)
        res = run_oracle(task, "local")
        assert res.strict and res.partial == 1.0, f"{task.task_id} oracle failed:\n{res.log[-3000:]}"
    task = load_task(paths[0])
    with make_sandbox(task, "local") as sb:
        assert probe_progress(sb, task) == 0.0, "progress tests must start failing"
        res = verify(sb, task)
    assert not res.strict and res.partial < 1.0 and len(res.tests) >= 3, res.tests


@pytest.mark.slow
@needs_local
def test_oracle_keystrokes_solve_in_a_terminal(tmp_path):
    """solution/commands.json replayed into the tmux terminal (what bootstrap demonstrations do) solves the task."""
    from trsi_jax.sandbox import make_sandbox, verify
    for path in build_suite(str(tmp_path), "train", 1, ["git", "scripting"], start=3):
        task = load_task(path)
        with make_sandbox(task, "local") as sb:
            term = sb.terminal()
            for k in json.load(open(os.path.join(path, "solution", "commands.json"))):
                term.send_keys(k["keystrokes"], duration_sec=k["duration"])
            res = verify(sb, task)
        assert res.strict, f"{task.task_id}:\n{res.log[-2000:]}"
