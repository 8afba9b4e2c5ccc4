"""Episodes -> PPO arrays: padding, reward placement (SPR on the last policy token, FDR on turn ends)."""
import numpy as np
import pytest

from trsi_jax import rl
from trsi_jax.rollout import Episode
from trsi_jax.rpr.batch import bootstrap_truncated, episodes_to_batch


def _episode(family, turns, strict, partial, progress, outcome="failure"):
    """system/user prompt (5 tokens), then per turn: 3 policy tokens + 2 observation tokens."""
    tokens, mask, turn_ids, ends = [1] * 5, [0] * 5, [-1] * 5, []
    for k in range(turns):
        tokens += [2, 3, 4, 5, 6]
        mask += [1, 1, 1, 0, 0]
        turn_ids += [k] * 5
        ends.append(len(tokens) - 3)
    return Episode(task_id=f"{family}-0", family=family, harness="common", messages=[], tokens=tokens,
                   policy_mask=mask, turn_ids=turn_ids, logprobs=[0.0] * len(tokens), turn_end_positions=ends,
                   progress=progress, strict=strict, partial=partial, outcome=outcome, reason="")


EPISODES = [_episode("files", 2, True, 1.0, [0.5, 1.0]),
            _episode("text", 3, False, 0.5, [0.0, 0.25, 0.5]),
            _episode("files", 1, False, 0.0, [0.0])]


def test_padding_masks_and_outcome_reward_placement():
    batch, stats = episodes_to_batch(EPISODES, ["files", "text"], rl.FamilyStats.init(2),
                                     reward="spr", kappa=0.5, fdr_beta=0.0, min_len=16)
    assert batch.tokens.shape == (3, 32)
    np.testing.assert_array_equal(batch.mask.sum(1), [15, 20, 10])
    np.testing.assert_array_equal(batch.family_ids, [0, 1, 0])
    assert (batch.turn_ids[:, -1] == -1).all() and (batch.policy_mask[:, 20:] == 0).all()
    np.testing.assert_allclose(batch.outcome_rewards, [1.0, 0.25, 0.0])
    expected = np.zeros((3, 32), np.float32)
    expected[0, 12], expected[1, 17] = 1.0, 0.25  # last policy token of each row
    np.testing.assert_array_equal(batch.rewards, expected)
    binary, _ = episodes_to_batch(EPISODES, ["files", "text"], stats, reward="binary", fdr_beta=0.0)
    np.testing.assert_array_equal(binary.outcome_rewards, [1.0, 0.0, 0.0])


def test_fdr_rewards_sit_on_turn_ends_and_update_family_stats():
    stats0 = rl.FamilyStats.init(2)
    batch, stats = episodes_to_batch(EPISODES, ["files", "text"], stats0, reward="spr", kappa=0.5,
                                     fdr_beta=0.1, fdr_clip=3.0, min_len=16)
    fdr = batch.rewards.copy()
    fdr[0, 12] -= 1.0
    fdr[1, 17] -= 0.25
    for i, e in enumerate(EPISODES):
        placed = np.zeros(32, np.float32)
        placed[e.turn_end_positions] = batch.turn_rewards[i, :len(e.turn_end_positions)]
        np.testing.assert_allclose(fdr[i], placed, atol=1e-7)
        assert (batch.turn_rewards[i, len(e.turn_end_positions):] == 0).all()
    assert np.abs(batch.turn_rewards).max() <= 0.1 * 3.0 + 1e-6
    assert np.abs(batch.turn_rewards).sum() > 0
    # Six gains were seen: three from family "files" (0.5, 0.5, 0.0), three from "text".
    np.testing.assert_array_equal(np.asarray(stats.count_F), [3, 3])


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="not in the run's family list"):
        episodes_to_batch(EPISODES, ["files"], rl.FamilyStats.init(1))
    with pytest.raises(ValueError, match="reward must be"):
        episodes_to_batch(EPISODES, ["files", "text"], rl.FamilyStats.init(2), reward="dense")
    with pytest.raises(ValueError, match="no episodes"):
        episodes_to_batch([], ["files"], rl.FamilyStats.init(1))


