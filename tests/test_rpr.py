"""RPR stage end to end on 8 fake devices: real sandboxes, real PPO updates, critic inheritance
onto another mesh shape, warm-up, and resume after a simulated kill."""
import dataclasses
import json
import os

import jax
import numpy as np
import pytest
from flax import nnx

from trsi_jax import config as C
from trsi_jax.models import Qwen
from trsi_jax.rollout import ByteTokenizer
from trsi_jax.rpr.handoff import read_handoff
from trsi_jax.rpr.stage import run_rpr, setup_rpr
from trsi_jax.sharding import make_mesh
from trsi_jax.tasks import load_task
from trsi_jax.train.checkpoint import Checkpointer

pytestmark = pytest.mark.slow

# vocab = the byte tokenizer's 260 ids, so every sampled id decodes.
MODEL = C.override(C.model_preset("tiny_qwen3"), {"num_layers": "1", "vocab_size": "260"})
CFG = C.RPRConfig(
    stage=1, updates=2, seed=3, tasks_per_update=2, samples_per_task=2, max_turns=1, max_new_tokens=24,
    max_len=1024, critic_warmup_updates=1, ppo=C.PPOConfig(epochs=1, minibatch_size=4),
    policy_optim=C.OptimConfig(lr=1e-3, schedule="constant"),
    critic_optim=C.OptimConfig(lr=1e-3, schedule="constant"), mesh=C.MeshConfig(data=1, fsdp=2, tensor=4))


TASK_TOML = """version = "1.0"
[metadata]
difficulty = "easy"
category = "{family}"
[agent]
timeout_sec = 60.0
[verifier]
timeout_sec = 30.0
progress_tests = ["test_workdir_exists", "test_done"]
[environment]
docker_image = "python:3.11-slim-bookworm"
allow_internet = false
workdir = "/app"
"""
TESTS = """from pathlib import Path


def test_workdir_exists():
    assert Path("/app").is_dir()


def test_done():
    assert Path("/app/done.txt").read_text().strip() == "ok"
"""
TEST_SH = """#!/bin/bash
mkdir -p /logs/verifier
cd /app
python3 -m pytest /tests/test_outputs.py -rA -p no:cacheprovider
if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
"""


def write_task(root, family):
    """A TB2 task whose untouched environment passes 1 of 2 tests: partial credit 0.5, so even a
    random policy earns SPR = kappa * 0.5 and the critic has something to fit."""
    files = {"task.toml": TASK_TOML.format(family=family),
             "instruction.md": "Write the text ok into /app/done.txt.\n",
             "environment/Dockerfile": "FROM python:3.11-slim-bookworm\nWORKDIR /app\n",
             "solution/solve.sh": "#!/bin/bash\necho ok > /app/done.txt\n",
             "tests/test.sh": TEST_SH, "tests/test_outputs.py": TESTS}
    for rel, text in files.items():
        path = root / f"{family}-0" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o755)
    return load_task(root / f"{family}-0")


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    root = tmp_path_factory.mktemp("tasks")
    return [write_task(root, family) for family in ("alpha", "beta")]


@pytest.fixture(scope="module")
def stage1(tasks, tmp_path_factory, devices8):
    """An uninterrupted 2-update RPR-1 run (update 1 = critic warm-up)."""
    workdir = str(tmp_path_factory.mktemp("rpr-1"))
    result = run_rpr(CFG, MODEL, workdir, tasks, ByteTokenizer(), progress=False)
    return workdir, result


def _restore(ckpt_dir, step, items):
    ckpt = Checkpointer(ckpt_dir, max_to_keep=None)
    out = ckpt.restore(step, items=items)
    ckpt.close()
    return out


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(tree))]


def test_stage1_updates_both_models_after_warmup(stage1):
    workdir, result = stage1
    assert result.updates == 2 and result.resumed_from is None
    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["warmup"] == 1.0 and "policy/loss" not in rows[0]
    assert rows[1]["warmup"] == 0.0 and np.isfinite(rows[1]["policy/loss"])
    for key in ("rollout/reward", "rollout/strict_success", "rollout/process_reward", "policy/clip_frac",
                "policy/approx_kl", "critic/explained_variance", "ppo/tokens_per_sec"):
        assert key in rows[1], key
    # Warm-up: the policy saved after update 1 is bitwise the initial one; the critic moved.
    init = nnx.jit(lambda: Qwen(MODEL, rngs=nnx.Rngs(CFG.seed)))()
    init_policy = _leaves(nnx.to_pure_dict(nnx.state(init, nnx.Param)))
    after1 = _restore(result.checkpoint_dir, 1, ["params", "critic"])
    after2 = _restore(result.checkpoint_dir, 2, ["params", "critic"])
    assert all(np.array_equal(a, b) for a, b in zip(_leaves(after1["params"]), init_policy))
    assert np.abs(after1["critic"]["value_head"]["kernel"]).sum() > 0  # the head starts at zero
    assert not all(np.array_equal(a, b) for a, b in zip(_leaves(after2["params"]), init_policy))
    assert not all(np.array_equal(a, b) for a, b in zip(_leaves(after2["critic"]), _leaves(after1["critic"])))
    record = read_handoff(workdir)["rpr-1"]
    assert record["policy_from"] == {"random_init_seed": CFG.seed} and record["critic_from"]["policy_backbone"]


