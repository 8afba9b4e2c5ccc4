"""Evaluate a policy: pass@k, strict success and process reward, overall and per family.

    # the built-in held-out split, a random tiny policy (smoke test)
    python -m experiments.evaluate --model=tiny --init=random --workdir=runs/eval-random
    # a stage checkpoint, 4 samples per task, pass@1 and pass@3
    python -m experiments.evaluate --model=tiny --ckpt_dir=runs/demo/rpr-2/checkpoints --samples=4 --k=1,3
    # an HF folder (weights + tokenizer) on Terminal-Bench task folders in docker sandboxes; the
    # model is placed on --mesh.* (default: FSDP over every device), numerics from --model
    python -m experiments.evaluate --hf_path=/models/qwen --tasks_dir=/data/terminal-bench/tasks --backend=docker

Writes `eval.json` (metrics, flags, outcome counts), `eval.txt` (the table, also printed) and the
episodes (`episodes/`, an HF dataset) into --workdir.
"""
from __future__ import annotations

import json
import os
from collections import Counter

from absl import app, flags, logging

from experiments import common
from trsi_jax.config import MeshConfig

FLAGS = flags.FLAGS
flags.DEFINE_string("tasks_dir", None, "Terminal-Bench task folders; default: the built-in suite's held-out split")
flags.DEFINE_integer("per_family", 4, "built-in suite: held-out tasks per family")
flags.DEFINE_list("families", [], "built-in suite: families to evaluate (default: all)")
flags.DEFINE_string("ckpt_dir", None, "policy checkpoint folder (Orbax, from a training stage)")
flags.DEFINE_string("hf_path", None, "HF model folder (safetensors + config.json, and its tokenizer)")
flags.DEFINE_enum("init", None, ["random"], "no weights: a randomly initialised --model (smoke tests)")
flags.DEFINE_string("tokenizer", None, "'byte' or an HF tokenizer folder (default: --hf_path if given, else byte)")
flags.DEFINE_integer("samples", 1, "episodes per task (n of pass@k)")
flags.DEFINE_list("k", ["1"], "pass@k values to report (each needs k <= --samples)")
flags.DEFINE_string("harness", "common", "harness name (see trsi_jax.agent.HARNESSES)")
flags.DEFINE_enum("backend", "local", ["local", "docker"], "sandbox backend")
flags.DEFINE_float("temperature", 0.7, "sampling temperature (0 = greedy)")
flags.DEFINE_float("top_p", 1.0, "nucleus sampling mass")
flags.DEFINE_integer("top_k", 0, "top-k sampling (0 = off)")
flags.DEFINE_integer("max_new_tokens", 512, "tokens per reply")
flags.DEFINE_integer("max_turns", 20, "turns per episode")
flags.DEFINE_integer("max_len", 8192, "tokens per episode (prompt + all turns)")
flags.DEFINE_float("wall_sec", 900.0, "wall-clock budget per episode")
flags.DEFINE_integer("concurrency", 8, "episodes run at once (one batched generate per round)")
flags.DEFINE_integer("seed", 0, "sampling seed")
common.define_runtime_flags()
common.define_config_flags("mesh", MeshConfig)


def load_model(mesh):
    """The policy on `mesh` from exactly one of --ckpt_dir, --hf_path, --init=random. An HF
    folder (or a checkpoint, without --model) gives the architecture; numerics come from --model
    when given and --model_cfg.*; each tensor slice is read straight onto its device."""
    given = [name for name in ("ckpt_dir", "hf_path", "init") if FLAGS[name].value]
    if len(given) != 1:
        raise app.UsageError(f"give exactly one of --ckpt_dir, --hf_path, --init=random (got {given or 'none'})")
    cfg = common.model_config_from_flags(FLAGS.hf_path or (None if FLAGS["model"].present else FLAGS.ckpt_dir))
    if FLAGS.hf_path or FLAGS.ckpt_dir:
        from trsi_jax.train.checkpoint import restore_policy

        return restore_policy(FLAGS.hf_path or FLAGS.ckpt_dir, cfg, mesh=mesh)
    from flax import nnx

    from trsi_jax.models import Qwen
    from trsi_jax.sharding import shard_params

    model = Qwen(cfg, rngs=nnx.Rngs(FLAGS.seed))
    nnx.update(model, shard_params(nnx.state(model, nnx.Param), mesh))
    return model


