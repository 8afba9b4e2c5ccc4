"""A whole RSR stage on two built-in tasks: real sandboxes, deterministic roles, tiny SFT, resume."""
import json
import os
import shutil

import jax
import numpy as np
import pytest
from flax import nnx

from sandboxes.suite import build_suite
from trsi_jax.agent import format_reply
from trsi_jax.config import MeshConfig, OptimConfig, RSRConfig, SFTConfig, model_preset
from trsi_jax.models import Qwen
from trsi_jax.rollout import ByteTokenizer, ScriptedPolicy, load_episodes
from trsi_jax.rsr.stage import run_rsr
from trsi_jax.tasks import load_task
from trsi_jax.train.checkpoint import restore_policy

# A scripted solver whose commands differ from the oracle's (so its runbooks are not copies of
# solution/), with one failing command first (a pitfall and a recovery for the planner).
SOLVER = {
    "Organise the files": [
        "cat /app/inbox/README",
        'cd /app/inbox; for f in *; do x=$(echo "${f##*.}" | tr A-Z a-z); mkdir -p ../sorted/$x; '
        'mv "$f" ../sorted/$x/; done; cd /app',
        "ls /app/sorted"],
    "Summarise the web server log": [
        "awk '{c[$(NF-1)]++} END {for (s in c) print s, c[s]}' /app/access.log | sort -k2,2nr -k1,1n > /app/report.txt",
        "head -3 /app/report.txt"],
}


def solve(conv):
    steps = next(v for k, v in SOLVER.items() if k in conv[1]["content"])
    n = sum(m["role"] == "assistant" for m in conv)
    if n < len(steps):
        return format_reply([(steps[n] + "\n", 1.0)], analysis="Checking the state.", plan=f"Do step {n + 1}.")
    return format_reply([], task_complete=True, analysis="All done.", plan="Finish.")