def test_infra_failures_are_left_out_counted_and_filled():
    """Sandbox and verifier failures never reach the batch (not even as reward 0); filler rows
    without policy tokens make the row count a multiple of the minibatch."""
    broken = [_episode("files", 1, False, 0.0, [0.0], outcome="sandbox_error"),
              _episode("text", 2, False, 0.0, [0.0, 0.0], outcome="verifier_error")]
    batch, _ = episodes_to_batch(broken[:1] + EPISODES + broken[1:], ["files", "text"], rl.FamilyStats.init(2),
                                 fdr_beta=0.1, min_len=16, row_multiple=4)
    clean, _ = episodes_to_batch(EPISODES, ["files", "text"], rl.FamilyStats.init(2), fdr_beta=0.1, min_len=16)
    assert batch.infra_failures == 2 and batch.tokens.shape == (4, 32)
    np.testing.assert_array_equal(batch.real, [True, True, True, False])
    for name in ("tokens", "mask", "policy_mask", "turn_ids", "rewards", "turn_rewards"):
        np.testing.assert_array_equal(getattr(batch, name)[:3], getattr(clean, name))
    assert batch.policy_mask[3].sum() == 0 and batch.mask[3].sum() == 1 and batch.rewards[3].sum() == 0
    with pytest.raises(ValueError, match="no episodes to train on \\(2 infrastructure failures\\)"):
        episodes_to_batch(broken, ["files", "text"], rl.FamilyStats.init(2))


def test_unmeasured_progress_is_carried_forward():
    """A failed probe (None) counts as no change: the FDR sees the same gains as the carried row."""
    measured = [_episode("files", 3, False, 0.5, [0.5, 0.5, 1.0]), _episode("text", 1, False, 0.0, [0.0])]
    probed = [_episode("files", 3, False, 0.5, [0.5, None, 1.0]), measured[1]]
    a, _ = episodes_to_batch(measured, ["files", "text"], rl.FamilyStats.init(2), fdr_beta=0.1, min_len=16)
    b, _ = episodes_to_batch(probed, ["files", "text"], rl.FamilyStats.init(2), fdr_beta=0.1, min_len=16)
    np.testing.assert_array_equal(a.rewards, b.rewards)


def _tb_gae_loop(r, v, m, k, g_tok, l_tok, g_turn, l_turn, v_cut):
    """Plain per-row TB-GAE whose last policy token looks ahead to V(cut) (None: terminal)."""
    adv, nxt = np.zeros_like(r), None
    for t in reversed(np.flatnonzero(m)):
        if nxt is None:
            adv[t] = r[t] + (0.0 if v_cut is None else g_turn * v_cut) - v[t]
        else:
            g, lam = (g_tok, l_tok) if k[nxt] == k[t] else (g_turn, l_turn)
            adv[t] = r[t] + g * v[nxt] - v[t] + g * lam * adv[nxt]
        nxt = t
    return adv


def test_truncation_terminal_or_bootstrapped_from_the_critic():
    """turn_limit/timeout/context_overflow rows are `truncated`; "terminal" keeps their outcome
    reward, "bootstrap" drops it and TB-GAE over `bootstrap_truncated` rewards equals a plain
    loop whose last step looks ahead to γ_turn · V(cut)."""
    eps = [_episode("files", 2, False, 0.5, [0.5, 0.5], outcome="turn_limit"),
           _episode("text", 3, True, 1.0, [0.0, 0.5, 1.0], outcome="success"),
           _episode("files", 1, False, 0.5, [0.5], outcome="context_overflow"),
           _episode("text", 1, False, 0.5, [0.5], outcome="timeout")]
    fams = ["files", "text"]
    term, _ = episodes_to_batch(eps, fams, rl.FamilyStats.init(2), fdr_beta=0.0, min_len=16)
    boot, _ = episodes_to_batch(eps, fams, rl.FamilyStats.init(2), fdr_beta=0.0, min_len=16, truncation="bootstrap")
    np.testing.assert_array_equal(term.truncated, [True, False, True, True])
    np.testing.assert_allclose(term.outcome_rewards, [0.25, 1.0, 0.25, 0.25])
    np.testing.assert_allclose(boot.outcome_rewards, [0.0, 1.0, 0.0, 0.0])
    rng = np.random.default_rng(0)
    values = rng.normal(size=boot.rewards.shape).astype(np.float32)
    cut = rng.normal(size=4).astype(np.float32)
    rewards = boot.rewards + rng.normal(size=boot.rewards.shape).astype(np.float32) * boot.policy_mask
    gammas = (1.0, 1.0, 0.9, 0.8)
    adv, _ = rl.tb_gae(bootstrap_truncated(rewards, boot.policy_mask, boot.truncated, cut, gammas[2]),
                       values, boot.policy_mask, boot.turn_ids, *gammas)
    for b in range(4):
        ref = _tb_gae_loop(rewards[b], values[b], boot.policy_mask[b], boot.turn_ids[b], *gammas,
                           cut[b] if boot.truncated[b] else None)
        np.testing.assert_allclose(np.asarray(adv)[b], ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="truncation must be one of"):
        episodes_to_batch(eps, fams, rl.FamilyStats.init(2), truncation="drop")
