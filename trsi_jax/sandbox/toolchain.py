"""The verifier's pristine toolchain: an interpreter, pytest and common test libraries, built once on
the host into a cache and mounted read-only at /.trsi in every verification and progress probe.

Nothing in it comes from the sandbox: the interpreter is a copy of this process's base Python with
every shared library it and its packages need, started through the bundled dynamic loader with
`--inhibit-cache` (the sandbox's /etc/ld.so.cache and ld.so.conf.d are never read) as a venv whose
pyvenv.cfg and site-packages are ours (the sandbox's /etc/python3.X, .pth files and sitecustomize
are never seen). Shims first on the verifier's PATH let a Terminal-Bench `tests/test.sh` run
unchanged offline: `curl .../uv/install.sh | sh` gets a no-op installer, `uvx -w pytest==... pytest`,
`uv run pytest`, `pytest`, `python -m pytest` and `pip install <what we have>` use the toolchain, and
`apt-get` never runs the sandbox's apt (its configuration is the agent's). Packages a script asks for
that the toolchain lacks make it print MISSING_MARK, which the verifier reports as an error.

A test script that asks uv for another Python (`uvx -p 3.13`, as most Terminal-Bench 2 tasks do)
gets a toolchain of that version (`for_script`), built the same way inside the image trsi/python:3.X
by that image's own interpreter (this file runs there alone), so its glibc and libraries come along.
A script that pins test packages PACKAGES lacks (`uvx -w selenium==4.35.0`) gets a toolchain of its
own with them added (`requested_extras`), built from PyPI on first use like the others.

Build (needs PyPI once): `python -m trsi_jax.sandbox.toolchain [--python 3.X]` (see `ensure`).
"""
from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

try:
    from trsi_jax.sandbox.base import SandboxError
except ImportError:  # run alone inside trsi/python:3.X to build that Python's toolchain (_build_in_image)
    SandboxError = RuntimeError

MOUNT = "/.trsi"  # where the toolchain appears inside a sandbox (a name the agent's files never use)
SHIMS = f"{MOUNT}/shims"
PYTHON = f"{MOUNT}/bin/trsi-python"
PYTEST_INI = f"{MOUNT}/pytest.ini"
MISSING_MARK = "trsi-verifier-missing:"  # printed by shims when a test script needs what we lack
# What the apt-get shim accepts as installed: the verifier's environment names the image's (local:
# the host's) Debian packages and commands, read before any agent file was there. Never the
# sandbox's dpkg database or PATH: the agent's /var and /usr/local reach the verifier.
INSTALLED_ENV = "TRSI_INSTALLED"
DPKG_INSTALLED = ["dpkg-query", "-W", "-f", "${db:Status-Abbrev} ${Package}\n"]


def dpkg_installed(out: str) -> list[str]:
    """Package names `DPKG_INSTALLED`'s output marks installed ("ii")."""
    return [line.split()[1] for line in out.splitlines() if line.startswith("ii ") and len(line.split()) > 1]


# Pinned from what Terminal-Bench 2 tests/test.sh files ask uvx/pip for (pytest + ctrf in all): the
# shared toolchain. What fewer tasks pin (torch, selenium, opencv, ...) is too big to share; those
# scripts get it added in a toolchain of their own (`requested_extras`).
PACKAGES = ("pytest==8.4.1", "pytest-json-ctrf==0.3.5", "numpy==2.3.1", "scipy==1.16.2", "pandas==2.3.2",
            "pillow==11.2.1", "requests==2.32.4", "psutil==7.0.0", "toml==0.10.2", "rdflib==7.1.4", "chess==1.11.2",
            "beautifulsoup4==4.13.5", "bs4==0.0.2", "biopython==1.85", "shapely==2.1.1", "scikit-learn==1.7.0",
            "scikit-image==0.25.0", "matplotlib==3.10.7", "tqdm==4.67.1", "pytesseract==0.3.13", "setuptools==78.1.1")
