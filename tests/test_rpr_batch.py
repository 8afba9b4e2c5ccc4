"""Episodes -> PPO arrays: padding, reward placement (SPR on the last policy token, FDR on turn ends)."""
import numpy as np
import pytest

from trsi_jax import rl
from trsi_jax.rollout import Episode
from trsi_jax.rpr.batch import episodes_to_batch


def _episode(family, turns, strict, partial, progress):
    """system/user prompt (5 tokens), then per turn: 3 policy tokens + 2 observation tokens."""
    tokens, mask, turn_ids, ends = [1] * 5, [0] * 5, [-1] * 5, []
    for k in range(turns):
        tokens += [2, 3, 4, 5, 6]
        mask += [1, 1, 1, 0, 0]
        turn_ids += [k] * 5
        ends.append(len(tokens) - 3)
    return Episode(task_id=f"{family}-0", family=family, harness="common", messages=[], tokens=tokens,
                   policy_mask=mask, turn_ids=turn_ids, logprobs=[0.0] * len(tokens), turn_end_positions=ends,
                   progress=progress, strict=strict, partial=partial, outcome="failure", reason="")


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
