"""Episodes -> padded [B, T] arrays for PPO, with the RPR rewards placed on tokens.

Rewards: the outcome reward (SPR, or binary strict success) sits on each episode's last policy
token; the family dense reward (FDR) of turn k sits on that turn's last token. Family ids index
the FDR statistics, so the family list is fixed for a run (stored in its checkpoints).
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import jax.numpy as jnp
import numpy as np

from trsi_jax import rl


@dataclasses.dataclass(frozen=True)
class RolloutBatch:
    """Right-padded episodes. [B, T] token arrays; [B] per-episode outcomes."""

    tokens: np.ndarray  # int32
    mask: np.ndarray  # int32, 1 = real token
    policy_mask: np.ndarray  # int32, 1 = sampled assistant token
    turn_ids: np.ndarray  # int32, assistant turn index (-1 before the first turn)
    rewards: np.ndarray  # float32, outcome + FDR rewards on token positions
    outcome_rewards: np.ndarray  # [B] float32
    turn_rewards: np.ndarray  # [B, K] float32 FDR per turn (zeros when disabled)
    family_ids: np.ndarray  # [B] int32
    strict: np.ndarray  # [B] bool
    partial: np.ndarray  # [B] float32

    @property
    def num_tokens(self) -> int:
        return int(self.mask.sum())


def _padded(rows: Sequence[Sequence], width: int, dtype) -> np.ndarray:
    out = np.zeros((len(rows), width), dtype)
    for i, row in enumerate(rows):
        out[i, :len(row)] = row
    return out


def family_ids(episodes: Sequence, families: Sequence[str]) -> np.ndarray:
    index = {f: i for i, f in enumerate(families)}
    unknown = sorted({e.family for e in episodes} - set(index))
    if unknown:
        raise ValueError(f"episode families {unknown} are not in the run's family list {list(families)}")
    return np.array([index[e.family] for e in episodes], np.int32)


def outcome_rewards(strict: np.ndarray, partial: np.ndarray, reward: str, kappa: float) -> np.ndarray:
    """SPR (`reward="spr"`) or 1/0 strict success (`"binary"`), per episode."""
    if reward == "spr":
        return np.asarray(rl.success_prioritized_reward(jnp.asarray(strict), jnp.asarray(partial), kappa),
                          np.float32)
    if reward == "binary":
        return strict.astype(np.float32)
    raise ValueError(f"reward must be 'spr' or 'binary', got {reward!r}")


def episodes_to_batch(episodes: Sequence, families: Sequence[str], fdr_stats, *, reward: str = "spr",
                      kappa: float = 0.5, fdr_beta: float = 0.1, fdr_clip: float = 3.0, min_len: int = 64):
    """Returns (RolloutBatch, updated FDR stats). T is the longest episode rounded up to a power
    of two (at least `min_len`), so the PPO steps compile for a handful of shapes per run; FDR is
    skipped when `fdr_beta == 0`."""
    if not episodes:
        raise ValueError("episodes_to_batch: no episodes")
    for e in episodes:
        if len(e.tokens) != len(e.policy_mask) or len(e.tokens) != len(e.turn_ids):
            raise ValueError(f"episode {e.task_id!r}: tokens/policy_mask/turn_ids lengths differ "
                             f"({len(e.tokens)}, {len(e.policy_mask)}, {len(e.turn_ids)})")
    longest = max(len(e.tokens) for e in episodes)
    T = max(min_len, 1 << (longest - 1).bit_length())
    tokens = _padded([e.tokens for e in episodes], T, np.int32)
    mask = _padded([[1] * len(e.tokens) for e in episodes], T, np.int32)
    policy_mask = _padded([e.policy_mask for e in episodes], T, np.int32)
    turn_ids = np.full((len(episodes), T), -1, np.int32)
    for i, e in enumerate(episodes):
        turn_ids[i, :len(e.turn_ids)] = e.turn_ids

    strict = np.array([bool(e.strict) for e in episodes])
    partial = np.array([float(e.partial) for e in episodes], np.float32)
    fam = family_ids(episodes, families)

    # Outcome reward on the last policy token of each row (none if the episode has no reply).
    outcome = outcome_rewards(strict, partial, reward, kappa)
    rewards = np.array(rl.place_episode_reward(jnp.asarray(outcome), jnp.asarray(policy_mask)), np.float32)

    # Family dense reward on each turn's last token.
    K = max(1, max(len(e.turn_end_positions) for e in episodes))
    turn_rewards = np.zeros((len(episodes), K), np.float32)
    if fdr_beta > 0:
        progress = np.zeros((len(episodes), K), np.float32)
        valid = np.zeros((len(episodes), K), bool)
        ends = np.full((len(episodes), K), -1, np.int32)  # -1: no turn
        for i, e in enumerate(episodes):
            k = min(len(e.progress), len(e.turn_end_positions))
            progress[i, :k] = e.progress[:k]
            valid[i, :k] = True
            ends[i, :len(e.turn_end_positions)] = e.turn_end_positions
        turn_rewards_BK, fdr_stats = rl.family_dense_reward(
            jnp.asarray(progress), jnp.asarray(valid), jnp.asarray(fam), fdr_stats,
            beta=fdr_beta, clip=fdr_clip)
        turn_rewards = np.where(valid, np.asarray(turn_rewards_BK, np.float32), 0.0)
        rewards += np.asarray(rl.place_turn_rewards(jnp.asarray(turn_rewards), jnp.asarray(ends), T))

    batch = RolloutBatch(tokens=tokens, mask=mask, policy_mask=policy_mask, turn_ids=turn_ids,
                         rewards=rewards, outcome_rewards=outcome, turn_rewards=turn_rewards,
                         family_ids=fam, strict=strict, partial=partial)
    return batch, fdr_stats
