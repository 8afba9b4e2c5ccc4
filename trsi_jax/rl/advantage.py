"""Advantage estimators over [B, T] token sequences: TB-GAE, textbook GAE, turn-broadcast GAE.

All three share one signature, `(rewards_BT, values_BT, policy_mask_BT, turn_ids_BT, gamma_tok,
lam_tok, gamma_turn, lam_turn) -> (adv_BT, ret_BT)`, and one convention: advantages and returns
are 0 wherever policy_mask is 0 (they are never targets there), so padding, prompts and
observations carry no signal. Each is a linear recurrence solved by `scan.reverse_linear_scan`.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from trsi_jax.rl import checks
from trsi_jax.rl.scan import SEQUENTIAL_UNROLL, resolve_impl, reverse_linear_scan

GAMMA_TOK, LAM_TOK, GAMMA_TURN, LAM_TURN = 1.0, 1.0, 0.99, 0.95


def _float_dtype(*xs):
    return jnp.result_type(*xs, jnp.float32)


def _shift_left(x_BT):
    """y_t = x_{t+1}, y_{T-1} = 0."""
    return jnp.concatenate([x_BT[..., 1:], jnp.zeros_like(x_BT[..., :1])], axis=-1)


def _first_policy(m_BT):
    """1 at each row's first policy token, else 0 (all 0 for a row without policy tokens)."""
    pos = jnp.arange(m_BT.shape[-1])
    return m_BT * (pos == jnp.argmax(m_BT, axis=-1, keepdims=True))


def _relocated_and_next(r, v, m, turn_f, impl):
    """Pass 1 of TB-GAE, for every t: V and turn id at n(t) (0 if none), and r_t plus the
    rewards on masked tokens up to n(t) (plus, on the first policy token, the masked rewards
    before it). One linear scan with three right-hand sides: masked tokens hand the value on
    their right through (a = 1 - m), policy tokens emit their own (b)."""
    not_m = 1.0 - m
    v_at, k_at, r_masked = reverse_linear_scan(not_m, m * v, m * turn_f, not_m * r, impl=impl)
    r_prefix_B1 = r_masked[..., :1]  # masked rewards before the first policy token (0 if m_0 = 1)
    r_eff = m * (r + _shift_left(r_masked)) + _first_policy(m) * r_prefix_B1
    return r_eff, _shift_left(v_at), _shift_left(k_at)


@functools.partial(jax.jit, static_argnames=("impl",))
def relocate_rewards(rewards_BT, policy_mask_BT, impl: str | None = None):
    """Rewards as TB-GAE sees them: each masked token's reward is added to the preceding policy
    token; rewards before the first policy token go to the first policy token. Nothing is lost
    unless a row has no policy token at all (then its rewards have nowhere to go)."""
    dt = _float_dtype(rewards_BT)
    r, m = rewards_BT.astype(dt), policy_mask_BT.astype(dt)
    return _relocated_and_next(r, jnp.zeros_like(r), m, jnp.zeros_like(r), impl)[0]


def _tb_gae_two_pass(r, v, m, turn_f, gamma_tok, lam_tok, gamma_turn, lam_turn, impl):
    r_eff, v_next, k_next = _relocated_and_next(r, v, m, turn_f, impl)
    same_turn = k_next == turn_f  # when n(t) is none, V_{n(t)} = A_{n(t)} = 0: the pair is moot
    gamma = jnp.where(same_turn, gamma_tok, gamma_turn).astype(r.dtype)
    lam = jnp.where(same_turn, lam_tok, lam_turn).astype(r.dtype)
    # Policy tokens: A_t = delta_t + gamma_t lam_t A_{n(t)}; masked tokens: identity (skipped).
    a = jnp.where(m > 0, gamma * lam, 1.0).astype(r.dtype)
    (x,) = reverse_linear_scan(a, m * (r_eff + gamma * v_next - v), impl=impl)
    return m * x


