"""SPR, FDR (family statistics and calibration), reward placement and process reward vs NumPy."""
import jax
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from trsi_jax import rl


@pytest.fixture(autouse=True)
def x64():
    with jax.enable_x64(True):
        yield


# ---------------------------------------------------------------- SPR
def test_spr_values():
    strict = np.array([1, 0, 0, 0, 1])
    partial = np.array([0.2, 0.0, 0.5, 1.3, 1.0])
    r = np.asarray(rl.success_prioritized_reward(strict, partial, kappa=0.5))
    np.testing.assert_allclose(r, [1.0, 0.0, 0.25, 0.5, 1.0])


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), kappa=st.floats(0.0, 0.999))
def test_property_spr_ranks_every_success_above_every_partial(seed, kappa):
    rng = np.random.default_rng(seed)
    strict = np.zeros(16, np.int32)
    strict[rng.permutation(16)[:5]] = 1
    partial = rng.uniform(-0.5, 1.5, 16)  # out-of-range partial credit is clipped, never outranks
    partial[np.flatnonzero(strict == 0)[0]] = 1.0  # a failure with every partial test passing
    r = np.asarray(rl.success_prioritized_reward(strict, partial, kappa))
    assert r[strict == 1].min() > r[strict == 0].max()
    assert (r[strict == 1] == 1.0).all() and (r >= 0).all()


@pytest.mark.parametrize("kw, match", [
    (dict(kappa=1.0), r"kappa=1.0 out of range \[0.0, 1.0\)"),
    (dict(kappa=-0.1), r"kappa=-0.1 out of range"),
    (dict(strict_B=np.array([1, 2, 0])), "strict: mask must be 0/1"),
    (dict(partial_B=np.array([0.1, np.nan, 0.0])), "partial: NaN or inf"),
    (dict(partial_B=np.zeros(4)), r"partial: shape \(4,\) does not match strict shape \(3,\)"),
])
def test_spr_bad_input(kw, match):
    args = dict(strict_B=np.array([1, 0, 0]), partial_B=np.array([0.1, 0.2, 0.0]), kappa=0.5)
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        rl.success_prioritized_reward(**args)


# ---------------------------------------------------------------- FDR
def test_family_stats_chan_update_matches_full_sample_moments():
    rng = np.random.default_rng(0)
    F = 3
    stats = rl.FamilyStats.init(F, dtype=np.float64)
    seen = {f: [] for f in range(F)}
    for _ in range(4):
        fam = rng.integers(0, F, 6)
        gains = rng.normal(loc=fam[:, None] * 2.0, size=(6, 5))
        valid = rng.random((6, 5)) < 0.7
        stats = rl.update_family_stats(stats, fam[:, None], gains, valid)
        for b in range(6):
            seen[fam[b]].extend(gains[b][valid[b]])
    for f in range(F):
        assert float(stats.count_F[f]) == len(seen[f])
        np.testing.assert_allclose(float(stats.mean_F[f]), np.mean(seen[f]), rtol=1e-12)
        np.testing.assert_allclose(float(stats.var_F[f]), np.var(seen[f]), rtol=1e-10)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), cut=st.integers(0, 12))
def test_property_family_stats_update_is_split_invariant(seed, cut):
    """Folding gains in two batches equals folding them all at once (Chan's merge is exact)."""
    rng = np.random.default_rng(seed)
    fam, gains, valid = rng.integers(0, 3, 12), rng.normal(size=(12, 4)), rng.random((12, 4)) < 0.6
    init = rl.FamilyStats.init(3, dtype=np.float64)
    once = rl.update_family_stats(init, fam[:, None], gains, valid)
    first = np.arange(12)[:, None] < cut  # split by masking, so shapes (and compiles) stay fixed
    twice = rl.update_family_stats(rl.update_family_stats(init, fam[:, None], gains, valid & first),
                                   fam[:, None], gains, valid & ~first)
    for a, b in zip(once, twice):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-12)


def fdr_np(progress, valid, fam, seen, beta, clip, eps):
    """Reference FDR: gains, then each family's mean/std over every valid gain seen so far (this batch included)."""
    prev = np.concatenate([np.zeros_like(progress[:, :1]), progress[:, :-1]], axis=1)
    gains = np.where(valid, progress - prev, 0.0)
    for b in range(len(fam)):
        seen.setdefault(fam[b], []).extend(gains[b][valid[b] > 0])
    out = np.zeros_like(progress)
    for b in range(len(fam)):
        mu, sd = np.mean(seen[fam[b]]), np.std(seen[fam[b]])
        out[b] = np.where(valid[b] > 0, beta * np.clip((gains[b] - mu) / (sd + eps), -clip, clip), 0.0)
    return out


def _episodes(rng, B, K, fam_scale):
    fam = rng.integers(0, len(fam_scale), B)
    steps = rng.random((B, K)) * np.array(fam_scale)[fam][:, None]
    progress = np.clip(np.cumsum(steps, axis=1), 0, 1)
    n_turns = rng.integers(1, K + 1, B)
    valid = (np.arange(K)[None] < n_turns[:, None]).astype(np.int32)
    return progress, valid, fam


