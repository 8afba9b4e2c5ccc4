"""Shared flag plumbing for the stage scripts: config dataclasses <-> absl flags, runtime set-up."""
from __future__ import annotations

import os
from typing import Any

from absl import flags, logging

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


def model_config_from_flags() -> config_lib.ModelConfig:
    return config_from_flags("model_cfg", config_lib.model_preset(FLAGS.model))


def init_runtime() -> None:
    """Multi-host init and the persistent compilation cache, before any computation."""
    import jax

    if FLAGS.distributed:
        jax.distributed.initialize()
    if FLAGS.jax_cache_dir:
        jax.config.update("jax_compilation_cache_dir", FLAGS.jax_cache_dir)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
    logging.info("jax %s: %d process(es), %d device(s): %s", jax.__version__, jax.process_count(),
                 jax.device_count(), jax.devices()[0].platform)
