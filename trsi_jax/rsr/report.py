"""Per-stage RSR report: coverage, runbook funnel, replays, SFT examples; JSON plus a text table."""
from __future__ import annotations

import collections
import json
from typing import Sequence

from trsi_jax.rsr.sft_data import DUPLICATE

PAPER_REWRITE_RATIO = 11094 / 2001  # trajectories per success in the paper


def reason_kind(source: str, reason: str) -> str:
    """A rejection reason's category for the report."""
    if source == "planner":
        return "planner failure"
    if source == "leak_scan":
        for prefix, kind in (("quotes", "leak: n-gram overlap with tests/solution"),
                             ("names the verifier path", "leak: verifier path"),
                             ("states an expected output", "leak: expected test output")):
            if reason.startswith(prefix):
                return kind
    if reason.startswith("critic reply unparsable"):
        return "model critic: unparsable reply"
    return "model critic: rejected"


def build_report(stage: int, coverage: dict, successes: int, records: Sequence[dict], plan_failures: int,
                 replays: int, verified: int, examples: int, dropped: Sequence[dict], sft: dict | None,
                 replay_infra_failures: int = 0, revised_verified: int = 0) -> dict:
    """`revised_verified`: runbooks accepted after a revision that at least one replay verified (a
    revision that had to drop the very command that did the work is accepted but useless)."""
    by_reason: collections.Counter = collections.Counter()
    revisions = 0
    for rec in records:
        for h in rec["history"]:
            if h["source"] == "planner" or not h["accept"]:
                for r in h["reasons"] or ["(no reason)"]:
                    by_reason[reason_kind(h["source"], r)] += 1
        revisions += sum(1 for h in rec["history"][1:] if h["source"] != "planner")
    accepted = sum(r["accepted"] for r in records)
    return {
        "stage": stage,
        "coverage": coverage,
        "successes": successes,
        "runbooks": {
            "written": len(records),
            "plan_failures": plan_failures,
            "accepted": accepted,
            "accepted_after_revision": sum(r["accepted"] and len(r["history"]) > 1 for r in records),
            "revised_verified": revised_verified,
            "rejected": len(records) - accepted,
            "revisions": revisions,
            "rejections_by_reason": dict(sorted(by_reason.items())),
        },
        "replays": {"run": replays, "verified": verified, "infra_failures": replay_infra_failures},
        "infra_failures": sum(coverage.get("infra_failures", {}).values()) + replay_infra_failures,
        "sft_examples": examples,
        "sft_examples_dropped": sum(d["reasons"] != [DUPLICATE] for d in dropped),
        "sft_examples_duplicates": sum(d["reasons"] == [DUPLICATE] for d in dropped),
        "rewrite_ratio": examples / successes if successes else None,
        "paper_rewrite_ratio": PAPER_REWRITE_RATIO,
        "sft": sft,
    }


def format_table(report: dict) -> str:
    """The report as an aligned two-column table."""
    cov = report["coverage"]
    rb = report["runbooks"]
    rows = [("tasks", cov["tasks"])]
    rows += [(f"solved by {name}", n) for name, n in cov["per_harness"].items()]
    gain = cov["union_gain_over_best"]
    rows += [("solved by the union", cov["union"]),
             ("union gain over best harness", "n/a" if gain is None else f"{gain:+.1%}"),
             ("successes", report["successes"]),
             ("runbooks written", rb["written"]), ("planner failures", rb["plan_failures"]),
             ("runbooks rejected", rb["rejected"])]
    rows += [(f"  rejections: {k}", v) for k, v in rb["rejections_by_reason"].items()]
    ratio = report["rewrite_ratio"]
    rows += [("runbooks accepted", rb["accepted"]), ("  after revision", rb["accepted_after_revision"]),
             ("  after revision, a replay verified", rb.get("revised_verified", "n/a")),
             ("replays run", report["replays"]["run"]), ("replays verified", report["replays"]["verified"]),
             ("infra failures (left out)", report["infra_failures"]),
             ("SFT examples", report["sft_examples"]), ("SFT examples dropped", report["sft_examples_dropped"]),
             ("SFT duplicates left out", report.get("sft_examples_duplicates", 0)),
             ("rewritten / successes", "n/a" if ratio is None else f"{ratio:.2f}"),
             ("paper: rewritten / successes", f"{report['paper_rewrite_ratio']:.2f} (11094 / 2001)")]
    if report.get("sft"):
        rows += [(f"SFT {k}", v if not isinstance(v, float) else f"{v:.4f}") for k, v in report["sft"].items()]
    width = max(len(k) for k, _ in rows)
    title = f"RSR-{report['stage']} report"
    return "\n".join([title, "-" * (width + 12)] + [f"{k:<{width}}  {v}" for k, v in rows])


def write_report(report: dict, path: str) -> None:
    with open(path, "w") as f:
        json.dump(report, f, indent=2)
