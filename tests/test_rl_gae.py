"""Advantage estimators vs plain NumPy loops written from the definitions (DESIGN §1.2)."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from trsi_jax import rl
from trsi_jax.rl.scan import reverse_linear_scan

IMPLS = sorted(rl.SCAN_IMPLS)
PAIRS = (0.9, 0.8, 0.7, 0.6)  # gamma_tok, lam_tok, gamma_turn, lam_turn: all distinct on purpose
B, T = 7, 48


# ---------------------------------------------------------------- NumPy references (plain loops)
def relocated_np(r, m):
    """Each reward on the preceding policy token, or on the first one when none precedes it."""
    out = np.zeros_like(r)
    for b in range(r.shape[0]):
        pol = np.flatnonzero(m[b])
        for t in range(r.shape[1]):
            before = pol[pol <= t]
            if len(pol):
                out[b, before[-1] if len(before) else pol[0]] += r[b, t]
    return out


def tb_gae_np(r, v, m, k, g_tok, l_tok, g_turn, l_turn):
    adv, ret = np.zeros_like(r), np.zeros_like(r)
    rr = relocated_np(r, m)
    for b in range(r.shape[0]):
        pol = np.flatnonzero(m[b])
        a_next = 0.0
        for i in reversed(range(len(pol))):
            t = pol[i]
            if i + 1 < len(pol):
                n = pol[i + 1]
                g, l = (g_tok, l_tok) if k[b, n] == k[b, t] else (g_turn, l_turn)
                delta = rr[b, t] + g * v[b, n] - v[b, t]
                a_next = delta + g * l * a_next
            else:
                a_next = rr[b, t] - v[b, t]
            adv[b, t], ret[b, t] = a_next, a_next + v[b, t]
    return adv, ret


def textbook_gae_np(r, v, gamma, lam):
    """The textbook per-token reverse loop over every position of a row, bootstrap 0 at the end."""
    adv = np.zeros_like(r)
    for b in range(r.shape[0]):
        a_next, v_next = 0.0, 0.0
        for t in reversed(range(r.shape[1])):
            a_next = r[b, t] + gamma * v_next - v[b, t] + gamma * lam * a_next
            adv[b, t], v_next = a_next, v[b, t]
    return adv, adv + v


def gae_estimator_np(r, v, m, gamma, lam):
    """Textbook GAE over tokens up to the last policy token (later rewards moved onto it), masked."""
    adv, ret = np.zeros_like(r), np.zeros_like(r)
    for b in range(r.shape[0]):
        pol = np.flatnonzero(m[b])
        if not len(pol):
            continue
        last = pol[-1]
        rb = r[b, : last + 1].copy()
        rb[last] += r[b, last + 1:].sum()
        a, rt = textbook_gae_np(rb[None], v[b, : last + 1][None], gamma, lam)
        adv[b, : last + 1], ret[b, : last + 1] = a[0] * m[b, : last + 1], rt[0] * m[b, : last + 1]
    return adv, ret


def turn_broadcast_np(r, v, m, k, gamma, lam):
    adv, ret = np.zeros_like(r), np.zeros_like(r)
    for b in range(r.shape[0]):
        pol = list(np.flatnonzero(m[b]))
        heads = [t for i, t in enumerate(pol) if i == 0 or k[b, pol[i - 1]] != k[b, t]]
        if not heads:
            continue
        bounds = [0] + heads[1:] + [r.shape[1]]  # turn j owns rewards in [bounds[j], bounds[j+1])
        a_turn, a_next = {}, 0.0
        for j in reversed(range(len(heads))):
            R = r[b, bounds[j]:bounds[j + 1]].sum()
            v_next = v[b, heads[j + 1]] if j + 1 < len(heads) else 0.0
            a_next = R + gamma * v_next - v[b, heads[j]] + gamma * lam * a_next
            a_turn[heads[j]] = a_next
        head = None
        for t in pol:
            head = t if t in a_turn else head
            adv[b, t], ret[b, t] = a_turn[head], a_turn[head] + v[b, head]
    return adv, ret


# ---------------------------------------------------------------- batches
def make_batch(seed, B=B, T=T):
    """Rows: all masked; prompt then turns ending on an observation; single-token turns; all policy;
    random segment layouts (same turn across an observation included). Rewards everywhere."""
    rng = np.random.default_rng(seed)
    m = np.zeros((B, T), np.int32)
    k = np.zeros((B, T), np.int32)
    for b in range(1, B):
        t, turn = 0, 0
        if b == 3:
            m[b], k[b] = 1, 0
            continue
        if b == 1:
            t = 5  # prompt
        while t < T:
            if b == 2:
                n_pol, n_obs = 1, int(rng.integers(0, 3))
            else:
                n_pol, n_obs = int(rng.integers(1, 7)), int(rng.integers(0, 6))
            m[b, t:t + n_pol] = 1
            k[b, t:] = turn
            t += n_pol
            t += n_obs
            turn += int(rng.random() < 0.8) if b > 3 else 1
        if b == 1:
            m[b, -4:] = 0  # ends on an observation
    r = rng.normal(size=(B, T))
    v = rng.normal(size=(B, T))
    return r, v, m, k


@pytest.fixture(autouse=True)
def x64():
    with jax.enable_x64(True):
        yield


def _np(xs):
    return tuple(np.asarray(x) for x in xs)


# ---------------------------------------------------------------- tests
@pytest.mark.parametrize("impl", IMPLS)
def test_reverse_linear_scan_matches_loop(impl):
    rng = np.random.default_rng(0)
    a, b1, b2 = rng.uniform(-1, 1, (3, 4, 37))
    x1, x2 = _np(jax.jit(functools.partial(reverse_linear_scan, impl=impl))(a, b1, b2))
    for b_arr, x in ((b1, x1), (b2, x2)):
        ref, nxt = np.zeros_like(b_arr), np.zeros(4)
        for t in reversed(range(37)):
            nxt = b_arr[:, t] + a[:, t] * nxt
            ref[:, t] = nxt
        np.testing.assert_allclose(x, ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("impl", IMPLS)
def test_tb_gae_matches_numpy_loop(impl):
    r, v, m, k = make_batch(1)
    adv, ret = _np(rl.tb_gae(r, v, m, k, *PAIRS, impl=impl))
    ref_adv, ref_ret = tb_gae_np(r, v, m, k, *PAIRS)
    assert adv.dtype == np.float64
    np.testing.assert_allclose(adv, ref_adv, rtol=0, atol=1e-10)
    np.testing.assert_allclose(ret, ref_ret, rtol=0, atol=1e-10)
    assert (adv[m == 0] == 0).all() and (ret[m == 0] == 0).all()
    assert (adv[0] == 0).all()  # the all-masked row


def test_tb_gae_defaults_and_fp32_close_to_float64():
    r, v, m, k = make_batch(2)
    ref_adv, _ = tb_gae_np(r, v, m, k, 1.0, 1.0, 0.99, 0.95)
    with jax.enable_x64(False):
        adv, ret = _np(rl.tb_gae(r.astype(np.float32), v.astype(np.float32), m, k))
    assert adv.dtype == np.float32 and ret.dtype == np.float32
    np.testing.assert_allclose(adv, ref_adv, rtol=0, atol=1e-4)


@pytest.mark.parametrize("impl", IMPLS)
def test_tb_gae_is_textbook_gae_without_observations(impl):
    r, v, _, k = make_batch(3)
    m = np.ones_like(k)
    for gamma, lam in ((0.9, 0.8), (1.0, 1.0)):
        ref_adv, ref_ret = textbook_gae_np(r, v, gamma, lam)
        adv, ret = _np(rl.tb_gae(r, v, m, k, gamma, lam, gamma, lam, impl=impl))
        np.testing.assert_allclose(adv, ref_adv, rtol=0, atol=1e-10)
        np.testing.assert_allclose(ret, ref_ret, rtol=0, atol=1e-10)
        gae_adv, _ = _np(rl.gae(r, v, m, k, gamma, lam, 0.5, 0.5, impl=impl))
        np.testing.assert_allclose(gae_adv, ref_adv, rtol=0, atol=1e-10)


@pytest.mark.parametrize("impl", IMPLS)
def test_gae_estimator_matches_numpy_loop(impl):
    r, v, m, k = make_batch(4)
    adv, ret = _np(rl.gae(r, v, m, k, 0.9, 0.8, 0.1, 0.1, impl=impl))
    ref_adv, ref_ret = gae_estimator_np(r, v, m, 0.9, 0.8)
    np.testing.assert_allclose(adv, ref_adv, rtol=0, atol=1e-10)
    np.testing.assert_allclose(ret, ref_ret, rtol=0, atol=1e-10)


@pytest.mark.parametrize("impl", IMPLS)
def test_turn_broadcast_matches_numpy_loop(impl):
    r, v, m, k = make_batch(5)
    adv, ret = _np(rl.turn_broadcast(r, v, m, k, 0.3, 0.3, 0.9, 0.8, impl=impl))
    ref_adv, ref_ret = turn_broadcast_np(r, v, m, k, 0.9, 0.8)
    np.testing.assert_allclose(adv, ref_adv, rtol=0, atol=1e-10)
    np.testing.assert_allclose(ret, ref_ret, rtol=0, atol=1e-10)
    assert k[1][m[1] > 0][0] == 0  # covered: a first turn with id 0 is still a turn head


def test_relocate_rewards_keeps_every_reward_of_rows_with_policy_tokens():
    r, _, m, _ = make_batch(6)
    moved = np.asarray(rl.relocate_rewards(r, m))
    np.testing.assert_allclose(moved, relocated_np(r, m), rtol=0, atol=1e-12)
    has_policy = m.any(1)
    np.testing.assert_allclose(moved.sum(1)[has_policy], r.sum(1)[has_policy], atol=1e-12)
    assert (moved[m == 0] == 0).all()


def test_registry_selects_estimators_by_name():
    assert set(rl.ADVANTAGE_ESTIMATORS) == {"tb_gae", "gae", "turn_broadcast"}
    r, v, m, k = make_batch(7)
    for name, fn in rl.ADVANTAGE_ESTIMATORS.items():
        assert rl.get_advantage_estimator(name) is fn
        adv, ret = fn(r, v, m, k, *PAIRS)
        assert adv.shape == ret.shape == r.shape
    with pytest.raises(ValueError, match="'ppo_gae' unknown; choose one of"):
        rl.get_advantage_estimator("ppo_gae")


# ---------------------------------------------------------------- properties
SEEDS = st.integers(0, 2**31 - 1)
UNIT = st.floats(0.0, 1.0)


@settings(max_examples=25, deadline=None)
@given(seed=SEEDS, g_tok=UNIT, l_tok=UNIT, g_turn=UNIT, l_turn=UNIT)
def test_property_every_estimator_and_impl_agrees_with_its_reference(seed, g_tok, l_tok, g_turn, l_turn):
    r, v, m, k = make_batch(seed)
    refs = {"tb_gae": tb_gae_np(r, v, m, k, g_tok, l_tok, g_turn, l_turn),
            "gae": gae_estimator_np(r, v, m, g_tok, l_tok),
            "turn_broadcast": turn_broadcast_np(r, v, m, k, g_turn, l_turn)}
    for name, (ref_adv, ref_ret) in refs.items():
        for impl in IMPLS:
            adv, ret = _np(rl.get_advantage_estimator(name)(r, v, m, k, g_tok, l_tok, g_turn, l_turn, impl=impl,
                                                            validate=False))
            np.testing.assert_allclose(adv, ref_adv, rtol=0, atol=1e-9, err_msg=f"{name}/{impl}")
            np.testing.assert_allclose(ret, ref_ret, rtol=0, atol=1e-9, err_msg=f"{name}/{impl}")


@settings(max_examples=25, deadline=None)
@given(seed=SEEDS)
def test_property_inserting_observations_leaves_policy_advantages_unchanged(seed):
    """Splice observation tokens (own values, rewards, turn ids) anywhere; policy tokens' advantages
    are those of the original sequence with the observation rewards added to the preceding
    policy token (the first one for observations before any policy token)."""
    rng = np.random.default_rng(seed)
    T0, T1 = 24, 48
    m0 = np.ones((1, T0), np.int32)
    k0 = np.cumsum(rng.random((1, T0)) < 0.3, axis=1).astype(np.int32)
    r0, v0 = rng.normal(size=(2, 1, T0))
    n_obs = rng.integers(0, 4, T0 + 1)
    while n_obs.sum() > T1 - T0:
        n_obs[np.argmax(n_obs)] -= 1
    r1, v1, m1, k1 = np.zeros((1, T1)), rng.normal(size=(1, T1)), np.zeros((1, T1), np.int32), np.zeros((1, T1), np.int32)
    r_expected = r0.copy()
    pos, src = 0, []
    for i in range(T0 + 1):
        obs_r = rng.normal(size=n_obs[i])
        r1[0, pos:pos + n_obs[i]] = obs_r
        k1[0, pos:pos + n_obs[i]] = k0[0, max(i - 1, 0)]
        r_expected[0, max(i - 1, 0)] += obs_r.sum()
        pos += n_obs[i]
        if i < T0:
            r1[0, pos], v1[0, pos], m1[0, pos], k1[0, pos] = r0[0, i], v0[0, i], 1, k0[0, i]
            src.append(pos)
            pos += 1
    r1[0, pos:] = rng.normal(size=T1 - pos)  # padding rewards land on the last policy token
    r_expected[0, -1] += r1[0, pos:].sum()
    ref, _ = tb_gae_np(r_expected, v0, m0, k0, *PAIRS)
    adv, _ = _np(rl.tb_gae(r1, v1, m1, k1, *PAIRS, validate=False))
    np.testing.assert_allclose(adv[0, src], ref[0], rtol=0, atol=1e-9)


# ---------------------------------------------------------------- bad input
def _bad(**over):
    r, v, m, k = make_batch(8)
    args = dict(rewards_BT=r, values_BT=v, policy_mask_BT=m, turn_ids_BT=k)
    args.update(over)
    return args


@pytest.mark.parametrize("over, match", [
    (dict(values_BT=np.zeros((B, T - 1))), r"values: shape \(7, 47\) does not match rewards shape \(7, 48\)"),
    (dict(rewards_BT=np.zeros(T)), r"rewards: expected 2 dims \[B, T\]"),
    (dict(policy_mask_BT=np.full((B, T), 2)), "policy_mask: mask must be 0/1"),
    (dict(turn_ids_BT=np.zeros((B, T)) + 0.5), "turn_ids: expected an integer array"),
    (dict(gamma_turn=1.5), r"gamma_turn=1.5 out of range \[0.0, 1.0\]"),
    (dict(impl="cuda"), "impl='cuda' unknown"),
])
@pytest.mark.parametrize("name", sorted(rl.ADVANTAGE_ESTIMATORS))
def test_bad_input_raises_naming_the_argument(name, over, match):
    with pytest.raises(ValueError, match=match):
        rl.get_advantage_estimator(name)(**_bad(**over))


@pytest.mark.parametrize("field", ["rewards_BT", "values_BT"])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_rewards_and_values_raise(field, bad):
    args = _bad()
    x = args[field].copy()
    x[2, 9] = bad
    with pytest.raises(ValueError, match=rf"{field[:-3]}: NaN or inf in 1 entries, first at index \(2, 9\)"):
        rl.tb_gae(**{**args, field: x})


def test_validation_under_jit_asks_for_eager_check():
    r, v, m, k = make_batch(9)
    with pytest.raises(ValueError, match="pass validate=False"):
        jax.jit(lambda r: rl.tb_gae(r, v, m, k))(r)
    adv, _ = jax.jit(lambda r: rl.tb_gae(r, v, m, k, validate=False))(r)
    np.testing.assert_allclose(np.asarray(adv), tb_gae_np(r, v, m, k, 1.0, 1.0, 0.99, 0.95)[0], atol=1e-10)
    assert jnp.asarray(adv).dtype == jnp.float64
