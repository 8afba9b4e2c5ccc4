"""The verifier toolchain follows the Python a test script asks uv for (`uvx -p 3.13`): built inside
trsi/python:3.13 by that image's interpreter, it runs the tests on both backends; a version that
cannot be had falls back to this machine's, with a warning."""
import logging
from collections import Counter
from pathlib import Path

import pytest

from tests.sandbox_tasks import write_tb2
from trsi_jax.sandbox import make_sandbox, toolchain, verify
from trsi_jax.sandbox.docker import apt_for_tests
from trsi_jax.tasks import load_task

TB2 = Path(__file__).resolve().parents[2] / "shared" / "terminal-bench-2"
VERSION_TEST = '''import sys
def test_version():
    assert f"{sys.version_info[0]}.{sys.version_info[1]}" == "WANT", sys.version
'''


def _image_ok() -> bool:
    try:
        import docker
        docker.from_env().images.get(toolchain.IMAGE.format("3.13"))
        return True
    except Exception:  # noqa: BLE001 (any failure means: no image here)
        return False


def test_requested_python_forms():
    assert toolchain.requested_python("uvx -p 3.13 -w pytest==8.4.1 pytest /tests -rA") == "3.13"
    assert toolchain.requested_python("uv venv --python=3.12 .tb\nuv run pytest") == "3.12"
    assert toolchain.requested_python("uv run --python python3.11 pytest") == "3.11"
    assert toolchain.requested_python("python3 -m pytest -p no:cacheprovider /tests") is None
    assert toolchain.requested_python("ls -p 3.13x") is None


def test_requested_python_of_the_shared_tb2_tasks():
    scripts = sorted(TB2.glob("*/tests/test.sh"))
    if len(scripts) != 63:
        pytest.skip(f"expected the 63 shared Terminal-Bench 2 tasks in {TB2}")
    counts = Counter(toolchain.requested_python(p.read_text()) for p in scripts)
    assert counts == {"3.13": 56, "3.11": 2, "3.12": 1, None: 4}


def test_a_version_that_cannot_be_had_falls_back_with_a_warning(tmp_path, caplog):
    script = tmp_path / "test.sh"
    script.write_text("uvx -p 3.9 -w pytest==8.4.1 pytest /tests -rA\n")  # no trsi/python:3.9 image exists
    with caplog.at_level(logging.WARNING):
        assert toolchain.for_script(script) == toolchain.ensure()
    assert f"Python 3.9 with Python {toolchain.host_python()}" in caplog.text
    assert "3.9" in toolchain._UNAVAILABLE  # noqa: SLF001 (asked once per process, not per episode)


def test_requested_extras_forms_and_the_shared_tb2_tasks():
    assert toolchain.requested_extras("uvx -w 'selenium==4.35.0' --with=opencv-python==4.11.0.86 -w numpy==2.3.4 "
                                      "-w tabulate pytest") == ("opencv-python==4.11.0.86", "selenium==4.35.0")
    assert toolchain.requested_extras("uvx -w pytest==8.4.1 -w Pytest_JSON.ctrf==0.3.5 pytest") == ()
    assert toolchain.requested_extras("uv pip install pytest==8.4.1 'mailman==3.3.8' -r x.txt flask\n"
                                      "pip3 install --no-cache-dir requests==2.32.5 && python3 -m pip install Tabulate==0.9.0\n"
                                      "echo pip install nope==1  # not a command\n") == ("Tabulate==0.9.0", "mailman==3.3.8")
    scripts = sorted(TB2.glob("*/tests/test.sh"))
    if len(scripts) != 63:
        pytest.skip(f"expected the 63 shared Terminal-Bench 2 tasks in {TB2}")
    extras = {p.parents[1].name: toolchain.requested_extras(p.read_text()) for p in scripts}
    extras = {k: v for k, v in extras.items() if v}
    assert len(extras) == 15 and extras["break-filter-js-from-html"] == ("selenium==4.35.0",)
    assert extras["mailman"] == ("mailman==3.3.8",)  # `uv pip install`
    assert extras["torch-pipeline-parallelism"] == ("torch==2.7.0", "transformers==4.55.0")


def test_requested_apt_forms_and_the_shared_tb2_tasks():
    assert toolchain.requested_apt("apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y \\\n"
                                   "  expect curl\nsudo apt install -y --no-install-recommends vim=2:9.0 libgl1\n"
                                   "echo apt-get install nope  # not a command\napt-get install -y $PKG\n") == (
        "expect", "libgl1", "vim=2:9.0")
    scripts = sorted(TB2.glob("*/tests/test.sh"))
    if len(scripts) != 63:
        pytest.skip(f"expected the 63 shared Terminal-Bench 2 tasks in {TB2}")
    apt = {p.parents[1].name: toolchain.requested_apt(p.read_text()) for p in scripts}
    apt = {k: v for k, v in apt.items() if v}  # 45 scripts install only curl, which the shims stand in for
    assert len(apt) == 14 and apt["headless-terminal"] == ("vim",) and apt["dna-insert"] == ("primer3",)
    assert apt["install-windows-3.11"] == ("mtools", "socat", "tesseract-ocr", "vncsnapshot")
    # what the docker image gets also counts scripts the tests run (configure-git-webserver's verify.sh)
    assert apt_for_tests(load_task(TB2 / "configure-git-webserver")) == ("expect",)
    assert apt_for_tests(load_task(TB2 / "headless-terminal")) == ("vim",)


def test_extras_that_cannot_be_installed_fall_back_with_a_warning(tmp_path, caplog):
    script = tmp_path / "test.sh"
    script.write_text("uvx -w pytest==8.4.1 -w tabulate==0.0.404 pytest /tests -rA\n")  # no such version
    with caplog.at_level(logging.WARNING):
        assert toolchain.for_script(script) == toolchain.ensure()
    assert "verifying tests that ask for tabulate==0.0.404 without them" in caplog.text


@pytest.mark.slow
def test_pinned_test_packages_are_added_in_a_toolchain_of_their_own(tmp_path):
    test_sh = "#!/bin/bash\nuvx -w pytest==8.4.1 -w tabulate==0.9.0 pytest /tests/test_outputs.py -rA\n"
    tests = "import tabulate\ndef test_extra():\n    assert tabulate.__version__ == '0.9.0'\n"
    task = load_task(write_tb2(tmp_path, tests=tests, test_sh=test_sh))
    assert toolchain.for_script(task.test_script) != toolchain.ensure()
    with make_sandbox(task, "local") as sb:
        res = verify(sb, task)
    assert (res.tests, res.strict, res.error) == ({"test_extra": True}, True, None), res.log[-3000:]


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.skipif(not _image_ok(), reason="needs dockerd and trsi/python:3.13")
@pytest.mark.parametrize("backend", ["local", "docker"])
@pytest.mark.parametrize("ask", ["-p 3.13 ", ""])
def test_tests_run_on_the_python_the_script_asks_for(tmp_path, backend, ask):
    want = "3.13" if ask else toolchain.host_python()
    test_sh = f"#!/bin/bash\nuvx {ask}-w pytest==8.4.1 -w pytest-json-ctrf==0.3.5 pytest --ctrf " \
              "/logs/verifier/ctrf.json /tests/test_outputs.py -rA\n"
    task = load_task(write_tb2(tmp_path, tests=VERSION_TEST.replace("WANT", want), test_sh=test_sh))
    with make_sandbox(task, backend) as sb:
        res = verify(sb, task)
    assert (res.tests, res.strict, res.error) == ({"test_version": True}, True, None), res.log[-3000:]
