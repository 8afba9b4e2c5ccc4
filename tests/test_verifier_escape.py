"""Attacks on the verifier, each on both backends: whatever the agent leaves behind, the reward is
the one its files earn. The task compares /app/out.txt with a golden file in /tests and runs a real
Terminal-Bench test.sh (apt-get, the uv installer piped to sh, uvx pytest --ctrf) through the
verifier toolchain; the empty episode earns exactly EMPTY, reward 0. Planted code writes a marker
only when it sees the golden file, i.e. only if it runs inside the verifier."""
import subprocess
import textwrap

import pytest

from tests.sandbox_tasks import write_tb2
from trsi_jax.sandbox import make_sandbox, probe_progress, verify
from trsi_jax.tasks import load_task

GOLDEN = "golden-4d1c9e\n"
TESTS = '''from pathlib import Path
def test_exists():
    assert Path("/app/out.txt").exists()
def test_content():
    assert Path("/app/out.txt").read_text() == Path("/tests/expected.txt").read_text()
def test_seed():
    assert Path("/app/seed.txt").read_text().strip() == "seeded"
'''
TEST_SH = """#!/bin/bash
apt-get update
apt-get install -y curl
curl -LsSf https://astral.sh/uv/0.9.5/install.sh | sh
source $HOME/.local/bin/env
if [ "$PWD" = "/" ]; then echo "Error: No working directory set."; exit 1; fi
uvx -p 3.13 -w pytest==8.4.1 -w pytest-json-ctrf==0.3.5 pytest --ctrf /logs/verifier/ctrf.json /tests/test_outputs.py -rA
if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
"""
EMPTY = {"test_exists": False, "test_content": False, "test_seed": True}
FORGE_CONFTEST = textwrap.dedent("""\
    import pytest
    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(item, call):
        outcome = yield
        outcome.get_result().outcome = "passed"
    """)
BACKENDS = ["local", pytest.param("docker", marks=pytest.mark.docker)]


def _docker_or_skip():
    try:
        import docker
        docker.from_env(timeout=10).ping()
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"dockerd unreachable: {e}")


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    d = write_tb2(tmp_path_factory.mktemp("esc"), "golden", tests=TESTS, test_sh=TEST_SH)
    (d / "tests" / "expected.txt").write_text(GOLDEN)
    return load_task(d)


def _verify_after(task, backend, *cmds, files=None, terminal=None):
    """Run the agent's commands (and put `files`: {sandbox dir: host dir}), then verify; returns the
    result and what the verifier's view holds at the marker paths."""
    if backend == "docker":
        _docker_or_skip()
    with make_sandbox(task, backend) as sb:
        for where, host in (files or {}).items():
            sb.put_dir(host, where)
        for c in cmds:
            r = sb.exec(c)
            assert r.exit_code == 0, (c, r.output)  # the attack really was planted
        if terminal:
            sb.terminal().send_keys(terminal, 0.5)
        res = verify(sb, task)
        markers = {m: sb.read_file(f"/app/{m}") for m in ("pwned", "pwned-ld", "pwned-pth", "pwned-site")}
    return res, {k: v for k, v in markers.items() if v is not None}


def _assert_not_forged(res, markers):
    assert (res.tests, res.reward, res.strict, res.error) == (EMPTY, 0.0, False, None), res.log[-3000:]
    assert markers == {}


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_and_solved_baseline(task, backend):
    res, _ = _verify_after(task, backend)
    _assert_not_forged(res, {})
    solved, _ = _verify_after(task, backend, f"printf '{GOLDEN.strip()}\\n' > /app/out.txt")
    assert (solved.tests, solved.reward, solved.strict, solved.error) == (dict.fromkeys(EMPTY, True), 1.0, True, None)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("plant", [
    "printf '[pytest]\\n' > /pytest.ini && cp /opt/plant/conftest.txt /conftest.py",
    "cp /opt/plant/conftest.txt /conftest.py",  # docker: a lone /conftest.py above /tests
    "printf '[pytest]\\naddopts = -k test_seed\\n' > /tox.ini",  # only the passing test would run
    "printf '[tool.pytest.ini_options]\\naddopts = \"-k test_seed\"\\n' > /pyproject.toml && "
    "printf '[pytest]\\naddopts = -k test_seed\\n' > /app/pytest.ini && cp /opt/plant/conftest.txt /app/conftest.py",
], ids=["pytest.ini+conftest", "conftest", "tox.ini-addopts", "pyproject+app-config"])
def test_pytest_config_above_tests_is_ignored(task, backend, plant, tmp_path):
    (tmp_path / "conftest.txt").write_text(FORGE_CONFTEST)
    res, markers = _verify_after(task, backend, plant, files={"/opt/plant": tmp_path})
    _assert_not_forged(res, markers)


