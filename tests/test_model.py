"""Model behaviour without a reference framework: cache/decode exactness, padding invariance,
scan/remat equivalence, Critic."""
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from trsi_jax.config import model_preset
from trsi_jax.models import Critic, Qwen, init_cache
from trsi_jax.models import attention
from trsi_jax.models.attention import attend

# Small GDN chunks so short test sequences cross chunk boundaries.
CONFIGS = {"qwen3_5": dataclasses.replace(model_preset("tiny"), gdn_chunk_size=4),
           "qwen3": model_preset("tiny_qwen3")}


@nnx.jit
def _forward(model, tokens, mask):
    return model(tokens, mask)


@nnx.jit
def _prefill(model, tokens, mask, cache):
    return model.prefill(tokens, mask, cache)


@nnx.jit
def _decode(model, tokens, cache):
    return model.decode_step(tokens, cache)


@nnx.jit
def _values(critic, tokens):
    return critic(tokens)


@pytest.mark.parametrize("arch", ["qwen3_5", "qwen3"])
def test_prefill_then_decode_equals_full_forward(arch):
    cfg = CONFIGS[arch]
    model = Qwen(cfg, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(0)
    prompt_len, n_new = 7, 6
    seq = jnp.asarray(rng.integers(0, cfg.vocab_size, (2, prompt_len + n_new)))
    mask = np.ones((2, prompt_len + n_new), np.int32)
    mask[1, :3] = 0  # row 1: 3 left pads in the prompt
    mask = jnp.asarray(mask)
    full = _forward(model, seq, mask)

    cache = init_cache(cfg, batch=2, max_len=prompt_len + n_new + 2)
    logits, cache = _prefill(model, seq[:, :prompt_len], mask[:, :prompt_len], cache)
    real = np.asarray(mask[:, :prompt_len], bool)
    np.testing.assert_allclose(np.asarray(logits)[real], np.asarray(full[:, :prompt_len])[real], atol=1e-5)
    for t in range(prompt_len, prompt_len + n_new):
        step_logits, cache = _decode(model, seq[:, t], cache)
        np.testing.assert_allclose(step_logits, full[:, t], atol=1e-5, err_msg=f"decode position {t}")
    assert int(cache.length) == prompt_len + n_new
    np.testing.assert_array_equal(cache.pos, mask.sum(1))


def test_continuation_chunk_and_padding_invariance():
    """A multi-token chunk after the prompt (next user turn) equals the full forward, and a
    left-padded row equals the same tokens run unpadded."""
    cfg = CONFIGS["qwen3_5"]
    model = Qwen(cfg, rngs=nnx.Rngs(1))
    seq = jnp.asarray(np.random.default_rng(1).integers(0, cfg.vocab_size, (1, 13)))
    full = _forward(model, seq, jnp.ones_like(seq))
    cache = init_cache(cfg, batch=1, max_len=16)
    _, cache = _prefill(model, seq[:, :6], jnp.ones((1, 6), jnp.int32), cache)
    chunk, _ = _prefill(model, seq[:, 6:], jnp.ones((1, 7), jnp.int32), cache)
    np.testing.assert_allclose(chunk, full[:, 6:], atol=1e-5)

    padded = jnp.concatenate([jnp.zeros((1, 5), seq.dtype), seq], axis=1)
    pmask = jnp.concatenate([jnp.zeros((1, 5), jnp.int32), jnp.ones_like(seq)], axis=1)
    np.testing.assert_allclose(_forward(model, padded, pmask)[:, 5:], full, atol=1e-5)


def _loss_and_grads(cfg, tokens):
    model = Qwen(cfg, rngs=nnx.Rngs(0))

    @nnx.jit
    def run(model):
        def loss(m):
            logits = m(tokens).astype(jnp.float32)
            return jnp.mean(jax.nn.log_softmax(logits)[..., 0]), logits
        return nnx.value_and_grad(loss, has_aux=True)(model)

    (loss, logits), grads = run(model)
    return logits, grads


@pytest.mark.slow
def test_scan_and_remat_do_not_change_results():
    base = CONFIGS["qwen3_5"]
    tokens = jnp.asarray(np.random.default_rng(2).integers(0, base.vocab_size, (2, 9)))
    ref_logits, ref_grads = _loss_and_grads(base, tokens)
    for change in (dict(scan_layers=False), dict(remat="full"), dict(remat="dots")):
        logits, grads = _loss_and_grads(dataclasses.replace(base, **change), tokens)
        np.testing.assert_allclose(logits, ref_logits, atol=1e-6, err_msg=str(change))
        for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
            np.testing.assert_allclose(a, b, atol=1e-6, err_msg=str(change))


def test_critic_from_policy():
    cfg = CONFIGS["qwen3_5"]
    policy = Qwen(cfg, rngs=nnx.Rngs(0))
    critic = Critic.from_policy(policy)
    tokens = jnp.asarray(np.random.default_rng(3).integers(0, cfg.vocab_size, (2, 5)))
    values = _values(critic, tokens)
    assert values.shape == (2, 5) and values.dtype == jnp.float32
    np.testing.assert_array_equal(values, 0.0)  # zero-initialised head
    for a, b in zip(jax.tree.leaves(nnx.state(policy.model)), jax.tree.leaves(nnx.state(critic.model))):
        np.testing.assert_array_equal(a, b)

    # Gradients reach the head and the backbone; updating the critic leaves the policy alone.
    grads = nnx.jit(nnx.grad(lambda c: jnp.sum(c(tokens) - 1.0) ** 2))(critic)
    assert float(jnp.abs(grads.value_head.bias[...]).sum()) > 0
    before = np.asarray(policy.model.norm.scale[...])
    critic.model.norm.scale[...] = critic.model.norm.scale[...] + 1.0
    critic.value_head.kernel[...] = jnp.ones_like(critic.value_head.kernel[...])
    np.testing.assert_array_equal(policy.model.norm.scale[...], before)
    assert float(jnp.abs(_values(critic, tokens)).max()) > 0
    own = Critic(cfg, rngs=nnx.Rngs(5))
    assert own.value_head.kernel.shape == (cfg.hidden_size, 1)


@pytest.mark.parametrize("preset,count", [("qwen3_8_27b", 26_895_998_464), ("qwen3_32b", 32_762_123_264),
                                          ("qwen3_0_6b", 596_049_920)])
def test_full_size_presets_build_abstractly(preset, count):
    """Published sizes (26.9B text params for Qwen3.8-27B), without allocating the weights."""
    model = nnx.eval_shape(lambda: Qwen(model_preset(preset), rngs=nnx.Rngs(0)))
    params = jax.tree.leaves(nnx.state(model, nnx.Param))
    assert sum(int(np.prod(p.shape)) for p in params) == count


@pytest.mark.parametrize("self_keys,max_blocks", [(False, 32), (True, 32), (True, 2)])
def test_blocked_attention_matches_reference(self_keys, max_blocks, monkeypatch):
    """Query blocking (any T, incl. a ragged last block; with self_keys each block reads only the
    keys up to its end, and past MAX_SELF_BLOCKS blocks the blocks grow) == a direct masked
    softmax in NumPy."""
    monkeypatch.setattr(attention, "MAX_SELF_BLOCKS", max_blocks)
    ks = jax.random.split(jax.random.key(0), 3)
    b, t, h, kv, d = 2, 11, 4, 2, 8
    q = jax.random.normal(ks[0], (b, t, h, d))
    k, v = jax.random.normal(ks[1], (b, t, kv, d)), jax.random.normal(ks[2], (b, t, kv, d))
    valid = jnp.asarray(np.arange(t)[None, :] >= np.array([[0], [3]]))  # row 1: 3 left pads
    blocked = jax.jit(attend, static_argnames=("q_block", "self_keys"))(
        q, k.swapaxes(1, 2), v.swapaxes(1, 2), valid, jnp.arange(t), q_block=4, self_keys=self_keys)
    qn, kn, vn = (np.repeat(np.asarray(x), h // x.shape[2], axis=2) for x in (q, k, v))
    logits = np.einsum("bthd,bshd->bhts", qn, kn) / np.sqrt(d)
    allowed = np.asarray(valid)[:, None, None, :] & (np.arange(t)[None, :] <= np.arange(t)[:, None])[None, None]
    logits = np.where(allowed, logits, -1e30)  # pad query rows: finite, ignored below
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    ref = np.einsum("bhts,bshd->bthd", probs / probs.sum(-1, keepdims=True), vn)
    real = np.asarray(valid)
    np.testing.assert_allclose(np.asarray(blocked)[real], ref[real], atol=1e-5)


def test_attention_gradient_matches_autodiff_of_plain_softmax():
    """attend's hand-written backward == autodiff of a plain masked softmax (GQA, padding, blocks)."""
    ks = jax.random.split(jax.random.key(1), 4)
    b, t, h, kv, d = 2, 11, 4, 2, 8
    q = jax.random.normal(ks[0], (b, t, h, d))
    k, v = jax.random.normal(ks[1], (b, t, kv, d)), jax.random.normal(ks[2], (b, t, kv, d))
    w = jax.random.normal(ks[3], (b, t, h, d))
    valid = jnp.asarray(np.arange(t)[None, :] < np.array([[t], [7]]))  # row 1: 4 right pads

    def plain(q, k, v):
        kk, vv = (jnp.repeat(x, h // kv, axis=2) for x in (k, v))
        logits = jnp.einsum("bthd,bshd->bhts", q, kk) / np.sqrt(d)
        allowed = valid[:, None, None, :] & (jnp.arange(t)[None, :] <= jnp.arange(t)[:, None])[None, None]
        probs = jax.nn.softmax(jnp.where(allowed, logits, -1e30), axis=-1)
        return jnp.einsum("bhts,bshd->bthd", probs, vv)

    def loss(fn, *args):
        return jnp.sum(jnp.where(valid[..., None, None], fn(*args), 0.0) * w)

    ours = lambda q, k, v: attend(q, k.swapaxes(1, 2), v.swapaxes(1, 2), valid, jnp.arange(t), q_block=4,  # noqa: E731
                                  self_keys=True)
    g_ours = jax.jit(jax.grad(functools.partial(loss, ours), argnums=(0, 1, 2)))(q, k, v)
    g_ref = jax.jit(jax.grad(functools.partial(loss, plain), argnums=(0, 1, 2)))(q, k, v)
    for a, r in zip(g_ours, g_ref):
        np.testing.assert_allclose(a, r, atol=1e-5)
