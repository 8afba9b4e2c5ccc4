"""Multi-host: 2 JAX processes on localhost (jax.distributed, 4 fake CPU devices each) run an RPR
update (rollouts, scoring, PPO, metrics, checkpoint) and end with the policy of one process
running the same update on 8 devices."""
import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "multihost_rpr.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _run(workdir: str, nproc: int) -> dict[str, np.ndarray]:
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    port = str(_free_port())
    procs = [subprocess.Popen([sys.executable, WORKER, str(i), str(nproc), port, str(8 // nproc), workdir],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(nproc)]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=1200)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    for p, out in zip(procs, outs):
        assert p.returncode == 0, f"worker failed ({p.args}):\n{out[-6000:]}"
    with np.load(os.path.join(workdir, "params.npz")) as f:
        return {k: f[k] for k in f.files}


def test_two_processes_match_one(tmp_path):
    single = _run(str(tmp_path / "one"), 1)
    multi = _run(str(tmp_path / "two"), 2)
    assert single.keys() == multi.keys()
    for k in single:
        np.testing.assert_allclose(multi[k], single[k], rtol=0, atol=1e-6, err_msg=k)
    # Process 0 wrote the metrics; the policy step really ran (entropy bonus: nonzero gradient).
    rows = {run: json.loads(open(tmp_path / run / "rpr" / "metrics.jsonl").readline()) for run in ("one", "two")}
    assert rows["two"]["policy/grad_norm"] > 0
    for key in ("rollout/reward", "policy/loss", "critic/loss", "policy/grad_norm"):
        assert rows["two"][key] == pytest.approx(rows["one"][key], rel=1e-5, abs=1e-7), key
