"""Episode datasets round-trip; schema errors are loud; pass@k and per-family summaries are exact."""
import itertools
import random

import datasets
import pytest

from trsi_jax.rollout import SCHEMA_VERSION, ByteTokenizer, Episode, encode_chat, load_episodes, pass_at_k, save_episodes
from trsi_jax.rollout.metrics import summarize


def make_episode(task_id="t1", family="files", strict=True, partial=1.0, turns=2):
    tok = ByteTokenizer()
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "do it ✓"}]
    for k in range(turns):
        messages += [{"role": "assistant", "content": f'{{"k": {k}}}'}, {"role": "user", "content": f"out {k}"}]
    enc = encode_chat(messages, tok)
    return Episode(task_id=task_id, family=family, harness="retry", messages=messages, tokens=enc.tokens_T.tolist(),
                   policy_mask=enc.policy_mask_T.tolist(), turn_ids=enc.turn_ids_T.tolist(),
                   logprobs=[-0.5 * m for m in enc.policy_mask_T.tolist()],
                   turn_end_positions=list(enc.turn_end_positions), progress=[0.25, 0.5][:turns], strict=strict,
                   partial=partial, outcome="success" if strict else "failure", reason="agent confirmed task completion",
                   parse_errors=1, num_turns=turns, wall_sec=1.5, tests={"test_a": True, "test_b": strict})


def test_roundtrip(tmp_path):
    eps = [make_episode(), make_episode("t2", "git", strict=False, partial=0.5, turns=1)]
    save_episodes(eps, str(tmp_path / "ds"))
    back = load_episodes(str(tmp_path / "ds"))
    assert back == eps
    ds = datasets.load_from_disk(str(tmp_path / "ds"))
    assert ds["schema_version"] == [SCHEMA_VERSION] * 2 and ds.features["policy_mask"].feature.dtype == "int8"


def test_empty_roundtrip(tmp_path):
    save_episodes([], str(tmp_path / "empty"))
    assert load_episodes(str(tmp_path / "empty")) == []


def test_schema_mismatch_and_missing_path_are_clear(tmp_path):
    save_episodes([make_episode()], str(tmp_path / "ds"))
    ds = datasets.load_from_disk(str(tmp_path / "ds"))
    ds.map(lambda r: {"schema_version": SCHEMA_VERSION + 1}).save_to_disk(str(tmp_path / "future"))
    with pytest.raises(ValueError, match=rf"future.*schema_version \[{SCHEMA_VERSION + 1}\].*v{SCHEMA_VERSION}"):
        load_episodes(str(tmp_path / "future"))
    ds.remove_columns(["turn_ids"]).save_to_disk(str(tmp_path / "old"))
    with pytest.raises(ValueError, match=r"old.*missing columns \['turn_ids'\]"):
        load_episodes(str(tmp_path / "old"))
    with pytest.raises(FileNotFoundError, match="nothing-here"):
        load_episodes(str(tmp_path / "nothing-here"))


def brute_force_pass_at_k(n, c, k):
    """Fraction of all k-subsets of n samples (c correct) that contain a correct one."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


def test_pass_at_k_matches_enumeration():
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(brute_force_pass_at_k(n, c, k), abs=1e-12)
    assert pass_at_k(5, 0, 3) == 0.0 and pass_at_k(5, 3, 3) == 1.0 and pass_at_k(4, 1, 1) == 0.25
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(2, 1, 3)


def test_summarize_per_family():
    rng = random.Random(0)
    eps = []
    for task, fam, outcomes in [("a", "files", [1, 0, 0]), ("b", "files", [1, 1, 1]), ("c", "git", [0, 0, 0])]:
        for s in outcomes:
            eps.append(make_episode(task, fam, strict=bool(s), partial=1.0 if s else rng.choice([0.0, 0.5])))
    out = summarize(eps, ks=(1, 3, 4))
    files, git = out["families"]["files"], out["families"]["git"]
    assert files["pass@1"] == pytest.approx((1 / 3 + 1) / 2) and files["pass@3"] == 1.0
    assert git["pass@1"] == 0.0 and git["strict_success"] == 0.0
    assert out["all"]["pass@1"] == pytest.approx((1 / 3 + 1 + 0) / 3) and "pass@4" not in out["all"]
    assert out["all"]["strict_success"] == pytest.approx(4 / 9)
    assert out["all"]["tasks"] == 3 and out["all"]["episodes"] == 9
    expected_pr = sum(sum(e.partial for e in eps if e.task_id == t) / 3 for t in "abc") / 3
    assert out["all"]["process_reward"] == pytest.approx(expected_pr)
