"""PPO learner: log-prob/value alignment, warm-up, and equality with a plain reference update."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from trsi_jax import config as C
from trsi_jax.models import Critic, Qwen
from trsi_jax.sharding import make_mesh
from trsi_jax.train.optim import make_optimizer
from trsi_jax.train.ppo import PPOLearner, action_values, token_logprobs, trimmed_width

CFG = C.override(C.model_preset("tiny_qwen3"), {"num_layers": "1"})
OPT = C.OptimConfig(lr=1e-2, schedule="constant", grad_clip=0.0)
B, T = 8, 24


@nnx.jit
def _policy():
    return Qwen(CFG, rngs=nnx.Rngs(0))


def _batch(seed=0):
    """Prompt of 6 tokens, then alternating policy (mask 1) and observation spans; ragged rows."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, CFG.vocab_size, (B, T)).astype(np.int32)
    lengths = rng.integers(12, T + 1, B)
    mask = (np.arange(T)[None] < lengths[:, None]).astype(np.int32)
    policy_mask = np.zeros((B, T), np.int32)
    policy_mask[:, 6:11] = 1
    policy_mask[:, 14:20] = 1
    policy_mask *= mask
    return {"tokens": tokens, "mask": mask, "policy_mask": policy_mask,
            "advantages": (rng.normal(size=(B, T)) * policy_mask).astype(np.float32),
            "returns": (rng.normal(size=(B, T)) * policy_mask).astype(np.float32)}


def _learner(mesh, ppo=C.PPOConfig(minibatch_size=8, epochs=1, whiten_advantages=False)):
    policy = _policy()
    return PPOLearner(policy, Critic.from_policy(policy, seed=1), ppo, OPT, OPT, mesh)


def _host(tree):
    return jax.tree.map(np.asarray, jax.device_get(nnx.to_pure_dict(tree)))


def test_alignment_of_logprobs_and_values():
    logits = jnp.asarray(np.random.default_rng(0).normal(size=(2, 5, 7)), jnp.float32)
    tokens = jnp.asarray([[1, 2, 3, 4, 5], [6, 0, 1, 2, 3]])
    logp = np.asarray(token_logprobs(logits, tokens))
    ref = np.asarray(jax.nn.log_softmax(logits, -1))
    assert logp[0, 0] == 0 and logp[1, 0] == 0
    for b in range(2):
        for t in range(1, 5):
            np.testing.assert_allclose(logp[b, t], ref[b, t - 1, tokens[b, t]], rtol=1e-6)
    values = jnp.arange(10.0).reshape(2, 5)
    np.testing.assert_array_equal(action_values(values), [[0, 0, 1, 2, 3], [0, 5, 6, 7, 8]])


def test_trimmed_width_keeps_every_real_token():
    mask = np.zeros((3, 1536), np.int32)
    assert trimmed_width(mask) == 128
    mask[0, :129] = 1
    assert trimmed_width(mask) == 192
    mask[2, :700] = 1
    assert trimmed_width(mask) == 768
    mask[2, :769] = 1
    assert trimmed_width(mask) == 1024
    mask[1, :1100] = 1
    assert trimmed_width(mask) == 1536  # never wider than the batch
    assert trimmed_width(mask[:, :100], minimum=128) == 100


def test_minibatches_cut_to_their_rows_change_nothing_but_the_work():
    """Score + update on a batch padded with 200 more columns == on the batch itself: the extra
    pad columns are cut away per minibatch, and scores come back at the batch's width."""
    mesh = make_mesh(C.MeshConfig(data=1, fsdp=1, tensor=1), devices=jax.devices()[:1])
    ppo = C.PPOConfig(minibatch_size=4, epochs=1, whiten_advantages=False)
    learners = [_learner(mesh, ppo), _learner(mesh, ppo)]
    batch = _batch()
    wide = {k: np.pad(v, ((0, 0), (0, 200))) for k, v in batch.items()}
    scores = [learners[0].score(batch), learners[1].score(wide)]
    assert scores[1]["old_logprobs"].shape == (B, T + 200) and not scores[1]["old_values"][:, T:].any()
    for k in scores[0]:
        np.testing.assert_allclose(scores[1][k][..., :T] if k != "cut_values" else scores[1][k], scores[0][k],
                                   atol=1e-6)
    m0 = learners[0].update({**batch, **scores[0]}, seed=0, train_policy=True)
    m1 = learners[1].update({**wide, **scores[1]}, seed=0, train_policy=True)
    assert m0["policy/loss"] == pytest.approx(m1["policy/loss"], abs=1e-6)
    # As in test_update_equals_plain_reference: Adam divides by |g|, so where g ~ 0 the rounding of
    # other shapes may move a weight by up to one step (lr); everything else agrees to float rounding.
    for a, b in ((learners[0].policy_params, learners[1].policy_params),
                 (learners[0].critic_params, learners[1].critic_params)):
        a, b = jax.tree.leaves(_host(a)), jax.tree.leaves(_host(b))
        close = np.concatenate([np.isclose(x, y, atol=2e-5, rtol=1e-4).ravel() for x, y in zip(a, b)])
        assert close.mean() > 0.999, close.mean()
        for x, y in zip(a, b):
            np.testing.assert_allclose(x, y, atol=2 * OPT.lr)


