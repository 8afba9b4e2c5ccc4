"""Episodes -> padded [B, T] arrays for PPO, with the RPR rewards placed on tokens.

Rewards: the outcome reward (SPR, or binary strict success) sits on each episode's last policy
token; the family dense reward (FDR) of turn k sits on that turn's last token. Family ids index
the FDR statistics, so the family list is fixed for a run (stored in its checkpoints).

Infrastructure failures (sandbox broke, verifier gave no result) are never trained on: they are
left out and counted (`RolloutBatch.infra_failures`); filler rows (no policy tokens, `real`
False) bring the batch back to a multiple of the PPO minibatch. Truncated episodes (turn limit,
timeout, context overflow) are graded like endings with `truncation="terminal"`; with
`"bootstrap"` their outcome reward is dropped and `bootstrap_truncated` later puts
γ · V(cut state) on their last policy token.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import jax.numpy as jnp
import numpy as np

from trsi_jax import rl
from trsi_jax.rollout.episodes import TRUNCATED, is_infra_failure

TRUNCATION_MODES = ("terminal", "bootstrap")


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
    truncated: np.ndarray  # [B] bool, cut by a budget (TRUNCATED outcomes)
    real: np.ndarray  # [B] bool, False for filler rows
    infra_failures: int = 0  # episodes left out: sandbox or verifier failed

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


def _progress_row(progress: Sequence) -> list[float]:
    """Per-turn progress with unmeasured turns (None: the probe failed) carried forward, so FDR
    sees no gain for a turn whose progress is unknown."""
    out, last = [], 0.0
    for p in progress:
        last = last if p is None else float(p)
        out.append(last)
    return out


def bootstrap_truncated(rewards_BT: np.ndarray, policy_mask_BT: np.ndarray, truncated_B: np.ndarray,
                        cut_values_B: np.ndarray, gamma: float) -> np.ndarray:
    """rewards + γ · V(cut) on the last policy token of each truncated row: with the next
    step after that token treated as missing by the estimators, its TD error becomes
    r + γ·V(cut) − V_t, i.e. the episode continues past the cut as the critic predicts."""
    extra_B = np.where(truncated_B, gamma * np.asarray(cut_values_B, np.float32), 0.0)
    return rewards_BT + np.asarray(rl.place_episode_reward(jnp.asarray(extra_B), jnp.asarray(policy_mask_BT)))


def episodes_to_batch(episodes: Sequence, families: Sequence[str], fdr_stats, *, reward: str = "spr",
                      kappa: float = 0.5, fdr_beta: float = 0.1, fdr_clip: float = 3.0, min_len: int = 64,
                      truncation: str = "terminal", row_multiple: int = 1):
    """Returns (RolloutBatch, updated FDR stats). Infrastructure failures are left out and
    counted; filler rows pad the rest to a multiple of `row_multiple`. T is the longest episode
    rounded up to a power of two (at least `min_len`), so the PPO steps compile for a handful of
    shapes per run; FDR is skipped when `fdr_beta == 0`. Raises ValueError when no episode is
    left to train on."""
    if truncation not in TRUNCATION_MODES:
        raise ValueError(f"truncation must be one of {TRUNCATION_MODES}, got {truncation!r}")
    infra = sum(map(is_infra_failure, episodes))
    episodes = [e for e in episodes if not is_infra_failure(e)]
    if not episodes:
        raise ValueError(f"episodes_to_batch: no episodes to train on ({infra} infrastructure failures)")
    n_real = len(episodes)
    n_rows = -(-n_real // row_multiple) * row_multiple
    for e in episodes:
        if len(e.tokens) != len(e.policy_mask) or len(e.tokens) != len(e.turn_ids):
            raise ValueError(f"episode {e.task_id!r}: tokens/policy_mask/turn_ids lengths differ "
                             f"({len(e.tokens)}, {len(e.policy_mask)}, {len(e.turn_ids)})")
    longest = max(len(e.tokens) for e in episodes)
    T = max(min_len, 1 << (longest - 1).bit_length())
    filler = n_rows - n_real  # one real (pad) token each keeps attention finite; no policy token
    tokens = _padded([e.tokens for e in episodes] + [[0]] * filler, T, np.int32)
    mask = _padded([[1] * len(e.tokens) for e in episodes] + [[1]] * filler, T, np.int32)
    policy_mask = _padded([e.policy_mask for e in episodes], T, np.int32)
    policy_mask = np.concatenate([policy_mask, np.zeros((filler, T), np.int32)])
    turn_ids = np.full((n_rows, T), -1, np.int32)
    for i, e in enumerate(episodes):
        turn_ids[i, :len(e.turn_ids)] = e.turn_ids

    pad = lambda x: np.concatenate([x, np.zeros(filler, x.dtype)])  # noqa: E731
    strict = pad(np.array([bool(e.strict) for e in episodes]))
    partial = pad(np.array([float(e.partial) for e in episodes], np.float32))
    truncated = pad(np.array([e.outcome in TRUNCATED for e in episodes]))
    real = np.arange(n_rows) < n_real
    fam = pad(family_ids(episodes, families))

    # Outcome reward on the last policy token of each row (none if the episode has no reply);
    # a cut episode has none in bootstrap mode (it has not ended).
    outcome = outcome_rewards(strict, partial, reward, kappa)
    if truncation == "bootstrap":
        outcome = np.where(truncated, 0.0, outcome).astype(np.float32)
    rewards = np.array(rl.place_episode_reward(jnp.asarray(outcome), jnp.asarray(policy_mask)), np.float32)

    # Family dense reward on each turn's last token.
    K = max(1, max(len(e.turn_end_positions) for e in episodes))
    turn_rewards = np.zeros((n_rows, K), np.float32)
    if fdr_beta > 0:
        progress = np.zeros((n_rows, K), np.float32)
        valid = np.zeros((n_rows, K), bool)
        ends = np.full((n_rows, K), -1, np.int32)  # -1: no turn
        for i, e in enumerate(episodes):
            k = min(len(e.progress), len(e.turn_end_positions))
            progress[i, :k] = _progress_row(e.progress[:k])
            valid[i, :k] = True
            ends[i, :len(e.turn_end_positions)] = e.turn_end_positions
        turn_rewards_BK, fdr_stats = rl.family_dense_reward(
            jnp.asarray(progress), jnp.asarray(valid), jnp.asarray(fam), fdr_stats,
            beta=fdr_beta, clip=fdr_clip)
        turn_rewards = np.where(valid, np.asarray(turn_rewards_BK, np.float32), 0.0)
        rewards += np.asarray(rl.place_turn_rewards(jnp.asarray(turn_rewards), jnp.asarray(ends), T))

    batch = RolloutBatch(tokens=tokens, mask=mask, policy_mask=policy_mask, turn_ids=turn_ids,
                         rewards=rewards, outcome_rewards=outcome, turn_rewards=turn_rewards,
                         family_ids=fam, strict=strict, partial=partial, truncated=truncated, real=real,
                         infra_failures=infra)
    return batch, fdr_stats
