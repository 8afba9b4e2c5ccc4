"""The five-stage pipeline: bootstrap -> base eval -> RSR-1 -> RPR-1 -> RSR-2 -> RPR-2 -> table.

    # `make demo`: the tiny model on CPU from the shipped base (experiments.make_base)
    python -m experiments.pipeline --preset=demo --init_hf=trsi_jax/assets/tiny_base --workdir=runs/demo
    # CI-sized smoke run; any field is a flag
    python -m experiments.pipeline --model=tiny --preset=ci --workdir=runs/ci \
        --pipeline.rpr1.updates=1 --pipeline.families=files,text
    # Terminal-RSI-27B: base = the HF folder itself (no bootstrap), result exported as HF
    python -m experiments.pipeline --preset=full --init_hf=/models/qwen3.8-27b --model=qwen3_8_27b \
        --workdir=runs/27b --export_hf=runs/27b/terminal-rsi-27b

Stages live in `<workdir>/<stage>/`, each reading the previous stage's checkpoints; re-running
skips finished stages and resumes a killed one. The held-out table is printed at the end and
written to `<workdir>/report.md` and `report.json`; `handoff.json` says which checkpoint each
stage started from.
"""
from __future__ import annotations

import jax
from absl import app, flags, logging

from experiments import common
from trsi_jax.pipeline.config import PipelineConfig, pipeline_preset

FLAGS = flags.FLAGS
flags.DEFINE_string("preset", "demo", "pipeline preset: demo (tiny, CPU), ci (smoke test) or full")
flags.DEFINE_string("tokenizer", "byte", "'byte' or an HF tokenizer folder")
common.define_runtime_flags()
common.define_hf_flags()
common.define_config_flags("pipeline", PipelineConfig)


def main(argv):
    del argv
    from trsi_jax.pipeline.run import Pipeline, quiet_library_logs

    quiet_library_logs()  # progress bars and one line per stage, not library INFO logs
    common.init_runtime()

    cfg = common.config_from_flags("pipeline", pipeline_preset(FLAGS.preset))
    model_cfg, tokenizer = common.model_config_from_flags(), common.tokenizer_from_flags()
    pipeline = Pipeline(cfg, model_cfg, FLAGS.workdir, tokenizer, init_hf=FLAGS.init_hf)
    report = pipeline.run()
    if jax.process_index() == 0:
        print("\nHeld-out evaluation per stage (" + FLAGS.workdir + "):\n" + report["table"])
        print("\nRSR stages:\n" + report["rsr_table"] + "\n\nplot: " + FLAGS.workdir + "/" + report["plot"])
    common.export_if_asked(pipeline.checkpoints("rpr-2"), model_cfg, tokenizer)
    logging.info("pipeline done: %s", FLAGS.workdir)


if __name__ == "__main__":
    app.run(main)
