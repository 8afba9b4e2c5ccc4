"""The docker backend against the running dockerd: builds, oracle/verifier, terminal, limits, escapes."""
import time

import pytest

from tests.sandbox_tasks import SECRET, TEST_OUTPUTS, write_tb1, write_tb2
from trsi_jax.sandbox import Limits, SandboxError, make_sandbox, probe_progress, run_oracle, verify
from trsi_jax.sandbox.docker import ensure_image, load_from_map, map_image
from trsi_jax.tasks import load_task

BASE = "trsi/base:bookworm"


def _docker_or_skip():
    try:
        import docker
        client = docker.from_env(timeout=10)
        client.ping()
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"dockerd unreachable: {e}")
    try:
        client.images.get(BASE)
    except docker.errors.ImageNotFound:
        pytest.skip(f"{BASE} missing: run sandboxes/docker/build_images.sh")
    return client


pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def client():
    return _docker_or_skip()


def test_from_image_mapping():
    rules = load_from_map()
    assert map_image("python:3.11-slim", rules) == "trsi/python:3.11"
    assert map_image("ubuntu:24.04", rules) == "trsi/debian:trixie"
    assert map_image("ghcr.io/laude-institute/t-bench/python-3-13:20250620", rules) == "trsi/python:3.13"
    assert map_image("trsi/custom:1", rules) == "trsi/custom:1"


def test_image_cached_by_content(client, tmp_path):
    task = load_task(write_tb2(tmp_path))
    tag = ensure_image(client, task)
    image_id = client.images.get(tag).id
    t0 = time.monotonic()
    assert ensure_image(client, load_task(write_tb2(tmp_path / "copy"))) == tag  # same content, same image
    assert time.monotonic() - t0 < 5 and client.images.get(tag).id == image_id
    (task.path / "environment" / "data.txt").write_text("changed\n")
    assert ensure_image(client, task) != tag


def test_oracle_and_empty_episode(client, tmp_path):
    for task in (load_task(write_tb2(tmp_path)), load_task(write_tb1(tmp_path, "sh", solution="sh"))):
        res = run_oracle(task, "docker")
        assert res.strict and res.tests == {"test_exists": True, "test_content": True, "test_seed": True}, res.log
    with make_sandbox(task, "docker") as sb:
        # root in its container, the agent swaps python3 for a fake that "passes"; the verifier runs in a
        # fresh container of the image carrying only the agent's non-system files.
        r = sb.exec("printf '%s\\n' '#!/bin/sh' 'echo PASSED test_outputs.py::test_exists' > /usr/local/bin/python3 "
                    "&& chmod +x /usr/local/bin/python3 && cp /usr/local/bin/python3 /usr/bin/python3 && python3")
        assert r.output == "PASSED test_outputs.py::test_exists\n"
        res = verify(sb, task)
    assert not res.strict and res.partial == pytest.approx(1 / 3)
    assert res.tests == {"test_exists": False, "test_content": False, "test_seed": True}


def test_packages_the_test_script_installs_are_built_into_the_image(client, tmp_path):
    """Offline, a test script's `apt-get install bc` cannot fetch at test time: the docker backend
    installs what the script names into the task's image at build time, so the tests find it.
    Without the line in the script the image has no bc (the control)."""
    tests = TEST_OUTPUTS + ("import subprocess\ndef test_bc():\n    assert subprocess.run(['bc'], input='6*7\\n', "
                            "capture_output=True, text=True).stdout == '42\\n'\n")

    def oracle(name: str, install: str):
        test_sh = (f"#!/bin/bash\napt-get update\n{install}\ncd /tests\npython3 -m pytest test_outputs.py -rA\n"
                   "if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n")
        return run_oracle(load_task(write_tb2(tmp_path, name, tests=tests, test_sh=test_sh)), "docker")

    res = oracle("with-bc", "apt-get install -y curl bc")
    assert res.strict and res.tests["test_bc"], res.log
    res = oracle("without-bc", "apt-get install -y curl")
    assert not res.strict and res.tests == {"test_exists": True, "test_content": True, "test_seed": True,
                                            "test_bc": False}, res.log


def test_terminal_probe_and_isolation(client, tmp_path):
    task = load_task(write_tb2(tmp_path))
    with make_sandbox(task, "docker") as sb:
        assert sb.container.attrs["HostConfig"]["NetworkMode"] == "none"
        r = sb.exec(f"ls /tests /solution {task.path}; grep -rl {SECRET[:12]} / --exclude-dir=proc --exclude-dir=sys "
                    "2>/dev/null | head; cat /proc/net/dev | tail -n +3 | cut -d: -f1; "
                    "mount -t tmpfs none /mnt 2>/dev/null; echo mount=$?")
        assert SECRET not in r.output and r.output.count("No such file or directory") == 3
        assert r.output.split()[-2:] == ["lo", "mount=32"]  # only loopback; no CAP_SYS_ADMIN
        term = sb.terminal()
        assert probe_progress(sb, task) == 0.0
        assert term.send_keys("echo hello > out.txt\n", 10)
        assert "echo hello > out.txt" in term.read_new_output()
        assert term.send_keys("python3 -c 'print(6 *\n7)'\n", 20)  # a continuation prompt counts too
        assert "42" in term.read_new_output().splitlines()
        assert probe_progress(sb, task) == 1.0
        assert sb.exec("ls -a /tmp").output.split() == [".", ".."]  # the probe's copy is gone
        term.send_keys("mkdir -p /logs/verifier; while true; do echo 0 > /logs/verifier/reward.txt; done &\n", 0.5)
        res = verify(sb, task)
        assert res.strict and res.reward == 1.0


