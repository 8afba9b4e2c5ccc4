"""Produces the shipped tiny base policy (`trsi_jax/assets/tiny_base/`) from a seed.

    make base   # the shipped base's exact flags (Makefile BASE_FLAGS; also in its make_base.json)
    python -m experiments.make_base --seed=0 --out=DIR [--model_cfg.* --bootstrap.* levers below]

Bootstrap = the `--preset`'s bootstrap SFT (steps, batch, learning rate; data order `--seed`;
`--bootstrap.*` overrides any of it) of a randomly initialised `tiny` model (init seed `--seed`)
on verified oracle demonstrations of TRAIN tasks of the preset's families only (suite seeds 0..train_per_family-1, more than the stages use;
held-out seeds are only built for the optional evaluation), tokenized with the shipped BPE. The result is a Hugging Face folder (config.json,
model.safetensors, tokenizer.json without a chat template, so the built-in Qwen rendering is
used) that `experiments.pipeline --init_hf=...` starts from, so `make demo` skips the bootstrap.
With --eval_per_family > 0 it also prints held-out strict success of the result.

Five levers shape what the base can do (all off by default):
`--render_per_family=N` adds N more train tasks per family whose oracle first replies are rendered
without a sandbox (`bootstrap.rendered_example`; checked token for token against every verified
demonstration first), `--render_templates` keeps only some templates among those (more examples of
what the base finds hard), `--exclude_templates` leaves built-in templates out of the bootstrap entirely
(the base then has something left to learn), `--hint_fraction` shows that share of the
examples under the `hint` harness, so the base learns to use the hint RSR's hint harness gives, and
`--hint_only_templates` shows every example of some templates under it (the base knows them only
with the hint: RSR's hint harness can collect them, the common harness at first cannot).
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
flags.DEFINE_integer("render_per_family", 0, "more train tasks per family (seeds after --train_per_family), "
                     "rendered without a sandbox")
flags.DEFINE_list("exclude_templates", [], "built-in suite templates left out of the bootstrap")
flags.DEFINE_list("render_templates", [], "only these templates among the --render_per_family tasks "
                  "(default: all), to give the bootstrap more of what the base finds hard")
flags.DEFINE_float("hint_fraction", 0.0, "share of the bootstrap examples shown under the `hint` harness")
flags.DEFINE_list("hint_only_templates", [], "built-in suite templates whose bootstrap examples are all shown "
                  "under the `hint` harness: the base learns them only with the hint RSR's hint harness gives")
RENDER_CHUNK = 500  # rendered tasks per family built on disk at a time
common.define_runtime_flags()
common.define_config_flags("bootstrap", SFTConfig)


def template(task) -> str:
    """A built-in suite task's template (its second tag)."""
    return task.tags[1]


def family_templates(families) -> set[str]:
    """Every template of `families`: each family cycles through its templates by seed, so seeds
    0, 1, ... give them all before the first repeats."""
    from sandboxes.suite import FAMILIES, make_task

    names = set()
    for family in families or FAMILIES:
        first, seed = make_task(family, 0).template, 1
        names.add(first)
        while (name := make_task(family, seed).template) != first:
            names.add(name)
            seed += 1
    return names


def render_all(data, tasks, tokenizer, work: str, families) -> tuple[list, dict]:
    """Bootstrap examples rendered without a sandbox: the verified tasks, then --render_per_family
    more per family (built on disk a chunk at a time), each under `hint` with --hint_fraction."""
    import random
    import shutil

    from sandboxes.suite import build_suite
    from trsi_jax.agent import make_harness
    from trsi_jax.pipeline.bootstrap import check_rendering, rendered_example
    from trsi_jax.tasks import load_tasks

    screen = check_rendering(data, tasks, tokenizer)
    harnesses, rng = {"common": make_harness("common"), "hint": make_harness("hint")}, random.Random(FLAGS.seed)
    counts = {"rendered": 0, "hint_examples": 0}

    def render(batch):
        out = []
        for task in batch:
            hint = rng.random() < FLAGS.hint_fraction or template(task) in FLAGS.hint_only_templates
            counts["hint_examples"] += hint
            out.append(rendered_example(task, harnesses["hint" if hint else "common"], screen, tokenizer))
        return out

    verified = {e.task_id for e in data.episodes if e.strict}
    examples = render([t for t in tasks if t.task_id in verified])
    folder = os.path.join(work, "tasks", "rendered")
    for start in range(0, FLAGS.render_per_family, RENDER_CHUNK):
        shutil.rmtree(folder, ignore_errors=True)
        build_suite(folder, "train", min(RENDER_CHUNK, FLAGS.render_per_family - start), families,
                    start=FLAGS.train_per_family + start)
        batch = [t for t in load_tasks(folder)[0] if template(t) not in FLAGS.exclude_templates
                 and (not FLAGS.render_templates or template(t) in FLAGS.render_templates)]
        examples += render(batch)
        counts["rendered"] += len(batch)
    shutil.rmtree(folder, ignore_errors=True)
    return examples, counts


