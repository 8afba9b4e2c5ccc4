"""RSR roles on real built-in tasks: runbook format, planner, critic recursion, executor, SFT data."""
import pytest

from sandboxes.suite import build_suite
from trsi_jax.agent import format_reply, parse_reply
from trsi_jax.rollout import ByteTokenizer, Budgets, ScriptedPolicy, encode_chat
from trsi_jax.rsr.critic import LeakScanCritic, ModelCritic, parse_verdict, review_with_revision
from trsi_jax.rsr.executor import deterministic_executor, replay
from trsi_jax.rsr.planner import DeterministicPlanner, ModelPlanner, derive_runbook
from trsi_jax.rsr.runbook import Milestone, Runbook, RunbookParseError, parse
from trsi_jax.rsr.sft_data import DUPLICATE, build_examples, contamination
from trsi_jax.tasks import load_task

TOK = ByteTokenizer()


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    root = tmp_path_factory.mktemp("suite")
    return load_task(build_suite(str(root), "train", 1, ["files"])[0])


def _conversation(task, steps):
    """A recorded episode: (command, terminal output) per turn, then confirmed completion."""
    msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": f"Task:\n{task.instruction}"}]
    for i, (cmd, out) in enumerate(steps):
        msgs.append({"role": "assistant", "content": format_reply([(cmd + "\n", 1.0)], plan=f"step {i} plan text")})
        msgs.append({"role": "user", "content": f"New terminal output:\n$ {cmd}\n{out}"})
    msgs.append({"role": "assistant", "content": format_reply([], task_complete=True)})
    return msgs


class _Ep:
    def __init__(self, task, messages, strict=True, outcome="success"):
        self.task_id, self.messages, self.strict, self.harness = task.task_id, messages, strict, "common"
        self.outcome = outcome


SORT = 'cd /app/inbox; for f in *; do x=$(echo "${f##*.}" | tr A-Z a-z); mkdir -p ../sorted/$x; mv "$f" ../sorted/$x/; done; cd /app'


def test_runbook_render_parse_round_trip():
    rb = Runbook("All files sorted.", (
        Milestone("Write the script", "python3 -c 'import os\nfor f in os.listdir(\".\"):\n    print(f)'", "a.txt"),
        Milestone("Look around", "ls -la", wait=0.5), Milestone("Build", "make -j2", wait=120.0), Milestone("Think")),
        checks=("ls shows it",), recovery=("retry with sudo",), pitfalls=("do not delete",))
    assert parse(rb.render()) == rb
    assert parse("chatter before\n" + rb.render()) == rb
    for bad, why in (("no header", "header"), ("RUNBOOK\nMilestones:\n1. x", "Target"),
                     ("RUNBOOK\nTarget end state: t\nMilestones:", "milestones")):
        with pytest.raises(RunbookParseError, match=why):
            parse(bad)


def test_deterministic_planner_derives_milestones_checks_pitfalls(task):
    msgs = _conversation(task, [("cat /app/nothing.txt", "cat: /app/nothing.txt: No such file or directory"),
                                (SORT, ""), ("ls /app/sorted", "csv ini log txt"),
                                ("grep -c Error /app/sorted/log/*", "0")])  # "Error" only in the echo
    rb = derive_runbook(task, msgs, variant=0)
    assert [m.command for m in rb.milestones] == [SORT, "ls /app/sorted", "grep -c Error /app/sorted/log/*"]
    assert rb.milestones[1].observed.endswith("csv ini log txt") and len(rb.pitfalls) == 1
    assert any("nothing.txt" in p and "No such file" in p for p in rb.pitfalls)
    assert rb.recovery and SORT.split()[0] in rb.recovery[0]
    assert any("ls /app/sorted" in c for c in rb.checks)
    assert all(m.wait == 1.0 for m in rb.milestones)
    plans = DeterministicPlanner().plan([(task, _Ep(task, msgs))], k=4)[0]
    renders = [p.runbook.render() for p in plans]
    assert 2 <= len(renders) <= 4 and len(set(renders)) == len(renders)  # K variants, no duplicates


def test_planner_keeps_waits_and_leaves_out_what_a_confirmation_sent(task):
    """The agent solves, claims completion, then confirms while sending a stray command: the
    runbook holds the work with the agent's waits, not the stray command. After a verifier's
    answer to a confirmation, the next claim is a first claim again: its commands stay."""
    confirm = "New terminal output:\n\nYou set task_complete. If the task is really done, reply again."
    msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "Task"},
            {"role": "assistant", "content": format_reply([("cd /app\n", 0.5), (SORT + "\n", 2.0)], task_complete=True)},
            {"role": "user", "content": confirm},
            {"role": "assistant", "content": format_reply([("rm -rf /app/docs\n", 2.0)], task_complete=True)},
            {"role": "user", "content": "The verifier says: 1 test failed."},
            {"role": "assistant", "content": "not json"},
            {"role": "user", "content": "Your reply could not be used"},
            {"role": "assistant", "content": format_reply([("ls /app/sorted\n", 1.5)], task_complete=True)},
            {"role": "user", "content": confirm},
            {"role": "assistant", "content": format_reply([], task_complete=True)}]
    rb = derive_runbook(task, msgs)
    assert [(m.command, m.wait) for m in rb.milestones] == [("cd /app", 0.5), (SORT, 2.0), ("ls /app/sorted", 1.5)]
    assert parse(rb.render()) == rb


