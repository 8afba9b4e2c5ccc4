"""RL math for RPR: advantage estimators, rewards, PPO losses (pure, jit-able functions)."""
from trsi_jax.rl.advantage import gae, relocate_rewards, tb_gae, turn_broadcast
from trsi_jax.rl.checks import check_advantage_inputs
from trsi_jax.rl.estimators import ADVANTAGE_ESTIMATORS, get_advantage_estimator
from trsi_jax.rl.losses import entropy, kl_penalty, masked_mean, policy_loss, value_loss, whiten
from trsi_jax.rl.rewards import (FamilyStats, check_fdr_inputs, family_dense_reward, place_episode_reward,
                                 place_turn_rewards, process_reward, process_reward_by_family, progress_gains,
                                 success_prioritized_reward, update_family_stats)
from trsi_jax.rl.scan import SCAN_IMPLS, reverse_linear_scan

__all__ = [
    "ADVANTAGE_ESTIMATORS", "FamilyStats", "SCAN_IMPLS", "check_advantage_inputs", "check_fdr_inputs", "entropy",
    "family_dense_reward", "gae", "get_advantage_estimator", "kl_penalty", "masked_mean", "place_episode_reward",
    "place_turn_rewards", "policy_loss", "process_reward", "process_reward_by_family", "progress_gains",
    "relocate_rewards", "reverse_linear_scan", "success_prioritized_reward", "tb_gae", "turn_broadcast",
    "update_family_stats", "value_loss", "whiten",
]