VERSION = "1"  # bump when the layout below changes
IMAGE = "trsi/python:{}"  # where another Python's toolchain is built (sandboxes/docker/build_images.sh)
_REQUESTED = re.compile(r"(?:^|\s)(?:-p|--python)(?:\s+|=)(?:python|cpython-?)?(3\.\d+)\b", re.MULTILINE)
_WITH = re.compile(r"(?:^|\s)(?:-w|--with)(?:\s+|=)['\"]?([A-Za-z0-9][A-Za-z0-9._-]*(?:\[[\w,.-]*\])?==[\w.+!-]+)")
_PIN = re.compile(r"^['\"]?([A-Za-z0-9][A-Za-z0-9._-]*(?:\[[\w,.-]*\])?==[\w.+!-]+)['\"]?$")
# `pip install ...` in a command's position: `uv pip`, `pip3`, `python3 -m pip` (not an `echo`'s words).
_PIP_INSTALL = re.compile(r"(?:^|[;&|(])\s*(?:uv\s+|python3?(?:\.\d+)?\s+-m\s+)?pip3?\s+install\s+([^\n;&|)#]*)",
                          re.MULTILINE)
# `apt-get install ...` / `apt install ...` in a command's position, after `sudo` or `VAR=value`s.
_APT_INSTALL = re.compile(r"(?:^|[;&|(])\s*(?:sudo\s+)?(?:[A-Z_]+=\S*\s+)*apt(?:-get)?\s+install\s+([^\n;&|)#]*)",
                          re.MULTILINE)
