"""CLI: write the built-in suite as TB2 task folders.

  python -m sandboxes.suite.build --out DIR --split train|heldout --per_family N [--families a,b] [--start S]
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

from sandboxes.suite.builder import SPLITS, build_suite
from sandboxes.suite.families import FAMILIES


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sandboxes.suite.build", description="Write the built-in task suite as TB2 folders.")
    p.add_argument("--out", required=True, help="output directory (task folders <family>-<seed> go inside)")
    p.add_argument("--split", default="train", choices=SPLITS)
    p.add_argument("--per_family", type=int, default=10)
    p.add_argument("--families", default="", help="comma-separated subset; default all: " + ",".join(FAMILIES))
    p.add_argument("--start", type=int, default=0, help="first seed offset within the split")
    a = p.parse_args(argv)
    fams = [f for f in a.families.split(",") if f] or None
    paths = build_suite(a.out, a.split, a.per_family, fams, a.start)
    print(f"wrote {len(paths)} tasks to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
