"""The bubblewrap backend with real commands: oracle/verifier, terminal, limits and escape attempts."""
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.sandbox_tasks import SECRET, write_tb1, write_tb2
from trsi_jax.sandbox import Limits, SandboxError, make_sandbox, probe_progress, run_oracle, verify
from trsi_jax.sandbox.verifier import parse_junit, parse_pytest_ra
from trsi_jax.tasks import load_task

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None or shutil.which("tmux") is None,
                                reason="bubblewrap and tmux are required (apt-get install bubblewrap tmux)")


@pytest.fixture
def tb2(tmp_path):
    return load_task(write_tb2(tmp_path))


def test_oracle_passes_tb2_and_tb1(tmp_path):
    for task in (load_task(write_tb2(tmp_path)), load_task(write_tb1(tmp_path, "sh", solution="sh")),
                 load_task(write_tb1(tmp_path, "yaml", solution="yaml"))):
        res = run_oracle(task, "local")
        assert res.strict, (task.task_id, res.log)
        assert res.tests == {"test_exists": True, "test_content": True, "test_seed": True}
        assert res.partial == 1.0
    assert res.reward is None  # TB1 writes no reward file
    assert run_oracle(load_task(write_tb2(tmp_path, "r")), "local").reward == 1.0


def test_empty_episode_fails_with_partial_credit(tb2):
    with make_sandbox(tb2) as sb:
        res = verify(sb, tb2)
    assert not res.strict
    assert res.tests == {"test_exists": False, "test_content": False, "test_seed": True}
    assert res.partial == pytest.approx(1 / 3) and res.reward == 0.0


def test_environment_built_from_dockerfile(tb2):
    with make_sandbox(tb2) as sb:
        r = sb.exec('pwd; cat seed.txt data.txt; echo "$GREETING/$OTHER"; test -d /srv/x && echo srv; id -u')
    assert r.exit_code == 0 and not r.timed_out
    assert r.output.split("\n")[:6] == ["/app", "seeded", "data", "seeded/two words", "srv", "0"]


def test_progress_probe_mid_episode(tb2):
    with make_sandbox(tb2) as sb:
        term = sb.terminal()
        assert probe_progress(sb, tb2) == 0.0
        term.send_keys("echo hi > /app/out.txt\n", 5)
        assert probe_progress(sb, tb2) == 0.5  # exists, but the content is wrong
        term.send_keys("echo hello > /app/out.txt\n", 5)
        assert probe_progress(sb, tb2) == 1.0
        assert term.send_keys("ls -a /tests /tmp | wc -l\n", 5)  # the probe left nothing behind
        assert "No such file" in term.read_new_output()
        assert verify(sb, tb2).strict


def test_terminal_keys_wait_and_output(tb2):
    with make_sandbox(tb2) as sb:
        term = sb.terminal()
        t0 = time.monotonic()
        assert term.send_keys("echo $((6*7))\n", 10)  # returns at the next prompt, not after 10 s
        assert time.monotonic() - t0 < 5
        assert "42" in term.read_new_output().splitlines()
        assert not term.send_keys("sleep 30\n", 0.5)  # still running after the duration
        term.send_keys("C-c", 0.3)
        assert term.send_keys("echo after-interrupt\n", 5)
        out = term.read_new_output()
        assert "^C" in out and "after-interrupt" in out
        term.send_keys("seq 1 3000\n", 10)
        out = term.read_new_output(max_bytes=400)
        assert len(out.encode()) < 500 and "bytes of output omitted" in out and out.rstrip().endswith("#")
        assert term.send_keys("exit\n", 2) is False  # shell gone: next call gets a fresh shell
        assert term.send_keys("echo fresh-shell\n", 5)
        assert "fresh-shell" in term.screen()


def test_multi_line_commands_return_at_their_prompt(tb2):
    # Every Enter of a multi-line command is answered by a continuation prompt (PS2), which counts
    # like the primary prompt: the call returns once the command ran, not after its duration.
    commands = {"python3 -c 'import sys\nprint(\"py\" + \"thon\")\nsys.exit(0)'\n": "python",
                "cat > notes.txt <<EOF\nalpha\nEOF\ncat notes.txt\n": "alpha",
                "for i in 1 2; do\necho loop-$i\ndone\n": "loop-2",
                "echo joined \\\nline\n": "joined line"}
    with make_sandbox(tb2) as sb:
        term = sb.terminal()
        assert term.send_keys("set -u\n", 5)  # the prompts' counting survives the agent's shell options
        for keys, shown in commands.items():
            t0 = time.monotonic()
            assert term.send_keys(keys, 20), keys
            assert time.monotonic() - t0 < 10, keys
            out = term.read_new_output()
            assert shown in out.splitlines() and "\n> " in out, out  # bash's own "> " is what shows
        t0 = time.monotonic()
        assert not term.send_keys("echo 'never closed\n", 1.0)  # still waiting for input
        assert time.monotonic() - t0 >= 1.0
        term.send_keys("C-c", 0.3)
        assert term.send_keys("echo after\n", 5) and "after" in term.read_new_output()


