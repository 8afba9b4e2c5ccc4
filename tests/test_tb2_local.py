"""Real Terminal-Bench 2 task folders on the local backend: the Dockerfile's COPY of environment/tests
lands in the image, `apt-get install` is satisfied by what the host has, and anything else is rejected
naming the step and the docker backend."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from trsi_jax.sandbox import SandboxError, make_sandbox
from trsi_jax.sandbox.apt_standin import BUILD_DIR, host_packages
from trsi_jax.tasks import load_task

TB2 = Path(__file__).resolve().parents[2] / "shared" / "terminal-bench-2"
pytestmark = [pytest.mark.skipif(shutil.which("bwrap") is None or shutil.which("tmux") is None,
                                 reason="bubblewrap and tmux are required (apt-get install bubblewrap tmux)"),
              pytest.mark.skipif(not TB2.is_dir(), reason=f"{TB2} missing (the shared Terminal-Bench 2 tasks)")]


@pytest.mark.skipif("gcc" not in host_packages().split(), reason="the host has no gcc package")
def test_circuit_fibsqrt_builds_locally_with_its_tests_file():
    """apt-get update/install gcc (on the host) pass through the stand-in; COPY tests/sim.c is kept."""
    task = load_task(TB2 / "circuit-fibsqrt")
    with make_sandbox(task, "local") as sb:
        assert sb.read_file("/app/sim.c") == (TB2 / "circuit-fibsqrt/environment/tests/sim.c").read_bytes()
        assert sb.read_file("/app/gates.txt") == (TB2 / "circuit-fibsqrt/environment/gates.txt").read_bytes()
        res = sb.exec(f"ls -d {BUILD_DIR}; command -v apt-get")
    # the stand-in is gone once the agent starts: apt-get is the host's again
    assert res.output.splitlines() == [f"ls: cannot access '{BUILD_DIR}': No such file or directory",
                                       "/usr/bin/apt-get"]


def test_missing_apt_package_rejects_with_step_and_remedy(tmp_path):
    task_dir = tmp_path / "t"
    shutil.copytree(TB2 / "circuit-fibsqrt", task_dir)
    dockerfile = task_dir / "environment" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text().replace("apt-get install -y gcc",
                                                         "apt-get install -y --no-install-recommends "
                                                         "trsi-no-such-package=1.0 gcc"))
    with pytest.raises(SandboxError) as e:
        make_sandbox(load_task(task_dir), "local")
    msg = str(e.value)
    assert f"{dockerfile}:6: RUN failed (exit 100)" in msg
    assert "not on the host: trsi-no-such-package." in msg and "use --backend=docker" in msg
    assert not list(Path("/tmp").glob(f"trsi-sbx-*/root{BUILD_DIR}"))


def test_pip_install_step_names_the_docker_backend():
    """regex-chess pip-installs into the (read-only, externally managed) host Python: a clear rejection."""
    with pytest.raises(SandboxError, match=r"regex-chess/environment/Dockerfile:\d+: RUN failed .*use --backend=docker"):
        make_sandbox(load_task(TB2 / "regex-chess"), "local")


def test_host_packages_lists_installed_ones_only():
    names = host_packages().split()
    assert "bash" in names and "dpkg" in names
    status = subprocess.run(["dpkg-query", "-W", "-f", "${db:Status-Abbrev}", names[0]], capture_output=True,
                            text=True).stdout
    assert status.startswith("ii")
