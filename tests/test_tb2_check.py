"""experiments/check_tasks: failure causes classified from real Terminal-Bench 2 outputs, and one
real task checked end to end on the local backend."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from experiments.check_tasks import Row, check, classify, summary, table
from trsi_jax.tasks import load_task

TB2 = Path(__file__).resolve().parents[2] / "shared" / "terminal-bench-2"


@pytest.mark.parametrize("text, where, cause", [
    ("Cloning into '/app'...\nfatal: unable to access 'https://github.com/bottlepy/bottle.git/': Could not "
     "resolve host: github.com", "outside", "needs https://github.com, which this machine cannot reach"),
    ("docker build failed: The command '/bin/sh -c wget -q https://dl-cdn.alpinelinux.org/alpine/v3.19/x.iso "
     "-O /app/alpine.iso' returned a non-zero code: 4", "outside",
     "needs https://dl-cdn.alpinelinux.org, which this machine cannot reach"),
    ("E: Version '4.3.3-2build2' for 'r-base' was not found", "outside",
     "package r-base=4.3.3-2build2 is not in the reachable archives (Debian, PyPI; ubuntu:24.04 stands in "
     "as Debian trixie)"),
    ("E: Unable to locate package python3.12-venv", "outside",
     "package python3.12-venv is not in the reachable archives (Debian, PyPI; ubuntu:24.04 stands in as Debian "
     "trixie)"),
    ("trsi-verifier: apt-get update: skipped\ntrsi-verifier-missing: apt-get: package primer3 is not installed\n"
     "=== 1 failed in 0.3s ===", "inside", "trsi-verifier-missing: apt-get: package primer3 is not installed"),
    ("FAILED ../tests/test_outputs.py::test_gcov_enabled - AssertionError: No .gcda\n"
     "FAILED ../tests/test_outputs.py::test_b - x\n===== 2 failed, 1 passed in 0.23s =====", "inside",
     "FAILED ../tests/test_outputs.py::test_gcov_enabled - AssertionError: No .gcda"),
    ("Step 4/6 : COPY weights.pt /app/\nCOPY failed: file not found in build context or excluded by "
     ".dockerignore: stat weights.pt: file does not exist", "outside",
     "the task folder lacks weights.pt, which the Dockerfile copies"),
    ('[ERROR] Could not update repository "default": OpamDownload.Download_fail(_, "curl failed: \\"/usr/bin/curl '
     '--write-out %{http_code}\\\\n -L -o /tmp/opam/index.tar.gz.part -- https://opam.ocaml.org/index.tar.gz\\" '
     'exited with code 6")', "outside", "needs https://opam.ocaml.org, which this machine cannot reach"),
    ("headers = {'Connection': 'close', 'Host': 'github.com', 'User-Agent': 'Python-urllib/3.13'}\n"
     "E       socket.gaierror: [Errno -2] Name or service not known", "outside",
     "needs github.com, which this machine cannot reach"),
    ('  File "/usr/local/lib/python3.11/dist-packages/mteb/models/gme_v_models.py", line 13, in <module>\n'
     "    from transformers import AutoModelForVision2Seq, AutoProcessor\nImportError: cannot import name "
     "'AutoModelForVision2Seq' from 'transformers' (/usr/local/lib/python3.11/dist-packages/transformers/"
     "__init__.py)", "outside", "installed packages do not fit together (AutoModelForVision2Seq from "
     "transformers): the Dockerfile leaves versions unpinned and today's PyPI has moved on"),
    ("E:Package tesseract-ocr is not available, but is referred to by another package.\n However the following "
     "packages replace it:\n  libtesseract5\n\n Version '5.3.4-1build5' for 'tesseract-ocr' was not found",
     "outside", "package tesseract-ocr=5.3.4-1build5 is not in the reachable archives (Debian, PyPI; ubuntu:24.04 "
     "stands in as Debian trixie)"),
    ("", "inside", "no output"),
])
def test_classify(text, where, cause):
    assert classify(text) == (where, cause)


def test_table_and_summary():
    rows = [Row("a", "yes", "pass", "fail 1/3", 12.3), Row("bb", "no", where="outside", cause="build: needs x"),
            Row("c", "no", where="local", cause="build: y")]
    assert table(rows).splitlines() == [
        "task  built  oracle  empty     seconds  cause of failure",
        "a     yes    pass    fail 1/3  12       ",
        "bb    no     -       -         0        [outside] build: needs x",
        "c     no     -       -         0        [local] build: y"]
    assert summary(rows) == ("3 tasks: 1 healthy, 1 with an outside cause, 0 with an inside cause, "
                             "1 the local backend cannot build (use --backend=docker)")


@pytest.mark.skipif(not TB2.is_dir() or shutil.which("bwrap") is None,
                    reason="needs the shared TB2 tasks and bubblewrap")
def test_check_real_task_on_local_backend():
    """sparql-university (ubuntu:24.04, COPY only) on the local backend: its oracle passes and its
    empty episode fails with tests run."""
    row = check(load_task(TB2 / "sparql-university"), "local", oracle_internet=False)
    assert (row.built, row.oracle, row.where, row.cause) == ("yes", "pass", "", "")
    assert row.empty.startswith("fail ") and row.empty != "fail 0/0"


def test_local_backend_rejection_is_not_an_inside_cause():
    if not TB2.is_dir() or shutil.which("bwrap") is None:
        pytest.skip("needs the shared TB2 tasks and bubblewrap")
    row = check(load_task(TB2 / "regex-chess"), "local", oracle_internet=False)
    assert (row.built, row.where) == ("no", "local")
    assert row.cause.startswith("build (Dockerfile:5): ")