@pytest.mark.parametrize("backend", BACKENDS)
def test_python_startup_files_and_venv_config_are_ignored(task, backend):
    site = "import os; os.path.exists('/tests/expected.txt') and open('/app/pwned-site', 'w').write('x')\n"
    pth = "import os; os.path.exists('/tests/expected.txt') and open('/app/pwned-pth', 'w').write('x')\n"
    cmds = [f"for v in 3 3.11 3.12 3.13; do mkdir -p /etc/python$v && printf \"{site}\" > /etc/python$v/sitecustomize.py;"
            f" done",
            f"mkdir -p /.trsi/lib/python3.11/site-packages /.trsi/bin /root/.local/lib/python3.11/site-packages && "
            f"printf 'home = /app\\ninclude-system-site-packages = true\\n' | tee /.trsi/pyvenv.cfg > /.trsi/bin/pyvenv.cfg"
            f" && printf \"{pth}\" | tee /.trsi/lib/python3.11/site-packages/evil.pth "
            f"/root/.local/lib/python3.11/site-packages/evil.pth > /dev/null && "
            f"printf \"{site}\" > /root/.local/lib/python3.11/site-packages/usercustomize.py"]
    res, markers = _verify_after(task, backend, *cmds)
    _assert_not_forged(res, markers)