@pytest.mark.slow
def test_warmup_leaves_policy_bitwise_unchanged_and_trains_critic(devices8):
    mesh = make_mesh(C.MeshConfig(data=2, fsdp=4, tensor=1))
    learner = _learner(mesh, C.PPOConfig(minibatch_size=8, epochs=2))
    batch = _batch()
    batch.update(learner.score(batch))
    policy0, critic0 = _host(learner.policy_params), _host(learner.critic_params)
    opt0 = jax.device_get(learner.policy_opt)
    metrics = learner.update(batch, seed=0, train_policy=False)
    assert "policy/loss" not in metrics and np.isfinite(metrics["critic/loss"])
    jax.tree.map(np.testing.assert_array_equal, _host(learner.policy_params), policy0)
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(learner.policy_opt), opt0)
    changed = jax.tree.leaves(jax.tree.map(lambda a, b: not np.array_equal(a, b),
                                           _host(learner.critic_params), critic0))
    assert any(changed)
    # After the warm-up both models move.
    metrics = learner.update(batch, seed=1, train_policy=True)
    assert np.isfinite(metrics["policy/loss"]) and metrics["ppo/minibatch_steps"] == 2
    changed = jax.tree.leaves(jax.tree.map(lambda a, b: not np.array_equal(a, b),
                                           _host(learner.policy_params), policy0))
    assert any(changed)


@pytest.mark.slow
def test_update_equals_plain_reference(devices8):
    """Two PPO epochs on a sharded mesh == the textbook clipped losses + AdamW written out here,
    on one device."""
    mesh = make_mesh(C.MeshConfig(data=1, fsdp=8, tensor=1))
    ppo = C.PPOConfig(minibatch_size=8, epochs=2, clip_eps=0.2, value_clip_eps=0.2, whiten_advantages=False)
    learner = _learner(mesh, ppo)
    batch = _batch(1)
    batch.update(learner.score(batch))

    policy = _policy()
    critic = Critic.from_policy(policy, seed=1)
    pg, pp, pr = nnx.split(policy, nnx.Param, ...)
    cg, cp, cr = nnx.split(critic, nnx.Param, ...)
    jb = {k: jnp.asarray(v) for k, v in batch.items()}
    m = jb["policy_mask"].astype(jnp.float32)
    n = m.sum()

    def policy_loss(p):
        logits = nnx.merge(pg, p, pr)(jb["tokens"], jb["mask"])
        logp = jnp.pad(jnp.take_along_axis(jax.nn.log_softmax(logits[:, :-1], -1),
                                           jb["tokens"][:, 1:, None], -1)[..., 0], ((0, 0), (1, 0)))
        ratio = jnp.exp(logp - jb["old_logprobs"])
        a = jb["advantages"]
        return -(jnp.minimum(ratio * a, jnp.clip(ratio, 0.8, 1.2) * a) * m).sum() / n

    def value_loss(p):
        v = nnx.merge(cg, p, cr)(jb["tokens"], jb["mask"])
        v = jnp.pad(v[:, :-1], ((0, 0), (1, 0)))
        old, ret = jb["old_values"], jb["returns"]
        clipped = old + jnp.clip(v - old, -0.2, 0.2)
        return 0.5 * (jnp.maximum((v - ret) ** 2, (clipped - ret) ** 2) * m).sum() / n

    for loss, params in ((policy_loss, pp), (value_loss, cp)):
        tx = make_optimizer(OPT)
        state = tx.init(params)
        for _ in range(2):
            updates, state = tx.update(jax.grad(loss)(params), state, params)
            params = optax.apply_updates(params, updates)
        if loss is policy_loss:
            pp = params
        else:
            cp = params
    learner.update(batch, seed=0, train_policy=True)
    # Adam divides by |g|: where a gradient is ~0 (rare tokens' embedding rows), the sharded and
    # single-device reductions may differ in sign at fp32 rounding level, moving that weight by
    # up to one step (lr). Everything else agrees to float rounding.
    for got, want in ((learner.policy_params, pp), (learner.critic_params, cp)):
        got, want = jax.tree.leaves(_host(got)), jax.tree.leaves(_host(want))
        close = np.concatenate([np.isclose(a, b, atol=2e-5, rtol=1e-4).ravel() for a, b in zip(got, want)])
        assert close.mean() > 0.999, close.mean()
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, atol=2 * OPT.lr)