def main(argv):
    del argv
    common.init_runtime()
    import jax
    from flax import nnx

    from trsi_jax.models import Qwen
    from trsi_jax.models.hf_io import save_hf
    from trsi_jax.pipeline.bootstrap import demonstrations, require_verified, train_bootstrap
    from trsi_jax.pipeline.bootstrap import summary as bootstrap_summary
    from trsi_jax.pipeline.config import pipeline_preset
    from trsi_jax.pipeline.run import built_in_tasks
    from trsi_jax.rollout import load_tokenizer

    preset = pipeline_preset(FLAGS.preset)
    tokenizer = load_tokenizer(FLAGS.tokenizer)
    cfg = common.model_config_from_flags()  # --model plus any --model_cfg.* override
    if tokenizer.vocab_size > cfg.vocab_size:
        raise ValueError(f"tokenizer vocab {tokenizer.vocab_size} exceeds the model's {cfg.vocab_size}")
    work, families = FLAGS.workdir, list(preset.families) or None
    if not 0.0 <= FLAGS.hint_fraction <= 1.0:
        raise ValueError(f"--hint_fraction={FLAGS.hint_fraction} must lie in [0, 1]")
    tasks = built_in_tasks(os.path.join(work, "tasks", "train"), "train", FLAGS.train_per_family, families)
    known = {template(t) for t in tasks}
    unknown = sorted(set(FLAGS.exclude_templates) - known)
    if unknown:
        raise ValueError(f"--exclude_templates: {unknown} not among the templates of these train tasks: "
                         f"{sorted(known)} (raise --train_per_family if a template is rare)")
    if both := sorted(set(FLAGS.exclude_templates) & set(FLAGS.hint_only_templates)):
        raise ValueError(f"{both} are in both --exclude_templates and --hint_only_templates: choose one")
    if FLAGS.render_templates or FLAGS.hint_only_templates:
        choices = family_templates(families)
        for name in ("render_templates", "hint_only_templates"):
            unknown = sorted(set(FLAGS[name].value) - choices)
            if unknown:
                raise ValueError(f"--{name}: {unknown} are not templates of the families {families}: "
                                 f"choose among {sorted(choices)}")
    tasks = [t for t in tasks if template(t) not in FLAGS.exclude_templates]
    sft = common.config_from_flags("bootstrap", dataclasses.replace(preset.bootstrap, seed=FLAGS.seed))
    model = nnx.jit(lambda: Qwen(cfg, rngs=nnx.Rngs(FLAGS.seed)))()
    data = demonstrations(tasks, tokenizer, preset.backend, sft.max_len)
    require_verified(data)
    examples, counts = data.examples, {}
    if FLAGS.render_per_family or FLAGS.hint_fraction or FLAGS.hint_only_templates:
        examples, counts = render_all(data, tasks, tokenizer, work, families)
    result = train_bootstrap(model, examples, tokenizer, sft, os.path.join(work, "base"))
    summary = dict(bootstrap_summary(data, len(tasks), len(examples), result), **counts)
    print(json.dumps({"bootstrap": summary}))
    if jax.process_index() == 0:
        shutil.rmtree(FLAGS.out, ignore_errors=True)
        save_hf(model, FLAGS.out)
        shutil.copy(os.path.join(FLAGS.tokenizer, "tokenizer.json"), os.path.join(FLAGS.out, "tokenizer.json"))
        with open(os.path.join(FLAGS.out, "make_base.json"), "w") as f:
            json.dump({"seed": FLAGS.seed, "preset": FLAGS.preset, "model": dataclasses.asdict(cfg),
                       "families": families,
                       "train_per_family": FLAGS.train_per_family, "render_per_family": FLAGS.render_per_family,
                       "exclude_templates": list(FLAGS.exclude_templates),
                       "render_templates": list(FLAGS.render_templates), "hint_fraction": FLAGS.hint_fraction,
                       "hint_only_templates": list(FLAGS.hint_only_templates), "sft": dataclasses.asdict(sft),
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
