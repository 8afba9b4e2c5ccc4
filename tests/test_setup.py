"""The fresh-machine contract: a missing host tool is named, and set-up without root prints the command."""
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.sandbox_tasks import write_tb2
from trsi_jax.sandbox import SandboxError, make_sandbox
from trsi_jax.tasks import load_task

ROOT = Path(__file__).resolve().parents[1]


def _path_with(tmp_path, tools) -> str:
    """A PATH directory holding only `tools` (links to the real programs)."""
    d = tmp_path / "bin"
    d.mkdir(mode=0o755)
    for t in tools:
        (d / t).symlink_to(shutil.which(t))
    return str(d)


@pytest.mark.skipif(os.geteuid() != 0, reason="the local backend needs root")
def test_local_sandbox_names_missing_tool(tmp_path, monkeypatch):
    task = load_task(write_tb2(tmp_path))
    monkeypatch.setenv("PATH", _path_with(tmp_path, ["tmux"]))  # tmux present, bwrap missing
    with pytest.raises(SandboxError, match=r"needs bwrap \(Debian package bubblewrap\)"):
        make_sandbox(task, "local")


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("su") is None, reason="needs root to run as nobody")
def test_setup_without_root_prints_exact_command():
    with tempfile.TemporaryDirectory() as tmp:  # a copy under /tmp, so that `nobody` can read it
        tmp = Path(tmp)
        tmp.chmod(0o755)
        (tmp / "scripts").mkdir(mode=0o755)
        shutil.copy(ROOT / "scripts" / "setup_system.sh", tmp / "scripts")
        path = _path_with(tmp, ["bash", "id", "dirname"])  # no bwrap, tmux, git, ... on PATH
        res = subprocess.run(["su", "nobody", "-s", "/bin/bash", "-c",
                              f"PATH={path} bash {tmp}/scripts/setup_system.sh demo"],
                             capture_output=True, text=True, timeout=60)
    assert res.returncode == 1, res.stderr
    assert "sudo apt-get update && sudo apt-get install -y bubblewrap tmux" in res.stderr