def test_stage2_inherits_critic_bit_exactly_on_another_mesh(stage1, tmp_path):
    _, result = stage1
    cfg2 = dataclasses.replace(CFG, stage=2, inherit_critic=True, inherit_critic_opt=True)
    mesh = make_mesh(C.MeshConfig(data=2, fsdp=2, tensor=2))
    setup = setup_rpr(cfg2, MODEL, str(tmp_path / "rpr-2"), ["alpha", "beta"], mesh,
                      init_checkpoint=result.checkpoint_dir, critic_checkpoint=result.checkpoint_dir)
    saved = _restore(result.checkpoint_dir, 2, ["params", "critic", "critic_opt"])
    learner = setup.learner
    for got, want in ((nnx.to_pure_dict(learner.critic_params), saved["critic"]),
                      (nnx.to_pure_dict(learner.policy_params), saved["params"]),
                      (learner.critic_opt, saved["critic_opt"])):
        got, want = _leaves(got), _leaves(want)
        assert len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want))
    for leaf in jax.tree.leaves(learner.critic_params):
        assert dict(leaf.sharding.mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
    assert setup.handoff["critic_from"]["dir"] == result.checkpoint_dir
    assert setup.handoff["critic_from"]["step"] == 2 and setup.handoff["policy_from"]["item"] == "params"
    setup.ckpt.close()


def test_kill_and_resume_matches_uninterrupted_run(stage1, tasks, tmp_path):
    _, reference = stage1
    workdir = str(tmp_path / "rpr-1")
    first = run_rpr(CFG, MODEL, workdir, tasks, ByteTokenizer(), stop_after=1, progress=False)
    assert first.updates == 1
    resumed = run_rpr(CFG, MODEL, workdir, tasks, ByteTokenizer(), progress=False)  # a new process would do this
    assert resumed.resumed_from == 1 and resumed.updates == 2
    got = _restore(resumed.checkpoint_dir, 2, ["params", "critic", "fdr_stats"])
    want = _restore(reference.checkpoint_dir, 2, ["params", "critic", "fdr_stats"])
    for name in ("params", "critic", "fdr_stats"):
        assert all(np.array_equal(a, b) for a, b in zip(_leaves(got[name]), _leaves(want[name]))), name


def test_inherit_without_checkpoint_is_refused(tmp_path, devices8):
    cfg2 = dataclasses.replace(CFG, stage=2, inherit_critic=True)
    with pytest.raises(ValueError, match="inherit_critic needs critic_checkpoint"):
        setup_rpr(cfg2, MODEL, str(tmp_path), ["alpha"], make_mesh(CFG.mesh))


def test_update_without_a_working_sandbox_makes_no_step(tmp_path, devices8):
    """Every episode of an update failed to start its sandbox (the image's RUN fails): nothing is
    trained on (no reward 0 for the policy), the update is recorded as skipped with its
    infrastructure failures counted, and the saved policy and critic are the initial ones."""
    task = write_task(tmp_path / "tasks", "alpha")
    dockerfile = task.path / "environment" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + "RUN exit 3\n")
    broken = load_task(task.path)
    cfg = dataclasses.replace(CFG, updates=1, critic_warmup_updates=0)
    result = run_rpr(cfg, MODEL, str(tmp_path / "rpr"), [broken], ByteTokenizer(), progress=False)
    (row,) = [json.loads(line) for line in open(tmp_path / "rpr" / "metrics.jsonl")]
    assert row["skipped"] == 1.0 and row["rollout/infra_failures"] == 4.0 and "policy/loss" not in row
    saved = _restore(result.checkpoint_dir, 1, ["params", "critic"])
    init = nnx.jit(lambda: Qwen(MODEL, rngs=nnx.Rngs(CFG.seed)))()
    assert all(np.array_equal(a, b) for a, b in zip(_leaves(saved["params"]),
                                                    _leaves(nnx.to_pure_dict(nnx.state(init, nnx.Param)))))
    assert np.abs(saved["critic"]["value_head"]["kernel"]).sum() == 0  # the zero-initialised head never moved
