"""Sandbox throughput: a scripted 10-command terminal episode + verification, per backend, with 1 and N
sandboxes in parallel (threads). Prints start latency, episode time and episodes/s, and the local
backend's speed-up over docker measured side by side in this run.

  .venv/bin/python -m benchmarks.bench_sandbox [--backends local,docker] [--episodes 8] [--parallel 4]
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from trsi_jax.sandbox import make_sandbox, verify
from trsi_jax.tasks import load_task

COMMANDS = 10


def write_task(root: Path) -> Path:
    d = root / "bench-task"
    for sub in ("environment", "tests", "solution"):
        (d / sub).mkdir(parents=True)
    (d / "task.toml").write_text('[metadata]\ncategory = "bench"\n[verifier]\ntimeout_sec = 60\n')
    (d / "instruction.md").write_text("Append the numbers 0..9 to /app/log.txt, one per line.\n")
    (d / "environment" / "Dockerfile").write_text("FROM python:3.11-slim\nWORKDIR /app\nRUN touch /app/log.txt\n")
    (d / "solution" / "solve.sh").write_text("seq 0 9 > /app/log.txt\n")
    (d / "tests" / "test_outputs.py").write_text(
        "def test_log():\n    assert open('/app/log.txt').read().split() == [str(i) for i in range(10)]\n")
    (d / "tests" / "test.sh").write_text(
        "cd /app && PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python3 -m pytest /tests/test_outputs.py -rA -p no:cacheprovider\n")
    return d


def episode(task, backend: str) -> tuple[float, float, bool]:
    """(start latency, whole episode seconds, strict success) for one scripted episode."""
    t0 = time.perf_counter()
    with make_sandbox(task, backend) as sb:
        started = time.perf_counter() - t0
        term = sb.terminal()
        for i in range(COMMANDS):
            term.send_keys(f"echo {i} >> /app/log.txt\n", duration_sec=10)
        term.read_new_output()
        ok = verify(sb, task).strict
    return started, time.perf_counter() - t0, ok


def run(task, backend: str, episodes: int, parallel: int) -> dict:
    episode(task, backend)  # warm-up: image build / page cache
    t0 = time.perf_counter()
    with ThreadPoolExecutor(parallel) as pool:
        results = list(pool.map(lambda _: episode(task, backend), range(episodes)))
    wall = time.perf_counter() - t0
    assert all(ok for _, _, ok in results), f"{backend}: a scripted episode failed verification"
    return {"start_ms": 1e3 * statistics.median(r[0] for r in results),
            "episode_s": statistics.median(r[1] for r in results), "eps_per_s": episodes / wall}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backends", default="local,docker")
    p.add_argument("--episodes", type=int, default=8)
    p.add_argument("--parallel", type=int, default=4)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        task = load_task(write_task(Path(tmp)))
        table = {}
        for backend in a.backends.split(","):
            for par in (1, a.parallel):
                r = run(task, backend, a.episodes, par)
                table[(backend, par)] = r
                print(f"{backend:7s} parallel={par}: start {r['start_ms']:8.1f} ms (median)  episode "
                      f"{r['episode_s']:6.2f} s (median)  throughput {r['eps_per_s']:6.2f} episodes/s  "
                      f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)", flush=True)
        for par in (1, a.parallel):
            if ("local", par) in table and ("docker", par) in table:
                loc, dok = table[("local", par)], table[("docker", par)]
                print(f"local vs docker, parallel={par}: start {dok['start_ms'] / loc['start_ms']:.1f}x faster, "
                      f"throughput {loc['eps_per_s'] / dok['eps_per_s']:.2f}x")


if __name__ == "__main__":
    main()
