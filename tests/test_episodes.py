"""Episode runner end to end: scripted and model policies, real `local` sandboxes, every outcome recorded."""
import base64
import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pytest
from flax import nnx

from sandboxes.suite import build_suite
from trsi_jax.agent import (HARNESSES, CommonHarness, RetryHarness, VerifierFeedbackHarness, format_reply,
                            record_progress)
from trsi_jax.config import model_preset
from trsi_jax.models import Qwen
from trsi_jax.rollout import (Budgets, ByteTokenizer, ModelPolicy, SampleConfig, ScriptedPolicy, encode_chat,
                              run_episodes)
from trsi_jax.tasks import load_task

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None or shutil.which("tmux") is None,
                                reason="bubblewrap and tmux are required (apt-get install bubblewrap tmux)")
TOK = ByteTokenizer()


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    (path,) = build_suite(str(tmp_path_factory.mktemp("suite")), "train", per_family=1, families=["files"])
    return load_task(path)


def solve_keys(task) -> str:
    """The oracle script as one typed line (one prompt back, so the harness waits exactly for it)."""
    script = base64.b64encode(Path(task.solution_path).read_bytes()).decode()
    return f"echo {script} | base64 -d | bash\n"


def n_assistant(conv):
    return sum(m["role"] == "assistant" for m in conv)


def scripted(task):
    """Plays the mode named in the context message: solve, solve after two malformed replies, or loop."""
    def fn(conv):
        mode = next((m["content"] for m in conv if m["content"].startswith("mode:")), "mode: solve")
        k = n_assistant(conv)
        if mode == "mode: malformed":
            if k == 0:
                return "I will list the files."  # no JSON at all
            if k == 1:
                return '{"analysis": "x", "commands": []}'  # missing "plan"
            k -= 2
        if mode == "mode: loop":
            return format_reply([("echo still working\n", 2)])
        return format_reply([(solve_keys(task), 10)]) if k == 0 else format_reply([], task_complete=True)
    return fn


def check_record(ep, cut_off_turns=0):
    """The recorded tokens are exactly the chat encoding of the recorded messages, except that a
    reply cut off by the token budget is closed by an `<|im_end|>` the policy did not sample (mask 0)."""
    enc = encode_chat(ep.messages, TOK)
    assert ep.tokens == enc.tokens_T.tolist()
    differ = np.flatnonzero(np.asarray(ep.policy_mask) != enc.policy_mask_T)
    assert len(differ) == cut_off_turns
    assert all(ep.tokens[i] == TOK.im_end_id and ep.policy_mask[i] == 0 for i in differ)
    assert ep.turn_ids == enc.turn_ids_T.tolist()
    assert ep.turn_end_positions == [e - 1 if e in differ else e for e in enc.turn_end_positions]
    assert len(ep.logprobs) == len(ep.tokens)
    assert sum(m["role"] == "assistant" for m in ep.messages) == ep.num_turns == len(ep.turn_end_positions)


def test_scripted_episodes_solve_feed_back_errors_and_hit_limits(task):
    modes = ["mode: solve", "mode: malformed", "mode: loop"]
    eps = run_episodes(ScriptedPolicy(scripted(task), TOK), [task] * 3, CommonHarness(),
                       budgets=Budgets(max_turns=5, max_tokens=20000, wall_sec=120), context=modes,
                       track_progress=True, show_progress=False)
    solved, malformed, looping = eps
    for ep in eps:
        check_record(ep)
        assert ep.task_id == task.task_id and ep.family == task.family and ep.harness == "common"
        assert not any("mode:" in m["content"] for m in ep.messages)  # the context is never recorded
        assert len(ep.progress) == ep.num_turns
    # solve: act, declare complete, confirm -> verified success
    assert (solved.outcome, solved.strict, solved.partial, solved.num_turns) == ("success", True, 1.0, 3)
    assert solved.reason == "agent confirmed task completion" and all(solved.tests.values())
    assert "You set task_complete" in solved.messages[-2]["content"]
    assert solved.progress[0] == 1.0 and solved.parse_errors == 0
    # malformed replies are shown back to the model and counted, then it still solves
    assert malformed.parse_errors == 2 and malformed.outcome == "success" and malformed.num_turns == 5
    assert "no JSON object found" in malformed.messages[3]["content"]
    assert "missing required field(s): plan" in malformed.messages[5]["content"]
    assert malformed.progress[:2] == [0.0, 0.0]
    # never completes: stopped by the turn budget, verified anyway (partial credit only)
    assert looping.outcome == "turn_limit" and not looping.strict and 0 <= looping.partial < 1
    assert "still working" in looping.messages[3]["content"]


