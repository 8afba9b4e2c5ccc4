"""PPO losses and whitening vs NumPy formulas, plus the gradients the clipping must produce."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from trsi_jax import rl


@pytest.fixture(autouse=True)
def x64():
    with jax.enable_x64(True):
        yield


def _data(seed=0, B=4, T=12):
    rng = np.random.default_rng(seed)
    mask = (rng.random((B, T)) < 0.7).astype(np.float64)
    mask[0] = 0  # a fully padded row
    old = rng.normal(-2.0, 0.5, (B, T))
    logp = old + rng.normal(0, 0.3, (B, T))
    adv = rng.normal(size=(B, T))
    return logp, old, adv, mask


def _mean(x, m):
    return (x * m).sum() / m.sum()


def test_whiten_masked_moments():
    _, _, adv, mask = _data()
    w = np.asarray(rl.whiten(adv, mask))
    sel = adv[mask > 0]
    np.testing.assert_allclose(w[mask > 0], (sel - sel.mean()) / np.sqrt(sel.var() + 1e-8), rtol=1e-12)
    assert (w[mask == 0] == 0).all()
    scaled = np.asarray(rl.whiten(adv, mask, shift_mean=False))
    np.testing.assert_allclose(scaled[mask > 0], sel / np.sqrt(sel.var() + 1e-8), rtol=1e-12)


def test_policy_loss_matches_formula_and_metrics():
    logp, old, adv, mask = _data(1)
    loss, met = rl.policy_loss(logp, old, adv, mask, clip_eps=0.2)
    ratio = np.exp(logp - old)
    ref = -_mean(np.minimum(ratio * adv, np.clip(ratio, 0.8, 1.2) * adv), mask)
    np.testing.assert_allclose(float(loss), ref, rtol=1e-12)
    np.testing.assert_allclose(float(met["clip_frac"]), _mean(np.abs(ratio - 1) > 0.2, mask), rtol=1e-12)
    np.testing.assert_allclose(float(met["approx_kl"]), _mean(ratio - 1 - np.log(ratio), mask), rtol=1e-12)
    assert 0 < float(met["clip_frac"]) < 1 and float(met["approx_kl"]) > 0


def test_policy_loss_gradient_vanishes_exactly_where_clipped():
    logp, old, adv, mask = _data(2)
    grad = np.asarray(jax.grad(lambda lp: rl.policy_loss(lp, old, adv, mask, 0.2)[0])(logp))
    ratio = np.exp(logp - old)
    clipped = ((ratio > 1.2) & (adv > 0)) | ((ratio < 0.8) & (adv < 0))
    expected = np.where(clipped, 0.0, -ratio * adv * mask / mask.sum())
    assert clipped[mask > 0].any() and (~clipped[mask > 0]).any()
    np.testing.assert_allclose(grad, expected, rtol=1e-10, atol=1e-15)


def test_value_loss_matches_formula_and_explained_variance():
    rng = np.random.default_rng(3)
    _, _, _, mask = _data(3)
    ret = rng.normal(size=mask.shape)
    old_v = ret + rng.normal(0, 0.5, mask.shape)
    v = old_v + rng.normal(0, 0.3, mask.shape)
    loss, met = rl.value_loss(v, old_v, ret, mask, clip_eps=0.2)
    vc = old_v + np.clip(v - old_v, -0.2, 0.2)
    np.testing.assert_allclose(float(loss), 0.5 * _mean(np.maximum((v - ret) ** 2, (vc - ret) ** 2), mask), rtol=1e-12)
    sel = mask > 0
    np.testing.assert_allclose(float(met["explained_variance"]), 1 - np.var((ret - v)[sel]) / np.var(ret[sel]),
                               rtol=1e-10)
    np.testing.assert_allclose(float(met["clip_frac"]), _mean((vc - ret) ** 2 > (v - ret) ** 2, mask), rtol=1e-12)
    _, perfect = rl.value_loss(ret, ret, ret, mask)
    assert float(perfect["explained_variance"]) == 1.0
    _, flat = rl.value_loss(v, old_v, np.ones_like(ret), mask)
    assert np.isnan(float(flat["explained_variance"]))


def test_kl_penalty_estimators():
    logp, ref, _, mask = _data(4)
    k1, m1 = rl.kl_penalty(logp, ref, mask, kind="k1")
    k2, m2 = rl.kl_penalty(logp, ref, mask, kind="k2")
    k3, m3 = rl.kl_penalty(logp, ref, mask, kind="k3")
    np.testing.assert_allclose(float(k1), _mean(logp - ref, mask), rtol=1e-12)
    np.testing.assert_allclose(float(k2), _mean(0.5 * (logp - ref) ** 2, mask), rtol=1e-12)
    d = ref - logp
    np.testing.assert_allclose(float(k3), _mean(np.exp(d) - d - 1, mask), rtol=1e-12)
    assert float(k3) > 0 and set(m1) == {"kl_k1"} and set(m2) == {"kl_k2"} and set(m3) == {"kl_k3"}
    assert float(rl.kl_penalty(logp, logp, mask)[0]) == 0.0
    with pytest.raises(ValueError, match=r"kind='k4' unknown; choose one of \['k1', 'k2', 'k3'\]"):
        rl.kl_penalty(logp, ref, mask, kind="k4")


def _exact_kl(p, q):
    return np.sum(p * (np.log(p) - np.log(q)))


@pytest.mark.parametrize("kind, direction", [("k1", "forward"), ("k2", "forward"), ("k3", "reverse")])
def test_kl_penalty_expected_gradient_is_the_named_kl(kind, direction):
    """On a 6-way categorical, the expectation over tokens a ~ π of the per-token penalty's
    gradient (the loss of a batch holding every token, weighted by sg(π(a))) equals the gradient
    of the exact KL the docstring names: KL(π‖π_ref) for k1 and k2, KL(π_ref‖π) for k3. The
    expected values of k1 and k3 equal KL(π‖π_ref) exactly."""
    rng = np.random.default_rng(7)
    theta, ref_logits = rng.normal(size=6), rng.normal(size=6)
    ref_logp = jax.nn.log_softmax(ref_logits)

    def expected_penalty(th):
        logp = jax.nn.log_softmax(th)
        weights = jax.lax.stop_gradient(jnp.exp(logp))  # E_{a~π}[.]: π(a) as constant weights
        return rl.kl_penalty(logp[None], ref_logp[None], weights[None], kind=kind)[0]

    def exact(th):
        p, q = jax.nn.softmax(th), jnp.exp(ref_logp)
        return jnp.sum(p * (jnp.log(p) - jnp.log(q))) if direction == "forward" else jnp.sum(q * (jnp.log(q) - jnp.log(p)))

    np.testing.assert_allclose(np.asarray(jax.grad(expected_penalty)(theta)), np.asarray(jax.grad(exact)(theta)),
                               rtol=1e-10, atol=1e-12)
    assert np.abs(np.asarray(jax.grad(exact)(theta))).max() > 1e-2  # a real gradient, not 0 = 0
    p = np.asarray(jax.nn.softmax(theta))
    if kind in ("k1", "k3"):  # unbiased estimates of KL(π‖π_ref)
        np.testing.assert_allclose(float(expected_penalty(theta)), _exact_kl(p, np.exp(np.asarray(ref_logp))),
                                   rtol=1e-10)


def test_sampling_logits_temperature_and_vocab_limit():
    """logits / T with ids past the limit at MASKED_LOGIT; softmax of it equals the plain
    renormalised tempered distribution, entropy is finite, greedy scores at T = 1."""
    from trsi_jax.rl.losses import MASKED_LOGIT, sampling_logits

    z = np.random.default_rng(3).normal(size=(2, 3, 7))
    out = np.asarray(sampling_logits(jnp.asarray(z), 0.7, 5))
    np.testing.assert_allclose(out[..., :5], z[..., :5] / 0.7, rtol=1e-12)
    assert (out[..., 5:] == MASKED_LOGIT).all()
    p = np.exp(z[..., :5] / 0.7)
    p /= p.sum(-1, keepdims=True)
    np.testing.assert_allclose(np.asarray(jax.nn.softmax(out, -1))[..., :5], p, rtol=1e-12)
    ent, _ = rl.entropy(jnp.asarray(out), np.ones((2, 3)))
    np.testing.assert_allclose(float(ent), np.mean(-(p * np.log(p)).sum(-1)), rtol=1e-10)
    np.testing.assert_array_equal(np.asarray(sampling_logits(jnp.asarray(z), 0.0)), z)


def test_entropy_matches_numpy_and_uniform_bound():
    rng = np.random.default_rng(5)
    logits = rng.normal(0, 3, (2, 5, 11)).astype(np.float32)
    mask = np.array([[1, 1, 0, 1, 0], [0, 0, 0, 1, 1]], np.float32)
    with jax.enable_x64(False):
        ent, met = rl.entropy(jnp.asarray(logits, jnp.bfloat16), mask)  # bf16 in, fp32 math out
        assert ent.dtype == jnp.float32 and set(met) == {"entropy"}
    z = np.asarray(jnp.asarray(logits, jnp.bfloat16).astype(jnp.float32), np.float64)
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    np.testing.assert_allclose(float(ent), _mean(-(p * np.log(p)).sum(-1), mask), rtol=1e-5)
    uniform, _ = rl.entropy(np.zeros((2, 5, 11)), mask)
    np.testing.assert_allclose(float(uniform), np.log(11), rtol=1e-12)


def test_empty_mask_gives_zero_losses_not_nan():
    logp, old, adv, _ = _data(6)
    zero = np.zeros_like(adv)
    assert float(rl.policy_loss(logp, old, adv, zero)[0]) == 0.0
    assert float(rl.value_loss(logp, old, adv, zero)[0]) == 0.0
    assert (np.asarray(rl.whiten(adv, zero)) == 0).all()


@pytest.mark.parametrize("call, match", [
    (lambda x, m: rl.policy_loss(x, x[:, :-1], x, m), r"old_logp: shape \(4, 11\) does not match logp shape \(4, 12\)"),
    (lambda x, m: rl.value_loss(x, x, x, m[:2]), r"mask: shape \(2, 12\) does not match values shape"),
    (lambda x, m: rl.whiten(x, m.T), r"mask: shape \(12, 4\) does not match x shape"),
    (lambda x, m: rl.entropy(x, m), r"logits: expected 3 dims \[B, T, V\]"),
    (lambda x, m: rl.entropy(x[..., None], m[:, :3]), r"mask: shape \(4, 3\) does not match logits\[..., 0\] shape"),
])
def test_shape_mismatch_is_named(call, match):
    logp, _, _, mask = _data()
    with pytest.raises(ValueError, match=match):
        call(logp, mask)
