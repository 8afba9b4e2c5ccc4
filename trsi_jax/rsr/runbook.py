"""Runbook: what a planner writes about one success, rendered as text and parsed back.

A runbook tells an executor how to reach the task's end state without being the solution
file: the target end state, ordered milestones (what to achieve, the command that achieved it,
how long its output took, what the terminal showed), checks, recovery steps and pitfalls. The
rendered text is what the critic reviews and what the executor sees as context; `parse` reads
it back (model planners write this format, the deterministic executor reads its steps from it).
"""
from __future__ import annotations

import dataclasses
import re

HEADER = "RUNBOOK"
_WAIT = re.compile(r"^\(wait ([0-9]+(?:\.[0-9]*)?(?:e[+-]?[0-9]+)?) s\)$")


class RunbookParseError(ValueError):
    """The text is not a runbook in the rendered format; the message says what is missing."""


@dataclasses.dataclass(frozen=True)
class Milestone:
    description: str
    command: str = ""  # keystrokes without the trailing newline ("" = no command)
    observed: str = ""  # what the terminal showed after the command (short excerpt)
    wait: float = 1.0  # seconds the agent waited for the command's output (its reply's duration)


@dataclasses.dataclass(frozen=True)
class Runbook:
    target: str
    milestones: tuple[Milestone, ...]
    checks: tuple[str, ...] = ()
    recovery: tuple[str, ...] = ()
    pitfalls: tuple[str, ...] = ()

    def render(self) -> str:
        lines = [HEADER, f"Target end state: {_one_line(self.target)}", "Milestones:"]
        for i, m in enumerate(self.milestones, 1):
            lines.append(f"{i}. {_one_line(m.description)}")
            for cmd_line in m.command.split("\n") if m.command else ():
                lines.append(f"   $ {cmd_line}")
            if m.command:
                lines.append(f"   (wait {m.wait:g} s)")
            if m.observed:
                lines.append(f"   -> {_one_line(m.observed)}")
        for title, items in (("Checks", self.checks), ("Recovery", self.recovery), ("Pitfalls", self.pitfalls)):
            lines.append(f"{title}:")
            lines.extend(f"- {_one_line(x)}" for x in items)
        return "\n".join(lines)

    def texts(self) -> list[str]:
        """Every prose field and command, for scans and revision."""
        out = [self.target, *self.checks, *self.recovery, *self.pitfalls]
        for m in self.milestones:
            out += [m.description, m.command, m.observed]
        return [t for t in out if t]


def _one_line(text: str) -> str:
    return " ".join(text.split())


def parse(text: str) -> Runbook:
    """Inverse of `Runbook.render` (tolerates text before the header and blank lines)."""
    start = text.find(HEADER)
    if start < 0:
        raise RunbookParseError(f"no {HEADER!r} header")
    lines = [line.rstrip() for line in text[start:].splitlines()[1:] if line.strip()]
    target, section = None, None
    milestones: list[dict] = []
    lists: dict[str, list[str]] = {"Checks": [], "Recovery": [], "Pitfalls": []}
    for line in lines:
        head = re.match(r"^(Target end state|Milestones|Checks|Recovery|Pitfalls):\s*(.*)$", line)
        if head:
            section = head.group(1)
            if section == "Target end state":
                target = head.group(2).strip()
            continue
        stripped = line.strip()
        if section == "Milestones":
            step = re.match(r"^(\d+)[.)]\s*(.*)$", stripped)
            if step:
                milestones.append({"description": step.group(2).strip(), "command": [], "observed": "",
                                   "wait": Milestone.wait})
            elif not milestones:
                raise RunbookParseError(f"milestone detail before the first numbered milestone: {stripped!r}")
            elif stripped.startswith("$"):
                milestones[-1]["command"].append(re.match(r"^\s*\$ ?(.*)$", line).group(1))
            elif wait := _WAIT.match(stripped):
                milestones[-1]["wait"] = float(wait.group(1))
            elif stripped.startswith("->"):
                milestones[-1]["observed"] = stripped[2:].strip()
            else:
                milestones[-1]["description"] += " " + stripped
        elif section in lists:
            lists[section].append(stripped[1:].strip() if stripped.startswith("-") else stripped)
        elif section == "Target end state" and target is not None:
            target += " " + stripped
    if not target:
        raise RunbookParseError("missing 'Target end state:'")
    if not milestones:
        raise RunbookParseError("no numbered milestones under 'Milestones:'")
    return Runbook(target, tuple(Milestone(m["description"], "\n".join(m["command"]), m["observed"], m["wait"])
                                 for m in milestones),
                   tuple(lists["Checks"]), tuple(lists["Recovery"]), tuple(lists["Pitfalls"]))


def to_json(rb: Runbook) -> dict:
    return dataclasses.asdict(rb)


def from_json(d: dict) -> Runbook:
    return Runbook(d["target"], tuple(Milestone(**m) for m in d["milestones"]), tuple(d.get("checks", ())),
                   tuple(d.get("recovery", ())), tuple(d.get("pitfalls", ())))