def test_bad_configs_are_refused(devices8):
    mesh = make_mesh(C.MeshConfig(data=1, fsdp=8, tensor=1))
    policy = _policy()
    with pytest.raises(ValueError, match="reference policy"):
        PPOLearner(policy, Critic.from_policy(policy), C.PPOConfig(kl_coef=0.1, minibatch_size=8), OPT, OPT, mesh)
    with pytest.raises(ValueError, match="minibatch_size=4 must be a multiple"):
        PPOLearner(policy, Critic.from_policy(policy), C.PPOConfig(minibatch_size=4), OPT, OPT, mesh)


@pytest.mark.slow
def test_reference_kl_is_scored_and_penalised(devices8):
    """With kl_coef > 0 the frozen reference's log-probs enter the batch; at the start they equal
    the policy's (same weights), and after a policy step the k3 KL is positive."""
    mesh = make_mesh(C.MeshConfig(data=1, fsdp=8, tensor=1))
    policy = _policy()
    ppo = C.PPOConfig(minibatch_size=8, epochs=2, kl_coef=0.5, kl_kind="k3", whiten_advantages=False)
    learner = PPOLearner(policy, Critic.from_policy(policy), ppo, OPT, OPT, mesh, reference=_policy())
    batch = _batch(2)
    scored = learner.score(batch)
    np.testing.assert_array_equal(scored["ref_logprobs"], scored["old_logprobs"])
    batch.update(scored)
    metrics = learner.update(batch, seed=0, train_policy=True)
    assert metrics["policy/ref_kl"] > 0 and np.isfinite(metrics["policy/loss"])


@pytest.mark.slow
def test_learner_old_logprobs_are_the_samplers(devices8):
    """The learner's old log-probs of sampled tokens equal what the sampler recorded when it drew
    them at temperature 0.7 within the tokenizer's vocabulary (the model's vocab is padded past it);
    raw temperature-1 scoring over the padded vocab would not."""
    from trsi_jax.rollout import ByteTokenizer, ModelPolicy, SampleConfig, encode_prompt

    tok = ByteTokenizer()
    assert tok.vocab_size < CFG.vocab_size
    mesh = make_mesh(C.MeshConfig(data=1, fsdp=8, tensor=1))
    policy = _policy()
    sampler = ModelPolicy(policy, tok, SampleConfig(temperature=0.7, max_new_tokens=24), max_len=128, seed=3)
    conv = [{"role": "system", "content": "You are a shell agent."}, {"role": "user", "content": "List files."}]
    prompt = encode_prompt(conv, tok)
    replies = sampler.act([conv] * 8)
    tokens, mask = np.zeros((8, 128), np.int32), np.zeros((8, 128), np.int32)
    for b, r in enumerate(replies):
        row = prompt + r.tokens
        tokens[b, :len(row)], mask[b, :len(row)] = row, 1
    batch = {"tokens": tokens, "mask": mask}
    ppo = C.PPOConfig(minibatch_size=8, epochs=1)
    learner = PPOLearner(policy, Critic.from_policy(policy), ppo, OPT, OPT, mesh, temperature=0.7,
                         vocab_limit=tok.vocab_size)
    scored = learner.score(batch)
    matched = scored["old_logprobs"]
    raw = PPOLearner(_policy(), Critic.from_policy(_policy()), ppo, OPT, OPT, mesh).score(batch)["old_logprobs"]
    worst = 0.0
    for b, r in enumerate(replies):
        span = slice(len(prompt), len(prompt) + len(r.tokens))
        np.testing.assert_allclose(matched[b, span], r.logprobs, atol=2e-5, rtol=0)
        worst = max(worst, float(np.abs(raw[b, span] - np.asarray(r.logprobs)).max()))
    assert worst > 0.1
    # The loss scores the new policy the same way: before the first step the ratio is exactly 1.
    policy_mask = np.zeros_like(mask)
    for b, r in enumerate(replies):
        policy_mask[b, len(prompt):len(prompt) + len(r.tokens)] = 1
    adv = np.random.default_rng(0).normal(size=mask.shape).astype(np.float32) * policy_mask
    metrics = learner.update({**batch, **scored, "policy_mask": policy_mask, "advantages": adv,
                              "returns": np.zeros_like(adv)}, seed=0, train_policy=True)
    assert metrics["policy/ratio_mean"] == pytest.approx(1.0, abs=1e-6) and metrics["policy/clip_frac"] == 0.0
    assert np.isfinite(metrics["policy/entropy"]) and metrics["policy/entropy"] > 0