_DEB_NAME = re.compile(r"^[a-z0-9][a-z0-9+.-]+(?::[a-z0-9]+)?(?:=[\w.+:~-]+)?$")
_SELF = Path(__file__).read_bytes()
_SHIM = Path(__file__).with_name("shim.py").read_bytes()
_SKIP_STDLIB = {"site-packages", "test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "config-3.11"}


class ToolchainError(SandboxError):
    """The verifier toolchain is not built and could not be built here."""


def cache_root() -> Path:
    return Path(os.environ.get("TRSI_VERIFIER_CACHE", Path.home() / ".cache" / "trsi_jax" / "verifier"))


def host_python() -> str:
    return f"{sys.version_info[0]}.{sys.version_info[1]}"


def _packages_key(packages: tuple[str, ...], python: str) -> str:
    h = hashlib.sha256(f"{VERSION}|{python}|{sys.platform}|{'|'.join(sorted(packages))}".encode())
    return f"py{python.replace('.', '')}-{h.hexdigest()[:12]}"


def toolchain_key(packages: tuple[str, ...] = PACKAGES, python: str | None = None) -> str:
    """<python+packages>-<layout>: the layout part changes with this file and shim.py (as this
    process loaded them, so a build always matches its key)."""
    layout = hashlib.sha256(b"layout:" + _SELF + _SHIM).hexdigest()[:8]
    return f"{_packages_key(packages, python or host_python())}-{layout}"


def requested_python(script: str) -> str | None:
    """The Python version a test script asks uv for (`uvx -p 3.13`, `uv venv --python 3.12`), if any."""
    found = _REQUESTED.findall(script)
    return found[0] if found else None


def _name(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", re.split(r"[\[=<>!~;\s]", requirement, maxsplit=1)[0]).lower()


def requested_extras(script: str, packages: tuple[str, ...] = PACKAGES) -> tuple[str, ...]:
    """The pinned packages a test script asks for (`uvx -w name==version`, `--with`; `pip install` and
    `uv pip install` arguments `name==version`) whose name `packages` lacks, sorted. Unpinned ones are
    not added (the shims name them)."""
    have = {_name(p) for p in packages}
    pins = set(_WITH.findall(script)) | {m.group(1) for args in _PIP_INSTALL.findall(script)
                                         for m in map(_PIN.match, args.split()) if m}
    return tuple(sorted(w for w in pins if _name(w) not in have))


def requested_apt(script: str) -> tuple[str, ...]:
    """The Debian packages a test script installs with `apt-get install` (sorted), but curl: the
    shims stand in for what tests fetch with it (uv's installer)."""
    words = {w for args in _APT_INSTALL.findall(script.replace("\\\n", " ")) for w in args.split()}
    return tuple(sorted(w for w in words if _DEB_NAME.match(w) and w.split("=")[0].split(":")[0] != "curl"))


_UNAVAILABLE: set = set()  # python versions, (python, extras): cannot be had (tried once per process)


def for_script(script: Path, packages: tuple[str, ...] = PACKAGES) -> Path:
    """The toolchain to run test script `script` with: of the Python it asks uv for, else this
    process's; with the script's `requested_extras` added. When the asked version cannot be had here
    (no docker or no trsi/python:3.X image), this process's, and when the extras cannot be installed
    (no PyPI, a conflict), the toolchain without them: each with a warning once, the second leaving the
    shims to name what is missing in the verifier's result."""
    text = script.read_text(errors="replace")
    python = requested_python(text)
    if python == host_python() or python in _UNAVAILABLE:
        python = None
    try:
        base = ensure(packages, python=python)
    except ToolchainError as e:
        if python is None:
            raise
        _UNAVAILABLE.add(python)
        logging.warning("verifying tests that ask for Python %s with Python %s: %s", python, host_python(), e)
        python, base = None, ensure(packages)
    extras = requested_extras(text, packages)
    if extras and (python, extras) not in _UNAVAILABLE:
        try:
            return ensure(packages + extras, python=python)
        except ToolchainError as e:
            _UNAVAILABLE.add((python, extras))
            logging.warning("verifying tests that ask for %s without them: %s", " ".join(extras), e)
    return base


def ensure(packages: tuple[str, ...] = PACKAGES, root: Path | None = None, python: str | None = None) -> Path:
    """Host directory of the toolchain for `packages` on Python `python` (default: this process's),
    built on first use (pip from PyPI; another Python's inside its image, see `_build_in_image`) and
    reused; safe across processes (a file lock, an atomic rename). Raises ToolchainError if it cannot
    be built."""
    root = root or cache_root()
    final = root / toolchain_key(packages, python)
    if (final / ".complete").is_file():
        return final
    if python not in (None, host_python()):
        _build_in_image(python, packages, root)
        if not (final / ".complete").is_file():
            raise ToolchainError(f"the build in {IMAGE.format(python)} left no toolchain at {final}")
        return final
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / ".complete").is_file():
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f"{final.name}.tmp-", dir=root))
        try:
            same = [d for d in root.glob(f"{_packages_key(packages, host_python())}-*")
                    if (d / ".complete").is_file()]
            _build(tmp, packages, reuse=same[0] if same else None)
            (tmp / ".complete").write_text("\n".join(packages) + "\n")
            shutil.rmtree(final, ignore_errors=True)
            tmp.rename(final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _build_in_image(python: str, packages: tuple[str, ...], root: Path) -> None:
    """Build Python `python`'s toolchain into `root` by running this file in trsi/python:`python` with
    that image's interpreter (network on, as for image builds; as this user, so the files are ours)."""
    image = IMAGE.format(python)
    try:
        import docker  # noqa: PLC0415
        client = docker.from_env()
        client.images.get(image)
    except ImportError:
        raise ToolchainError(f"no verifier toolchain for Python {python}: building one needs the docker "
                             "package (pip install docker)") from None
    except Exception as e:  # noqa: BLE001 (no daemon, no image: both say what to do)
        what = (f"the image {image} is missing: build it with `sudo sandboxes/docker/build_images.sh`"
                if type(e).__name__ == "ImageNotFound" else f"docker is not reachable ({e})")
        raise ToolchainError(f"no verifier toolchain for Python {python}: {what}") from None
    root.mkdir(parents=True, exist_ok=True)
    key = toolchain_key(packages, python)
    with open(root / f"{key}.image.lock", "w") as lock:  # not <key>.lock: the build inside takes that one
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (root / key / ".complete").is_file():
            return
        try:
            client.containers.run(
                image, ["python3", "-I", "/src/toolchain.py", *packages], remove=True, network_mode="bridge",
                user=f"{os.getuid()}:{os.getgid()}", environment={"TRSI_VERIFIER_CACHE": "/out", "HOME": "/tmp"},
                volumes={str(Path(__file__).parent): {"bind": "/src", "mode": "ro"},
                         str(root): {"bind": "/out", "mode": "rw"}})
        except Exception as e:  # noqa: BLE001 (ContainerError carries the build's stderr)
            err = getattr(e, "stderr", None)
            tail = err.decode(errors="replace")[-1500:] if isinstance(err, bytes) else str(e)
            raise ToolchainError(f"building the verifier toolchain for Python {python} in {image} "
                                 f"failed:\n{tail}") from None


def _build(t: Path, packages: tuple[str, ...], reuse: Path | None) -> None:
    """Interpreter, packages and libraries (hard-linked from `reuse`, a toolchain with the same
    packages and an older layout, when there is one), then the wrappers and shims."""
    ver = host_python()
    if reuse is not None:
        for part in ("rt", "lib"):
            subprocess.run(["cp", "-al", str(reuse / part), str(t / part)], check=True)
    else:
        _install(t, packages, ver)
    for tree, shown in ((t / "rt" / "lib" / f"python{ver}", f"{MOUNT}/rt/lib/python{ver}"), (t / "lib", f"{MOUNT}/lib")):
        # bytecode now: the mount is read-only, so nothing compiled later would be kept
        subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", "-d", shown, str(tree)],
                       capture_output=True, check=False)
    (t / "pyvenv.cfg").write_text(f"home = {MOUNT}/rt/bin\ninclude-system-site-packages = false\nversion = "
                                  f"{sys.version.split()[0]}\n")
    (t / "pytest.ini").write_text("[pytest]\n")
    (t / "bin").mkdir()
    _write_exe(t / "bin" / "trsi-python",
               f'#!/bin/sh\nexec {MOUNT}/rt/syslib/{_loader_name()} --inhibit-cache --library-path '
               f'{MOUNT}/rt/lib:{MOUNT}/rt/syslib --argv0 {PYTHON} {MOUNT}/rt/bin/python{ver} "$@"\n')
    (t / "shim.py").write_bytes(_SHIM)
    shims = t / "shims"
    shims.mkdir()
    for name in ("uv", "uvx", "pip", "pip3", "curl", "apt-get", "apt", "pytest", "py.test"):
        _write_exe(shims / name, f'#!/bin/sh\nexec {PYTHON} -I {MOUNT}/shim.py {name} "$@"\n')
    for name in ("python", "python3"):
        _write_exe(shims / name, PY_PASSTHROUGH.replace("NAME", name))


