"""Critic role: accept or reject a runbook, seeing only the public task and the runbook.

Two layers. The deterministic leak scan (`LeakScanner`, over every field of the runbook) always
runs first; a runbook it flags is rejected with one reason per finding. `ModelCritic` then asks the policy about the runbooks
the scan passed, showing only the instruction, the environment's Dockerfile and file names and
the runbook (never tests or solution); its reply must be JSON {"verdict": "accept"|"reject",
"reasons": [...]}, and anything else is a rejection saying why.
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Sequence

from trsi_jax.rsr.leak_scan import Finding, LeakScanner


@dataclasses.dataclass(frozen=True)
class Verdict:
    accept: bool
    reasons: tuple[str, ...] = ()
    source: str = "leak_scan"  # which layer decided: "leak_scan" | "model"
    findings: tuple[Finding, ...] = ()


class LeakScanCritic:
    """The deterministic critic: the leak scan alone. Scanners are cached per task id."""

    def __init__(self, n: int = 8):
        self.n = n
        self._scanners: dict[str, LeakScanner] = {}

    def scanner(self, task) -> LeakScanner:
        if task.task_id not in self._scanners:
            self._scanners[task.task_id] = LeakScanner(task, n=self.n)
        return self._scanners[task.task_id]

    def review(self, items: Sequence[tuple]) -> list[Verdict]:
        """A verdict for each (task, runbook)."""
        out = []
        for task, rb in items:
            findings = tuple(scan_runbook(self.scanner(task), rb))
            out.append(Verdict(not findings, tuple(f.reason for f in findings), "leak_scan", findings))
        return out


def scan_runbook(scanner: LeakScanner, rb) -> list[Finding]:
    """Findings field by field (target, each milestone's description/command/observation, each
    check, recovery step and pitfall), so each finding lies inside one field that revision can
    remove; a run of words spanning two fields is not one quotation."""
    seen, out = set(), []
    for text in rb.texts():
        for f in scanner.scan(text):
            if (f.kind, f.span) not in seen:
                seen.add((f.kind, f.span))
                out.append(f)
    return out


def public_environment(task, max_files: int = 40) -> str:
    """What anyone sees before starting: the Dockerfile and the names of the environment files."""
    env = task.environment
    parts = []
    if env.dockerfile and os.path.isfile(env.dockerfile):
        parts.append("Dockerfile:\n" + Path(env.dockerfile).read_text(errors="replace")[:2000])
    if env.context_dir and os.path.isdir(env.context_dir):
        root = Path(env.context_dir)
        names = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
        if names:
            parts.append("Files: " + ", ".join(names[:max_files]) + (" ..." if len(names) > max_files else ""))
    return "\n".join(parts)


CRITIC_PROMPT = """\
You review a runbook written for a terminal task. Reject it if it reveals anything an agent
could not know from the task: test code, expected test outputs, paths of the verifier, or a
ready-made solution copied from elsewhere. Also reject it if it is wrong or useless for the task.
Reply with JSON only: {{"verdict": "accept" or "reject", "reasons": ["..."]}}

Task:
{instruction}

Environment:
{environment}

Runbook:
{runbook}"""


def parse_verdict(text: str) -> Verdict:
    start, end = text.find("{"), text.rfind("}")
    try:
        obj = json.loads(text[start:end + 1]) if start >= 0 and end > start else None
    except json.JSONDecodeError as e:
        return Verdict(False, (f"critic reply unparsable: {e.msg}",), "model")
    if not isinstance(obj, dict) or obj.get("verdict") not in ("accept", "reject"):
        return Verdict(False, (f"critic reply unparsable: no verdict accept|reject in {text[:200]!r}",), "model")
    reasons = obj.get("reasons", [])
    if not isinstance(reasons, list) or not all(isinstance(r, str) for r in reasons):
        return Verdict(False, ("critic reply unparsable: 'reasons' must be a list of strings",), "model")
    if obj["verdict"] == "reject" and not reasons:
        reasons = ["rejected without a reason"]
    return Verdict(obj["verdict"] == "accept", tuple(reasons), "model")


class ModelCritic:
    """Leak scan, then the policy as critic on what the scan passed (one batched call)."""

    def __init__(self, policy, n: int = 8):
        self.policy = policy
        self.scan = LeakScanCritic(n)

    def review(self, items: Sequence[tuple]) -> list[Verdict]:
        verdicts = self.scan.review(items)
        ask = [i for i, v in enumerate(verdicts) if v.accept]
        if ask:
            prompts = [[{"role": "user", "content": CRITIC_PROMPT.format(
                instruction=items[i][0].instruction.strip(), environment=public_environment(items[i][0]),
                runbook=items[i][1].render())}] for i in ask]
            for i, reply in zip(ask, self.policy.act(prompts)):
                verdicts[i] = parse_verdict(reply.text)
        return verdicts


def review_with_revision(critic, planner, items: Sequence[tuple], rounds: int) -> list[dict]:
    """The recursion: review every (task, episode, runbook); send rejected ones back to the
    planner with the reasons, up to `rounds` revisions. Returns one record per input runbook:
    {"runbook": final Runbook, "accepted": bool, "history": [{"round", "accept", "source", "reasons"}]}."""
    state = [{"task": t, "episode": e, "runbook": rb, "accepted": False, "history": []} for t, e, rb in items]
    active = list(range(len(state)))
    for rnd in range(rounds + 1):
        if not active:
            break
        verdicts = critic.review([(state[i]["task"], state[i]["runbook"]) for i in active])
        rejected = []
        for i, v in zip(active, verdicts):
            state[i]["history"].append({"round": rnd, "accept": v.accept, "source": v.source,
                                        "reasons": list(v.reasons)})
            if v.accept:
                state[i]["accepted"] = True
            else:
                rejected.append((i, v))
        if rnd == rounds or not rejected:
            break
        revised = planner.revise([(state[i]["task"], state[i]["episode"], state[i]["runbook"], v.findings,
                                   list(v.reasons)) for i, v in rejected])
        active = []
        for (i, _v), res in zip(rejected, revised):
            if res.runbook is None or not res.runbook.milestones:
                state[i]["history"].append({"round": rnd, "accept": False, "source": "planner",
                                            "reasons": [res.error or "revision left no milestones"]})
            else:
                state[i]["runbook"] = res.runbook
                active.append(i)
    return [{"task_id": s["task"].task_id, "runbook": s["runbook"], "accepted": s["accepted"],
             "history": s["history"]} for s in state]


def final_reasons(record: dict) -> list[str]:
    """Reasons of the last rejection of a runbook that was never accepted."""
    return [] if record["accepted"] else list(record["history"][-1]["reasons"]) if record["history"] else []