def test_leaking_runbook_is_rejected_then_revised_and_clean_one_passes(task):
    msgs = _conversation(task, [(SORT, ""), ("ls /app/sorted", "csv ini log txt")])
    clean = derive_runbook(task, msgs)
    test_line = next(ln.strip() for ln in (task.tests_dir / "test_outputs.py").read_text().splitlines()
                     if ln.strip().startswith("assert") and len(ln.split()) > 8)
    solution_cmd = task.solution_path.read_text().strip().splitlines()[-1]
    leaky = Runbook(clean.target, clean.milestones + (
        Milestone("Copy the reference", solution_cmd), Milestone("Confirm", "cat /logs/verifier/reward.txt")),
        checks=clean.checks + (f"the checker does: {test_line}",), pitfalls=("none",))
    ep = _Ep(task, msgs)
    records = review_with_revision(LeakScanCritic(), DeterministicPlanner(),
                                   [(task, ep, clean), (task, ep, leaky)], rounds=3)
    assert records[0]["accepted"] and len(records[0]["history"]) == 1
    hist = records[1]["history"]
    assert not hist[0]["accept"] and hist[-1]["accept"] and len(hist) == 2
    reasons = " ".join(hist[0]["reasons"])
    assert "tests/test_outputs.py" in reasons and "solution/" in reasons and "/logs/verifier" in reasons
    final = records[1]["runbook"]
    text = final.render()
    assert test_line not in text and solution_cmd not in text and "/logs/verifier" not in text
    assert [m.command for m in final.milestones] == [m.command for m in clean.milestones]
    # With no revision rounds the leaky runbook stays rejected, with its reasons recorded.
    once = review_with_revision(LeakScanCritic(), DeterministicPlanner(), [(task, ep, leaky)], rounds=0)[0]
    assert not once["accepted"] and once["history"][0]["reasons"]


def test_model_critic_sees_only_the_public_task_and_parses_verdicts(task):
    solution_text = task.solution_path.read_text()
    prompts = []

    def critic_fn(conv):
        prompt = conv[-1]["content"]
        prompts.append(prompt)
        assert task.instruction.strip() in prompt and "Dockerfile" in prompt
        assert "def test_" not in prompt and solution_text.strip() not in prompt
        if "Milestone A" in prompt:
            return 'Looks fine. {"verdict": "accept", "reasons": []}'
        if "Milestone B" in prompt:
            return '{"verdict": "reject", "reasons": ["step 1 is wrong"]}'
        return "I think it is fine"

    critic = ModelCritic(ScriptedPolicy(critic_fn, TOK))
    mk = lambda d: Runbook("goal", (Milestone(d, "ls"),))  # noqa: E731
    leaky = Runbook("goal", (Milestone("Milestone D", "cat /tests/test_outputs.py"),))
    verdicts = critic.review([(task, mk("Milestone A")), (task, mk("Milestone B")), (task, mk("Milestone C")),
                              (task, leaky)])
    assert [v.accept for v in verdicts] == [True, False, False, False]
    assert verdicts[1].reasons == ("step 1 is wrong",) and verdicts[1].source == "model"
    assert verdicts[2].reasons[0].startswith("critic reply unparsable")
    assert verdicts[3].source == "leak_scan" and len(prompts) == 3  # the scan rejects before the model
    assert not parse_verdict('{"verdict": "maybe"}').accept


def test_model_planner_parses_runbooks_and_records_failures(task):
    good = Runbook("goal", (Milestone("sort", SORT),)).render()
    replies = iter(["Here it is:\n" + good, "no runbook here"])
    planner = ModelPlanner(ScriptedPolicy(lambda conv: next(replies), TOK))
    msgs = _conversation(task, [(SORT, "")])
    out = planner.plan([(task, _Ep(task, msgs))], k=2)[0]
    assert out[0].runbook == parse(good) and out[1].runbook is None
    assert "unparsable" in out[1].error