def test_observations_do_not_race_the_prompt(tb2):
    """The prompt counter moves before bash prints the prompt: the first screen and every
    observation read right after a finished command end with the prompt, so the next observation
    starts with the typed command alone, every time, even with many sandboxes starting at once
    (else a seeded episode observes different text from run to run)."""
    def episode(i: int) -> list[list[str]]:
        with make_sandbox(tb2) as sb:
            term = sb.terminal()
            outs = []
            for k in range(3):
                assert term.send_keys(f"echo line-{i}-{k}\n", 5)
                outs.append(term.read_new_output().splitlines())
            return outs

    with ThreadPoolExecutor(12) as pool:
        for i, outs in enumerate(pool.map(episode, range(12))):
            for k, out in enumerate(outs):
                assert out[:2] == [f" echo line-{i}-{k}", f"line-{i}-{k}"] and out[2].endswith("#"), out


def test_host_environment_stays_out(tmp_path, monkeypatch):
    """The host's environment (here a marker and the LD_PRELOAD the Makefile sets for tcmalloc)
    reaches neither the agent's commands and terminal nor the verifier's tests."""
    monkeypatch.setenv("TRSI_HOST_MARK", "host-only")
    monkeypatch.setenv("LD_PRELOAD", os.environ.get("LD_PRELOAD", ""))
    tests = ("import os\ndef test_env():\n"
             "    assert 'TRSI_HOST_MARK' not in os.environ and 'LD_PRELOAD' not in os.environ\n")
    task = load_task(write_tb2(tmp_path, tests=tests))
    with make_sandbox(task) as sb:
        assert "TRSI_HOST_MARK" not in sb.exec("env").output
        term = sb.terminal()
        assert term.send_keys("env | grep -c -E 'TRSI_HOST_MARK|LD_PRELOAD'\n", 5)
        assert term.read_new_output().strip().splitlines()[-2:-1] == ["0"]
        assert verify(sb, task).tests == {"test_env": True}


def test_no_network(tb2):
    with make_sandbox(tb2) as sb:
        r = sb.exec("python3 -c \"import socket; s=socket.socket(); s.settimeout(3); s.connect(('1.1.1.1', 80))\"; "
                    "ls /sys/class/net 2>/dev/null; cat /proc/net/dev | tail -n +3 | cut -d: -f1")
    assert r.exit_code == 0
    assert "Network is unreachable" in r.output
    assert [x.strip() for x in r.output.strip().splitlines()[-1:]] == ["lo"]


def test_cannot_read_tests_solution_or_task_folder(tb2):
    with make_sandbox(tb2) as sb:
        term = sb.terminal()
        cmds = [f"cat {tb2.path}/tests/test_outputs.py", f"ls {tb2.path}", "ls /tests /solution",
                f"grep -rl {SECRET[:12]} / --exclude-dir=proc --exclude-dir=sys --exclude-dir=usr 2>/dev/null | head",
                "ls /work /root /home"]
        r = sb.exec("; ".join(cmds))
        assert SECRET not in r.output
        assert r.output.count("No such file or directory") == 5  # cat, ls task, /tests, /solution, /work
        term.send_keys(f"cat {tb2.path}/solution/solve.sh\n", 5)
        assert SECRET not in term.read_new_output()


def test_writes_outside_sandbox_fail_or_stay_inside(tb2, tmp_path):
    marker = tmp_path / "escaped"
    with make_sandbox(tb2) as sb:
        r = sb.exec(f"touch /usr/bin/x; touch {marker}; echo pwned >> /etc/hosts; mkdir -p /opt/own && touch /opt/own/f; "
                    "mount -t tmpfs none /mnt; echo rc=$?")
        assert "Read-only file system" in r.output and "rc=" in r.output and "rc=0" not in r.output
        root = sb.root
        assert (root / "opt" / "own" / "f").exists()  # lands in the sandbox's own root
    assert not marker.exists() and not os.path.exists("/usr/bin/x")
    assert "pwned" not in open("/etc/hosts").read()
    assert not root.exists()  # torn down with the sandbox


