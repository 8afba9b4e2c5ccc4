"""`make demo` end to end: the demo preset from the shipped base (`trsi_jax/assets/tiny_base`,
made by `experiments.make_base`) gives RSR-1 real successes, and its critic rejects a runbook
whose revision is then accepted. Held-out evaluation is shrunk to 2 tasks per family and the stages after RSR-1 are
shortened to keep the test short; everything that RSR-1 does is the preset's own."""
import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE = os.path.join(ROOT, "trsi_jax", "assets", "tiny_base")


def test_demo_preset_rsr1_learns_from_successes_and_revises_a_rejected_runbook(tmp_path):
    workdir = tmp_path / "demo"
    cmd = [sys.executable, "-m", "experiments.pipeline", "--preset=demo", f"--init_hf={BASE}",
           f"--workdir={workdir}", f"--jax_cache_dir={os.path.join(ROOT, '.cache', 'jax')}",
           # Past RSR-1 (what this test checks) the later stages run shortened, so the suite stays
           # within its time budget: one small update per RPR stage, RSR-2 under the common harness only.
           "--pipeline.heldout_per_family=2", "--pipeline.rpr1.updates=1", "--pipeline.rpr2.updates=1",
           "--pipeline.rpr1.tasks_per_update=4", "--pipeline.rpr2.tasks_per_update=4",
           "--pipeline.rsr2.harnesses=common"]
    env = dict(os.environ, XLA_FLAGS=os.environ.get("XLA_FLAGS", "").replace(
        "--xla_force_host_platform_device_count=8", "").strip())  # one CPU device, as `make demo`
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=2400)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    rsr = json.loads((workdir / "rsr-1" / "report.json").read_text())
    assert rsr["successes"] >= 1, rsr["coverage"]
    runbooks = rsr["runbooks"]
    assert runbooks["rejected"] + runbooks["accepted_after_revision"] >= 1 and runbooks["revisions"] >= 1, runbooks
    assert runbooks["accepted_after_revision"] >= 1, runbooks
    assert rsr["sft_examples"] >= 1 and rsr["sft"]["steps"] > 0, rsr
    report = json.loads((workdir / "report.json").read_text())
    assert report["eval"]["base"]["checkpoint"]["dir"] == BASE
