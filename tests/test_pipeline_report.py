"""Pipeline report: mean ± 95% t-interval, the per-stage and RSR tables, one line per stage, the plot."""
import math

import numpy as np
import pytest

from trsi_jax.pipeline import report


def _eval(strict, process, files, infra=0):
    return {"all": {"pass@1": strict, "pass@2": min(1.0, 2 * strict), "strict_success": strict,
                    "process_reward": process, "tasks": 4, "episodes": 8, "infra_failures": infra},
            "families": {"files": {"strict_success": files}}}


def _rsr(union, common, written, rejected, revisions, accepted, after):
    return {"coverage": {"tasks": 10, "per_harness": {"common": common, "retry": union - 1}, "union": union},
            "successes": union + 2, "runbooks": {"written": written, "rejected": rejected, "revisions": revisions,
                                                  "accepted": accepted, "accepted_after_revision": after,
                                                  "revised_verified": after},
            "replays": {"verified": 5}, "sft_examples": 4, "infra_failures": 1}


def test_mean_ci_is_the_student_t_interval():
    x = [0.1, 0.2, 0.4]
    mean, half = report.mean_ci(x)
    t_975_df2 = math.sqrt(2 * 0.95 ** 2 / (1 - 0.95 ** 2))  # df = 2: F(t) = 1/2 + t / (2 sqrt(2 + t^2))
    assert mean == pytest.approx(np.mean(x), abs=1e-15)
    assert half == pytest.approx(t_975_df2 * np.std(x, ddof=1) / math.sqrt(3), rel=1e-12)
    assert report.mean_ci([0.3])[0] == 0.3 and math.isnan(report.mean_ci([0.3])[1])
    assert report.cell([0.1, 0.2, 0.4]) == f"{mean:.3f} ± {half:.3f}" and report.cell([0.25]) == "0.250"


def test_tables_one_run_and_over_seeds():
    one = report.eval_table([{"base": _eval(0.1, 0.3, 0.0), "rsr-1": _eval(0.2, 0.4, 0.5)}])
    lines = one.splitlines()
    assert lines[0].split(" | ") == ["stage", "pass@1", "pass@2", "strict_success", "process_reward", "files:strict"]
    assert [c.strip() for c in lines[2].split(" | ")] == ["base", "0.100", "0.200", "0.100", "0.300", "0.000"]
    runs = [{"base": _eval(s, 0.3, 0.0, infra=i)} for s, i in ((0.1, 0), (0.2, 2), (0.4, 1))]
    seeds = report.eval_table(runs).splitlines()
    assert seeds[0].split(" | ")[-1].strip() == "infra failures"
    assert seeds[2].split(" | ")[3].strip() == report.cell([0.1, 0.2, 0.4])
    rsr = report.rsr_table([{"rsr-1": _rsr(4, 3, 8, 1, 2, 7, 1)}]).splitlines()
    assert rsr[0] == report.RSR_LEGEND
    header = [c.strip() for c in rsr[1].split(" | ")]
    row = dict(zip(header, [c.strip() for c in rsr[3].split(" | ")]))
    assert row == {"stage": "rsr-1", "tasks": "10", "common": "3", "retry": "3", "union": "4", "successes": "6",
                   "written": "8", "rejected": "1", "revised": "2", "accepted": "7", "after revision": "1",
                   "revised+verified": "1", "replays ok": "5", "SFT": "4", "infra": "1"}
    older = _rsr(4, 3, 8, 1, 2, 7, 1)
    del older["runbooks"]["revised_verified"]  # a report written before the field existed
    rows = report.rsr_table([{"rsr-1": older}]).splitlines()
    assert dict(zip(header, [c.strip() for c in rows[3].split(" | ")]))["revised+verified"] == "n/a"


def test_stage_line_and_plot(tmp_path):
    summary = {"seconds": 61.2, **_rsr(4, 3, 8, 1, 2, 7, 1)}
    line = report.stage_line("rsr-1", summary, _eval(0.25, 0.5, 0.5, infra=1))
    assert "\n" not in line and "held-out strict 0.250 pass@1 0.250 pass@2 0.500 process 0.500" in line
    assert "runbooks 8 written / 1 rejected / 2 revised / 7 accepted" in line and "1 infra failures" in line
    path = tmp_path / "report.png"
    report.plot([{"base": _eval(0.1, 0.3, 0.0), "rpr-2": _eval(0.3, 0.5, 0.2)},
                 {"base": _eval(0.2, 0.3, 0.0), "rpr-2": _eval(0.4, 0.6, 0.2)}], str(path), "test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