def test_replays_run_in_fresh_sandboxes(task):
    rb = Runbook("probe", (Milestone("look for the marker", "test -e /app/.marker && echo MARK-FOUND || echo MARK-ABSENT"),
                           Milestone("leave a marker", "touch /app/.marker")))
    (group,) = replay(deterministic_executor(TOK), [task], [rb], m=2, backend="local",
                      budgets=Budgets(max_turns=6, max_tokens=20000))
    assert len(group) == 2
    for ep in group:
        observations = "\n".join(m["content"] for m in ep.messages if m["role"] == "user")
        assert "MARK-ABSENT" in observations and "MARK-FOUND" not in observations.replace("echo MARK-FOUND", "")
        assert "RUNBOOK" not in "".join(m["content"] for m in ep.messages)  # context never recorded
        assert ep.num_turns >= 3


def test_one_reply_executor_sends_every_command_then_confirms(task):
    rb = Runbook("probe", (Milestone("look for the marker", "test -e /app/.marker && echo MARK-FOUND || echo MARK-ABSENT",
                                     wait=0.5), Milestone("think"), Milestone("leave a marker", "touch /app/.marker", wait=2.0)))
    (group,) = replay(deterministic_executor(TOK, one_reply=True), [task], [rb], m=1, backend="local",
                      budgets=Budgets(max_turns=6, max_tokens=20000))
    (ep,) = group
    replies = [parse_reply(m["content"]) for m in ep.messages if m["role"] == "assistant"]
    assert [[(c.keystrokes, c.duration) for c in r.commands] for r in replies] == [
        [("test -e /app/.marker && echo MARK-FOUND || echo MARK-ABSENT\n", 0.5), ("touch /app/.marker\n", 2.0)], []]
    assert all(r.task_complete for r in replies) and ep.num_turns == 2
    assert "MARK-ABSENT" in ep.messages[3]["content"]


def test_sft_examples_drop_runbook_context_and_keep_clean_replays(task):
    rb = Runbook(task.instruction, (Milestone("Sort every inbox file into its extension folder", SORT),),
                 pitfalls=("Never leave a file behind in the inbox folder",))
    clean = _conversation(task, [(SORT, "")])
    leaked_ctx = clean[:2] + [{"role": "user", "content": rb.render()}] + clean[2:]
    pitfall_ctx = clean[:2] + [{"role": "user", "content": "Note: " + rb.pitfalls[0]}] + clean[2:]
    solution_cmd = task.solution_path.read_text().strip().splitlines()[-1]
    cheating = _conversation(task, [(solution_cmd, "")])
    scanner = LeakScanCritic().scanner(task)
    assert contamination(clean, rb, scanner) == []
    assert "runbook header in the context" in contamination(leaked_ctx, rb, scanner)
    assert any("runbook text" in r for r in contamination(pitfall_ctx, rb, scanner))
    assert any(r.startswith("quotes solution/") for r in contamination(cheating, rb, scanner))
    replays = [{"episode": _Ep(task, m), "runbook": rb} for m in (clean, leaked_ctx, pitfall_ctx, cheating)]
    replays.append({"episode": _Ep(task, clean, strict=False), "runbook": rb})  # unverified: never used
    replays.append({"episode": _Ep(task, clean, outcome="verifier_error"), "runbook": rb})  # no result: never used
    replays.append({"episode": _Ep(task, [dict(m) for m in clean]), "runbook": rb})  # a second identical replay
    examples, dropped = build_examples(replays, {task.task_id: scanner}, TOK)
    assert len(examples) == 1 and len(dropped) == 4 and dropped[-1]["reasons"] == [DUPLICATE]
    enc = encode_chat(clean, TOK)
    assert examples[0]["tokens"] == enc.tokens_T.tolist() and examples[0]["loss_mask"] == enc.policy_mask_T.tolist()


def test_model_roles_recursion_passes_critic_reasons_back_to_the_planner(task):
    """Critic rejects with a reason; the planner's revision prompt carries it; the revision passes."""
    first = Runbook("goal", (Milestone("sort everything", SORT),))
    revised = Runbook("goal", (Milestone("sort everything, then list the result", SORT), Milestone("list", "ls /app/sorted")))
    seen_revision_prompts = []

    def critic_fn(conv):
        if "then list the result" in conv[-1]["content"]:
            return '{"verdict": "accept", "reasons": []}'
        return '{"verdict": "reject", "reasons": ["never checks the result"]}'

    def planner_fn(conv):
        seen_revision_prompts.append(conv[-1]["content"])
        return revised.render()

    records = review_with_revision(ModelCritic(ScriptedPolicy(critic_fn, TOK)),
                                   ModelPlanner(ScriptedPolicy(planner_fn, TOK)),
                                   [(task, _Ep(task, []), first)], rounds=2)
    (rec,) = records
    assert rec["accepted"] and rec["runbook"] == revised
    assert [h["accept"] for h in rec["history"]] == [False, True]
    assert rec["history"][0]["reasons"] == ["never checks the result"] and rec["history"][0]["source"] == "model"
    assert len(seen_revision_prompts) == 1 and "- never checks the result" in seen_revision_prompts[0]
    assert first.render() in seen_revision_prompts[0]