def test_overlapped_verification_records_the_same_episodes(task):
    """Verifying in the background (the default) changes no record: same rounds, same slots, same order."""
    modes = ["mode: loop", "mode: solve", "mode: malformed", "mode: solve", "mode: loop"]
    runs = [run_episodes(ScriptedPolicy(scripted(task), TOK), [task] * 5, CommonHarness(),
                         budgets=Budgets(max_turns=4, max_tokens=20000, wall_sec=120), context=modes,
                         concurrency=2, show_progress=False, overlap_verify=overlap) for overlap in (False, True)]
    strip = lambda ep: dataclasses.replace(ep, wall_sec=0.0)
    assert [strip(e) for e in runs[0]] == [strip(e) for e in runs[1]]
    assert [e.outcome for e in runs[1]] == ["turn_limit", "success", "success", "success", "turn_limit"]


class EagerProgress(CommonHarness):
    """The reference: every turn's state probed right after the turn."""

    def after_turn(self, session):
        record_progress(session)
        return ""


def test_lazy_progress_equals_probing_every_turn_and_skips_the_final_probe(task, monkeypatch):
    """Progress measured lazily (a turn's state probed before the next keystrokes, the final state
    read from the verifier's run) equals probing after every turn, with one probe fewer per episode."""
    import trsi_jax.sandbox as sandbox_lib

    probes, real = [], sandbox_lib.probe_progress
    monkeypatch.setattr(sandbox_lib, "probe_progress", lambda *a, **k: probes.append(1) or real(*a, **k))
    modes = ["mode: solve", "mode: malformed", "mode: loop"]
    runs, counts = [], []
    for harness in (EagerProgress(), CommonHarness()):
        probes.clear()
        runs.append(run_episodes(ScriptedPolicy(scripted(task), TOK), [task] * 3, harness,
                                 budgets=Budgets(max_turns=5, max_tokens=20000, wall_sec=120), context=modes,
                                 track_progress=True, show_progress=False))
        counts.append(len(probes))
    eager, lazy = runs
    assert [e.progress for e in lazy] == [e.progress for e in eager]
    assert [e.progress for e in lazy][0] == [1.0] * 3 and lazy[2].progress[-1] is not None
    assert counts == [8, 5]  # solve 1 -> 0, malformed 2 -> 1, loop 5 -> 4


def test_sandbox_crash_and_context_overflow_are_recorded(task, tmp_path):
    broken_dir = tmp_path / "broken"
    shutil.copytree(task.path, broken_dir)
    dockerfile = broken_dir / "environment" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + "\nRUN echo cannot build >&2; exit 3\n")
    broken = load_task(broken_dir)
    eps = run_episodes(ScriptedPolicy(scripted(task), TOK), [broken, task], CommonHarness(),
                       budgets=Budgets(max_turns=5, max_tokens=1200), show_progress=False)
    crashed, overflow = eps
    assert crashed.outcome == "sandbox_error" and crashed.reason.startswith("SandboxError:")
    assert not crashed.strict and crashed.tokens == [] and crashed.num_turns == 0
    # the long first reply is cut at the budget (so it is malformed JSON); the next prompt overflows
    assert overflow.outcome == "context_overflow" and "max_tokens=1200" in overflow.reason
    assert overflow.num_turns == 1 and overflow.parse_errors == 1
    check_record(overflow, cut_off_turns=1)
    assert overflow.turn_end_positions == [1199] and overflow.policy_mask[1200] == 0


