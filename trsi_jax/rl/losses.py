"""PPO losses over [B, T] token arrays, each a token-mean over the policy mask.

Every function returns `(scalar, metrics)` with `metrics` a small dict of scalars for logging.
Shapes are checked at trace time (free under jit); the mask is taken as 0/1 and values as
finite (check host arrays with `checks` if they come from outside the model).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from trsi_jax.rl import checks


def masked_mean(x, mask):
    """Σ m·x / max(Σ m, 1): the token mean over masked tokens (0 for an empty mask)."""
    m = mask.astype(x.dtype)
    return jnp.sum(x * m) / jnp.maximum(jnp.sum(m), 1)


def masked_var(x, mask):
    """Population variance of x over masked tokens."""
    mu = masked_mean(x, mask)
    return masked_mean((x - mu) ** 2, mask)


def _same_shapes(**arrays):
    (first, x0), *rest = arrays.items()
    for name, x in rest:
        checks.check_shape(name, x, jnp.shape(x0), first)


def whiten(x, mask, shift_mean: bool = True, eps: float = 1e-8):
    """(x − μ) / √(σ² + ε) with μ, σ² over masked entries; 0 outside the mask.

    shift_mean=False only rescales (keeps the sign of every advantage, as some PPO variants do).
    """
    _same_shapes(x=x, mask=mask)
    mu, var = masked_mean(x, mask), masked_var(x, mask)
    y = (x - mu if shift_mean else x) * jax.lax.rsqrt(var + eps)
    return jnp.where(mask > 0, y, 0.0)


def policy_loss(logp, old_logp, adv, mask, clip_eps: float = 0.2):
    """Clipped surrogate: mean over m of −min(ρ A, clip(ρ, 1−ε, 1+ε) A), ρ = exp(logp − old_logp).

    Metrics: clip_frac (tokens with |ρ − 1| > ε), approx_kl (k3 estimate of KL(old‖new):
    mean of (ρ − 1) − log ρ), ratio_mean.
    """
    _same_shapes(logp=logp, old_logp=old_logp, adv=adv, mask=mask)
    log_ratio = logp - old_logp
    ratio = jnp.exp(log_ratio)
    surrogate = jnp.minimum(ratio * adv, jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * adv)
    loss = -masked_mean(surrogate, mask)
    metrics = {
        "clip_frac": masked_mean((jnp.abs(ratio - 1.0) > clip_eps).astype(ratio.dtype), mask),
        "approx_kl": masked_mean(ratio - 1.0 - log_ratio, mask),
        "ratio_mean": masked_mean(ratio, mask),
    }
    return loss, metrics


def value_loss(values, old_values, returns, mask, clip_eps: float = 0.2):
    """Clipped value loss: ½ mean over m of max((V − R)², (V_old + clip(V − V_old, ±ε) − R)²).

    Metrics: explained_variance = 1 − Var(R − V)/Var(R) over m (NaN if Var(R) = 0),
    clip_frac (tokens where the clipped term is the larger), value_mean, return_mean.
    """
    _same_shapes(values=values, old_values=old_values, returns=returns, mask=mask)
    v_clipped = old_values + jnp.clip(values - old_values, -clip_eps, clip_eps)
    sq, sq_clipped = (values - returns) ** 2, (v_clipped - returns) ** 2
    loss = 0.5 * masked_mean(jnp.maximum(sq, sq_clipped), mask)
    var_ret = masked_var(returns, mask)
    metrics = {
        "explained_variance": jnp.where(var_ret > 0, 1.0 - masked_var(returns - values, mask) / var_ret, jnp.nan),
        "clip_frac": masked_mean((sq_clipped > sq).astype(sq.dtype), mask),
        "value_mean": masked_mean(values, mask),
        "return_mean": masked_mean(returns, mask),
    }
    return loss, metrics


KL_KINDS = ("k1", "k2", "k3")


def kl_penalty(logp, ref_logp, mask, kind: str = "k3"):
    """KL penalty between the policy π and the reference π_ref, token-mean over m, from the
    log-probs of tokens sampled from π. With log r = logp − ref_logp (per token):

    - "k1": value log r, an unbiased estimate of KL(π‖π_ref). Its gradient is taken through the
      score function, sg(log r)·∇logp, whose expectation is ∇KL(π‖π_ref). (The plain term
      log r has gradient ∇logp, whose expectation under π is 0: it would not pull π anywhere.)
    - "k2": value ½(log r)², a biased estimate of KL(π‖π_ref) (≥ 0); gradient log r·∇logp, the
      same unbiased ∇KL(π‖π_ref) as k1.
    - "k3": value 1/r − 1 + log r, an unbiased, always ≥ 0 estimate of KL(π‖π_ref); but its
      gradient (1 − π_ref/π)·∇logp has expectation ∇KL(π_ref‖π): it optimises the *reverse* KL.

    Expectations are on-policy (tokens from the current π); later PPO epochs reuse the sampled
    tokens, as the surrogate does.
    """
    _same_shapes(logp=logp, ref_logp=ref_logp, mask=mask)
    checks.check_choice("kind", kind, KL_KINDS)
    log_r = logp - ref_logp
    if kind == "k1":
        sg = jax.lax.stop_gradient
        per_token = sg(log_r) * (1.0 + logp - sg(logp))  # value log r, gradient sg(log r)·∇logp
    elif kind == "k2":
        per_token = 0.5 * log_r ** 2
    else:
        per_token = jnp.exp(-log_r) - 1.0 + log_r
    kl = masked_mean(per_token, mask)
    return kl, {f"kl_{kind}": kl}


# Logit of ids the sampler never draws: finite, so that exp gives exactly 0 and p·log p is 0 (not NaN).
MASKED_LOGIT = -1e30


def sampling_logits(logits, temperature: float = 1.0, vocab_limit: int = 0):
    """The logits of the distribution the sampler draws from, in fp32: logits / temperature, with
    ids ≥ vocab_limit (padding of the model's vocabulary beyond the tokenizer's) set to
    MASKED_LOGIT; vocab_limit 0 keeps every id. Temperature 0 (greedy) has no density and is
    scored at temperature 1. Top-p/top-k truncation is deliberately not part of it: a token's
    log-prob under a truncated policy is −inf whenever the new policy's cut moves past it, so the
    PPO ratio, entropy and KL use the tempered, vocabulary-limited distribution before truncation
    (exact for RPR's default top_p = 1, top_k = 0).
    """
    z = logits.astype(jnp.promote_types(logits.dtype, jnp.float32))
    if temperature > 0:
        z = z / temperature
    if 0 < vocab_limit < z.shape[-1]:
        z = jnp.where(jnp.arange(z.shape[-1]) < vocab_limit, z, MASKED_LOGIT)
    return z


def entropy(logits_BTV, mask_BT):
    """Mean over m of the policy entropy H = logsumexp(z) − Σ softmax(z)·z, computed in fp32.

    Returned as a positive number: an entropy bonus enters the total loss as −coef · entropy.
    """
    checks.check_ndim("logits", logits_BTV, 3, "[B, T, V]")
    checks.check_shape("mask", mask_BT, jnp.shape(logits_BTV)[:2], "logits[..., 0]")
    z = logits_BTV.astype(jnp.promote_types(logits_BTV.dtype, jnp.float32))
    logp = jax.nn.log_softmax(z, axis=-1)
    h = -jnp.sum(jnp.exp(logp) * logp, axis=-1)
    ent = masked_mean(h, mask_BT)
    return ent, {"entropy": ent}