def test_family_dense_reward_matches_numpy_over_batches():
    rng = np.random.default_rng(1)
    stats, seen = rl.FamilyStats.init(2), {}
    for _ in range(3):
        progress, valid, fam = _episodes(rng, 8, 6, [0.3, 0.05])
        rewards, stats = rl.family_dense_reward(progress, valid, fam, stats, beta=0.1, clip=2.0, eps=1e-6)
        ref = fdr_np(progress, valid, fam, seen, 0.1, 2.0, 1e-6)
        np.testing.assert_allclose(np.asarray(rewards), ref, rtol=0, atol=1e-6)  # stats are float32
    assert float(stats.count_F.sum()) == sum(len(v) for v in seen.values())
    assert np.abs(np.asarray(rewards)).max() <= 0.1 * 2.0 + 1e-12


def test_fdr_calibration_makes_families_with_different_progress_scales_comparable():
    """Family 0 advances ~20x faster than family 1. Raw gains differ by that factor; calibrated
    rewards have matching per-family scale and ~0 mean."""
    rng = np.random.default_rng(2)
    stats = rl.FamilyStats.init(2)
    raw, cal = {0: [], 1: []}, {0: [], 1: []}
    for _ in range(6):
        fam = np.repeat([0, 1], 16)
        steps = rng.random((32, 4)) * np.where(fam == 0, 0.2, 0.01)[:, None]
        progress, valid = np.cumsum(steps, axis=1), np.ones((32, 4), np.int32)
        rewards, stats = rl.family_dense_reward(progress, valid, fam, stats)
        gains = np.asarray(rl.progress_gains(progress, valid))
        for f in (0, 1):
            raw[f].extend(gains[fam == f].ravel())
            cal[f].extend(np.asarray(rewards)[fam == f].ravel())
    assert np.std(raw[0]) / np.std(raw[1]) > 10
    ratio = np.std(cal[0]) / np.std(cal[1])
    assert 0.8 < ratio < 1.25, ratio
    for f in (0, 1):
        assert abs(np.mean(cal[f])) < 0.02 and abs(np.std(cal[f]) - 0.1) < 0.02  # beta = 0.1 scale


@pytest.mark.parametrize("kw, match", [
    (dict(family_ids_B=np.array([0, 2])), r"family_ids: values must lie in \[0, 2\), got 2"),
    (dict(family_ids_B=np.array([0, -1])), r"family_ids: values must lie in \[0, 2\), got -1"),
    (dict(progress_BK=np.array([[0.1, 1.2, 0.0], [0.0, 0.0, 0.0]])), r"progress: values must lie in \[0, 1\]"),
    (dict(progress_BK=np.array([[0.1, np.nan, 0.0], [0.0, 0.0, 0.0]])), "progress: NaN or inf"),
    (dict(turn_valid_BK=np.array([[1, 0, 1], [1, 1, 0]])), "turn_valid: valid turns must form a prefix"),
    (dict(turn_valid_BK=np.ones((2, 2))), r"turn_valid: shape \(2, 2\) does not match progress shape \(2, 3\)"),
    (dict(beta=-1.0), "beta=-1.0 out of range"),
    (dict(eps=0.0), "eps=0.0 must be > 0"),
])
def test_fdr_bad_input(kw, match):
    args = dict(progress_BK=np.array([[0.1, 0.5, 0.5], [0.0, 0.2, 0.0]]), turn_valid_BK=np.array([[1, 1, 1], [1, 1, 0]]),
                family_ids_B=np.array([0, 1]), stats=rl.FamilyStats.init(2))
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        rl.family_dense_reward(**args)
    with pytest.raises(ValueError, match="num_families=0 must be >= 1"):
        rl.FamilyStats.init(0)


# ---------------------------------------------------------------- placement, process reward
def test_place_turn_rewards_and_episode_reward():
    turn_r = np.array([[0.5, -0.25, 2.0], [1.0, 3.0, 7.0]])
    ends = np.array([[2, 6, -1], [4, 4, 9]])  # -1: absent turn; repeated position adds
    out = np.asarray(rl.place_turn_rewards(turn_r, ends, 10))
    ref = np.zeros((2, 10))
    ref[0, 2], ref[0, 6], ref[1, 4], ref[1, 9] = 0.5, -0.25, 4.0, 7.0
    np.testing.assert_array_equal(out, ref)
    with pytest.raises(ValueError, match="turn_end_positions: position 10 out of range for T=10"):
        rl.place_turn_rewards(turn_r, ends + 1, 10)
    mask = np.array([[0, 1, 1, 0, 1, 0], [0, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1]])
    placed = np.asarray(rl.place_episode_reward(np.array([0.7, 1.0, 0.2]), mask))
    np.testing.assert_array_equal(placed, [[0, 0, 0, 0, 0.7, 0], [0] * 6, [0, 0, 0, 0, 0, 0.2]])


def test_process_reward_overall_and_per_family():
    p = np.array([0.0, 0.5, 1.0, 0.25, 0.75])
    fam = np.array([0, 0, 2, 2, 2])
    assert float(rl.process_reward(p)) == pytest.approx(0.5)
    means, counts = rl.process_reward_by_family(p, fam, 3)
    np.testing.assert_allclose(np.asarray(means), [0.25, np.nan, 2.0 / 3.0])
    np.testing.assert_array_equal(np.asarray(counts), [2, 0, 3])
    with pytest.raises(ValueError, match=r"family_ids: values must lie in \[0, 3\), got 3"):
        rl.process_reward_by_family(p, fam + 1, 3)