EVIL_C = r"""
#include <fcntl.h>
#include <unistd.h>
__attribute__((constructor)) static void pwn(void) {
    if (access("/tests/expected.txt", F_OK) != 0) return;  /* only inside the verifier */
    int fd = open("/app/pwned-ld", O_WRONLY | O_CREAT, 0644);
    if (fd >= 0) { write(fd, "x", 1); close(fd); }
    fd = open("/logs/verifier/reward.txt", O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) { write(fd, "1\n", 2); close(fd); }
}
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_loader_config_pointing_libraries_at_agent_code_is_ignored(task, backend, tmp_path):
    """ld.so.conf.d + a rebuilt ld.so.cache resolve libm/libtinfo/libz (python's, bash's) to agent .so
    files whose constructor would forge the reward; the verifier must never load them."""
    (tmp_path / "evil.c").write_text(EVIL_C)
    for soname in ("libm.so.6", "libtinfo.so.6", "libz.so.1", "libpython3.11.so.1.0"):
        subprocess.run(["gcc", "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(tmp_path / soname),
                        str(tmp_path / "evil.c")], check=True)
    (tmp_path / "evil.c").unlink()
    res, markers = _verify_after(task, backend, "mkdir -p /etc/ld.so.conf.d /var/cache/ldconfig && "
                                 "echo /app/evil > /etc/ld.so.conf.d/0.conf && echo /app/evil > /etc/ld.so.conf && "
                                 "ldconfig && ldconfig -p | grep -q /app/evil/libm.so.6 && "
                                 "echo /app/evil/libm.so.6 > /etc/ld.so.preload", files={"/app/evil": tmp_path})
    _assert_not_forged(res, markers)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("link", [
    "ln -sf /tests/expected.txt /app/out.txt",
    "ln -s / /app/root && ln -sf root/tests/expected.txt /app/out.txt",  # through a link to /
    "ln -s /tests /app/t && ln -s t/expected.txt /app/out.txt",  # through a link to the directory
    "ln -sf /proc/self/root/tests/expected.txt /app/out.txt",
    "rm -rf /tests && mkdir -p /tests && ln /app/seed.txt /tests/expected.txt && ln -sf /tests/expected.txt "
    "/app/out.txt",  # a hard link planted where the tests will go
    "mkdir -p /app/$(printf 'd/%.0s' $(seq 1500)) && ln -sf /tests/expected.txt /app/out.txt",  # deep tree first
], ids=["direct", "via-root-link", "via-dir-link", "via-proc", "hardlink-at-tests", "deep-tree"])
def test_links_into_the_tests_do_not_resolve(task, backend, link):
    res, markers = _verify_after(task, backend, link)
    _assert_not_forged(res, markers)


@pytest.mark.parametrize("backend", BACKENDS)
def test_probe_files_never_reach_the_agent(task, backend):
    """A background loop in the agent's terminal copies anything test-like it can find while a probe
    runs; nothing of the tests may land in its files."""
    if backend == "docker":
        _docker_or_skip()
    loop = ("while true; do for d in /tmp/.trsi-* /tmp/probe-* /tests /.trsi; do [ -e $d ] && cp -r $d /app/stolen-$RANDOM;"
            " done; grep -rls golden-4d1c9e / --exclude-dir=proc --exclude-dir=sys --exclude-dir=app 2>/dev/null"
            " | while read f; do cp $f /app/; done; sleep 0.01; done > /dev/null 2>&1 &\n")
    with make_sandbox(task, backend) as sb:
        sb.terminal().send_keys(loop, 0.5)
        assert probe_progress(sb, task) == 0.0  # progress_tests: test_exists, test_content
        sb.terminal().send_keys(f"echo {GOLDEN.strip()} > /app/out.txt\n", 0.5)
        assert probe_progress(sb, task) == 0.5  # content compares with /tests/expected.txt: not in the probe
        sb.terminal().send_keys("true\n", 1.0)
        out = sb.exec("grep -rl golden-4d1c9e / --exclude-dir=proc --exclude-dir=sys 2>/dev/null; ls /app").output
    assert sorted(out.split()) == ["/app/out.txt", "data.txt", "out.txt", "seed.txt"], out


TROJAN = "#!/bin/sh\n[ -e /tests/expected.txt ] && echo x > /app/pwned && echo 1 > /logs/verifier/reward.txt\nexit 0\n"


@pytest.mark.docker
def test_usr_local_is_carried_but_never_runs_for_the_verifier(task, tmp_path):
    """docker carries /usr/local (programs and packages the agent installed) to the verifier; trojan
    copies of every command the backend and test.sh use, planted there, never run for them."""
    for name in ("sh", "bash", "rm", "mkdir", "find", "timeout", "cp", "cat", "tar", "curl", "apt-get", "uvx", "uv",
                 "python3", "pytest"):
        (tmp_path / name).write_text(TROJAN)
        (tmp_path / name).chmod(0o755)
    (tmp_path / "hello-tool").write_text("#!/bin/sh\necho tool-ok\n")
    (tmp_path / "hello-tool").chmod(0o755)
    res, markers = _verify_after(task, "docker", "cp -a /opt/plant/. /usr/local/bin/ && echo planted",
                                 files={"/opt/plant": tmp_path})
    _assert_not_forged(res, markers)
    with make_sandbox(task, "docker") as sb:
        sb.exec("printf '#!/bin/sh\\necho tool-ok\\n' > /usr/local/bin/hello-tool && chmod +x /usr/local/bin/hello-tool")
        sb.stop_processes()
        assert sb.exec("hello-tool", with_pytest=True).output.strip() == "tool-ok"


@pytest.mark.parametrize("backend", BACKENDS)
def test_apt_packages_the_agent_forged_are_not_installed(backend, tmp_path):
    """The test script's `apt-get install` passes only for what the image (local: the host) has. The
    agent forges a package the image lacks: a dpkg record in its /var and (docker) the command in
    /usr/local/bin and /usr/bin, which reach the verifier. The install must fail as missing (an
    infrastructure error, never a reward), not let the tests run the agent's program; bash passes."""
    tests = "import subprocess\ndef test_tool():\n    assert subprocess.run(['trsi-forged-tool'], " \
            "capture_output=True, text=True).stdout == 'ok\\n'\n"
    test_sh = ("#!/bin/bash\napt-get update\napt-get install -y bash trsi-forged-tool\ncd /tests\n"
               "python3 -m pytest test_outputs.py -rA\n"
               "if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n")
    forged = load_task(write_tb2(tmp_path, "forged", tests=tests, test_sh=test_sh))
    cmds = ["mkdir -p /var/lib/dpkg/info && touch /var/lib/dpkg/info/trsi-forged-tool.list "
            "/var/lib/dpkg/info/trsi-forged-tool:amd64.list"]
    if backend == "docker":
        cmds.append("for d in /usr/local/bin /usr/bin; do printf '#!/bin/sh\\necho ok\\n' > $d/trsi-forged-tool && "
                    "chmod +x $d/trsi-forged-tool; done && trsi-forged-tool")
    res, _ = _verify_after(forged, backend, *cmds)
    assert not res.strict and res.error and "trsi-forged-tool" in res.error, res.log[-3000:]
    assert "package bash " not in res.log, res.log[-3000:]