def test_agent_cannot_forge_verifier_output(tb2):
    with make_sandbox(tb2) as sb:
        sb.exec("mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt && "
                "printf '<testsuite><testcase name=\"test_exists\"/></testsuite>' > /logs/verifier/junit.xml; "
                "mkdir -p /tests && cp /app/seed.txt /tests/test_outputs.py; "
                # a fake pytest on the agent's paths, a poisoned /bin, a preload and a loop rewriting the reward
                "printf 'import sys; print(\"PASSED test_outputs.py::test_exists\"); sys.exit(0)' > /app/pytest.py; "
                "echo '/app/evil.so' > /etc/ld.so.preload; rm /bin && mkdir /bin && printf '#!/usr/bin/sh\\nexit 0' > /bin/bash; "
                "chmod +x /bin/bash")
        sb.terminal().send_keys("while true; do echo 1 > /logs/verifier/reward.txt; done &\n", 0.5)
        res = verify(sb, tb2)
    assert not res.strict and res.reward == 0.0
    assert res.tests == {"test_exists": False, "test_content": False, "test_seed": True}


def test_fork_bomb_is_contained(tb2):
    limits = Limits(pids=64, cpu_sec=60)
    with make_sandbox(tb2, limits=limits) as sb:
        if sb.cgroup is None:
            pytest.skip("no writable cgroup (pids controller) on this machine: fork bombs are not capped")
        r = sb.exec("python3 -c \"import os, time\nn = 0\nwhile n < 1000:\n    try:\n        pid = os.fork()\n"
                    "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(60)\n        os._exit(0)\n"
                    "    n += 1\nprint('forked', n)\"", timeout_sec=30)
        forked = int(r.output.split("forked")[1])
        assert 0 < forked < 64
        sb.exec(":(){ :|:& };:", timeout_sec=2)  # the classic, in bash
        assert sb.exec("echo still-alive").output.strip() == "still-alive"
        # Everything was killed with its command: the pid namespace's members get SIGKILL when its
        # init dies and leave the cgroup as the kernel reaps them, a moment after exec returns.
        deadline = time.monotonic() + 5
        while sb.cgroup.pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sb.cgroup.pids() == []


def test_output_flood_time_and_file_limits(tb2):
    with make_sandbox(tb2, limits=Limits(file_size_mb=8, output_bytes=4096)) as sb:
        t0 = time.monotonic()
        r = sb.exec("yes", timeout_sec=1.5)
        assert r.timed_out and r.truncated and r.exit_code == -1
        assert "bytes of output omitted" in r.output and len(r.output) < 4200
        r = sb.exec("sleep 1e9", timeout_sec=1)
        assert r.timed_out and time.monotonic() - t0 < 10
        r = sb.exec("head -c 100M /dev/zero > /app/big; echo rc=$?; stat -c %s /app/big")
        assert "File size limit exceeded" in r.output or "rc=153" in r.output
        assert int(r.output.split()[-1]) <= 8 << 20


def test_memory_limit(tb2):
    with make_sandbox(tb2, limits=Limits(memory_mb=128)) as sb:
        r = sb.exec("python3 -c \"b = bytearray(512 << 20); b[::4096] = b'x' * len(b[::4096]); print('allocated')\"")
    assert r.exit_code != 0 and "allocated" not in r.output


def test_background_processes_die_with_the_sandbox(tb2):
    with make_sandbox(tb2) as sb:
        term = sb.terminal()
        term.send_keys("sleep 1e9 & disown; setsid sleep 1e9 &\n", 1)
        cg = sb.cgroup
        if cg is not None:
            assert len(cg.pids()) >= 2
        sb.stop_processes()
        if cg is not None:
            assert cg.pids() == []
        with pytest.raises(SandboxError, match="terminal is closed"):
            term.send_keys("echo\n")


def test_sandbox_death_raises_sandbox_error(tb2):
    with make_sandbox(tb2) as sb:
        term = sb.terminal()
        if sb.cgroup is None:
            pytest.skip("no writable cgroup to kill the sandbox's processes through")
        sb.cgroup.kill_all()  # every process of the sandbox dies, the tmux server included
        with pytest.raises(SandboxError, match="terminal"):
            term.send_keys("echo hi\n", 1)
        if sb.root.is_mount():  # the root is its own disk (disk.py): unmount it first
            subprocess.run(["umount", "-l", str(sb.root)], check=True)
        shutil.rmtree(sb.root)
        with pytest.raises(SandboxError, match="vanished"):
            sb.exec("true")


def test_bad_environment_raises_sandbox_error(tmp_path):
    bad_run = load_task(write_tb2(tmp_path, "a", dockerfile="FROM debian:12\nRUN echo building; exit 3\n"))
    with pytest.raises(SandboxError, match=r"Dockerfile:2: RUN failed \(exit 3\).*building"):
        make_sandbox(bad_run)
    bad_copy = load_task(write_tb2(tmp_path, "b", dockerfile="FROM debian:12\nCOPY missing.txt /app/\n"))
    with pytest.raises(SandboxError, match="COPY source 'missing.txt' not found"):
        make_sandbox(bad_copy)
    sys_write = load_task(write_tb2(tmp_path, "c", dockerfile="FROM debian:12\nCOPY data.txt /usr/local/bin/\n"))
    with pytest.raises(SandboxError, match="cannot write into /usr"):
        make_sandbox(sys_write)