# `python [flags] -m pytest ...` is ours (the flags are dropped: pytest runs isolated), anything else
# the sandbox's own python, found on PATH past the shims.
PY_PASSTHROUGH = f"""#!/bin/sh
n=0; val=""
for a in "$@"; do
  if [ -n "$val" ]; then val=""; n=$((n+1)); continue; fi
  case "$a" in
    -m) break ;;
    -W|-X) val=1; n=$((n+1)) ;;
    -c*|-) n=-1; break ;;
    -?*) n=$((n+1)) ;;
    *) n=-1; break ;;
  esac
done
if [ "$n" -ge 0 ] && [ "$#" -ge $((n+2)) ]; then
  eval "m=\\${{$((n+1))}} p=\\${{$((n+2))}}"
  if [ "$m" = "-m" ] && [ "$p" = "pytest" ]; then shift $((n+2)); exec {PYTHON} -I {MOUNT}/shim.py pytest "$@"; fi
fi
IFS=:
for d in $PATH; do
  [ "$d" = "{SHIMS}" ] && continue
  [ -x "$d/NAME" ] && exec "$d/NAME" "$@"
done
echo "NAME: command not found" >&2
exit 127
"""


def _install(t: Path, packages: tuple[str, ...], ver: str) -> None:
    site = t / "lib" / f"python{ver}" / "site-packages"
    res = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                          "--no-input", "--prefer-binary", "--no-compile", "--target", str(site), *packages],
                         capture_output=True, text=True, timeout=1800)
    if res.returncode != 0:
        raise ToolchainError(f"could not build the verifier toolchain in {t.parent}: pip install {' '.join(packages)} "
                             f"failed (is PyPI reachable? build it once where it is: `python -m "
                             f"trsi_jax.sandbox.toolchain`, or copy {cache_root()} here):\n{res.stderr[-1500:]}")
    _copy_runtime(t / "rt", ver)
    _bundle_libs(t / "rt" / "syslib", [t / "rt"], [site])


