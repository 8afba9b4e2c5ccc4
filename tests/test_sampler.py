"""JAX sampler against the plain full-sequence forward, batch vs single, stops, limits, sharding."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from trsi_jax.config import MeshConfig, model_preset
from trsi_jax.models import Qwen
from trsi_jax.rollout.sampler import SampleConfig, Sampler, sample_tokens

PROMPTS = [[5, 17, 200, 3, 99, 42, 7], [300, 11], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]]
GREEDY = SampleConfig(temperature=0.0, max_new_tokens=10)
# One Gated DeltaNet layer and one full-attention layer: both cache kinds, quick to compile.
CFG = dataclasses.replace(model_preset("tiny"), num_layers=2, full_attention_interval=2)


@pytest.fixture(scope="module")
def model():
    return Qwen(CFG, rngs=nnx.Rngs(3))


def reference_greedy(model, prompt, n):
    """Greedy decoding by re-running the whole sequence each step (no cache). The sequence is
    right-padded to a fixed length so one compiled forward serves every step (the model is causal)."""
    forward = nnx.jit(lambda m, t: m(t))
    seq, logps = list(prompt), []
    for _ in range(n):
        logits_V = forward(model, jnp.asarray([seq + [0] * (32 - len(seq))]))[0, len(seq) - 1]
        tok = int(jnp.argmax(logits_V))
        logps.append(float(jax.nn.log_softmax(logits_V)[tok]))
        seq.append(tok)
    return seq[len(prompt):], logps


def test_greedy_equals_full_forward_argmax_and_logprobs(model):
    out = Sampler(model, max_len=64).generate(PROMPTS, GREEDY, jax.random.key(0))
    for prompt, (toks, logps) in zip(PROMPTS, out):
        ref_toks, ref_logps = reference_greedy(model, prompt, GREEDY.max_new_tokens)
        assert toks == ref_toks
        np.testing.assert_allclose(logps, ref_logps, atol=2e-5)


def test_batch_equals_one_at_a_time(model):
    sampler = Sampler(model, max_len=64)
    batch = sampler.generate(PROMPTS, GREEDY, jax.random.key(0))
    for prompt, (toks, logps) in zip(PROMPTS, batch):
        (single_toks, single_logps), = sampler.generate([prompt], GREEDY, jax.random.key(0))
        assert toks == single_toks
        np.testing.assert_allclose(logps, single_logps, atol=2e-5)


def test_cached_turns_equal_a_full_reprefill(model):
    """Three turns of three conversations: continuing each row from its kept cache (only the new
    tokens prefilled; one row starts fresh each turn; rows stop at different steps, so finished
    rows keep decoding) samples exactly what re-prefilling the whole conversation samples, with
    log-probs equal up to float rounding."""
    sampler = Sampler(model, max_len=128)
    cfg = dataclasses.replace(GREEDY, max_new_tokens=6)
    rng = np.random.default_rng(0)
    convs, kept = [list(p) for p in PROMPTS], None
    for turn in range(3):
        full = sampler.generate(convs, cfg, jax.random.key(turn), max_new_tokens=[6, 3, 5])
        if kept is not None:
            assert all(x.tokens == tuple(c[:len(x.tokens)]) and len(x.tokens) < len(c) for x, c in zip(kept, convs))
            kept[turn] = None  # this row is prefilled whole, next to cached ones
        cached, kept = sampler.generate_cached(convs, cfg, jax.random.key(turn), [6, 3, 5], kept, keep=True)
        for (toks, logps), (c_toks, c_logps) in zip(full, cached):
            assert c_toks == toks
            np.testing.assert_allclose(c_logps, logps, atol=2e-5)
        for c, x, (toks, _) in zip(convs, kept, full):
            assert x.tokens == tuple(c + toks) and x.k.shape[2] == len(x.tokens)
        convs = [c + toks + rng.integers(1, 500, size=4 + 5 * b).tolist()
                 for b, (c, (toks, _)) in enumerate(zip(convs, full))]


def test_rows_stop_independently_on_stop_ids_and_limits(model):
    sampler = Sampler(model, max_len=64)
    free = sampler.generate(PROMPTS, GREEDY, jax.random.key(0))
    stop = free[0][0][3]  # the 4th token row 0 produces
    cfg = dataclasses.replace(GREEDY, stop_ids=(stop,))
    out = sampler.generate(PROMPTS, cfg, jax.random.key(0), max_new_tokens=[10, 10, 2])
    for (toks, logps), (ftoks, flogps), cap in zip(out, free, [10, 10, 2]):
        n = min(ftoks.index(stop) + 1 if stop in ftoks else cap, cap)
        assert toks == ftoks[:n] and len(logps) == n  # a stop token is included, nothing after it
    assert out[0][0][-1] == stop and len(out[0][0]) <= 4
    assert len(out[2][0]) <= 2


@pytest.mark.slow
def test_each_row_gets_the_room_its_own_prompt_leaves(model):
    """Room is per row: a long prompt in the batch never cuts a short prompt's reply, and a prompt
    near max_len still gets exactly max_len minus its own length."""
    sampler, never_stops = Sampler(model, max_len=24), dataclasses.replace(GREEDY, max_new_tokens=12)
    prompt = list(range(1, 13))  # bucket 16, yet 12 tokens of room remain
    (toks, logps), = sampler.generate([prompt], never_stops, jax.random.key(0))
    ref_toks, ref_logps = reference_greedy(model, prompt, 12)
    assert toks == ref_toks
    np.testing.assert_allclose(logps, ref_logps, atol=2e-5)
    # The 20-token row has 4 tokens of room and asks 3; the 3-token row next to it still gets all 12,
    # identical to decoding it alone.
    out = sampler.generate([[7, 8, 9], list(range(1, 21))], never_stops, jax.random.key(0), max_new_tokens=[12, 3])
    assert [len(t) for t, _ in out] == [12, 3]
    assert out[0][0] == reference_greedy(model, [7, 8, 9], 12)[0]
    with pytest.raises(ValueError, match="max_len=24"):
        sampler.generate([list(range(1, 25))], GREEDY, jax.random.key(0))
    (toks, _), = sampler.generate([list(range(1, 24))], GREEDY, jax.random.key(0))
    assert len(toks) == 1  # a prompt of max_len - 1 tokens still gets its one token


@pytest.mark.slow
def test_sampling_is_seeded_and_top_k_1_is_greedy(model):
    sampler = Sampler(model, max_len=64)
    hot = SampleConfig(temperature=1.0, max_new_tokens=10)
    a = sampler.generate(PROMPTS, hot, jax.random.key(1))
    assert a == sampler.generate(PROMPTS, hot, jax.random.key(1))
    assert a != sampler.generate(PROMPTS, hot, jax.random.key(2))
    k1 = sampler.generate(PROMPTS, dataclasses.replace(hot, top_k=1), jax.random.key(1))
    assert [t for t, _ in k1] == [t for t, _ in sampler.generate(PROMPTS, GREEDY, jax.random.key(0))]


def test_sample_tokens_follows_the_filtered_distribution():
    logits_V = jnp.log(jnp.asarray([0.5, 0.3, 0.15, 0.05]))
    logits_NV = jnp.broadcast_to(logits_V, (20000, 4))
    rng = jax.random.key(0)

    def freq(**kw):
        toks = sample_tokens(logits_NV, rng, **kw)
        return np.bincount(np.asarray(toks), minlength=4) / len(toks)

    np.testing.assert_allclose(freq(temperature=1.0, top_p=1.0, top_k=0), [0.5, 0.3, 0.15, 0.05], atol=0.015)
    np.testing.assert_allclose(freq(temperature=1.0, top_p=1.0, top_k=2), [0.625, 0.375, 0, 0], atol=0.015)
    # top_p=0.7: keep tokens whose preceding mass is < 0.7 -> {0, 1}; 0.85 -> {0, 1, 2}
    np.testing.assert_allclose(freq(temperature=1.0, top_p=0.7, top_k=0), [0.625, 0.375, 0, 0], atol=0.015)
    np.testing.assert_allclose(freq(temperature=1.0, top_p=0.85, top_k=0), np.asarray([0.5, 0.3, 0.15, 0]) / 0.95,
                               atol=0.015)
    np.testing.assert_allclose(freq(temperature=1.0, top_p=1.0, top_k=0, vocab_limit=2), [0.625, 0.375, 0, 0],
                               atol=0.015)
    assert set(np.asarray(sample_tokens(logits_NV, rng, 0.0, 1.0, 0, vocab_limit=1)).tolist()) == {0}
    p2 = np.asarray([0.5, 0.3, 0.15, 0.05]) ** 2
    np.testing.assert_allclose(freq(temperature=0.5, top_p=1.0, top_k=0), p2 / p2.sum(), atol=0.015)


@pytest.mark.slow
def test_runs_unchanged_with_sharded_params_and_batch(model, devices8):
    from trsi_jax import sharding

    mesh = sharding.make_mesh(MeshConfig(data=2, fsdp=2, tensor=2), devices8)
    sharded = nnx.clone(model)
    graphdef, state = nnx.split(sharded)
    nnx.update(sharded, sharding.shard_params(state, mesh))
    leaf = jax.tree_util.tree_leaves(nnx.state(sharded))[0]
    assert len(leaf.sharding.device_set) == 8
    expected = Sampler(model, max_len=64).generate(PROMPTS, GREEDY, jax.random.key(0))
    out = Sampler(sharded, max_len=64, mesh=mesh).generate(PROMPTS, GREEDY, jax.random.key(0))
    assert [t for t, _ in out] == [t for t, _ in expected]
    np.testing.assert_allclose([l for _, ls in out for l in ls], [l for _, ls in expected for l in ls], atol=2e-5)
