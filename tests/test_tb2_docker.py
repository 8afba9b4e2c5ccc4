"""Real Terminal-Bench 2 tasks on the docker backend: they load, their environment builds from the
mapped local images (with the machine's package sources at build time), the reference solution
passes, and an empty episode fails with its tests actually run."""
from __future__ import annotations

from pathlib import Path

import pytest

from trsi_jax.sandbox import make_sandbox, run_oracle, verify
from trsi_jax.tasks import load_task

TB2 = Path(__file__).resolve().parents[2] / "shared" / "terminal-bench-2"
# Small builds that cover: a python:3.13 image with apt-get and a COPY from environment/tests
# (circuit-fibsqrt), apt-get at build time and in the solution (cobol-modernization), pip install at
# build time (model-extraction-relu-logits).
TASKS = ("circuit-fibsqrt", "cobol-modernization", "model-extraction-relu-logits")
pytestmark = [pytest.mark.docker, pytest.mark.slow,
              pytest.mark.skipif(not TB2.is_dir(), reason=f"{TB2} missing (the shared Terminal-Bench 2 tasks)")]


@pytest.fixture(scope="module")
def docker_images():
    try:
        import docker
        client = docker.from_env(timeout=10)
        client.ping()
        for image in ("trsi/python:3.13", "trsi/debian:trixie"):
            client.images.get(image)
    except Exception as e:  # noqa: BLE001 - any failure means the engine or the local images are not there
        pytest.skip(f"docker backend unavailable ({e}); run sandboxes/docker/build_images.sh")


@pytest.mark.parametrize("name", TASKS)
def test_tb2_oracle_passes_and_empty_episode_fails(name, docker_images):
    task = load_task(TB2 / name)
    oracle = run_oracle(task, "docker")
    assert oracle.error is None, oracle.error
    assert oracle.strict and oracle.tests and all(oracle.tests.values()), oracle.log[-3000:]
    with make_sandbox(task, "docker") as sb:
        empty = verify(sb, task)
    assert empty.error is None, empty.error
    assert empty.tests and not empty.strict and not all(empty.tests.values())
    assert set(empty.tests) == set(oracle.tests)