def test_limits_and_floods(client, tmp_path):
    task = load_task(write_tb2(tmp_path))
    with make_sandbox(task, "docker", limits=Limits(pids=64, file_size_mb=8, output_bytes=4096, memory_mb=256)) as sb:
        r = sb.exec("python3 -c \"import os, time\nn = 0\nwhile n < 1000:\n    try:\n        pid = os.fork()\n"
                    "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(60)\n        os._exit(0)\n"
                    "    n += 1\nprint('forked', n)\"", timeout_sec=30)
        assert 0 < int(r.output.split("forked")[1]) < 64
        sb.stop_processes()
        r = sb.exec("yes", timeout_sec=1.5)
        assert r.timed_out and r.truncated and len(r.output) < 4200
        t0 = time.monotonic()
        assert sb.exec("sleep 1e9", timeout_sec=1).timed_out and time.monotonic() - t0 < 10
        r = sb.exec("head -c 100M /dev/zero > /app/big; stat -c %s /app/big")
        assert int(r.output.split()[-1]) <= 8 << 20, r.output
        r = sb.exec("python3 -c \"b = bytearray(512 << 20); b[::4096] = b'x' * len(b[::4096]); print('allocated')\"")
        assert "allocated" not in r.output
        assert sb.exec("echo alive").output.strip() == "alive"


def test_build_failure_is_a_sandbox_error(client, tmp_path):
    task = load_task(write_tb2(tmp_path, dockerfile="FROM debian:12\nRUN echo building && exit 3\n"))
    with pytest.raises(SandboxError, match="docker build failed"):
        make_sandbox(task, "docker")


@pytest.mark.parametrize("verifier_network", [False, True])
def test_verifier_network_is_per_phase(client, tmp_path, verifier_network):
    """`Limits.verifier_network`: the verifier's container is on the bridge (an interface besides
    lo), the agent's stays without network either way; the local backend refuses the option."""
    task = load_task(write_tb2(tmp_path))
    limits = Limits.for_task(task, verifier_network=verifier_network)
    with make_sandbox(task, "docker", limits=limits) as sb:
        assert sb.exec("ls /sys/class/net").output.split() == ["lo"]
        sb.stop_processes()
        interfaces = sb.exec("ls /sys/class/net", with_pytest=True).output.split()
        assert interfaces == (["eth0", "lo"] if verifier_network else ["lo"]), interfaces
    if verifier_network:
        with pytest.raises(SandboxError, match="docker backend only"):
            make_sandbox(task, "local", limits=limits)


SERVICE_TESTS = '''import urllib.request
from pathlib import Path
def test_service():
    assert urllib.request.urlopen("http://127.0.0.1:8080/hello.html", timeout=5).read() == b"served\\n"
def test_file():
    assert Path("/app/out.txt").exists()
'''
WAIT_LISTEN = ("python3 -c 'import socket, time\nfor _ in range(100):\n    try:\n"
               "        socket.create_connection((\"127.0.0.1\", 8080)); break\n"
               "    except OSError:\n        time.sleep(0.1)'")


@pytest.mark.parametrize("serve", [True, False])
def test_servers_the_agent_left_answer_the_tests_from_their_own_container(client, tmp_path, serve):
    """Tasks tested over the network (configure-git-webserver's git and web servers): a server the
    agent left listening keeps running in the agent's container, which the verifier's container joins
    on localhost but shares no files or processes with: the agent's loop there, forging the results
    once it sees the tests, never does, and that container goes with the sandbox. Without a server, all is stopped."""
    import docker
    task = load_task(write_tb2(tmp_path, tests=SERVICE_TESTS))
    with make_sandbox(task, "docker") as sb:
        term = sb.terminal()
        assert sb.exec("mkdir -p /srv/www /logs/verifier && echo served > /srv/www/hello.html").exit_code == 0
        if serve:
            term.send_keys("cd /srv/www && python3 -m http.server 8080 --bind 127.0.0.1 > /dev/null 2>&1 &\n", 1)
            assert sb.exec(WAIT_LISTEN).exit_code == 0
        # fires only where it sees the tests, i.e. if it shared the verifier's files, directly or
        # through another process's root
        term.send_keys("while true; do for r in / /proc/[0-9]*/root/; do [ -e ${r}tests/test_outputs.py ] && "
                       "touch ${r}app/out.txt && echo 1 > ${r}logs/verifier/reward.txt; done; sleep 0.01; "
                       "done 2>/dev/null &\n", 0.5)
        res = verify(sb, task)
        agent = sb.services
    assert res.tests == {"test_service": serve, "test_file": False}, res.log[-3000:]
    assert (res.strict, res.reward, res.error) == (False, 0.0, None)
    assert (agent is not None) == serve
    if agent is not None:
        with pytest.raises(docker.errors.NotFound):
            client.containers.get(agent.id)