def _write_exe(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


def _loader_name() -> str:
    return "ld-linux-x86-64.so.2" if os.uname().machine == "x86_64" else "ld-linux-aarch64.so.1"


def _copy_runtime(rt: Path, ver: str) -> None:
    """This interpreter's binary, libpython and standard library (no site-packages) under `rt`."""
    base = Path(sys.base_prefix)
    (rt / "bin").mkdir(parents=True)
    shutil.copy2(Path(sys._base_executable).resolve(), rt / "bin" / f"python{ver}")  # noqa: SLF001
    libdir = Path(sysconfig.get_config_var("LIBDIR") or base / "lib")
    (rt / "lib").mkdir()
    for so in libdir.glob("libpython*.so*"):
        shutil.copy2(so, rt / "lib" / so.name, follow_symlinks=True)
    std = Path(sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_prefix})["stdlib"])
    dst = rt / "lib" / f"python{ver}"
    dst.mkdir()
    for child in std.iterdir():
        if child.name in _SKIP_STDLIB or child.name.startswith("config-"):
            continue
        if child.is_dir():
            shutil.copytree(child, dst / child.name, symlinks=False,
                            ignore=shutil.ignore_patterns("test", "tests"))
        else:
            shutil.copy2(child, dst / child.name)
    (dst / "site-packages").mkdir()


_LDD_LINE = re.compile(r"^\s*(\S+)\s+=>\s+(/\S+)|^\s*(/\S+)\s+\(0x")


def _bundle_libs(dest: Path, trees: list[Path], sites: list[Path]) -> None:
    """Copy every shared library the ELF files under `trees`/`sites` load (per ldd), and the loader,
    into `dest`, except those the trees ship themselves (e.g. numpy.libs, found by RUNPATH $ORIGIN)."""
    dest.mkdir(parents=True)
    shipped = {p.name for tree in trees + sites for p in tree.rglob("*.so*")}
    elves = [p for tree in trees + sites for p in tree.rglob("*") if p.is_file() and not p.is_symlink()
             and (p.suffix == ".so" or ".so." in p.name or p.parent.name == "bin")]
    extra = ["libgcc_s.so.1", "libnss_files.so.2", "libnss_dns.so.2", "libresolv.so.2"]  # dlopened by glibc
    for p in elves:
        res = subprocess.run(["ldd", str(p)], capture_output=True, text=True)
        for line in res.stdout.splitlines():
            m = _LDD_LINE.match(line)
            if not m:
                continue
            name, path = (m.group(1), m.group(2)) if m.group(1) else (Path(m.group(3)).name, m.group(3))
            if name in shipped and not path.startswith(("/lib", "/usr/lib")):
                continue
            target = dest / (Path(path).name if m.group(3) else name)
            if not target.exists():
                shutil.copy2(path, target, follow_symlinks=True)
    for name in extra:
        for d in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu", "/lib64", "/lib"):
            if Path(d, name).exists() and not (dest / name).exists():
                shutil.copy2(Path(d, name), dest / name, follow_symlinks=True)
                break
    if not (dest / _loader_name()).exists():
        raise ToolchainError(f"could not find the dynamic loader {_loader_name()} for the verifier toolchain")


if __name__ == "__main__":  # [--python 3.X] [packages...]; inside an image: packages only
    args = sys.argv[1:]
    want = args[1] if args[:1] == ["--python"] else None
    print(ensure(tuple(args[2 if want else 0:]) or PACKAGES, python=want))
