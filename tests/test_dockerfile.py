"""Dockerfile subset against real Terminal-Bench 2 task folders: COPY source normalisation, the build
context's private-name filter (TB1 only), FROM --platform, and the FROM image mapping for docker."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from trsi_jax.sandbox import dockerfile as dfile
from trsi_jax.sandbox.docker import load_from_map, map_image

TB2 = Path(__file__).resolve().parents[2] / "shared" / "terminal-bench-2"
needs_tb2 = pytest.mark.skipif(not TB2.is_dir(), reason=f"{TB2} missing (the shared Terminal-Bench 2 tasks)")


@pytest.mark.parametrize("src, want", [("./x", "x"), ("x/.", "x"), ("x/", "x"), ("./", "."), (".", "."),
                                       ("a//b/./c", "a/b/c"), ("./task-deps/", "task-deps")])
def test_copy_sources_are_normalised(src, want):
    assert dfile.normalise_source(src) == want


def test_dotted_sources_match_like_plain_ones(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("x")
    (tmp_path / "top.txt").write_text("y")
    (tmp_path / "Dockerfile").write_text("FROM x\nCOPY ./top.txt src/. /app/\nCOPY ./ /all\n")
    spec = dfile.parse_dockerfile(tmp_path / "Dockerfile")
    assert [s.args for s in spec.steps] == [(("top.txt", "src"), "/app/"), ((".",), "/all")]
    assert dfile.match_sources(tmp_path, "./top.txt") == [Path("top.txt")]
    assert dfile.match_sources(tmp_path, "src/.") == [Path("src")]
    assert dfile.match_sources(tmp_path, "./src/*.py") == [Path("src/a.py")]


@pytest.mark.parametrize("src", ["../x", "./../x", "a/../../x", "/etc/passwd"])
def test_copy_sources_stay_in_context(tmp_path, src):
    (tmp_path / "Dockerfile").write_text(f"FROM x\nCOPY {src} /app/\n")
    with pytest.raises(dfile.DockerfileError, match=":2: COPY source must stay inside the build context"):
        dfile.parse_dockerfile(tmp_path / "Dockerfile")


@needs_tb2
@pytest.mark.parametrize("task, src, want", [
    ("circuit-fibsqrt", "tests/sim.c", "tests/sim.c"),
    ("overfull-hbox", "tests/main.tex", "tests/main.tex"),
    ("break-filter-js-from-html", "tests/test_outputs.py", "tests/test_outputs.py"),
])
def test_tb2_environment_context_keeps_tests_folder(task, src, want):
    """TB2's build context is environment/, where `tests` is an ordinary folder the image needs."""
    ctx = TB2 / task / "environment"
    assert dfile.match_sources(ctx, src) == [Path(want)]
    assert Path(want) in dfile.context_files(ctx)
    assert not dfile.is_task_folder(ctx) and dfile.is_task_folder(TB2 / task)


@needs_tb2
def test_tb2_trailing_slash_sources_match_real_folders():
    spec = dfile.parse_dockerfile(TB2 / "pytorch-model-cli" / "environment" / "Dockerfile")
    copies = [s.args for s in spec.steps if s.kind == "copy"]
    assert copies == [(("task-deps",), "./")]
    assert dfile.match_sources(TB2 / "pytorch-model-cli" / "environment", "task-deps/") == [Path("task-deps")]


def test_from_platform_of_this_host_is_honoured(tmp_path):
    host = dfile.host_platform()
    other = "linux/s390x" if host != "linux/s390x" else "linux/amd64"
    f = tmp_path / "Dockerfile"
    for line in (f"FROM --platform={host} python:3.13 AS build", "FROM --platform=$BUILDPLATFORM python:3.13",
                 "FROM --platform=${TARGETPLATFORM} python:3.13"):
        f.write_text(line + "\nRUN true\n")
        assert dfile.parse_dockerfile(f).base_image == "python:3.13"
    f.write_text(f"FROM --platform={other} python:3.13\n")
    with pytest.raises(dfile.DockerfileError, match=f":1: FROM --platform={other}: only this host's platform "
                                                    f"\\({host}\\)"):
        dfile.parse_dockerfile(f)
    assert re.fullmatch(r"linux/\w+(/\w+)?", host)


def test_map_images_rewrites_from_and_copy_from(tmp_path):
    f = tmp_path / "Dockerfile"
    f.write_text(f"ARG V=3.13\nFROM --platform={dfile.host_platform()} python:${{V}}-slim AS build\n"
                 "COPY --from=ghcr.io/astral-sh/uv:0.8.14 /uv /bin/\nRUN uv --version\n"
                 "FROM ubuntu:24.04 AS target\nCOPY --from=build /app /app\nCOPY --from=0 /x /x\n")
    text = dfile.map_images(f, lambda image: f"local/{image.replace(':', '_')}")
    assert text.splitlines() == ["ARG V=3.13", "FROM local/python_3.13-slim AS build",
                                 "COPY --from=local/ghcr.io/astral-sh/uv_0.8.14 /uv /bin/", "RUN uv --version",
                                 "FROM local/ubuntu_24.04 AS target", "COPY --from=build /app /app",
                                 "COPY --from=0 /x /x"]


@needs_tb2
def test_from_map_covers_every_tb2_image():
    """Every FROM and COPY --from image of the shared TB2 tasks maps to a locally built trsi/ image."""
    rules = load_from_map()
    seen = set()
    for f in sorted(TB2.glob("*/environment/Dockerfile")):
        for line in dfile.map_images(f, lambda image: (seen.add(image), map_image(image, rules))[1]).splitlines():
            words = line.split()
            if words[:1] == ["FROM"]:
                assert words[1].startswith("trsi/") or words[1] in ("build",), (f, line)
    assert {"ubuntu:24.04", "python:3.13-slim-bookworm", "python:3.10-slim-bookworm", "python:3.11",
            "debian:bullseye-slim", "ghcr.io/astral-sh/uv:0.8.14"} <= seen
    assert map_image("python:3.13-slim-bookworm", rules) == "trsi/python:3.13"
    assert map_image("python:3.11-slim", rules) == "trsi/python:3.11"
