"""Sandboxes for Terminal-Bench tasks: `make_sandbox(task, backend)` gives a fresh machine per episode."""
from trsi_jax.sandbox.base import ExecResult, Limits, Sandbox, SandboxError
from trsi_jax.sandbox.verifier import VerifyResult, probe_progress, progress_from, verify

BACKENDS = ("local", "docker")


def make_sandbox(task, backend: str = "local", limits: Limits | None = None) -> Sandbox:
    """A fresh sandbox for `task` on `backend` ("local": bubblewrap, "docker": Docker engine)."""
    if backend == "local":
        from trsi_jax.sandbox.local import LocalSandbox
        return LocalSandbox(task, limits)
    if backend == "docker":
        from trsi_jax.sandbox.docker import DockerSandbox
        return DockerSandbox(task, limits)
    raise ValueError(f"unknown sandbox backend {backend!r}; choose one of {BACKENDS}")


def run_oracle(task, backend: str = "local", limits: Limits | None = None) -> VerifyResult:
    """Run the task's reference solution in a fresh sandbox, then verify (see oracle.py)."""
    from trsi_jax.sandbox.oracle import run_oracle as _run
    return _run(task, backend, limits)


__all__ = ["BACKENDS", "ExecResult", "Limits", "Sandbox", "SandboxError", "VerifyResult", "make_sandbox",
           "probe_progress", "progress_from", "run_oracle", "verify"]