def test_infra_failures_are_excluded_from_metrics_batches_and_successes(task, tmp_path):
    """A sandbox that cannot start and a test script that produces no result (no tests, no reward
    file) are infrastructure failures: their own outcomes, never a success, never in a PPO batch,
    an RSR success or a pass@k denominator, and counted."""
    from trsi_jax import rl
    from trsi_jax.rollout import summarize
    from trsi_jax.rpr.batch import episodes_to_batch
    from trsi_jax.rsr.collect import coverage, successes

    crash_dir, silent_dir = tmp_path / "crash", tmp_path / "silent"
    shutil.copytree(task.path, crash_dir)
    shutil.copytree(task.path, silent_dir)
    dockerfile = crash_dir / "environment" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + "\nRUN exit 3\n")
    (silent_dir / "tests" / "test.sh").write_text("#!/bin/bash\necho the grader crashed before running\nexit 0\n")
    crash, silent = load_task(crash_dir), load_task(silent_dir)
    eps = run_episodes(ScriptedPolicy(scripted(task), TOK), [crash, silent, task], CommonHarness(),
                       budgets=Budgets(max_turns=5, max_tokens=20000, wall_sec=120), show_progress=False)
    crashed, unverified, solved = eps
    assert crashed.outcome == "sandbox_error" and unverified.outcome == "verifier_error"
    assert "no result" in unverified.reason and not unverified.strict and unverified.partial == 0.0
    assert solved.outcome == "success"
    summary = summarize(eps, ks=(1,))["all"]
    assert summary == {"tasks": 1, "episodes": 1, "infra_failures": 2, "strict_success": 1.0,
                       "process_reward": 1.0, "pass@1": 1.0}
    batch, _ = episodes_to_batch(eps, [task.family], rl.FamilyStats.init(1), fdr_beta=0.0)
    assert batch.infra_failures == 2 and batch.tokens.shape[0] == 1 and batch.tokens[0].tolist()[:5] == solved.tokens[:5]
    assert successes({"common": eps}) == [solved]
    assert coverage({"common": eps}, 3)["infra_failures"] == {"common": 2}


def test_privileged_harnesses(task):
    def gives_up_then_solves(conv):
        failed = next((i for i, m in enumerate(conv) if "Verification failed" in m["content"]), None)
        if failed is not None and n_assistant(conv[failed:]) == 0:
            return format_reply([(solve_keys(task), 10)])
        return format_reply([], task_complete=True)

    retry, feedback = (run_episodes(ScriptedPolicy(fn, TOK), [task], h, budgets=Budgets(max_turns=3),
                                    show_progress=False)[0]
                       for fn, h in [(gives_up_then_solves, RetryHarness(extra_turns=4)),
                                     (scripted(task), VerifierFeedbackHarness())])
    assert retry.outcome == "success" and retry.num_turns > 3  # the retry granted turns past max_turns=3
    assert "Verification failed: only 0% of the checks pass" in retry.messages[5]["content"]
    assert retry.num_turns == 5 and retry.progress[-1] == 1.0
    assert feedback.outcome == "success"
    assert "Verifier feedback: 100% of the progress checks pass." in feedback.messages[3]["content"]
    assert feedback.progress == [1.0] * feedback.num_turns
    assert set(HARNESSES) == {"common", "verifier_feedback", "retry", "hint"}


class Recording:
    """Wraps a policy and keeps every batch of replies it gave."""

    def __init__(self, inner):
        self.inner, self.tokenizer, self.batches = inner, inner.tokenizer, []

    def act(self, conversations, max_new_tokens=None):
        self.batches.append(self.inner.act(conversations, max_new_tokens))
        return self.batches[-1]


