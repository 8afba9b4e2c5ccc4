"""RPR stage (PPO with a warm-up critic) on the built-in suite or a Terminal-Bench folder.

    # RPR-1: policy from RSR-1, critic = policy backbone + fresh value head
    python -m experiments.rpr --stage=1 --model=tiny --workdir=runs/demo/rpr-1 \
        --init_checkpoint=runs/demo/rsr-1/checkpoints
    # RPR-2: policy from RSR-2, critic inherited from RPR-1 (resharded onto this mesh)
    python -m experiments.rpr --stage=2 --model=tiny --workdir=runs/demo/rpr-2 \
        --init_checkpoint=runs/demo/rsr-2/checkpoints --critic_checkpoint=runs/demo/rpr-1/checkpoints

Every `RPRConfig` field is a flag: `--rpr.advantage=gae --rpr.kappa=0.3 --rpr.fdr_beta=0
--rpr.critic_warmup_updates=4 --rpr.inherit_critic=false --rpr.policy_optim.lr=3e-6`.
Re-running with the same workdir resumes from the latest checkpoint.
"""
from __future__ import annotations

import os

from absl import app, flags, logging

from experiments import common
from trsi_jax.config import RPRConfig, rpr_stage
from trsi_jax.rollout import load_tokenizer
from trsi_jax.tasks import load_tasks

FLAGS = flags.FLAGS
flags.DEFINE_integer("stage", 1, "RPR stage: 1 or 2 (selects the stage preset)")
flags.DEFINE_string("init_checkpoint", None, "previous stage's checkpoint folder (policy); none = random init")
flags.DEFINE_string("critic_checkpoint", None, "RPR-1's checkpoint folder, for --stage=2 critic inheritance")
flags.DEFINE_string("tasks_dir", None, "Terminal-Bench task folders; default: the built-in suite's train split")
flags.DEFINE_integer("per_family", 4, "built-in suite: training tasks per family")
flags.DEFINE_list("families", [], "built-in suite: families to use (default: all)")
flags.DEFINE_string("tokenizer", "byte", "'byte' or an HF tokenizer folder")
common.define_runtime_flags()
common.define_config_flags("rpr", RPRConfig)


def train_tasks(workdir: str):
    """Tasks from --tasks_dir, else the built-in suite's train split written under the workdir."""
    if FLAGS.tasks_dir is None:
        from trsi_jax.pipeline.run import built_in_tasks

        return built_in_tasks(os.path.join(workdir, "tasks"), "train", FLAGS.per_family,
                              FLAGS.families or None)
    tasks, rejected = load_tasks(FLAGS.tasks_dir)
    for path, reason in rejected:
        logging.warning("skipping task %s: %s", path, reason)
    return tasks


def main(argv):
    del argv
    common.init_runtime()
    from trsi_jax.rpr.stage import run_rpr

    cfg = common.config_from_flags("rpr", rpr_stage(FLAGS.stage))
    result = run_rpr(cfg, common.model_config_from_flags(), FLAGS.workdir, train_tasks(FLAGS.workdir),
                     load_tokenizer(FLAGS.tokenizer), init_checkpoint=FLAGS.init_checkpoint,
                     critic_checkpoint=FLAGS.critic_checkpoint)
    logging.info("RPR-%d done: %d updates, checkpoints in %s", cfg.stage, result.updates, result.checkpoint_dir)


if __name__ == "__main__":
    app.run(main)
