"""The five-stage Terminal-RSI pipeline: bootstrap -> base -> RSR-1 -> RPR-1 -> RSR-2 -> RPR-2.

Each stage runs in its own folder under the pipeline workdir and reads the previous stage's
checkpoint folder; RPR-2 also inherits RPR-1's critic. A stage whose `stage.done.json` exists is
skipped on re-run (a killed stage resumes from its own checkpoints), and so is an evaluation whose
`eval.json` exists, provided each was run with the same config (`reuse`: a changed flag stops the
re-run with the changed fields and what to delete). After every stage its policy is evaluated on the
held-out split and one line per stage is printed; at the end the per-stage table (pass@k, strict
success, process reward, per family), the RSR table (coverage per harness and union, runbooks
written / rejected / revised / accepted) and `report.png` (held-out strict success and process
reward per stage) go to `report.json`, `report.md` and stdout. `handoff.json` records which
checkpoint each stage started from.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import os
import shutil
import time
from typing import Any, Callable

import jax
from absl import logging
from flax import nnx

from trsi_jax.config import ModelConfig, RPRConfig, RSRConfig
from trsi_jax.models import Qwen
from trsi_jax.pipeline.bootstrap import bootstrap
from trsi_jax.pipeline.config import PipelineConfig
from trsi_jax.pipeline import report as report_lib
from trsi_jax.pipeline.reuse import check_reuse, fingerprint
from trsi_jax.pipeline.evaluate import evaluate_policy
from trsi_jax.rpr.handoff import checkpoint_source, load_policy, read_handoff, write_handoff, write_json
from trsi_jax.rpr.stage import CHECKPOINTS, run_rpr
from trsi_jax.sharding import make_mesh

STAGES = ("base", "rsr-1", "rpr-1", "rsr-2", "rpr-2")
RSR_STAGES = ("rsr-1", "rsr-2")
PLOT = "report.png"


def quiet_library_logs() -> None:
    """Warnings and errors only from absl (Orbax logs through it), JAX and friends: an entry point
    that shows progress bars and one line per stage calls this after parsing its flags."""
    import logging as py_logging

    logging.set_verbosity(logging.WARNING)
    for name in ("jax", "orbax", "absl", "flax", "tensorstore"):
        py_logging.getLogger(name).setLevel(py_logging.WARNING)
    import datasets  # episode files are HF datasets; their save bars are not a phase of the pipeline

    datasets.disable_progress_bars()


DONE = "stage.done.json"
EVAL = "eval.json"


def _json_read(path: str) -> Any | None:
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def built_in_tasks(folder: str, split: str, per_family: int, families=None) -> list:
    """The built-in suite's `split` as Tasks, written to `folder` once (atomically: built in a
    temporary folder, then renamed) and loaded from there on later calls."""
    from sandboxes.suite import build_suite
    from trsi_jax.tasks import load_tasks

    if not os.path.isdir(folder) and jax.process_index() == 0:
        tmp = f"{folder}.tmp{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        build_suite(tmp, split=split, per_family=per_family, families=families)
        os.replace(tmp, folder)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices(f"tasks:{folder}")
    tasks, rejected = load_tasks(folder)
    if rejected:
        raise ValueError(f"built-in tasks rejected by the loader: {rejected}")
    _check_task_counts(folder, tasks, per_family, families)
    return sorted(tasks, key=lambda t: t.task_id)


def _check_task_counts(folder: str, tasks: list, per_family: int, families) -> None:
    """A folder written earlier with other task flags must not be used silently."""
    from sandboxes.suite import FAMILIES

    want = {f: per_family for f in (families or FAMILIES)}
    have = dict(collections.Counter(t.family for t in tasks))
    if have != want:
        raise ValueError(f"{folder} holds {have} tasks per family, but {want} were asked: it was written by a "
                         f"run with other task flags. Use a new --workdir, or delete {folder} and the stages "
                         f"trained on it")


class Pipeline:
    """Runs the stages in order; every method is safe to call again after a kill."""

    def __init__(self, cfg: PipelineConfig, model_cfg: ModelConfig, workdir: str, tokenizer,
                 show_progress: bool = True, init_hf: str | None = None):
        """`init_hf`: a Hugging Face model folder that *is* the base policy (no bootstrap)."""
        self.cfg, self.model_cfg, self.tokenizer = cfg, model_cfg, tokenizer
        self.init_hf = os.path.abspath(init_hf) if init_hf else None
        self.workdir = os.path.abspath(workdir)
        self.show_progress = show_progress
        self.mesh = make_mesh(cfg.mesh)
        self.train_tasks, self.heldout_tasks = self._tasks()

    def _tasks(self):
        families = tuple(self.cfg.families) or None
        root = os.path.join(self.workdir, "tasks")
        return (built_in_tasks(os.path.join(root, "train"), "train", self.cfg.train_per_family, families),
                built_in_tasks(os.path.join(root, "heldout"), "heldout", self.cfg.heldout_per_family, families))

    def stage_dir(self, stage: str) -> str:
        return os.path.join(self.workdir, stage)

    def checkpoints(self, stage: str) -> str:
        if stage == "base" and self.init_hf:
            return self.init_hf
        return os.path.join(self.stage_dir(stage), CHECKPOINTS)

    # -- stages ------------------------------------------------------------------------------

    def _from(self, stage: str, name: str = "") -> list[str]:
        """`stage`'s folder (or its file `name`) and those of every later stage."""
        return [os.path.join(self.stage_dir(s), name) if name else self.stage_dir(s)
                for s in STAGES[STAGES.index(stage):]]

    def stage_config(self, stage: str) -> dict:
        """What decides `stage`'s result: its config, the shared task and model settings, and
        (nested) the upstream stage's record."""
        cfg = self.cfg
        shared = dict(model=self.model_cfg, families=cfg.families, train_per_family=cfg.train_per_family,
                      backend=cfg.backend)
        if stage == "base":
            if self.init_hf:
                return fingerprint(model=self.model_cfg, init_hf=self.init_hf)
            return fingerprint(**shared, seed=cfg.seed, bootstrap=cfg.bootstrap, repeats=cfg.bootstrap_repeats)
        own = {"rsr-1": cfg.rsr1, "rpr-1": cfg.rpr1, "rsr-2": cfg.rsr2, "rpr-2": cfg.rpr2}[stage]
        previous = STAGES[STAGES.index(stage) - 1]
        return fingerprint(**shared, stage=own, previous=self.stage_config(previous))

    def eval_config(self, stage: str) -> dict:
        cfg = self.cfg
        return fingerprint(stage=self.stage_config(stage), families=cfg.families,
                           heldout_per_family=cfg.heldout_per_family, samples=cfg.eval_samples,
                           temperature=cfg.eval_temperature, max_turns=cfg.eval_max_turns,
                           max_new_tokens=cfg.eval_max_new_tokens, max_len=cfg.max_len, seed=cfg.seed)

    def _once(self, stage: str, fn: Callable[[], dict]) -> dict:
        path = os.path.join(self.stage_dir(stage), DONE)
        done = _json_read(path)
        config = self.stage_config(stage)
        if done is not None:
            check_reuse(f"stage {stage} ({self.stage_dir(stage)})", done.get("config"), config, self._from(stage))
            logging.info("pipeline: %s already done, skipping", stage)
            return done
        os.makedirs(self.stage_dir(stage), exist_ok=True)
        start = time.perf_counter()
        logging.info("pipeline: %s starting", stage)
        summary = dict(fn(), seconds=time.perf_counter() - start, config=config)
        write_json(path, summary)
        return summary

    def _base(self) -> dict:
        if self.init_hf:
            write_handoff(self.workdir, "base", {"policy_from": {"dir": self.init_hf, "hf": True}})
            return {"hf": self.init_hf}
        model = nnx.jit(lambda: Qwen(self.model_cfg, rngs=nnx.Rngs(self.cfg.seed)))()
        summary = bootstrap(model, self.train_tasks, self.tokenizer, self.cfg.bootstrap, self.stage_dir("base"),
                            mesh=self.mesh, backend=self.cfg.backend, repeats=self.cfg.bootstrap_repeats,
                            show_progress=self.show_progress)
        write_handoff(self.workdir, "base", {"policy_from": {"random_init_seed": self.cfg.seed},
                                             "bootstrap": summary})
        return summary

    def _rsr(self, stage: str, cfg: RSRConfig, previous: str) -> dict:
        from trsi_jax.rsr.stage import run_rsr

        init = self.checkpoints(previous)
        write_handoff(self.workdir, stage, {"policy_from": checkpoint_source(init, ("params",))})
        report = run_rsr(cfg, self.model_cfg, self.stage_dir(stage), self.train_tasks, self.tokenizer,
                         init_checkpoint=init, mesh=self.mesh, show_progress=self.show_progress, print_table=False)
        return dict(report) if isinstance(report, dict) else dataclasses.asdict(report)

    def _rpr(self, stage: str, cfg: RPRConfig, previous: str, critic_from: str | None) -> dict:
        init = self.checkpoints(previous)
        critic = self.checkpoints(critic_from) if critic_from else None
        result = run_rpr(cfg, self.model_cfg, self.stage_dir(stage), self.train_tasks, self.tokenizer,
                         init_checkpoint=init, critic_checkpoint=critic, mesh=self.mesh,
                         progress=self.show_progress)
        write_handoff(self.workdir, stage, read_handoff(self.stage_dir(stage))[stage])
        return {"updates": result.updates, "last_metrics": result.last_metrics}

    def evaluate(self, stage: str) -> dict:
        path = os.path.join(self.stage_dir(stage), EVAL)
        done = _json_read(path)
        config = self.eval_config(stage)
        if done is not None:
            check_reuse(f"the held-out evaluation {path}", done.get("config"), config, self._from(stage, EVAL))
            return done
        cfg = self.cfg
        policy, source = load_policy(self.checkpoints(stage), self.model_cfg, self.mesh)
        result = evaluate_policy(policy, self.heldout_tasks, self.tokenizer, samples=cfg.eval_samples,
                                 temperature=cfg.eval_temperature, max_turns=cfg.eval_max_turns,
                                 max_new_tokens=cfg.eval_max_new_tokens, max_len=cfg.max_len,
                                 backend=cfg.backend, seed=cfg.seed, show_progress=self.show_progress,
                                 desc=f"eval[{stage}]", concurrency=cfg.concurrency)
        result["checkpoint"], result["config"] = source, config
        write_json(path, result)
        return result

    def run(self) -> dict[str, Any]:
        cfg = self.cfg
        steps = {
            "base": self._base,
            "rsr-1": lambda: self._rsr("rsr-1", cfg.rsr1, "base"),
            "rpr-1": lambda: self._rpr("rpr-1", cfg.rpr1, "rsr-1", None),
            "rsr-2": lambda: self._rsr("rsr-2", cfg.rsr2, "rpr-1"),
            "rpr-2": lambda: self._rpr("rpr-2", cfg.rpr2, "rsr-2", "rpr-1" if cfg.rpr2.inherit_critic else None),
        }
        stages, evals = {}, {}
        main = jax.process_index() == 0
        for stage in STAGES:
            reused = os.path.exists(os.path.join(self.stage_dir(stage), DONE))
            stages[stage] = self._once(stage, steps[stage])
            evals[stage] = self.evaluate(stage)
            logging.info("pipeline: %s held-out %s", stage, json.dumps(evals[stage]["all"]))
            if main:
                print(report_lib.stage_line(stage, stages[stage], evals[stage], reused=reused), flush=True)
            # Free the stage's compiled programs (the next stage reads its own from the persistent cache):
            # XLA:CPU maps ~140 memory regions per executable and jax's caches keep every one, so a
            # 3-seed bench_pipeline process passed vm.max_map_count (65,530) and LLVM's JIT segfaulted.
            jax.clear_caches()
        table = report_lib.eval_table([evals])
        rsr_table = report_lib.rsr_table([{s: stages[s] for s in RSR_STAGES}])
        report = {"stages": stages, "eval": evals, "table": table, "rsr_table": rsr_table, "plot": PLOT,
                  "handoff": read_handoff(self.workdir)}
        write_json(os.path.join(self.workdir, "report.json"), report)
        if main:
            report_lib.plot([evals], os.path.join(self.workdir, PLOT), f"Terminal-RSI per stage ({os.path.basename(self.workdir)})")
            with open(os.path.join(self.workdir, "report.md"), "w") as f:
                f.write(f"Held-out evaluation per stage\n\n```\n{table}\n```\n\nRSR stages\n\n```\n{rsr_table}\n```\n"
                        f"\n![held-out strict success and process reward per stage]({PLOT})\n")
        return report
