"""`experiments.pipeline --model=tiny` runs all five stages on a small task subset, records the
hand-offs between them, and skips finished stages on a re-run."""
import dataclasses
import json
import os
import subprocess
import sys

import pytest

from trsi_jax.pipeline import STAGES

pytestmark = pytest.mark.slow
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(workdir, *flags, ok=True):
    cmd = [sys.executable, "-m", "experiments.pipeline", "--model=tiny", "--preset=ci", f"--workdir={workdir}",
           f"--jax_cache_dir={os.path.join(ROOT, '.cache', 'jax')}", "--pipeline.families=files,text", *flags]
    # One CPU device, as `make demo` runs (the 8 fake devices of conftest are for mesh tests).
    env = dict(os.environ, XLA_FLAGS=os.environ.get("XLA_FLAGS", "").replace(
        "--xla_force_host_platform_device_count=8", "").strip())
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    assert (out.returncode == 0) == ok, out.stdout[-3000:] + out.stderr[-5000:]
    return out


def test_pipeline_runs_five_stages_and_resumes(tmp_path):
    workdir = tmp_path / "demo"
    out = _run(workdir)
    report = json.loads((workdir / "report.json").read_text())
    assert set(report["eval"]) == set(STAGES)
    for stage in STAGES:
        assert (workdir / stage / "stage.done.json").exists(), stage
        ev = report["eval"][stage]
        assert set(ev["families"]) == {"files", "text"}
        assert 0.0 <= ev["all"]["strict_success"] <= 1.0 and "pass@2" in ev["all"]
        assert ev["checkpoint"]["dir"] == str(workdir / stage / "checkpoints")
    assert report["stages"]["base"]["verified"] >= 1  # oracle demonstrations passed the verifier
    # Each stage started from the previous stage's latest checkpoint; RPR-2's critic from RPR-1.
    handoff = json.loads((workdir / "handoff.json").read_text())
    chain = {"rsr-1": "base", "rpr-1": "rsr-1", "rsr-2": "rpr-1", "rpr-2": "rsr-2"}
    for stage, previous in chain.items():
        assert handoff[stage]["policy_from"]["dir"] == str(workdir / previous / "checkpoints"), stage
    assert handoff["rpr-2"]["critic_from"]["dir"] == str(workdir / "rpr-1" / "checkpoints")
    assert handoff["rpr-1"]["critic_from"]["policy_backbone"] is True
    for stage in STAGES:
        assert stage in out.stdout  # the final table
    # One line per stage, the RSR table and the plot; no library INFO log lines (absl: "I1203 ...").
    lines = {s: [ln for ln in out.stdout.splitlines() if ln.startswith(f"{s} ") and "held-out strict" in ln]
             for s in STAGES}
    assert all(len(v) == 1 for v in lines.values()), lines
    assert "runbooks" in lines["rsr-1"][0] and "PPO updates" in lines["rpr-2"][0]
    assert not [ln for ln in out.stderr.splitlines() if ln[:1] == "I" and ln[1:5].isdigit()], out.stderr[-2000:]
    assert (workdir / "report.png").read_bytes()[:4] == b"\x89PNG"
    assert report["rsr_table"] in (workdir / "report.md").read_text() and "union" in report["rsr_table"]
    # A re-run finds every stage done and reproduces the same report without training.
    again = _run(workdir)
    assert "reused" in [ln for ln in again.stdout.splitlines() if ln.startswith("rpr-2 ")][0]
    assert json.loads((workdir / "report.json").read_text())["eval"] == report["eval"]
    # Changing a flag but keeping the workdir must not report the old result: the re-run stops at
    # the first stage the flag changes, naming the field and the folders to delete.
    changed = _run(workdir, "--pipeline.rpr2.policy_optim.lr=1e-06", ok=False)
    assert "policy_optim.lr" in changed.stderr and f"rm -r {workdir / 'rpr-2'}" in changed.stderr, changed.stderr[-3000:]


def test_pipeline_keeps_no_compiled_programs_between_stages(tmp_path):
    """XLA:CPU maps ~140 memory regions per compiled program and jax's caches keep every one: a
    3-seed bench process passed vm.max_map_count (65,530) and segfaulted. The pipeline clears the
    caches after each stage, so a whole run leaves the process's mappings where they were."""
    import jax

    from trsi_jax.config import MODEL_PRESETS
    from trsi_jax.pipeline import Pipeline, pipeline_preset
    from trsi_jax.rollout.tokenizer import ByteTokenizer

    def maps() -> int:
        with open("/proc/self/maps") as f:
            return sum(1 for _ in f)

    jax.clear_caches()
    before = maps()
    cfg = dataclasses.replace(pipeline_preset("ci"), families=("files", "text"))
    threshold = jax.config.jax_persistent_cache_min_compile_time_secs
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)  # as init_runtime: stages read programs back
    try:
        Pipeline(cfg, MODEL_PRESETS["tiny"], str(tmp_path / "run"), ByteTokenizer(), show_progress=False).run()
    finally:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", threshold)
    assert sum(1 for _ in (tmp_path / "run").rglob("stage.done.json")) == 5
    assert maps() - before < 1000, (before, maps())  # one cached program alone maps ~140
