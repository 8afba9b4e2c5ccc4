"""`experiments.make_base` (the script behind the shipped tiny base): a short run with model and
bootstrap overrides, a left-out template, rendered tasks and hint-only templates writes an HF folder of that
architecture, records what it ran with, and the folder loads back as that model."""
import json
import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from trsi_jax.models import load_hf
from trsi_jax.models.hf_io import config_from_hf

pytestmark = pytest.mark.slow
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_make_base_applies_overrides_and_writes_a_loadable_folder(tmp_path):
    out_dir = tmp_path / "base"
    cmd = [sys.executable, "-m", "experiments.make_base", "--seed=1", f"--out={out_dir}",
           f"--workdir={tmp_path / 'work'}", "--train_per_family=1", f"--jax_cache_dir={ROOT}/.cache/jax",
           "--model_cfg.hidden_size=32", "--model_cfg.intermediate_size=64",
           "--bootstrap.optim.total_steps=2", "--bootstrap.optim.warmup_steps=1", "--bootstrap.checkpoint_every=2",
           # seeds 0-2: files sort_by_extension, find_files, batch_rename; text status_report, replace_word,
           # extract_emails. Seed 0 runs in a sandbox, seeds 1-2 are rendered (batch_rename left out).
           # Hints: every example of the hint-only templates, and no other (fraction 0).
           "--exclude_templates=status_report", "--render_per_family=2", "--hint_fraction=0",
           "--hint_only_templates=sort_by_extension,find_files",
           "--render_templates=find_files,replace_word,extract_emails"]
    env = dict(os.environ, XLA_FLAGS=os.environ.get("XLA_FLAGS", "").replace(
        "--xla_force_host_platform_device_count=8", "").strip())
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]

    record = json.loads((out_dir / "make_base.json").read_text())
    assert record["model"]["hidden_size"] == 32 and record["sft"]["optim"]["total_steps"] == 2
    summary = record["bootstrap"]
    assert summary["sft_steps"] == 2 and summary["tasks"] == 1 and summary["verified"] == 1, summary
    assert (summary["rendered"], summary["hint_examples"], summary["sft_examples"]) == (3, 2, 4), summary
    assert record["exclude_templates"] == ["status_report"] and record["hint_fraction"] == 0.0
    assert record["hint_only_templates"] == ["sort_by_extension", "find_files"]
    assert record["render_templates"] == ["find_files", "replace_word", "extract_emails"]
    cfg = config_from_hf(str(out_dir))
    assert (cfg.hidden_size, cfg.intermediate_size) == (32, 64)
    model = load_hf(str(out_dir), cfg)
    logits = np.asarray(model(jnp.arange(8)[None]))
    assert logits.shape == (1, 8, cfg.vocab_size) and np.isfinite(logits).all()


@pytest.mark.parametrize("flags,error", [
    (["--render_templates=replace_word,nope"], "--render_templates: ['nope'] are not templates"),
    (["--hint_only_templates=nope"], "--hint_only_templates: ['nope'] are not templates"),
    (["--exclude_templates=find_files", "--hint_only_templates=find_files"],
     "['find_files'] are in both --exclude_templates and --hint_only_templates"),
])
def test_make_base_names_a_bad_template_choice(tmp_path, flags, error):
    cmd = [sys.executable, "-m", "experiments.make_base", f"--out={tmp_path / 'base'}",
           f"--workdir={tmp_path / 'work'}", "--train_per_family=3", *flags]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode != 0 and error in run.stderr, run.stderr[-2000:]
    assert not (tmp_path / "base").exists()