def test_terminal_outlives_the_thread_that_made_it(tb2):
    """bwrap's --die-with-parent follows the spawning thread; a worker thread may end before the episode."""
    made = {}

    def work():
        made["sb"] = make_sandbox(tb2)
        made["term"] = made["sb"].terminal()

    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
    with made["sb"] as sb:
        assert made["term"].send_keys("echo survived\n", 5)
        assert "survived" in sb.terminal().read_new_output()


def test_sandboxes_start_together_while_a_killed_runs_dirs_are_swept(tb2):
    """A run killed mid-rollout leaves `trsi-sbx-<pid>-*` dirs; the next run's sandboxes, started
    from many threads at once, each sweep them. Every start must succeed (a sweep racing another
    one used to fail 13 of 32 sandbox starts) and the dead run's dirs must be gone."""
    import tempfile
    from pathlib import Path

    from trsi_jax.sandbox import disk

    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = [tempfile.mkdtemp(prefix=f"trsi-sbx-{dead.pid}-") for _ in range(24)]
    for d in stale:  # as a killed run leaves them: the root on its mounted disk where quotas work
        if disk.available():
            disk._make(Path(d), 64, 4096)  # noqa: SLF001 - the dir layout a sandbox start makes
        os.makedirs(os.path.join(d, "root", "app"), exist_ok=True)
    made, errors = [], []

    def start():
        try:
            made.append(make_sandbox(tb2))
        except Exception as e:  # noqa: BLE001 - the test reports every failed start
            errors.append(repr(e))

    workers = [threading.Thread(target=start) for _ in range(32)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    for sb in made:
        sb.close()
    assert not errors, errors
    assert not [d for d in stale if os.path.exists(d)]


@pytest.mark.parametrize("script, strict, partial, reward", [
    ("echo 0.5 > /logs/verifier/reward.txt", False, 0.5, 0.5),
    ("echo 1 > /logs/verifier/reward.txt", True, 1.0, 1.0),
    ('echo \'{"reward": 1.0, "style": 0.2}\' > /logs/verifier/reward.json', True, 1.0, 1.0),
    ('echo \'{"a": 1.0, "b": 0.0}\' > /logs/verifier/reward.json', False, 0.5, 0.5),
    ("echo not-a-number > /logs/verifier/reward.txt", False, 0.0, None),
    ("exit 0", False, 0.0, None),  # no tests and no reward: nothing was shown to pass
])
def test_reward_files_without_pytest(tmp_path, script, strict, partial, reward):
    task = load_task(write_tb2(tmp_path, test_sh=f"#!/bin/bash\n{script}\n"))
    with make_sandbox(task) as sb:
        res = verify(sb, task)
    assert (res.strict, res.partial, res.reward, res.tests) == (strict, partial, reward, {})


def test_pytest_summary_parsing():
    out = ("PASSED tests/test_outputs.py::test_a\nFAILED tests/test_outputs.py::test_b - assert 0 == 1\n"
           "ERROR tests/test_outputs.py::test_c - fixture 'x' not found\nPASSED test_outputs.py::test_p[1-2]\n"
           "SKIPPED [1] test_outputs.py:9: no\nXFAIL test_outputs.py::test_x\n")
    assert parse_pytest_ra(out) == {"test_a": True, "test_b": False, "test_c": False, "test_p[1-2]": True,
                                    "test_x": True}
    xml = (b'<testsuites><testsuite><testcase name="test_a"/><testcase name="test_b"><failure/></testcase>'
           b'<testcase name="test_c"><error/></testcase><testcase name="test_d"><skipped/></testcase>'
           b'</testsuite></testsuites>')
    assert parse_junit(xml) == {"test_a": True, "test_b": False, "test_c": False}


def test_leftovers_of_a_killed_owner_are_swept(tb2):
    """A process SIGKILLed mid-episode cannot close its sandbox; the next sandbox removes what it left."""
    code = ("import sys, time; from trsi_jax.tasks import load_task; from trsi_jax.sandbox import make_sandbox\n"
            f"sb = make_sandbox(load_task({str(tb2.path)!r})); sb.terminal()\n"
            "print(sb.root.parent, sb.cgroup.dirs[0] if sb.cgroup else '', flush=True); time.sleep(60)")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    sandbox_dir, cgroup_dir = child.stdout.readline().split(" ")
    cgroup_dir = cgroup_dir.strip()
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert os.path.isdir(sandbox_dir)
    with make_sandbox(tb2):
        assert not os.path.exists(sandbox_dir)
        assert not cgroup_dir or not os.path.exists(cgroup_dir)
