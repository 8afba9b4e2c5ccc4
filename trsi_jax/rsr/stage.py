"""One RSR stage with phase resume: collect -> plan + criticise -> execute -> SFT data -> SFT.

Every phase writes its output into the stage workdir and a `.done` marker last; a re-run skips
a phase whose marker is there, so a killed run resumes at the phase (and, inside SFT, at the
checkpoint) where it stopped:

    collect/<harness>/ + collect/.done     episodes per harness (HF datasets)
    runbooks.jsonl + runbooks.done         every runbook with its critic history
    replays/ + replays/.done               M replays per accepted runbook (fresh sandboxes)
    sft_data/ + sft_data/.done             verified, leak-checked replays as token sequences
    checkpoints/ + sft.done                Orbax checkpoints of the new policy ("params")
    report.json                            the stage report (also printed as a table)
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Sequence

import jax
from absl import logging
from flax import nnx

from trsi_jax import sharding as sharding_lib
from trsi_jax.config import ModelConfig, RSRConfig
from trsi_jax.rollout import Budgets, ModelPolicy, SampleConfig, load_episodes, save_episodes
from trsi_jax.rollout.episodes import is_infra_failure
from trsi_jax.rsr import collect as collect_lib
from trsi_jax.rsr import sft_data
from trsi_jax.rsr.critic import LeakScanCritic, ModelCritic, review_with_revision
from trsi_jax.rsr.executor import deterministic_executor, replay
from trsi_jax.rsr.planner import DeterministicPlanner, ModelPlanner
from trsi_jax.rsr.report import build_report, format_table, write_report
from trsi_jax.rsr.runbook import from_json, to_json
from trsi_jax.train.checkpoint import Checkpointer, restore_policy, save_model
from trsi_jax.train.sft import SFTTrainer, split_eval


def _done(path: str) -> bool:
    return os.path.exists(path)


def _mark(path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, "w").close()


def _write_jsonl(path: str, rows: Sequence[dict]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    os.replace(tmp, path)


def _read_jsonl(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def stage_mesh(mesh_cfg) -> jax.sharding.Mesh:
    """The configured mesh; without a -1 axis it takes the first data*fsdp*tensor devices."""
    sizes = (mesh_cfg.data, mesh_cfg.fsdp, mesh_cfg.tensor)
    devices = None if -1 in sizes else jax.devices()[:math.prod(sizes)]
    return sharding_lib.make_mesh(mesh_cfg, devices=devices)


def load_policy_model(model_cfg: ModelConfig, mesh, init_checkpoint: str | None, seed: int):
    """The stage's starting policy: the previous stage's checkpoint, or a fresh init (tiny runs)."""
    if init_checkpoint:
        return restore_policy(init_checkpoint, model_cfg, mesh=mesh)
    from trsi_jax.models import Qwen

    model = Qwen(model_cfg, rngs=nnx.Rngs(seed))
    params = nnx.state(model, nnx.Param)
    nnx.update(model, sharding_lib.shard_params(params, mesh))
    return model


def run_rsr(cfg: RSRConfig, model_cfg: ModelConfig, workdir: str, tasks: Sequence, tokenizer,
            init_checkpoint: str | None = None, mesh=None, collect_policy=None, show_progress: bool = True,
            print_table: bool = True) -> dict:
    """Runs (or resumes) the stage; returns the report dict (also written to report.json and,
    with `print_table`, printed as a table).

    collect_policy: what collects successes instead of the policy being trained (a scripted
      solver in tests and demos); the planner, critic, executor and SFT are unchanged.
    """
    if not tasks:
        raise ValueError("run_rsr got no tasks")
    os.makedirs(workdir, exist_ok=True)
    mesh = mesh if mesh is not None else stage_mesh(cfg.mesh)
    by_id = {t.task_id: t for t in tasks}
    model = load_policy_model(model_cfg, mesh, init_checkpoint, cfg.seed)
    budgets = Budgets(max_turns=cfg.max_turns, max_tokens=cfg.max_len)

    def model_policy(temperature: float, max_new_tokens: int, seed_offset: int) -> ModelPolicy:
        return ModelPolicy(model, tokenizer, SampleConfig(temperature=temperature, max_new_tokens=max_new_tokens),
                           max_len=cfg.max_len, seed=cfg.seed * 1000 + seed_offset, mesh=mesh)

    # -- 1. collect under every harness -----------------------------------------------------
    collect_dir = os.path.join(workdir, "collect")
    by_harness = collect_lib.collect(
        collect_policy or model_policy(cfg.collect_temperature, cfg.max_new_tokens, 1), tasks, cfg.harnesses, cfg.samples_per_task,
        cfg.backend, budgets, collect_dir, show_progress, cfg.concurrency)
    _mark(os.path.join(collect_dir, ".done"))
    wins = collect_lib.successes(by_harness)
    coverage = collect_lib.coverage(by_harness, len(tasks))
    logging.info("RSR-%d collect: %d successes, coverage %s", cfg.stage, len(wins), coverage)

    # -- 2+3. plan K runbooks per success, criticise with up to R revisions -----------------
    if cfg.roles == "model":
        planner = ModelPlanner(model_policy(cfg.planner_temperature, cfg.role_max_new_tokens, 2))
        critic = ModelCritic(model_policy(0.0, cfg.role_max_new_tokens, 4), cfg.leak_ngram)
    else:
        planner, critic = DeterministicPlanner(), LeakScanCritic(cfg.leak_ngram)
    runbooks_path = os.path.join(workdir, "runbooks.jsonl")
    if not _done(runbooks_path.replace(".jsonl", ".done")):
        plans = planner.plan([(by_id[ep.task_id], ep) for ep in wins], cfg.runbooks_per_success)
        items, meta, rows = [], [], []
        for s, (ep, results) in enumerate(zip(wins, plans)):
            for k, res in enumerate(results):
                if res.runbook is None:
                    rows.append({"task_id": ep.task_id, "source_harness": ep.harness, "success": s, "k": k,
                                 "accepted": False, "runbook": None,
                                 "history": [{"round": 0, "accept": False, "source": "planner",
                                              "reasons": [res.error]}]})
                else:
                    items.append((by_id[ep.task_id], ep, res.runbook))
                    meta.append({"source_harness": ep.harness, "success": s, "k": k})
        reviewed = review_with_revision(critic, planner, items, cfg.revision_rounds)
        for m, rec in zip(meta, reviewed):
            rows.append({"task_id": rec["task_id"], **m, "accepted": rec["accepted"],
                         "runbook": to_json(rec["runbook"]), "history": rec["history"]})
        _write_jsonl(runbooks_path, rows)
        _mark(runbooks_path.replace(".jsonl", ".done"))
    records = _read_jsonl(runbooks_path)
    accepted = [r for r in records if r["accepted"]]

    # -- 4. execute: M replays of each accepted runbook in fresh sandboxes ------------------
    replay_dir = os.path.join(workdir, "replays")
    if not _done(os.path.join(replay_dir, ".done")):
        os.makedirs(replay_dir, exist_ok=True)
        executor = (model_policy(cfg.replay_temperature, cfg.max_new_tokens, 3)
                    if (cfg.executor or cfg.roles) == "model"
                    else deterministic_executor(tokenizer, one_reply=cfg.executor == "deterministic_one_reply"))
        episodes, index = [], []
        if accepted:
            groups = replay(executor, [by_id[r["task_id"]] for r in accepted],
                            [from_json(r["runbook"]) for r in accepted], cfg.replays, cfg.backend, budgets,
                            show_progress, cfg.concurrency)
            for i, group in enumerate(groups):
                episodes.extend(group)
                index.extend({"runbook": i, "task_id": accepted[i]["task_id"],
                              "source_harness": accepted[i]["source_harness"]} for _ in group)
            save_episodes(episodes, os.path.join(replay_dir, "episodes"))
        _write_jsonl(os.path.join(replay_dir, "index.jsonl"), index)
        _mark(os.path.join(replay_dir, ".done"))
    index = _read_jsonl(os.path.join(replay_dir, "index.jsonl"))
    replayed = load_episodes(os.path.join(replay_dir, "episodes")) if index else []

    # -- 5. SFT data: verified replays without runbook/critic context, leak-checked ---------
    data_dir = os.path.join(workdir, "sft_data")
    if not _done(os.path.join(data_dir, ".done")):
        scan = LeakScanCritic(cfg.leak_ngram)
        recs = [{"episode": ep, "runbook": from_json(accepted[ix["runbook"]]["runbook"]),
                 "source_harness": ix["source_harness"]} for ep, ix in zip(replayed, index)]
        scanners = {ep.task_id: scan.scanner(by_id[ep.task_id]) for ep in replayed}
        examples, dropped = sft_data.build_examples(recs, scanners, tokenizer)
        sft_data.save_examples(examples, data_dir)
        _write_jsonl(os.path.join(data_dir, "dropped.jsonl"), dropped)
        _mark(os.path.join(data_dir, ".done"))
    examples = sft_data.load_examples(data_dir)
    dropped = _read_jsonl(os.path.join(data_dir, "dropped.jsonl"))

    # -- 6. SFT on the rewritten trajectories -> the new policy ----------------------------
    ckpt_dir = os.path.join(workdir, "checkpoints")
    sft_summary = None
    if not _done(os.path.join(workdir, "sft.done")):
        meta = {"model_cfg": dataclasses.asdict(model_cfg), "stage": f"rsr{cfg.stage}"}
        if examples:
            train, held = split_eval(sft_data.to_sft_examples(examples), cfg.sft.eval_fraction, cfg.sft.seed)
            trainer = SFTTrainer(model, cfg.sft, workdir, mesh=mesh, pad_id=tokenizer.pad_id, metadata=meta)
            result = trainer.train(train, held, progress=show_progress)
            sft_summary = {"steps": result.step, "train_loss": result.train_loss, "eval_loss": result.eval_loss,
                           "examples": result.examples, "truncated": result.truncated,
                           "no_loss": result.no_loss, "resumed_from": result.resumed_from}
        else:  # nothing to learn from: the policy passes through unchanged
            logging.warning("RSR-%d: no SFT examples; saving the starting policy unchanged", cfg.stage)
            if Checkpointer(ckpt_dir).latest_step() is None:  # a killed re-run may have saved it already
                save_model(ckpt_dir, model, step=0, cfg=model_cfg, metadata={**meta, "note": "no SFT examples"})
            sft_summary = {"steps": 0, "note": "no SFT examples; policy unchanged"}
        with open(os.path.join(workdir, "sft.json"), "w") as f:
            json.dump(sft_summary, f)
        _mark(os.path.join(workdir, "sft.done"))
    with open(os.path.join(workdir, "sft.json")) as f:
        sft_summary = json.load(f)

    # -- 7. report ---------------------------------------------------------------------------
    plan_failures = sum(1 for r in records if r["runbook"] is None)
    verified_ids = {ix["runbook"] for ep, ix in zip(replayed, index) if ep.strict and not is_infra_failure(ep)}
    report = build_report(
        cfg.stage, coverage, len(wins), [r for r in records if r["runbook"] is not None], plan_failures,
        replays=len(replayed), verified=sum(ep.strict for ep in replayed), examples=len(examples),
        dropped=dropped, sft=sft_summary, replay_infra_failures=sum(map(is_infra_failure, replayed)),
        revised_verified=sum(len(accepted[i]["history"]) > 1 for i in verified_ids))
    report["checkpoint_dir"] = ckpt_dir
    write_report(report, os.path.join(workdir, "report.json"))
    if print_table and jax.process_index() == 0:
        print(format_table(report))
    return report
