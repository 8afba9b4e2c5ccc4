"""Commands of the verifier toolchain, run inside a sandbox by its own interpreter (`python -I shim.py
NAME args`); copied into the toolchain by toolchain.py, never imported by the package.

pytest / python -m pytest: pytest pinned to the tests (rootdir, config, conftest cut-off at the test
directory). uvx / uv run / uv pip install / pip install: resolve the requested packages from the
toolchain, or print MISSING lines. curl: the uv installer URL gets an offline no-op installer,
anything else goes to the sandbox's curl. apt-get: never runs (apt's configuration is the agent's);
`install` passes for what the image has.
sanitize: replace every symlink in the agent's files that resolves into the tests, the verifier's
logs or the toolchain by a dangling one, so the tests never read their own golden files through them.
"""
import os
import re
import sys

MOUNT = "/.trsi"
SHIMS = MOUNT + "/shims"
PYTHON = MOUNT + "/bin/trsi-python"
MISSING = "trsi-verifier-missing:"
INSTALLED_ENV = "TRSI_INSTALLED"  # toolchain.INSTALLED_ENV
PROTECTED = ("/tests", "/logs/verifier", MOUNT)
NOT_AGENT = {"proc", "sys", "dev", "usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", ".trsi"}
UV_INSTALLER = re.compile(r"astral\.sh/uv/.*install\.sh|astral\.sh/uv/?$")
INSTALLER = f"""#!/bin/sh
# trsi verifier: offline stand-in for the uv installer (uv and uvx come from {SHIMS})
for d in "$HOME/.local" "$HOME/.local/bin"; do [ -L "$d" ] && rm -f "$d"; done
mkdir -p "$HOME/.local/bin" && rm -rf "$HOME/.local/bin/env" &&
printf 'export PATH="{SHIMS}:$PATH"\\n' > "$HOME/.local/bin/env"
"""


def _site() -> str:
    return next(p for p in sys.path if p.endswith("site-packages"))


def _have() -> dict[str, str]:
    from importlib import metadata
    return {_norm(d.metadata["Name"]): d.version for d in metadata.distributions(path=[_site()])}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _check(reqs: list[str], who: str) -> bool:
    """True if every requirement names a package the toolchain has (versions: a note, not a failure)."""
    have, ok = _have(), True
    for req in reqs:
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*(?:[=<>!~]=?\s*([^,;\s]+))?", req)
        if not m or _norm(m.group(1)) not in have:
            print(f"{MISSING} {who}: {req} is not in the verifier toolchain (a `uvx -w name==version` pin is "
                  f"added from PyPI, see the host's warning if that failed; else add it to "
                  f"trsi_jax.sandbox.toolchain.PACKAGES)", flush=True)
            ok = False
        elif m.group(3) and have[_norm(m.group(1))] != m.group(3):
            print(f"trsi-verifier: {who}: using {m.group(1)} {have[_norm(m.group(1))]} for {req}", file=sys.stderr)
    return ok


def _test_dir() -> str:
    return os.environ.get("TRSI_TEST_DIR", "/tests")


def pytest(args: list[str]) -> None:
    tests = _test_dir()
    cfg = next((f"{tests}/{n}" for n in ("pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg")
                if os.path.isfile(f"{tests}/{n}") and n != "setup.cfg"), MOUNT + "/pytest.ini")
    os.execv(PYTHON, [PYTHON, "-I", "-B", "-m", "pytest", "-p", "no:cacheprovider", f"--rootdir={tests}",
                      "-c", cfg, f"--confcutdir={tests}", *args])


def _run_tool(argv: list[str], withs: list[str], who: str) -> None:
    if not argv:
        sys.exit(f"{who}: no command given")
    if not _check(withs, who):
        sys.exit(97)
    cmd = os.path.basename(argv[0])
    if cmd in ("pytest", "py.test"):
        pytest(argv[1:])
    if cmd in ("python", "python3") or re.fullmatch(r"python3\.\d+", cmd):
        if argv[1:3] == ["-m", "pytest"]:
            pytest(argv[3:])
        os.execv(PYTHON, [PYTHON, *argv[1:]])
    print(f"{MISSING} {who}: command {cmd!r} is not provided by the verifier toolchain", flush=True)
    sys.exit(97)


_UV_VALUE_OPTS = {"-p", "--python", "--from", "--index", "--default-index", "--index-url", "-i",
                  "--extra-index-url", "--index-strategy", "--find-links", "-f", "--cache-dir", "--directory",
                  "--project", "--constraint", "-c", "--override", "--prerelease", "--resolution"}


def uvx(args: list[str], who: str = "uvx") -> None:
    withs, i = [], 0
    while i < len(args) and args[i].startswith("-"):
        a = args[i]
        if a in ("-w", "--with"):
            withs.append(args[i + 1])
            i += 2
        elif a.startswith("--with="):
            withs.append(a.split("=", 1)[1])
            i += 1
        elif a in _UV_VALUE_OPTS:
            i += 2
        elif a == "--":
            i += 1
            break
        else:
            i += 1
    _run_tool(args[i:], withs, who)