def _tb_gae_fused_loop(r, v, m, turn_f, gamma_tok, lam_tok, gamma_turn, lam_turn, unroll=SEQUENTIAL_UNROLL):
    """The same recurrence as one reverse `lax.scan` over tokens, carrying (A, V, turn) of the
    next policy token and the rewards pending since it: the compiled textbook loop."""
    B = r.shape[0]

    def step(carry, x):
        a_next, v_next, k_next, r_pend = carry
        r_t, v_t, m_t, k_t = x
        same = k_next == k_t
        gamma = jnp.where(same, gamma_tok, gamma_turn).astype(r.dtype)
        lam = jnp.where(same, lam_tok, lam_turn).astype(r.dtype)
        a_t = r_t + r_pend + gamma * v_next - v_t + gamma * lam * a_next
        pol = m_t > 0
        carry = (jnp.where(pol, a_t, a_next), jnp.where(pol, v_t, v_next), jnp.where(pol, k_t, k_next),
                 jnp.where(pol, 0.0, r_pend + r_t))
        return carry, jnp.where(pol, a_t, 0.0)

    init = (jnp.zeros(B, r.dtype), jnp.zeros(B, r.dtype), jnp.full(B, -1, r.dtype), jnp.zeros(B, r.dtype))
    (_, _, _, r_prefix), adv_TB = jax.lax.scan(step, init, (r.T, v.T, m.T, turn_f.T), reverse=True,
                                               unroll=unroll)
    # Rewards left pending at t = 0 precede every policy token: they belong to the first one, whose
    # advantage feeds no other token.
    return adv_TB.T + _first_policy(m) * r_prefix[:, None]


@functools.partial(jax.jit, static_argnames=("impl",))
def _tb_gae_core(rewards, values, policy_mask, turn_ids, gamma_tok, lam_tok, gamma_turn, lam_turn, impl):
    dt = _float_dtype(rewards, values)
    r, v, m, turn_f = (x.astype(dt) for x in (rewards, values, policy_mask, turn_ids))
    if impl == "sequential":  # the whole recurrence in one loop beats two sequential scans
        adv = _tb_gae_fused_loop(r, v, m, turn_f, gamma_tok, lam_tok, gamma_turn, lam_turn)
    else:
        adv = _tb_gae_two_pass(r, v, m, turn_f, gamma_tok, lam_tok, gamma_turn, lam_turn, impl)
    return adv, m * (adv + v)


def tb_gae(rewards_BT, values_BT, policy_mask_BT, turn_ids_BT, gamma_tok=GAMMA_TOK, lam_tok=LAM_TOK,
           gamma_turn=GAMMA_TURN, lam_turn=LAM_TURN, *, impl: str | None = None, validate: bool = True):
    """Turn-Boundary Skip-Observation GAE (DESIGN §1.2).

    n(t) = next index after t with m = 1 (observations skipped); (γ_t, λ_t) = (γ_tok, λ_tok) if
    turn[n(t)] == turn[t] else (γ_turn, λ_turn); δ_t = r_t + γ_t V_{n(t)} − V_t (V_{n(t)} = 0 if
    no n(t)); A_t = δ_t + γ_t λ_t A_{n(t)}; return_t = A_t + V_t. A_t = return_t = 0 where m_t = 0.
    Rewards on masked tokens count on the preceding policy token, those before the first policy
    token on the first one (`relocate_rewards`). With all m = 1 and equal pairs this is
    textbook GAE. `validate` checks shapes/values eagerly (see `checks.check_advantage_inputs`);
    pass validate=False inside an outer jit after checking the host arrays once.

    impl: "associative" = two passes of reverse associative scans (pass 1 carries V, turn id and
    pending rewards of n(t) back over masked tokens; pass 2 solves A_t = δ_t + γλ A_{n(t)} with
    masked tokens as identity maps); "sequential" = the same recurrence as one fused `lax.scan`;
    None = the faster one for the backend (`scan.resolve_impl`).
    """
    if validate:
        checks.check_advantage_inputs(rewards_BT, values_BT, policy_mask_BT, turn_ids_BT,
                                      gamma_tok=gamma_tok, lam_tok=lam_tok, gamma_turn=gamma_turn, lam_turn=lam_turn)
    return _tb_gae_core(rewards_BT, values_BT, policy_mask_BT, turn_ids_BT, gamma_tok, lam_tok, gamma_turn, lam_turn,
                        resolve_impl(impl))


@functools.partial(jax.jit, static_argnames=("impl",))
def _gae_core(rewards, values, policy_mask, gamma, lam, impl):
    dt = _float_dtype(rewards, values)
    r, v, m = rewards.astype(dt), values.astype(dt), policy_mask.astype(dt)
    pos = jnp.arange(r.shape[-1])
    last = jnp.max(jnp.where(m > 0, pos, -1), axis=-1, keepdims=True)  # -1: row has no policy token
    live = (pos <= last).astype(dt)
    tail_reward = jnp.sum(jnp.where(pos > last, r, 0.0), axis=-1, keepdims=True)
    r_eff = live * r + (pos == last) * tail_reward
    delta = live * (r_eff + gamma * _shift_left(live * v) - v)
    (x,) = reverse_linear_scan(live * (gamma * lam), delta, impl=impl)
    return m * x, m * (x + v)


