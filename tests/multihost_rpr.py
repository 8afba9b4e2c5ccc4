"""One process of the multi-host RPR test (run by tests/test_multihost.py, not collected).

    python tests/multihost_rpr.py PROCESS_ID NUM_PROCESSES PORT DEVICES_PER_PROCESS WORKDIR

Runs one RPR update (rollouts in real sandboxes, scoring, PPO step on policy and critic,
metrics, checkpoint) of a tiny model on 8 devices in all; with NUM_PROCESSES > 1 the processes
join through jax.distributed on localhost. Process 0 writes WORKDIR/params.npz (the final policy).
"""
import os
import sys

pid, nproc, port, ndev, workdir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5]
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={ndev}"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import trsi_jax  # noqa: E402,F401  (XLA:CPU flag before jax starts)
import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")
if nproc > 1:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"localhost:{port}", num_processes=nproc, process_id=pid)

import pathlib  # noqa: E402

import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from tests.test_rpr import CFG, MODEL, write_task  # noqa: E402
from trsi_jax import config as C  # noqa: E402
from trsi_jax.rollout import ByteTokenizer  # noqa: E402
from trsi_jax.rpr.stage import run_rpr  # noqa: E402
from trsi_jax.sharding import to_host  # noqa: E402
from trsi_jax.train.checkpoint import Checkpointer, restore_policy  # noqa: E402

assert jax.device_count() == 8 and jax.process_count() == nproc, (jax.device_count(), jax.process_count())
# Every process builds the same task folders (its own copy) and runs the same episodes.
root = pathlib.Path(workdir) / f"tasks-{pid}"
tasks = [write_task(root, family) for family in ("alpha", "beta")]
cfg = C.override(CFG, {"updates": "1", "critic_warmup_updates": "0", "samples_per_task": "4",
                       "ppo.minibatch_size": "8", "ppo.entropy_coef": "0.01", "mesh.fsdp": "2", "mesh.tensor": "4"})
run_rpr(cfg, MODEL, os.path.join(workdir, "rpr"), tasks, ByteTokenizer(), progress=False)
# The checkpoint read back onto the mesh (policy) and onto every host (critic, as NumPy).
mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(1, 2, 4), ("data", "fsdp", "tensor"))
policy = restore_policy(os.path.join(workdir, "rpr", "checkpoints"), MODEL, mesh=mesh)
ckpt = Checkpointer(os.path.join(workdir, "rpr", "checkpoints"), max_to_keep=None)
critic = ckpt.restore(items=["critic"])["critic"]
ckpt.close()
leaves = to_host(jax.tree.leaves(nnx.state(policy, nnx.Param))) + [np.asarray(x) for x in jax.tree.leaves(critic)]
if jax.process_index() == 0:
    np.savez(os.path.join(workdir, "params.npz"), *leaves)
print(f"process {pid}/{nproc}: done", flush=True)