def load_eval_tasks():
    from trsi_jax.tasks import load_tasks

    if FLAGS.tasks_dir:
        tasks, rejected = load_tasks(FLAGS.tasks_dir)
        for path, reason in rejected:
            logging.warning("skipping task %s: %s", path, reason)
    else:  # written once into the workdir; a re-run reuses it (and stops if other task flags wrote it)
        from trsi_jax.pipeline.run import built_in_tasks

        tasks = built_in_tasks(os.path.join(FLAGS.workdir, "tasks"), "heldout", FLAGS.per_family,
                               FLAGS.families or None)
    if not tasks:
        raise app.UsageError(f"no loadable tasks in {FLAGS.tasks_dir or 'the built-in held-out split'}")
    return tasks


def format_table(summary: dict, ks: list[int]) -> str:
    cols = [f"pass@{k}" for k in ks] + ["strict_success", "process_reward", "tasks", "episodes"]
    rows = [("all", summary["all"])] + list(summary["families"].items())
    header = ["family"] + cols
    cells = [[name] + [f"{m[c]:.3f}" if isinstance(m.get(c), float) else str(m.get(c, "-")) for c in cols]
             for name, m in rows]
    widths = [max(len(r[i]) for r in [header] + cells) for i in range(len(header))]
    fmt = lambda r: "  ".join(x.ljust(w) for x, w in zip(r, widths))  # noqa: E731
    return "\n".join([fmt(header), fmt(["-" * w for w in widths])] + [fmt(r) for r in cells])


def main(argv):
    del argv
    common.init_runtime()
    from trsi_jax.agent import make_harness
    from trsi_jax.rollout import (Budgets, ModelPolicy, SampleConfig, load_tokenizer, run_episodes,
                                  save_episodes, summarize)

    ks = sorted({int(k) for k in FLAGS.k})
    if max(ks) > FLAGS.samples:
        raise app.UsageError(f"pass@{max(ks)} needs --samples >= {max(ks)}, got {FLAGS.samples}")
    from trsi_jax.config import ChatConfig

    tokenizer = load_tokenizer(FLAGS.tokenizer or FLAGS.hf_path or "byte",
                               thinking=common.config_from_flags("chat", ChatConfig()).thinking)
    from trsi_jax.sharding import make_mesh

    mesh = make_mesh(common.config_from_flags("mesh", MeshConfig()))
    model = load_model(mesh)
    if tokenizer.vocab_size > model.cfg.vocab_size:
        raise app.UsageError(f"tokenizer vocab {tokenizer.vocab_size} exceeds the model's {model.cfg.vocab_size}")
    tasks = load_eval_tasks()
    policy = ModelPolicy(model, tokenizer, SampleConfig(temperature=FLAGS.temperature, top_p=FLAGS.top_p,
                                                        top_k=FLAGS.top_k, max_new_tokens=FLAGS.max_new_tokens),
                         max_len=FLAGS.max_len, seed=FLAGS.seed, mesh=mesh)
    episodes = run_episodes(policy, [t for t in tasks for _ in range(FLAGS.samples)], make_harness(FLAGS.harness),
                            backend=FLAGS.backend, concurrency=FLAGS.concurrency,
                            budgets=Budgets(FLAGS.max_turns, FLAGS.max_len, FLAGS.wall_sec))

    summary = summarize(episodes, ks)
    summary["outcomes"] = dict(Counter(e.outcome for e in episodes))
    summary["flags"] = {name: FLAGS[name].value for name in ("tasks_dir", "ckpt_dir", "hf_path", "init", "samples",
                                                              "harness", "temperature", "max_turns", "max_len")}
    table = format_table(summary, ks)
    os.makedirs(FLAGS.workdir, exist_ok=True)
    with open(os.path.join(FLAGS.workdir, "eval.json"), "w") as f:
        json.dump(summary, f, indent=2)
    with open(os.path.join(FLAGS.workdir, "eval.txt"), "w") as f:
        f.write(table + "\n")
    save_episodes(episodes, os.path.join(FLAGS.workdir, "episodes"))
    print(table)
    print("outcomes:", summary["outcomes"])


if __name__ == "__main__":
    app.run(main)
