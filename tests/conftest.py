"""Test harness: 8 fake CPU devices, fp32, a persistent compilation cache. Runs before jax loads."""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
import trsi_jax  # noqa: E402,F401  (sets the XLA:CPU scheduler flag before jax starts)
# Shared with the experiments (`--jax_cache_dir` default): survives fresh clones on one machine.
_CACHE = os.path.expanduser("~/.cache/trsi_jax/jax")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", _CACHE)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")


@pytest.fixture(scope="session")
def devices8():
    devs = jax.devices()
    assert len(devs) == 8, f"expected 8 fake CPU devices, got {len(devs)}; is XLA_FLAGS set before jax import?"
    return devs
