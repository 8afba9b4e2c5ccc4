"""Optimizer per stage: global-norm clip, AdamW, warm-up then cosine|constant, grad accumulation.

`OptimConfig.total_steps` and `warmup_steps` count optimizer updates. With `grad_accum = k`
the returned transformation is `optax.MultiSteps`: it accumulates k micro-batch gradients (mean)
and applies one update every k calls, so the schedule advances once per k micro-steps. Its
state holds the running gradient sum, so a checkpoint taken between updates resumes exactly.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from absl import logging

from trsi_jax.config import OptimConfig

SCHEDULES = ("cosine", "constant")


def _check(cfg: OptimConfig) -> None:
    if cfg.schedule not in SCHEDULES:
        raise ValueError(f"OptimConfig.schedule must be one of {SCHEDULES}, got {cfg.schedule!r}")
    if cfg.lr < 0:
        raise ValueError(f"OptimConfig.lr must be >= 0, got {cfg.lr}")
    if cfg.warmup_steps < 0 or cfg.total_steps < 1:
        raise ValueError(f"OptimConfig needs warmup_steps >= 0 and total_steps >= 1, got "
                         f"{cfg.warmup_steps} and {cfg.total_steps}")
    if cfg.schedule == "cosine" and cfg.warmup_steps >= cfg.total_steps:
        raise ValueError(f"OptimConfig.warmup_steps={cfg.warmup_steps} must be < total_steps="
                         f"{cfg.total_steps} for a cosine schedule")
    if not 0.0 <= cfg.end_lr_ratio <= 1.0:
        raise ValueError(f"OptimConfig.end_lr_ratio must be in [0, 1], got {cfg.end_lr_ratio}")
    if cfg.grad_accum < 1:
        raise ValueError(f"OptimConfig.grad_accum must be >= 1, got {cfg.grad_accum}")
    if cfg.grad_clip < 0:
        raise ValueError(f"OptimConfig.grad_clip must be >= 0 (0 disables), got {cfg.grad_clip}")


def make_schedule(cfg: OptimConfig) -> optax.Schedule:
    """lr(step): linear 0 -> lr over `warmup_steps`, then cosine to `lr * end_lr_ratio` at
    `total_steps` (held after), or constant `lr`."""
    _check(cfg)
    if cfg.schedule == "constant":
        if cfg.warmup_steps == 0:
            return optax.constant_schedule(cfg.lr)
        return optax.join_schedules(
            [optax.linear_schedule(0.0, cfg.lr, cfg.warmup_steps), optax.constant_schedule(cfg.lr)],
            [cfg.warmup_steps])
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=cfg.lr, warmup_steps=cfg.warmup_steps,
        decay_steps=cfg.total_steps, end_value=cfg.lr * cfg.end_lr_ratio)


def _decay_mask(params):
    """Weight decay on matrices only: norms, biases and other vectors are left alone."""
    return jax.tree.map(lambda p: getattr(p, "ndim", 0) >= 2, params)


def warn_low_precision_params() -> optax.GradientTransformation:
    """Identity that warns at init when parameters are stored below fp32: AdamW's state follows
    the parameter dtype, and a bf16 weight ignores updates smaller than ~2^-9 of its size (at
    lr 1e-6 most entries of a 0.02-scale matrix never move). Use ModelConfig.param_dtype=float32
    (fp32 master weights) with dtype=bfloat16 (bf16 compute)."""

    def init(params):
        low = sorted({str(p.dtype) for p in jax.tree.leaves(params)
                      if jnp.issubdtype(p.dtype, jnp.floating) and jnp.finfo(p.dtype).bits < 32})
        if low:
            logging.warning("optimizer: parameters stored in %s; small updates are rounded away. Set "
                            "--model_cfg.param_dtype=float32 for fp32 master weights and optimizer state.", low)
        return optax.EmptyState()

    return optax.GradientTransformation(init, lambda updates, state, params=None: (updates, state))


def make_optimizer(cfg: OptimConfig) -> optax.GradientTransformation:
    """clip_by_global_norm -> AdamW(schedule), wrapped in MultiSteps when `grad_accum > 1`.
    The optimizer state takes each parameter's dtype: keep master weights in fp32."""
    schedule = make_schedule(cfg)
    parts = [warn_low_precision_params()]
    if cfg.grad_clip > 0:
        parts.append(optax.clip_by_global_norm(cfg.grad_clip))
    parts.append(optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay,
                             mask=_decay_mask))
    tx = optax.chain(*parts)
    if cfg.grad_accum > 1:
        tx = optax.MultiSteps(tx, every_k_schedule=cfg.grad_accum).gradient_transformation()
    return tx
