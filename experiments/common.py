"""Shared flag plumbing for the stage scripts: config dataclasses <-> absl flags, runtime set-up."""
from __future__ import annotations

import os
from typing import Any

from absl import app, flags, logging

from trsi_jax import config as config_lib

FLAGS = flags.FLAGS


def define_config_flags(prefix: str, cls: type) -> None:
    """Defines `--{prefix}.{field}` (string-valued, parsed by field type) for every leaf field."""
    for name, typ in config_lib.leaf_fields(cls).items():
        flags.DEFINE_string(f"{prefix}.{name}", None, f"override {cls.__name__}.{name} ({typ})")


def config_from_flags(prefix: str, default: Any) -> Any:
    """`default` with every `--{prefix}.field` given on the command line applied."""
    updates = {}
    for name in config_lib.leaf_fields(type(default)):
        flag = FLAGS[f"{prefix}.{name}"]
        if flag.present:
            updates[name] = flag.value
    return config_lib.override(default, updates)


def define_runtime_flags() -> None:
    flags.DEFINE_string("workdir", "runs/default", "stage output folder (checkpoints, metrics, data)")
    flags.DEFINE_string("model", "tiny", f"model preset: {sorted(config_lib.MODEL_PRESETS)}")
    flags.DEFINE_string("jax_cache_dir", os.path.expanduser("~/.cache/trsi_jax/jax"),
                        "persistent XLA compilation cache ('' disables)")
    flags.DEFINE_bool("distributed", False, "call jax.distributed.initialize() (multi-host pods)")
    define_config_flags("model_cfg", config_lib.ModelConfig)
    define_config_flags("chat", config_lib.ChatConfig)


def define_task_flags() -> None:
    flags.DEFINE_string("tasks_dir", None, "Terminal-Bench task folders; default: the built-in suite's train split")
    flags.DEFINE_integer("per_family", 4, "built-in suite: training tasks per family")
    flags.DEFINE_list("families", [], "built-in suite: families to use (default: all)")


def train_tasks(workdir: str) -> list:
    """Tasks from --tasks_dir (rejected folders logged with their reason), else the built-in
    suite's train split written under the workdir."""
    from trsi_jax.tasks import load_tasks

    if FLAGS.tasks_dir is None:
        from trsi_jax.pipeline.run import built_in_tasks

        return built_in_tasks(os.path.join(workdir, "tasks"), "train", FLAGS.per_family, FLAGS.families or None)
    tasks, rejected = load_tasks(FLAGS.tasks_dir)
    for path, reason in rejected:
        logging.warning("skipping task %s: %s", path, reason)
    return tasks


def define_hf_flags() -> None:
    """--init_hf (start from an HF model folder) and --export_hf (write the final policy as one)."""
    flags.DEFINE_string("init_hf", None, "HF model folder (config.json, safetensors, tokenizer) to start from: "
                        "architecture from its config.json, weights read onto the stage mesh, tokenizer and "
                        "chat template from the folder; numerics from --model (if given) and --model_cfg.*")
    flags.DEFINE_string("export_hf", None, "write the stage's final policy as an HF folder here")


def model_config_from_flags(source: str | None = None) -> config_lib.ModelConfig:
    """The architecture of `source` or --init_hf (an HF folder's config.json), else of
    --init_checkpoint's metadata when --model is not given, else --model's preset; numerics
    (dtype, param_dtype, remat, scan_layers, attn_block, gdn_chunk_size) from --model when given; then every
    --model_cfg.* flag."""
    source = source or _flag("init_hf") or (None if FLAGS["model"].present else _flag("init_checkpoint"))
    if not source:
        return config_from_flags("model_cfg", config_lib.model_preset(FLAGS.model))
    import dataclasses

    from experiments.export import checkpoint_model_config

    base = checkpoint_model_config(source)
    if FLAGS["model"].present:
        preset = config_lib.model_preset(FLAGS.model)
        base = dataclasses.replace(base, **{k: getattr(preset, k) for k in (
            "dtype", "param_dtype", "remat", "scan_layers", "attn_block", "gdn_chunk_size")})
    return config_from_flags("model_cfg", base)


def _flag(name: str):
    return FLAGS[name].value if name in FLAGS else None


def tokenizer_from_flags():
    """--tokenizer when given, else the --init_hf folder's tokenizer, else the byte tokenizer."""
    from trsi_jax.rollout import load_tokenizer

    init_hf = _flag("init_hf")
    name = FLAGS.tokenizer if FLAGS["tokenizer"].present or not init_hf else init_hf
    return load_tokenizer(name, thinking=config_from_flags("chat", config_lib.ChatConfig()).thinking)


def init_checkpoint_from_flags() -> str | None:
    """--init_checkpoint or --init_hf (not both): the folder the stage's policy starts from."""
    if FLAGS.init_hf and FLAGS.init_checkpoint:
        raise app.UsageError("give --init_checkpoint or --init_hf, not both")
    return FLAGS.init_hf or FLAGS.init_checkpoint


def export_if_asked(ckpt_dir: str, model_cfg: config_lib.ModelConfig, tokenizer) -> None:
    """--export_hf: the latest policy in `ckpt_dir` as an HF folder (all processes take part)."""
    if FLAGS.export_hf:
        from experiments.export import export_policy

        export_policy(ckpt_dir, FLAGS.export_hf, model_cfg, tokenizer)


def init_runtime() -> None:
    """Multi-host init and the persistent compilation cache, before any computation."""
    import jax

    if FLAGS.distributed:
        jax.distributed.initialize()
    if FLAGS.jax_cache_dir:
        jax.config.update("jax_compilation_cache_dir", FLAGS.jax_cache_dir)
        # Every program, however quick to compile: the pipeline clears jax's in-memory caches between
        # stages, and reading a program back is cheaper than compiling it again.
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    logging.info("jax %s: %d process(es), %d device(s): %s", jax.__version__, jax.process_count(),
                 jax.device_count(), jax.devices()[0].platform)