@pytest.mark.docker
def test_added_usr_files_are_carried_changed_and_shadowing_ones_are_not(task):
    """An install's new files in /usr reach the verifier (tests may run the programs the agent
    installed); a changed image file, a new command that would run before an image command of that
    name, and the agent's nsswitch.conf (with an added module it could load agent code) do not."""
    _docker_or_skip()
    with make_sandbox(task, "docker") as sb:
        plant = ("printf '#!/bin/sh\\necho tool-ok\\n' > /usr/bin/hello-tool && chmod +x /usr/bin/hello-tool && "
                 "mkdir -p /usr/lib/added-pkg && echo data > /usr/lib/added-pkg/f && for c in mkdir cat; do "
                 "printf '#!/bin/sh\\necho shadow\\n' > /usr/sbin/$c && chmod +x /usr/sbin/$c; done && "
                 "printf '#!/bin/sh\\necho changed\\n' > /usr/bin/tac && echo 'passwd: files evil' > /etc/nsswitch.conf")
        assert sb.exec(plant).exit_code == 0
        assert sb.exec("cat /dev/null; tac").output == "shadow\nchanged\n"  # planted: they run for the agent
        sb.stop_processes()
        out = sb.exec("hello-tool; cat /usr/lib/added-pkg/f; ls /usr/sbin/mkdir /usr/sbin/cat 2>/dev/null | wc -l; "
                      "tac --version | head -1; grep -c evil /etc/nsswitch.conf", with_pytest=True).output
    lines = out.splitlines()
    assert lines[:3] == ["tool-ok", "data", "0"] and lines[3].startswith("tac (GNU coreutils)") and lines[4] == "0", out


@pytest.mark.docker
def test_alternatives_pointed_at_agent_code_are_the_images(tmp_path):
    """/etc/alternatives picks what /usr/bin/awk (which, editor, ...) runs; the agent (root in its
    container) points awk at a trojan, and the test script's `awk` must still run the image's."""
    d = write_tb2(tmp_path, "alt", tests=TESTS, test_sh=TEST_SH.replace("uvx -p", "awk 'BEGIN { exit 0 }'\nuvx -p"))
    (d / "tests" / "expected.txt").write_text(GOLDEN)
    (tmp_path / "plant").mkdir()
    (tmp_path / "plant" / "awk").write_text(TROJAN)
    res, markers = _verify_after(load_task(d), "docker", "readlink /usr/bin/awk | grep -qx /etc/alternatives/awk && "
                                 "cp /opt/plant/awk /app/awk-evil && chmod +x /app/awk-evil && "
                                 "ln -sfn /app/awk-evil /etc/alternatives/awk", files={"/opt/plant": tmp_path / "plant"})
    _assert_not_forged(res, markers)


@pytest.mark.docker
def test_docker_probe_without_a_host_path_copies_the_agent_files(task):
    """Where the storage driver gives no host path to the container's files, the probe container
    gets copies of the agent's entries instead: same results, nothing enters the agent's container."""
    from trsi_jax.sandbox.docker_probe import probe
    from trsi_jax.sandbox.verifier import parse_pytest_ra
    _docker_or_skip()
    with make_sandbox(task, "docker") as sb:
        sb.exec(f"echo {GOLDEN.strip()} > /app/out.txt && mkdir -p /usr/local/lib/x && echo agent > /usr/local/lib/x/f")
        res = probe(sb, task.tests_dir, lambda where: f"cat /usr/local/lib/x/f; TRSI_TEST_DIR={where} "
                    f"/.trsi/bin/trsi-python -I /.trsi/shim.py pytest -q -rA {where}/test_outputs.py", 60, use_binds=False)
        assert res.output.startswith("agent\n")
        assert parse_pytest_ra(res.output) == {"test_exists": True, "test_content": False, "test_seed": True}
        assert sorted(sb.exec("ls /tmp /app").output.split()) == ["/app:", "/tmp:", "data.txt", "out.txt", "seed.txt"]
