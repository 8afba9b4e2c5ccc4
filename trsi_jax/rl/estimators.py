"""Advantage estimators selectable by name (what ablation flags choose).

Every estimator has the signature `(rewards_BT, values_BT, policy_mask_BT, turn_ids_BT,
gamma_tok, lam_tok, gamma_turn, lam_turn, *, impl, validate) -> (adv_BT, ret_BT)`:
- "tb_gae":         Turn-Boundary Skip-Observation GAE (the method; `advantage.tb_gae`).
- "gae":            textbook token-level GAE over every token with (γ_tok, λ_tok); observations
                    are ordinary steps, turns are ignored (`advantage.gae`).
- "turn_broadcast": turn-level GAE with (γ_turn, λ_turn) on each turn's first policy token,
                    broadcast to the turn's tokens (`advantage.turn_broadcast`).
"""
from __future__ import annotations

from typing import Callable

from trsi_jax.rl import advantage

ADVANTAGE_ESTIMATORS: dict[str, Callable] = {
    "tb_gae": advantage.tb_gae,
    "gae": advantage.gae,
    "turn_broadcast": advantage.turn_broadcast,
}


def get_advantage_estimator(name: str) -> Callable:
    """The estimator registered under `name`; ValueError listing the choices otherwise."""
    try:
        return ADVANTAGE_ESTIMATORS[name]
    except KeyError:
        raise ValueError(f"advantage estimator {name!r} unknown; choose one of {sorted(ADVANTAGE_ESTIMATORS)}") from None
