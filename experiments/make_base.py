"""Produces the shipped tiny base policy (`trsi_jax/assets/tiny_base/`) from a seed.

    python -m experiments.make_base --seed=0 --out=trsi_jax/assets/tiny_base

Bootstrap = the `--preset`'s bootstrap SFT (steps, batch, learning rate; data order `--seed`;
`--bootstrap.*` overrides any of it) of a randomly initialised `tiny` model (init seed `--seed`)
on verified oracle demonstrations of TRAIN tasks of the preset's families only (suite seeds 0..train_per_family-1, more than the stages use;
held-out seeds are only built for the optional evaluation), tokenized with the shipped BPE. The result is a Hugging Face folder (config.json,
model.safetensors, tokenizer.json without a chat template, so the built-in Qwen rendering is
used) that `experiments.pipeline --init_hf=...` starts from, so `make demo` skips the bootstrap.
With --eval_per_family > 0 it also prints held-out strict success of the result.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil

from absl import app, flags

from experiments import common
from trsi_jax.config import SFTConfig

FLAGS = flags.FLAGS
SHIPPED_TOKENIZER = os.path.join("trsi_jax", "assets", "tiny_tokenizer")
flags.DEFINE_string("out", os.path.join("trsi_jax", "assets", "tiny_base"), "output HF folder")
flags.DEFINE_string("tokenizer", SHIPPED_TOKENIZER, "HF tokenizer folder (copied into --out)")
flags.DEFINE_integer("seed", 0, "model init and data order seed")
flags.DEFINE_string("preset", "demo", "pipeline preset whose families and bootstrap SFT config are used")
flags.DEFINE_integer("train_per_family", 100, "train tasks per family to bootstrap on (train seeds 0..N-1)")
flags.DEFINE_integer("eval_per_family", 0, "held-out tasks per family to evaluate the result on (0: none)")
common.define_runtime_flags()
common.define_config_flags("bootstrap", SFTConfig)


def main(argv):
    del argv
    common.init_runtime()
    import jax
    from flax import nnx

    from trsi_jax.models import Qwen
    from trsi_jax.models.hf_io import save_hf
    from trsi_jax.pipeline.bootstrap import bootstrap
    from trsi_jax.pipeline.config import pipeline_preset
    from trsi_jax.pipeline.run import built_in_tasks
    from trsi_jax.rollout import load_tokenizer

    preset = pipeline_preset(FLAGS.preset)
    tokenizer = load_tokenizer(FLAGS.tokenizer)
    cfg = common.model_config_from_flags()  # --model plus any --model_cfg.* override
    if tokenizer.vocab_size > cfg.vocab_size:
        raise ValueError(f"tokenizer vocab {tokenizer.vocab_size} exceeds the model's {cfg.vocab_size}")
    work, families = FLAGS.workdir, list(preset.families) or None
    tasks = built_in_tasks(os.path.join(work, "tasks", "train"), "train", FLAGS.train_per_family, families)
    sft = common.config_from_flags("bootstrap", dataclasses.replace(preset.bootstrap, seed=FLAGS.seed))
    model = nnx.jit(lambda: Qwen(cfg, rngs=nnx.Rngs(FLAGS.seed)))()
    summary = bootstrap(model, tasks, tokenizer, sft, os.path.join(work, "base"), backend=preset.backend)
    print(json.dumps({"bootstrap": summary}))
    if jax.process_index() == 0:
        shutil.rmtree(FLAGS.out, ignore_errors=True)
        save_hf(model, FLAGS.out)
        shutil.copy(os.path.join(FLAGS.tokenizer, "tokenizer.json"), os.path.join(FLAGS.out, "tokenizer.json"))
        with open(os.path.join(FLAGS.out, "make_base.json"), "w") as f:
            json.dump({"seed": FLAGS.seed, "preset": FLAGS.preset, "model": dataclasses.asdict(cfg),
                       "families": families,
                       "train_per_family": FLAGS.train_per_family, "sft": dataclasses.asdict(sft),
                       "bootstrap": summary}, f, indent=1)
    if FLAGS.eval_per_family:
        from trsi_jax.pipeline.evaluate import evaluate_policy

        heldout = built_in_tasks(os.path.join(work, "tasks", "heldout"), "heldout", FLAGS.eval_per_family, families)
        result = evaluate_policy(model, heldout, tokenizer, samples=preset.eval_samples,
                                 temperature=preset.eval_temperature, max_turns=preset.eval_max_turns,
                                 max_new_tokens=preset.eval_max_new_tokens, max_len=preset.max_len,
                                 seed=FLAGS.seed)
        print(json.dumps({"heldout": result["all"], "families": {k: v["strict_success"] for k, v in
                                                                 result["families"].items()},
                          "outcomes": result["outcomes"]}))


if __name__ == "__main__":
    app.run(main)