@pytest.mark.slow
def test_model_policy_records_sampled_tokens_and_logprobs(task):
    cfg = dataclasses.replace(model_preset("tiny"), num_layers=2, full_attention_interval=2)
    policy = Recording(ModelPolicy(Qwen(cfg, rngs=nnx.Rngs(0)), TOK, SampleConfig(temperature=1.0, max_new_tokens=24),
                                   max_len=2048, seed=1))
    eps = run_episodes(policy, [task, task], CommonHarness(), budgets=Budgets(max_turns=2, max_tokens=2048),
                       show_progress=False)
    assert [len(b) for b in policy.batches] == [2, 2]  # both episodes sampled together, turn by turn
    for i, ep in enumerate(eps):
        assert ep.outcome == "turn_limit" and ep.parse_errors == 2  # random weights never write the JSON
        turn_ids, mask = np.asarray(ep.turn_ids), np.asarray(ep.policy_mask, bool)
        tokens, logprobs = np.asarray(ep.tokens), np.asarray(ep.logprobs)
        for k, batch in enumerate(policy.batches):
            reply = batch[i]
            where = np.flatnonzero(mask & (turn_ids == k))
            assert tokens[where].tolist() == reply.tokens  # kept as sampled, never re-tokenized
            np.testing.assert_allclose(logprobs[where], reply.logprobs)
            assert ep.messages[2 + 2 * k]["content"] == reply.text
        assert np.all(logprobs[mask] < 0) and np.all(logprobs[~mask] == 0)
        assert all(t < TOK.vocab_size for t in ep.tokens)
    assert eps[0].tokens != eps[1].tokens  # independent samples


@pytest.mark.slow
def test_evaluate_script_writes_metrics_and_table(tmp_path):
    import json
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    cmd = [sys.executable, "-m", "experiments.evaluate", "--model=tiny", "--model_cfg.num_layers=2",
           "--model_cfg.full_attention_interval=2", "--init=random", f"--workdir={tmp_path}", "--per_family=1",
           "--families=files", "--samples=2", "--k=1,2", "--max_turns=1", "--max_new_tokens=8", "--max_len=2048",
           "--jax_cache_dir=" + str(root / ".cache" / "jax")]
    out = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads((tmp_path / "eval.json").read_text())
    assert result["all"]["episodes"] == 2 and result["all"]["pass@2"] == 0.0
    assert set(result["families"]) == {"files"} and result["outcomes"] == {"turn_limit": 2}
    table = (tmp_path / "eval.txt").read_text()
    assert table.splitlines()[0].split() == ["family", "pass@1", "pass@2", "strict_success", "process_reward",
                                             "tasks", "episodes"]
    assert table in out.stdout
    from trsi_jax.rollout import load_episodes

    assert len(load_episodes(str(tmp_path / "episodes"))) == 2
    # A re-run into the same workdir reuses its task folders; other task flags stop with the fix.
    again = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((tmp_path / "eval.json").read_text())["all"]["episodes"] == 2
    other = subprocess.run([c.replace("--per_family=1", "--per_family=2") for c in cmd], cwd=root,
                           capture_output=True, text=True, timeout=600)
    assert other.returncode != 0 and "Use a new --workdir" in other.stderr, other.stderr[-3000:]


def test_agent_that_kills_its_terminal_is_verified_not_excused(task):
    """Killing the terminal is the agent's act, not an infrastructure failure: the episode is still
    verified and trained on (else a failing policy could escape its zero by crashing the terminal)."""
    def solve_then_kill(conv):
        return format_reply([(solve_keys(task) if n_assistant(conv) == 0 else "tmux kill-server\n", 5)])

    def kill_only(conv):
        return format_reply([("tmux kill-server\n", 5)])

    budgets = Budgets(max_turns=4, max_tokens=20000, wall_sec=120)
    (solver,), (quitter,) = (run_episodes(ScriptedPolicy(fn, TOK), [task], CommonHarness(), budgets=budgets,
                                          show_progress=False) for fn in (solve_then_kill, kill_only))
    assert solver.outcome == "success" and solver.strict, (solver.outcome, solver.reason)
    assert quitter.outcome == "terminal_lost" and not quitter.strict and quitter.tests, quitter.reason
