"""Episode rewards: SPR (success-prioritized), FDR (family dense), placement on tokens, process reward.

DESIGN §1.2. All cores are pure and jit-able; the public functions validate eagerly when
`validate=True` (see `checks`), which needs concrete arrays.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from trsi_jax.rl import checks


def success_prioritized_reward(strict_B, partial_B, kappa=0.5, *, validate: bool = True):
    """SPR: r = 1 for a strict success (every verifier test passed), else κ · clip(p, 0, 1).

    κ ∈ [0, 1), so every strict success outranks every partial one. p = fraction of tests passed.
    """
    if validate:
        checks.check_scalar_in("kappa", kappa, 0.0, 1.0, hi_open=True)
        checks.check_shape("partial", partial_B, np.shape(strict_B), "strict")
        checks.check_binary_mask("strict", strict_B)
        checks.check_finite("partial", partial_B)
    partial = jnp.asarray(partial_B, jnp.result_type(partial_B, jnp.float32))
    return jnp.where(jnp.asarray(strict_B) > 0, 1.0, kappa * jnp.clip(partial, 0.0, 1.0)).astype(partial.dtype)


class FamilyStats(NamedTuple):
    """Running statistics of FDR gains per task family, arrays indexed by family id.

    count_F, mean_F and m2_F (sum of squared deviations) follow Chan et al.'s parallel update.
    """
    count_F: jax.Array
    mean_F: jax.Array
    m2_F: jax.Array

    @classmethod
    def init(cls, num_families: int, dtype=jnp.float32) -> "FamilyStats":
        if int(num_families) < 1:
            raise ValueError(f"num_families={num_families} must be >= 1")
        z = jnp.zeros((int(num_families),), dtype)
        return cls(z, z, z)

    @property
    def num_families(self) -> int:
        return self.count_F.shape[0]

    @property
    def var_F(self) -> jax.Array:
        """Population variance (0 for families with fewer than one sample)."""
        return jnp.where(self.count_F > 0, self.m2_F / jnp.maximum(self.count_F, 1), 0.0)


@jax.jit
def update_family_stats(stats: FamilyStats, family_ids, gains, valid) -> FamilyStats:
    """Fold the valid `gains` into each family's (count, mean, M2); `family_ids` broadcasts to
    `gains`' shape. Batch statistics per family, then Chan's merge:
    δ = μ_b − μ_a, n = n_a + n_b, μ = μ_a + δ n_b / n, M2 = M2_a + M2_b + δ² n_a n_b / n."""
    F = stats.num_families
    dt = jnp.result_type(stats.mean_F, gains)
    g = jnp.asarray(gains, dt).ravel()
    w = jnp.broadcast_to(jnp.asarray(valid), jnp.shape(gains)).astype(dt).ravel()
    ids = jnp.broadcast_to(jnp.asarray(family_ids), jnp.shape(gains)).ravel()
    seg = functools.partial(jax.ops.segment_sum, segment_ids=ids, num_segments=F)
    n_b = seg(w)
    mean_b = seg(w * g) / jnp.maximum(n_b, 1)
    m2_b = seg(w * (g - mean_b[ids]) ** 2)
    n_a, mean_a, m2_a = (x.astype(dt) for x in stats)
    n = n_a + n_b
    delta = mean_b - mean_a
    safe_n = jnp.maximum(n, 1)
    mean = mean_a + delta * n_b / safe_n
    m2 = m2_a + m2_b + delta**2 * n_a * n_b / safe_n
    keep = stats.mean_F.dtype  # stats keep their dtype (stable checkpoints, no recompiles)
    return FamilyStats(n.astype(keep), mean.astype(keep), m2.astype(keep))


def progress_gains(progress_BK, turn_valid_BK):
    """g_k = p_k − p_{k−1} with p_{−1} = 0; 0 on invalid (padding) turns."""
    p = jnp.asarray(progress_BK)
    prev = jnp.concatenate([jnp.zeros_like(p[:, :1]), p[:, :-1]], axis=1)
    return jnp.where(jnp.asarray(turn_valid_BK) > 0, p - prev, 0.0)


@jax.jit
def _family_dense_reward_core(progress_BK, turn_valid_BK, family_ids_B, stats, beta, clip, eps):
    dt = jnp.result_type(progress_BK, jnp.float32)
    gains = progress_gains(progress_BK.astype(dt), turn_valid_BK)
    valid = turn_valid_BK > 0
    new_stats = update_family_stats(stats, family_ids_B[:, None], gains, valid)
    mu = new_stats.mean_F[family_ids_B][:, None]
    sigma = jnp.sqrt(new_stats.var_F)[family_ids_B][:, None]
    g_hat = jnp.clip((gains - mu) / (sigma + eps), -clip, clip)
    return jnp.where(valid, beta * g_hat, 0.0).astype(dt), new_stats


def family_dense_reward(progress_BK, turn_valid_BK, family_ids_B, stats: FamilyStats, beta=0.1, clip=3.0, eps=1e-6,
                        *, validate: bool = True):
    """FDR: per-turn reward β · clip((g_k − μ_f) / (σ_f + ε), −c, c) with g_k = p_k − p_{k−1}.

    Stats are updated with this batch first and the *post-update* (μ_f, σ_f) normalise it, so a
    family's first batch is standardised by its own gains instead of by empty statistics.
    Valid turns must come first in each row (invalid = padding, reward 0, not counted).
    Returns (rewards_BK, new_stats); place them with `place_turn_rewards`.
    """
    if validate:
        check_fdr_inputs(progress_BK, turn_valid_BK, family_ids_B, stats, beta=beta, clip=clip, eps=eps)
    return _family_dense_reward_core(jnp.asarray(progress_BK), jnp.asarray(turn_valid_BK), jnp.asarray(family_ids_B),
                                     stats, beta, clip, eps)


def check_fdr_inputs(progress_BK, turn_valid_BK, family_ids_B, stats: FamilyStats, beta, clip, eps) -> None:
    checks.check_ndim("progress", progress_BK, 2, "[B, K]")
    checks.check_shape("turn_valid", turn_valid_BK, np.shape(progress_BK), "progress")
    checks.check_shape("family_ids", family_ids_B, np.shape(progress_BK)[:1], "progress[:, 0]")
    checks.check_finite("progress", progress_BK)
    p = np.asarray(progress_BK)
    if ((p < 0) | (p > 1)).any():
        raise ValueError(f"progress: values must lie in [0, 1], got {p[(p < 0) | (p > 1)].flat[0]}")
    checks.check_binary_mask("turn_valid", turn_valid_BK)
    v = np.asarray(turn_valid_BK)
    if (np.diff(v.astype(np.int8), axis=1) > 0).any():
        raise ValueError("turn_valid: valid turns must form a prefix of each row (no valid turn after padding)")
    checks.check_int_range("family_ids", family_ids_B, 0, stats.num_families)
    checks.check_scalar_in("beta", beta, 0.0, np.inf)
    checks.check_scalar_in("clip", clip, 0.0, np.inf)
    if not float(eps) > 0:
        raise ValueError(f"eps={eps} must be > 0")


def place_turn_rewards(turn_rewards_BK, turn_end_positions_BK, T: int):
    """Scatter per-turn rewards onto token positions: out[b, pos[b, k]] += r[b, k].

    Positions < 0 mark absent turns and are skipped. Use each turn's last policy token.
    """
    pos = jnp.asarray(turn_end_positions_BK)
    r = jnp.asarray(turn_rewards_BK)
    if pos.shape != r.shape or pos.ndim != 2:
        raise ValueError(f"turn_end_positions: shape {pos.shape} must equal turn_rewards shape {r.shape} ([B, K])")
    if not isinstance(pos, jax.core.Tracer) and bool((pos >= T).any()):
        raise ValueError(f"turn_end_positions: position {int(pos.max())} out of range for T={T}")
    rows = jnp.broadcast_to(jnp.arange(pos.shape[0])[:, None], pos.shape)
    cols = jnp.where(pos < 0, T, pos)  # out of bounds -> dropped
    out = jnp.zeros((pos.shape[0], T), jnp.result_type(r, jnp.float32))
    return out.at[rows, cols].add(r, mode="drop")


def place_episode_reward(reward_B, policy_mask_BT):
    """Put each row's episode reward (e.g. SPR) on its last policy token; rows without policy
    tokens (padding rows) get nothing."""
    m = jnp.asarray(policy_mask_BT) > 0
    T = m.shape[-1]
    last = T - 1 - jnp.argmax(jnp.flip(m, -1), axis=-1)
    at_last = (jnp.arange(T) == last[:, None]) & m.any(-1, keepdims=True)
    r = jnp.asarray(reward_B)
    return jnp.where(at_last, r[:, None], 0.0).astype(jnp.result_type(r, jnp.float32))


def process_reward(final_progress_B):
    """Process reward (evaluation metric): mean final progress p over episodes."""
    return jnp.mean(jnp.asarray(final_progress_B, jnp.result_type(final_progress_B, jnp.float32)))


def process_reward_by_family(final_progress_B, family_ids_B, num_families: int, *, validate: bool = True):
    """Per-family mean final progress and episode counts; NaN mean for a family with no episodes."""
    if validate:
        checks.check_shape("family_ids", family_ids_B, np.shape(final_progress_B), "final_progress")
        checks.check_finite("final_progress", final_progress_B)
        checks.check_int_range("family_ids", family_ids_B, 0, num_families)
    p = jnp.asarray(final_progress_B, jnp.result_type(final_progress_B, jnp.float32))
    ids = jnp.asarray(family_ids_B)
    counts = jax.ops.segment_sum(jnp.ones_like(p), ids, num_segments=num_families)
    sums = jax.ops.segment_sum(p, ids, num_segments=num_families)
    return jnp.where(counts > 0, sums / jnp.maximum(counts, 1), jnp.nan), counts
