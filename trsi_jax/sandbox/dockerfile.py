"""The Dockerfile subset task environments may use, parsed into steps a backend can replay.

Supported: FROM (one stage; `--platform` only when it names this host's platform), WORKDIR, ENV,
ARG (build-time variables), COPY/ADD (local sources only), RUN (shell or JSON form). Ignored (no
effect on a task's files): LABEL, MAINTAINER, EXPOSE, CMD, ENTRYPOINT, VOLUME, HEALTHCHECK,
STOPSIGNAL, SHELL, USER. Anything else is an error naming the line. The docker backend hands the
file to the Docker engine (multi-stage builds and `COPY --from` included) after `map_images`.
"""
from __future__ import annotations

import dataclasses
import fnmatch
import json
import platform
import posixpath
import re
import shlex
from pathlib import Path
from typing import Callable, Sequence

IGNORED = {"LABEL", "MAINTAINER", "EXPOSE", "CMD", "ENTRYPOINT", "VOLUME", "HEALTHCHECK", "STOPSIGNAL", "SHELL", "USER"}
# Files of the task folder that must never reach the environment. Only TB1 uses the task folder
# itself as build context; TB2's environment/ holds no such files, so there the names are ordinary.
PRIVATE_NAMES = ("tests", "solution", "solution.sh", "solution.yaml", "run-tests.sh", "task.yaml", "task.toml")
TASK_SPECS = ("task.yaml", "task.toml")


class DockerfileError(ValueError):
    """The Dockerfile uses something outside the supported subset; names file, line and instruction."""


@dataclasses.dataclass(frozen=True)
class Step:
    kind: str  # "workdir" | "env" | "copy" | "run"
    line: int
    args: tuple  # workdir: (path,); env: ((k, v), ...); copy: (sources tuple, dest); run: (shell cmd,)


@dataclasses.dataclass(frozen=True)
class DockerfileSpec:
    path: Path
    base_image: str
    steps: tuple[Step, ...]

    @property
    def workdir(self) -> str | None:
        dirs = [s.args[0] for s in self.steps if s.kind == "workdir"]
        return dirs[-1] if dirs else None

    @property
    def env(self) -> dict[str, str]:
        out = {}
        for s in self.steps:
            if s.kind == "env":
                out.update(dict(s.args))
        return out


def _logical_lines(text: str):
    """(line number, instruction text) with comments dropped and backslash continuations joined."""
    buf, start = [], 0
    for i, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not buf and (not stripped or stripped.startswith("#")):
            continue
        if buf and stripped.startswith("#"):
            continue
        if not buf:
            start = i
        if stripped.endswith("\\"):
            buf.append(stripped[:-1].rstrip())
            continue
        buf.append(stripped)
        yield start, " ".join(b for b in buf if b)
        buf = []
    if buf:
        yield start, " ".join(buf)


_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")


def substitute(value: str, env: dict[str, str]) -> str:
    """Expand $VAR, ${VAR} and ${VAR:-default} like Docker does in WORKDIR/ENV/COPY."""
    def repl(m):
        name = m.group(1) or m.group(3)
        return env.get(name) or (m.group(2) or "") if m.group(2) is not None else env.get(name, "")
    return _VAR.sub(repl, value)


def _err(path: Path, line: int, msg: str) -> DockerfileError:
    return DockerfileError(f"{path}:{line}: {msg}")


def _pairs(rest: str, path: Path, line: int, what: str) -> list[tuple[str, str]]:
    """ENV/ARG arguments: `K=V K2="v 2"` or the legacy `K V with spaces`."""
    try:
        words = shlex.split(rest)
    except ValueError as e:
        raise _err(path, line, f"{what}: {e}") from None
    if not words:
        raise _err(path, line, f"{what} needs arguments")
    if "=" not in words[0]:
        if what == "ARG":
            return [(words[0], "")]
        if len(words) < 2:
            raise _err(path, line, f"{what} {words[0]} has no value")
        return [(words[0], rest.split(None, 1)[1].strip())]
    out = []
    for w in words:
        if "=" not in w:
            raise _err(path, line, f"{what}: expected KEY=VALUE, got {w!r}")
        k, v = w.split("=", 1)
        out.append((k, v))
    return out


