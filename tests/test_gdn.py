"""Gated delta rule: chunked WY form == recurrent form == a plain NumPy loop; streaming conv."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from trsi_jax.models import gated_deltanet

chunk_gated_delta_rule = jax.jit(gated_deltanet.chunk_gated_delta_rule, static_argnames="chunk")
recurrent_gated_delta_rule = jax.jit(gated_deltanet.recurrent_gated_delta_rule)
causal_conv1d = jax.jit(gated_deltanet.causal_conv1d)


def _inputs(t, b=2, hk=2, hv=4, dk=8, dv=6, seed=0):
    ks = jax.random.split(jax.random.key(seed), 6)
    q = jax.random.normal(ks[0], (b, t, hk, dk))
    k = jax.random.normal(ks[1], (b, t, hk, dk))
    v = jax.random.normal(ks[2], (b, t, hv, dv))
    g = -jax.nn.softplus(jax.random.normal(ks[3], (b, t, hv)))
    beta = jax.nn.sigmoid(jax.random.normal(ks[4], (b, t, hv)))
    s0 = jax.random.normal(ks[5], (b, hv, dk, dv)) * 0.1
    return q, k, v, g, beta, s0


def _numpy_reference(q, k, v, g, beta, s0):
    """The defining recurrence, token by token, in float64."""
    q, k, v, g, beta, s = (np.asarray(x, np.float64) for x in (q, k, v, g, beta, s0))
    rep = v.shape[2] // q.shape[2]
    q, k = (np.repeat(x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6), rep, axis=2) for x in (q, k))
    q = q / np.sqrt(q.shape[-1])
    out = np.zeros(v.shape)
    for t in range(v.shape[1]):
        for b in range(v.shape[0]):
            for h in range(v.shape[2]):
                st = s[b, h] * np.exp(g[b, t, h])
                delta = beta[b, t, h] * (v[b, t, h] - st.T @ k[b, t, h])
                s[b, h] = st + np.outer(k[b, t, h], delta)
                out[b, t, h] = s[b, h].T @ q[b, t, h]
    return out, s


@pytest.mark.parametrize("t,chunk", [(1, 16), (37, 16), (130, 64)])
def test_chunked_equals_recurrent_and_numpy(t, chunk):
    q, k, v, g, beta, s0 = _inputs(t)
    o_c, s_c = chunk_gated_delta_rule(q, k, v, g, beta, s0, chunk=chunk)
    o_r, s_r = recurrent_gated_delta_rule(q, k, v, g, beta, s0)
    np.testing.assert_allclose(o_c, o_r, atol=2e-5, rtol=1e-4)
    np.testing.assert_allclose(s_c, s_r, atol=2e-5, rtol=1e-4)
    o_np, s_np = _numpy_reference(q[:1, :40], k[:1, :40], v[:1, :40], g[:1, :40], beta[:1, :40], s0[:1])
    np.testing.assert_allclose(o_r[:1, :40], o_np, atol=2e-5, rtol=1e-4)
    if t <= 40:
        np.testing.assert_allclose(s_r[:1], s_np, atol=2e-5, rtol=1e-4)


def test_chunked_state_carries_across_calls():
    q, k, v, g, beta, s0 = _inputs(37)
    o_full, s_full = chunk_gated_delta_rule(q, k, v, g, beta, s0, chunk=16)
    # Split so both pieces pad their last chunk: 17 + 20 (the state must pass through padding).
    o_a, s_a = chunk_gated_delta_rule(q[:, :17], k[:, :17], v[:, :17], g[:, :17], beta[:, :17], s0, chunk=16)
    o_b, s_b = chunk_gated_delta_rule(q[:, 17:], k[:, 17:], v[:, 17:], g[:, 17:], beta[:, 17:], s_a, chunk=16)
    np.testing.assert_allclose(jnp.concatenate([o_a, o_b], 1), o_full, atol=2e-5, rtol=1e-4)
    np.testing.assert_allclose(s_b, s_full, atol=2e-5, rtol=1e-4)


def test_zero_beta_and_decay_leave_state_unchanged():
    q, k, v, g, beta, s0 = _inputs(1)
    _, s = recurrent_gated_delta_rule(q, k, v, jnp.zeros_like(g), jnp.zeros_like(beta), s0)
    np.testing.assert_array_equal(s, s0)


def test_causal_conv_streaming_matches_whole_sequence():
    x = jax.random.normal(jax.random.key(1), (2, 9, 5))
    w = jax.random.normal(jax.random.key(2), (4, 5))
    y_full, tail = causal_conv1d(x, w)
    y1, p1 = causal_conv1d(x[:, :4], w)
    ys = [y1]
    for i in range(4, 9):
        y_i, p1 = causal_conv1d(x[:, i:i + 1], w, p1)
        ys.append(y_i)
    np.testing.assert_allclose(jnp.concatenate(ys, 1), y_full, atol=1e-6)
    np.testing.assert_array_equal(p1, tail)
    np.testing.assert_array_equal(tail, x[:, -3:])
    # Direct definition: y_t = silu(sum_j w_j x_{t-3+j}).
    xp = np.pad(np.asarray(x), [(0, 0), (3, 0), (0, 0)])
    ref = sum(xp[:, j:j + 9] * np.asarray(w)[j] for j in range(4))
    np.testing.assert_allclose(y_full, ref / (1 + np.exp(-ref)), atol=1e-5)


def test_causal_conv_continues_past_left_pads():
    """A left-padded continuation (pads between the cached prefix and the new inputs) gives each row
    what its unpadded continuation gives, and the same new prefix."""
    x = jax.random.normal(jax.random.key(1), (2, 4, 5))
    w = jax.random.normal(jax.random.key(2), (4, 5))
    _, prefix = causal_conv1d(x, w)
    pads = [3, 0]  # row 0: 3 pads, then 5 new inputs; row 1: 8 new inputs
    x_new = jax.random.normal(jax.random.key(3), (2, 8, 5)).at[0, :3].set(0.0)
    y, tail = jax.jit(gated_deltanet.causal_conv1d)(x_new, w, prefix, jnp.array(pads))
    for b, p in enumerate(pads):
        y_ref, tail_ref = causal_conv1d(x_new[b:b + 1, p:], w, prefix[b:b + 1])
        np.testing.assert_allclose(y[b, p:], y_ref[0], atol=1e-6)
        np.testing.assert_array_equal(tail[b], tail_ref[0])


@pytest.mark.slow
def test_pallas_chunk_scan_matches_jax_scan():
    """The Pallas scan kernel (interpret mode on CPU) == the lax.scan reference, values and grads;
    T=37 in chunks of 16 (a padded last chunk), one row, two heads to keep interpret mode fast;
    Dv=64 runs two value-column blocks."""
    t, chunk = 37, 16
    q, k, v, g, beta, s0 = _inputs(t, b=1, hk=1, hv=2, dk=16, dv=64)
    fwd = jax.jit(gated_deltanet.chunk_gated_delta_rule, static_argnames=("chunk", "impl"))
    o_j, s_j = fwd(q, k, v, g, beta, s0, chunk=chunk, impl="jax")
    o_p, s_p = fwd(q, k, v, g, beta, s0, chunk=chunk, impl="pallas")
    np.testing.assert_allclose(o_p, o_j, atol=2e-5, rtol=1e-4)
    np.testing.assert_allclose(s_p, s_j, atol=2e-5, rtol=1e-4)

    def loss(impl, v_):
        o, s = gated_deltanet.chunk_gated_delta_rule(q, k, v_, g, beta, s0, chunk=chunk, impl=impl)
        return (o ** 2).sum() + s.sum()

    grads = [jax.jit(jax.grad(functools.partial(loss, impl)))(v) for impl in ("jax", "pallas")]
    np.testing.assert_allclose(grads[1], grads[0], atol=2e-5, rtol=1e-4)
