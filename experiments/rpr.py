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

from absl import app, flags, logging

from experiments import common
from trsi_jax.config import RPRConfig, rpr_stage

FLAGS = flags.FLAGS
flags.DEFINE_integer("stage", 1, "RPR stage: 1 or 2 (selects the stage preset)")
flags.DEFINE_string("init_checkpoint", None, "previous stage's checkpoint folder (policy); none = random init")
flags.DEFINE_string("critic_checkpoint", None, "RPR-1's checkpoint folder, for --stage=2 critic inheritance")
common.define_task_flags()
flags.DEFINE_string("tokenizer", "byte", "'byte' or an HF tokenizer folder")
common.define_runtime_flags()
common.define_hf_flags()
common.define_config_flags("rpr", RPRConfig)



def main(argv):
    del argv
    common.init_runtime()
    from trsi_jax.rpr.stage import run_rpr

    cfg = common.config_from_flags("rpr", rpr_stage(FLAGS.stage))
    model_cfg, tokenizer = common.model_config_from_flags(), common.tokenizer_from_flags()
    result = run_rpr(cfg, model_cfg, FLAGS.workdir, common.train_tasks(FLAGS.workdir), tokenizer,
                     init_checkpoint=common.init_checkpoint_from_flags(), critic_checkpoint=FLAGS.critic_checkpoint)
    logging.info("RPR-%d done: %d updates, checkpoints in %s", cfg.stage, result.updates, result.checkpoint_dir)
    common.export_if_asked(result.checkpoint_dir, model_cfg, tokenizer)


if __name__ == "__main__":
    app.run(main)