def pip_install(args: list[str], who: str) -> None:
    reqs, i = [], 0
    while i < len(args):
        a = args[i]
        if a in ("-r", "--requirement", "-e", "--editable"):
            print(f"{MISSING} {who}: {a} {args[i + 1] if i + 1 < len(args) else ''} needs the network", flush=True)
            sys.exit(1)
        if a in ("-i", "--index-url", "--extra-index-url", "-f", "--find-links", "-c", "--constraint", "--target",
                 "-t", "--prefix", "--python", "-p", "--index-strategy"):
            i += 2
            continue
        if not a.startswith("-"):
            reqs.append(a)
        i += 1
    sys.exit(0 if _check(reqs, who) else 1)


def _passthrough(name: str, args: list[str]) -> None:
    for d in os.environ.get("PATH", "").split(":"):
        if d and d != SHIMS and os.access(os.path.join(d, name), os.X_OK):
            os.execv(os.path.join(d, name), [name, *args])
    sys.exit(f"{name}: command not found")


def uv(args: list[str]) -> None:
    if not args or args[0] in ("--version", "-V", "version", "self"):
        print("uv 0.9.5 (trsi verifier offline stand-in)")
        return
    if args[0] == "run":
        uvx(args[1:], "uv run")
    if args[0] == "tool" and args[1:2] == ["run"]:
        uvx(args[2:], "uv tool run")
    if args[0] == "pip" and args[1:2] == ["install"]:
        pip_install(args[2:], "uv pip install")
    if args[0] == "venv":
        rest = [a for a in args[1:] if not a.startswith("-")]
        skip = {args[j + 1] for j in range(1, len(args) - 1) if args[j] in _UV_VALUE_OPTS}
        target = next((a for a in rest if a not in skip), ".venv")
        os.makedirs(f"{target}/bin", exist_ok=True)
        with open(f"{target}/bin/activate", "w") as f:
            f.write(f'export VIRTUAL_ENV="$(pwd)/{target}"\nexport PATH="{SHIMS}:$PATH"\n')
        return
    print(f"{MISSING} uv: 'uv {' '.join(args[:2])}' is not supported offline by the verifier toolchain", flush=True)
    sys.exit(97)


def curl(args: list[str]) -> None:
    urls = [a for a in args if UV_INSTALLER.search(a)]
    if not urls:
        _passthrough("curl", args)
    out = next((args[i + 1] for i, a in enumerate(args[:-1]) if a in ("-o", "--output")), None)
    if out:
        with open(out, "w") as f:
            f.write(INSTALLER)
    else:
        sys.stdout.write(INSTALLER)


def apt_get(args: list[str]) -> None:
    """`install` succeeds only for packages (or commands) the verifier's environment names as the
    image's: the sandbox's dpkg database and PATH hold what the agent wrote."""
    words, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a in ("-o", "-t", "-c"):
            skip = True
        elif not a.startswith("-"):
            words.append(a)
    if words and words[0] == "install":
        have = set(os.environ.get(INSTALLED_ENV, "").split())
        lacking = [p for p in words[1:] if p != "curl" and p.split("=")[0].split(":")[0] not in have]
        for p in lacking:
            print(f"{MISSING} apt-get: package {p} is not in the image (local backend: on the host) and the "
                  "verifier is offline", flush=True)
        sys.exit(100 if lacking else 0)
    print(f"trsi-verifier: apt-get {' '.join(words[:1])}: skipped (offline verifier)")


def _neutralize(p: str) -> None:
    real = os.path.realpath(p)
    if any(real == q or real.startswith(q + "/") for q in PROTECTED):
        os.unlink(p)
        os.symlink("/nonexistent/trsi-verifier-removed-link-into-tests", p)
        print(f"trsi-verifier: {p} pointed into {real}: made dangling", file=sys.stderr)


def sanitize() -> None:
    """Make every agent symlink that resolves into PROTECTED dangle (the agent's top-level entries;
    an explicit stack, so no nesting depth or unreadable entry can stop the walk)."""
    stack = ["/" + e for e in os.listdir("/") if e not in NOT_AGENT and e != "tests"]
    if os.access("/usr/local", os.W_OK):  # docker carries the agent's /usr/local; local's is the host's, read-only
        stack.append("/usr/local")
    while stack:
        p = stack.pop()
        if p == "/logs/verifier":
            continue
        try:
            if os.path.islink(p):
                _neutralize(p)
            elif os.path.isdir(p):
                stack.extend(os.path.join(p, c) for c in os.listdir(p))
        except OSError as e:  # a path too long to open by name is one the tests cannot open either
            print(f"trsi-verifier: sanitize skipped {p[:200]}: {e.strerror}", file=sys.stderr)


def main() -> None:
    name, args = sys.argv[1], sys.argv[2:]
    if name in ("pytest", "py.test"):
        pytest(args)
    elif name == "uvx":
        uvx(args)
    elif name == "uv":
        uv(args)
    elif name in ("pip", "pip3"):
        if args[:1] == ["install"]:
            pip_install(args[1:], name + " install")
        _passthrough(name, args)
    elif name == "curl":
        curl(args)
    elif name in ("apt-get", "apt"):
        apt_get(args)
    elif name == "sanitize":
        sanitize()
    else:
        sys.exit(f"shim.py: unknown command {name}")


if __name__ == "__main__":
    main()