def gae(rewards_BT, values_BT, policy_mask_BT, turn_ids_BT, gamma_tok=GAMMA_TOK, lam_tok=LAM_TOK,
        gamma_turn=GAMMA_TURN, lam_turn=LAM_TURN, *, impl: str | None = None, validate: bool = True):
    """Textbook token-level GAE with (γ, λ) = (γ_tok, λ_tok); turns and γ_turn/λ_turn are ignored.

    Every token up to the row's last policy token is a step (observations included, with their
    own values): δ_t = r_t + γ V_{t+1} − V_t, A_t = δ_t + γλ A_{t+1}; the episode ends at the last
    policy token (bootstrap 0). Rewards after it (final observation, padding) are added to it.
    A = return = 0 where m = 0.
    """
    if validate:
        checks.check_advantage_inputs(rewards_BT, values_BT, policy_mask_BT, turn_ids_BT,
                                      gamma_tok=gamma_tok, lam_tok=lam_tok, gamma_turn=gamma_turn, lam_turn=lam_turn)
    return _gae_core(rewards_BT, values_BT, policy_mask_BT, gamma_tok, lam_tok, resolve_impl(impl))


def _flip_scan(a, *bs, impl):
    """Forward recurrence x_t = b_t + a_t x_{t-1}, x_{-1} = 0 (the reverse one on flipped rows)."""
    flip = lambda x: jnp.flip(x, axis=-1)
    return tuple(flip(x) for x in reverse_linear_scan(flip(a), *map(flip, bs), impl=impl))


@functools.partial(jax.jit, static_argnames=("impl",))
def _turn_broadcast_core(rewards, values, policy_mask, turn_ids, gamma_turn, lam_turn, impl):
    dt = _float_dtype(rewards, values)
    r, v, m, turn_f = (x.astype(dt) for x in (rewards, values, policy_mask, turn_ids))
    # Turn heads: policy tokens whose previous policy token (if any) is in another turn.
    turn_at_or_before, seen = _flip_scan(1.0 - m, m * turn_f, m, impl=impl)
    shift_right = lambda x: jnp.concatenate([jnp.zeros_like(x[..., :1]), x[..., :-1]], axis=-1)
    head = m * ((shift_right(seen) == 0) | (shift_right(turn_at_or_before) != turn_f))
    # Turn-level GAE is TB-GAE on the heads alone: every step crosses a turn, so only the turn pair
    # applies, and each turn's rewards (its observation's too) relocate onto its head.
    adv_head = _tb_gae_two_pass(r, v, head, turn_f, gamma_turn, lam_turn, gamma_turn, lam_turn, impl)
    # Carry A_k and V_k from each head forward over the rest of its turn.
    adv, v_turn = _flip_scan(1.0 - head, adv_head, head * v, impl=impl)
    return m * adv, m * (adv + v_turn)


def turn_broadcast(rewards_BT, values_BT, policy_mask_BT, turn_ids_BT, gamma_tok=GAMMA_TOK, lam_tok=LAM_TOK,
                   gamma_turn=GAMMA_TURN, lam_turn=LAM_TURN, *, impl: str | None = None, validate: bool = True):
    """Bi-level GAE: turn-level GAE with (γ_turn, λ_turn), broadcast to the turn's tokens.

    Turn k's value V_k is V at its first policy token, its reward R_k the sum of the rewards from
    there up to the next turn's first policy token (observation rewards included; rewards before
    the first turn count on it); δ_k = R_k + γ V_{k+1} − V_k, A_k = δ_k + γλ A_{k+1}. Every policy
    token of turn k gets A_k and the turn return A_k + V_k. γ_tok/λ_tok are unused (accepted
    for the uniform estimator signature). A = return = 0 where m = 0.
    """
    if validate:
        checks.check_advantage_inputs(rewards_BT, values_BT, policy_mask_BT, turn_ids_BT,
                                      gamma_tok=gamma_tok, lam_tok=lam_tok, gamma_turn=gamma_turn, lam_turn=lam_turn)
    return _turn_broadcast_core(rewards_BT, values_BT, policy_mask_BT, turn_ids_BT, gamma_turn, lam_turn,
                                resolve_impl(impl))
