"""RSR stage (recursive self-rewrite + SFT) on the built-in suite or a Terminal-Bench folder.

    # RSR-1 from the base policy (tiny: random init; deterministic planner/critic/executor)
    python -m experiments.rsr --stage=1 --model=tiny --workdir=runs/demo/rsr-1
    # RSR-2 from RPR-1's policy, with the policy itself as planner, critic and executor
    python -m experiments.rsr --stage=2 --model=tiny --workdir=runs/demo/rsr-2 \
        --init_checkpoint=runs/demo/rpr-1/checkpoints --roles=model
    # RSR-1 from a Hugging Face folder (architecture, weights, tokenizer), bf16 compute on fp32
    # master weights (the 27B preset's numerics), the result exported as an HF folder too
    python -m experiments.rsr --stage=1 --init_hf=/models/qwen3.8-27b --model=qwen3_8_27b \
        --workdir=runs/27b/rsr-1 --export_hf=runs/27b/rsr-1/hf

Every `RSRConfig` field is a flag: `--rsr.runbooks_per_success=4 --rsr.revision_rounds=3
--rsr.replays=4 --rsr.harnesses=common,verifier_feedback,hint --rsr.sft.optim.lr=2e-5`.
Re-running with the same workdir skips finished phases and resumes SFT from its checkpoint.
"""
from __future__ import annotations

from absl import app, flags, logging

from experiments import common
from trsi_jax.config import RSRConfig, rsr_stage

FLAGS = flags.FLAGS
flags.DEFINE_integer("stage", 1, "RSR stage: 1 or 2 (selects the stage preset)")
flags.DEFINE_string("init_checkpoint", None, "previous stage's checkpoint folder (policy); none = random init")
flags.DEFINE_enum("roles", None, ["model", "deterministic"],
                  "planner/critic/executor implementation (default: the preset's, deterministic)")
common.define_task_flags()
flags.DEFINE_string("tokenizer", "byte", "'byte' or an HF tokenizer folder")
common.define_runtime_flags()
common.define_hf_flags()
common.define_config_flags("rsr", RSRConfig)



def main(argv):
    del argv
    common.init_runtime()
    from trsi_jax.config import override
    from trsi_jax.rsr.stage import run_rsr

    cfg = common.config_from_flags("rsr", rsr_stage(FLAGS.stage))
    if FLAGS.roles is not None:
        cfg = override(cfg, {"roles": FLAGS.roles})
    model_cfg, tokenizer = common.model_config_from_flags(), common.tokenizer_from_flags()
    report = run_rsr(cfg, model_cfg, FLAGS.workdir, common.train_tasks(FLAGS.workdir), tokenizer,
                     init_checkpoint=common.init_checkpoint_from_flags())
    logging.info("RSR-%d done: %d SFT examples, policy in %s", cfg.stage, report["sft_examples"],
                 report["checkpoint_dir"])
    common.export_if_asked(report["checkpoint_dir"], model_cfg, tokenizer)


if __name__ == "__main__":
    app.run(main)