def parse_dockerfile(path: Path, build_args: dict[str, str] | None = None) -> DockerfileSpec:
    """Parse a task Dockerfile into steps; raises DockerfileError naming file:line on anything unsupported."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise DockerfileError(f"{path}: cannot read: {e}") from None
    base, steps, env, args = None, [], {}, dict(build_args or {})
    for line, inst in _logical_lines(text):
        word, _, rest = inst.partition(" ")
        op, rest = word.upper(), rest.strip()
        scope = {**args, **env}
        if "<<" in rest and op in ("RUN", "COPY"):
            raise _err(path, line, f"{op} heredocs are not supported")
        if op == "FROM":
            if base is not None:
                raise _err(path, line, "multi-stage builds (a second FROM) are not supported by the local "
                                       "backend; use --backend=docker")
            base, _ = parse_from(rest, scope, path, line)
        elif base is None and op != "ARG":
            raise _err(path, line, f"{op} before FROM")
        elif op == "ARG":
            for k, v in _pairs(rest, path, line, "ARG"):
                args.setdefault(k, substitute(v, scope))
        elif op == "ENV":
            pairs = tuple((k, substitute(v, scope)) for k, v in _pairs(rest, path, line, "ENV"))
            env.update(pairs)
            steps.append(Step("env", line, pairs))
        elif op == "WORKDIR":
            wd = substitute(rest, scope).strip().strip('"')
            if not wd:
                raise _err(path, line, "WORKDIR needs a path")
            prev = next((s.args[0] for s in reversed(steps) if s.kind == "workdir"), "/")
            steps.append(Step("workdir", line, (wd if wd.startswith("/") else f"{prev.rstrip('/')}/{wd}",)))
        elif op in ("COPY", "ADD"):
            steps.append(Step("copy", line, _copy_args(op, rest, scope, path, line)))
        elif op == "RUN":
            if rest.startswith("["):
                try:
                    argv = json.loads(rest)
                except json.JSONDecodeError as e:
                    raise _err(path, line, f"RUN: bad JSON form: {e}") from None
                rest = shlex.join(argv)
            elif rest.startswith("--"):
                raise _err(path, line, f"RUN flags are not supported: {rest.split()[0]}")
            if not rest:
                raise _err(path, line, "RUN needs a command")
            steps.append(Step("run", line, (rest,)))
        elif op not in IGNORED:
            raise _err(path, line, f"unsupported instruction {op}")
    if base is None:
        raise DockerfileError(f"{path}: no FROM instruction")
    return DockerfileSpec(path=path, base_image=base, steps=tuple(steps))


def host_platform() -> str:
    """This machine's platform as Docker names it (linux/amd64, linux/arm64)."""
    arch = platform.machine().lower()
    return "linux/" + {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm/v7"}.get(arch, arch)


def parse_from(rest: str, scope: dict, path: Path, line: int) -> tuple[str, str | None]:
    """`[--platform=P] image [AS name]` -> (image, stage name). A platform other than the host's is
    an error (nothing here emulates another architecture)."""
    parts = rest.split()
    flags = [p for p in parts if p.startswith("--")]
    words = [p for p in parts if not p.startswith("--")]
    for f in flags:
        name, _, value = f.partition("=")
        if name != "--platform":
            raise _err(path, line, f"FROM flag {name} is not supported (only --platform)")
        value = substitute(value, {"BUILDPLATFORM": host_platform(), "TARGETPLATFORM": host_platform(), **scope})
        if value.split("/")[:2] != host_platform().split("/")[:2]:
            raise _err(path, line, f"FROM --platform={value}: only this host's platform ({host_platform()}) "
                                   "can be built here")
    if len(words) == 3 and words[1].upper() == "AS":
        return substitute(words[0], scope), words[2]
    if len(words) != 1:
        raise _err(path, line, f"FROM: expected `image [AS name]`, got {rest!r}")
    return substitute(words[0], scope), None


def map_images(path: Path, mapper: Callable[[str], str]) -> str:
    """The Dockerfile's text for the Docker engine: every FROM image and `COPY --from=<image>` passed
    through `mapper` (the local stand-ins), `--platform` checked and dropped; stage names kept."""
    path = Path(path)
    raw = path.read_text().splitlines()
    scope, stages, seen_from = {}, set(), False
    for line, inst in _logical_lines("\n".join(raw)):
        word, _, rest = inst.partition(" ")
        op, rest = word.upper(), rest.strip()
        if op == "ARG" and not seen_from:  # ARGs before the first FROM may parameterise FROM lines
            for k, v in _pairs(rest, path, line, "ARG"):
                scope.setdefault(k, substitute(v, scope))
        elif op == "FROM":
            image, stage = parse_from(rest, scope, path, line)
            base = image if image in stages else mapper(image)
            raw[line - 1] = f"FROM {base}" + (f" AS {stage}" if stage else "")
            stages |= {stage} - {None}
            seen_from = True
        elif op in ("COPY", "ADD") and "--from=" in rest:
            def repl(m):
                src = m.group(1)
                return m.group(0) if src in stages or src.isdigit() else f"--from={mapper(src)}"
            raw[line - 1] = re.sub(r"--from=(\S+)", repl, raw[line - 1])
    return "\n".join(raw) + "\n"


def with_packages(text: str, packages: Sequence[str]) -> str:
    """`text` (a Dockerfile) plus a last layer that installs `packages` (Debian) where the image lacks
    them: what a task's test script installs at test time, which the offline verifier cannot. The
    agent sees them too, as it could install them itself where Terminal-Bench runs online. A package
    the archives lack leaves the image as it was (the verifier's apt-get shim then names it)."""
    if not packages:
        return text
    final = re.split(r"(?im)^\s*FROM\s", text)[-1]
    users = re.findall(r"(?im)^\s*USER\s+(\S+)", final)
    names = " ".join(packages)
    run = (f"RUN missing=; for p in {names}; do dpkg -s \"${{p%%=*}}\" >/dev/null 2>&1 || missing=\"$missing $p\"; "
           "done; [ -z \"$missing\" ] || { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y "
           "$missing; } || echo \"trsi: the test script's packages$missing could not be installed\"")
    lines = ["USER root", run, f"USER {users[-1]}"] if users else [run]
    return text.rstrip("\n") + "\n# trsi: packages the test script installs (trsi_jax/sandbox/dockerfile.py)\n" + \
        "\n".join(lines) + "\n"


def _copy_args(op: str, rest: str, scope: dict, path: Path, line: int) -> tuple[tuple[str, ...], str]:
    if rest.startswith("["):
        try:
            words = json.loads(rest)
        except json.JSONDecodeError as e:
            raise _err(path, line, f"{op}: bad JSON form: {e}") from None
    else:
        words = shlex.split(rest)
    flags = [w for w in words if w.startswith("--")]
    words = [substitute(w, scope) for w in words if not w.startswith("--")]
    for f in flags:
        if not f.startswith(("--chown=", "--chmod=")):
            hint = "; use --backend=docker" if f.startswith("--from=") else ""
            raise _err(path, line, f"{op} flag {f} is not supported by the local backend (only --chown/--chmod){hint}")
    if len(words) < 2:
        raise _err(path, line, f"{op} needs at least one source and a destination")
    sources = []
    for src in words[:-1]:
        if re.match(r"^[a-z]+://", src):
            raise _err(path, line, f"{op} from a URL is not supported: {src}")
        norm = normalise_source(src)
        if src.startswith("/") or norm == ".." or norm.startswith("../"):
            raise _err(path, line, f"{op} source must stay inside the build context: {src}")
        sources.append(norm)
    return tuple(sources), words[-1]


def normalise_source(src: str) -> str:
    """A COPY source relative to the context root: `./x`, `x/`, `x/.` and `x//y` -> `x`, `x/y`; `./` -> `.`.
    (`x/.` copies the directory's contents, which is what copying a directory does anyway.)"""
    return posixpath.normpath(src) if src else "."


def is_task_folder(context_dir: Path) -> bool:
    """True when the build context is the task folder itself (TB1), which holds tests and solution."""
    return any((Path(context_dir) / name).is_file() for name in TASK_SPECS)


def is_private(rel: Path, context_dir: Path) -> bool:
    """True for task-folder files that must never enter the environment (tests, solution, task spec);
    only a TB1 context (the task folder) has any."""
    return bool(rel.parts) and rel.parts[0] in PRIVATE_NAMES and is_task_folder(context_dir)


def context_files(context_dir: Path) -> list[Path]:
    """Relative paths of the build context, minus the task's private files (see PRIVATE_NAMES)."""
    out = []
    for p in sorted(context_dir.rglob("*")):
        rel = p.relative_to(context_dir)
        if not is_private(rel, context_dir) and (p.is_file() or p.is_symlink() or (p.is_dir() and not any(p.iterdir()))):
            out.append(rel)
    return out


def match_sources(context_dir: Path, src: str) -> list[Path]:
    """Context paths named by one COPY source (globs match within one path level, as docker's do);
    private files never match."""
    pattern = normalise_source(src)
    if pattern == ".":
        return [Path(".")]
    depth = len(Path(pattern).parts)
    names = [str(p.relative_to(context_dir)) for p in context_dir.rglob("*")]
    hits = [Path(n) for n in sorted(fnmatch.filter(names, pattern)) if len(Path(n).parts) == depth]
    return [h for h in hits if not is_private(h, context_dir)]