@pytest.mark.slow
def test_rsr_stage_end_to_end_and_resume(tmp_path):
    tasks = [load_task(p) for p in build_suite(str(tmp_path / "tasks"), "train", 1, ["files", "text"])]
    tok = ByteTokenizer()
    model_cfg = model_preset("tiny_qwen3")
    cfg = RSRConfig(harnesses=("common", "retry"), runbooks_per_success=2, replays=2, max_len=6000,
                    mesh=MeshConfig(data=1, fsdp=1, tensor=1),
                    sft=SFTConfig(optim=OptimConfig(lr=1e-3, warmup_steps=1, total_steps=2), batch_size=2,
                                  max_len=2048, pad_multiple=512, eval_fraction=0.0, checkpoint_every=1))
    work = tmp_path / "rsr1"
    report = run_rsr(cfg, model_cfg, str(work), tasks, tok, collect_policy=ScriptedPolicy(solve, tok),
                     show_progress=False)

    cov = report["coverage"]
    assert cov == {"tasks": 2, "per_harness": {"common": 2, "retry": 2}, "union": 2, "union_gain_over_best": 0.0,
                   "infra_failures": {"common": 0, "retry": 0}}
    assert report["infra_failures"] == 0 and report["replays"]["infra_failures"] == 0
    assert report["successes"] == 4
    rb = report["runbooks"]
    assert rb["written"] == rb["accepted"] + rb["rejected"] and rb["accepted"] > 0
    assert report["replays"]["run"] == 2 * rb["accepted"] and report["replays"]["verified"] > 0
    assert report["sft_examples"] == (report["replays"]["verified"] - report["sft_examples_dropped"]
                                      - report["sft_examples_duplicates"]) > 0
    assert report["rewrite_ratio"] == report["sft_examples"] / 4
    assert json.loads((work / "report.json").read_text()) == report
    for marker in ("collect/.done", "runbooks.done", "replays/.done", "sft_data/.done", "sft.done"):
        assert (work / marker).exists(), marker

    # Revised runbooks count as useful only where a replay of theirs verified.
    runbooks = [json.loads(line) for line in open(work / "runbooks.jsonl")]
    accepted = [r for r in runbooks if r["accepted"]]
    index = [json.loads(line) for line in open(work / "replays" / "index.jsonl")]
    verified = {ix["runbook"] for ep, ix in zip(load_episodes(str(work / "replays" / "episodes")), index) if ep.strict}
    assert rb["revised_verified"] == sum(len(accepted[i]["history"]) > 1 for i in verified)
    assert rb["revised_verified"] <= rb["accepted_after_revision"]

    # SFT data: no runbook, test or solution text, loss only on assistant tokens.
    by_id = {t.task_id: t for t in tasks}
    for line in open(work / "sft_data" / "examples.jsonl"):
        ex = json.loads(line)
        text = tok.decode(ex["tokens"])
        task = by_id[ex["task_id"]]
        assert "RUNBOOK" not in text and "Milestones:" not in text and "Pitfalls:" not in text
        for r in runbooks:
            for p in r["runbook"]["pitfalls"] + r["runbook"]["recovery"]:
                assert p not in text
        for src in [*(task.tests_dir.rglob("*.py")), task.solution_path]:
            for code in src.read_text().splitlines():
                if len(code.strip()) >= 30:
                    assert code.strip() not in text, (src, code)
        mask = np.array(ex["loss_mask"])
        assert 0 < mask.sum() < len(mask)

    # The new policy is an Orbax checkpoint the next stage restores; SFT changed it.
    policy = restore_policy(str(work / "checkpoints"), model_cfg)
    fresh = Qwen(model_cfg, rngs=nnx.Rngs(cfg.seed))
    diffs = [float(np.abs(np.asarray(a) - np.asarray(b)).max()) for a, b in
             zip(jax.tree.leaves(nnx.state(policy, nnx.Param)), jax.tree.leaves(nnx.state(fresh, nnx.Param)))]
    assert max(diffs) > 0

    # Re-running skips every finished phase: outputs untouched, same report.
    stamps = {p: os.path.getmtime(work / p) for p in ("runbooks.jsonl", "sft_data/examples.jsonl",
                                                      "replays/index.jsonl", "sft.json")}
    again = run_rsr(cfg, model_cfg, str(work), tasks, tok, collect_policy=ScriptedPolicy(solve, tok),
                    show_progress=False)
    assert again == report
    assert stamps == {p: os.path.getmtime(work / p) for p in stamps}

    # Killed during SFT after its step-1 checkpoint: the re-run redoes only SFT, from step 1, and
    # ends on the same parameters.
    for p in ("sft.done", "sft.json", "report.json"):
        os.remove(work / p)
    shutil.rmtree(work / "checkpoints" / "2")
    resumed = run_rsr(cfg, model_cfg, str(work), tasks, tok, collect_policy=ScriptedPolicy(solve, tok),
                      show_progress=False)
    assert resumed["sft"]["resumed_from"] == 1 and resumed["sft"]["steps"] == 2
    assert os.path.getmtime(work / "runbooks.jsonl") == stamps["runbooks.jsonl"]
    again_policy = restore_policy(str(work / "checkpoints"), model_cfg)
    for a, b in zip(jax.tree.leaves(nnx.state(policy, nnx.Param)), jax.tree.leaves(nnx.state(again_policy, nnx.Param))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.slow
def test_rsr_stage_with_model_roles_records_planner_failures(tmp_path):
    """The policy itself as planner/critic/executor (a random tiny model: it writes no parsable
    runbook), so every success ends as a recorded planner failure and the policy passes through."""
    tasks = [load_task(p) for p in build_suite(str(tmp_path / "tasks"), "train", 1, ["files"])]
    tok = ByteTokenizer()
    model_cfg = model_preset("tiny_qwen3")
    cfg = RSRConfig(roles="model", harnesses=("common",), runbooks_per_success=2, revision_rounds=1, replays=1,
                    max_len=4096, max_new_tokens=8, role_max_new_tokens=8, mesh=MeshConfig(data=1, fsdp=1, tensor=1))
    report = run_rsr(cfg, model_cfg, str(tmp_path / "rsr"), tasks, tok, collect_policy=ScriptedPolicy(solve, tok),
                     show_progress=False)
    assert report["successes"] == 1
    assert report["runbooks"]["plan_failures"] == 2 and report["runbooks"]["written"] == 0
    rows = [json.loads(line) for line in open(tmp_path / "rsr" / "runbooks.jsonl")]
    assert all("planner reply unparsable" in r["history"][0]["reasons"][0] for r in rows)
    assert report["sft_examples"] == 0 and report["sft"]["steps"] == 0
    assert restore_policy(str(tmp_path / "rsr" / "checkpoints"), model_cfg) is not None
