"""Fake CPU devices for the AOT planners: call `from_argv()` before jax is imported."""
import os
import sys


def from_argv(default_mesh: str = "fsdp=8") -> None:
    """As many host devices as the `--mesh=a=N,b=M` flag's axes multiply to (CPU platform)."""
    mesh = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--mesh=")), default_mesh)
    n = 1
    for part in mesh.split(","):
        n *= int(part.split("=")[1])
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={n}").strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
