"""experiments/bench_mechanism.py at its development size: the real stages end to end, seeds side by side."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def bench(out_dir: Path, *extra: str) -> str:
    """The report of one invocation (--quick: 300 articles, 1 + 1 epochs, a 3-epoch planner)."""
    done = subprocess.run([sys.executable, str(ROOT / "experiments" / "bench_mechanism.py"), "--quick",
                           "--seeds", "0", "1", "--out_dir", str(out_dir), *extra],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
def test_seeds_in_worker_processes_give_the_tables_of_one_process(tmp_path):
    parallel = bench(tmp_path, "--workers", "2")
    serial = bench(tmp_path, "--workers", "1", "--tag", "serial")  # the corpus and planner are reused
    tables = [[line for line in report.splitlines() if line.startswith("|")] for report in (parallel, serial)]
    assert tables[0] == tables[1]
    assert "| ours - sampled |" in parallel and "| seed 0 | seed 1 |" in parallel
    assert parallel.count("PASS") + parallel.count("FAIL") == 4
    assert (tmp_path / "serial" / "report.md").is_file() and (tmp_path / "lm" / "ours-seed1").is_dir()
