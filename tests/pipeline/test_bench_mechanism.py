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


@pytest.mark.slow
def test_bench_expectation_prints_its_table_and_targets(tmp_path):
    """experiments/bench_expectation.py --quick on one seed: every point, the timing and the two targets."""
    done = subprocess.run([sys.executable, str(ROOT / "experiments" / "bench_expectation.py"), "--quick", "--seeds",
                           "0", "--repeats", "1", "--no_compute_sweep", "--out_dir", str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    for row in ("| sampled K=50 |", "| expectation K=1 |", "| trained in expectation |", "| 1 | "):
        assert row in done.stdout
    assert done.stdout.count("PASS") + done.stdout.count("FAIL") == 2
    assert (tmp_path / "expectation" / "report-sampled.md").is_file()


def test_a_pooled_difference_over_seeds_carries_seed_noise(monkeypatch):
    """mechanism.paired over several seeds is the seed-noise interval of `planlm compare`: two seeds that disagree
    in sign give an interval across 0, where resampling articles alone would exclude it."""
    import numpy as np

    from planlm.evaluate import bootstrap

    monkeypatch.syspath_prepend(str(ROOT / "experiments"))
    import bench_mechanism as mechanism

    rng = np.random.default_rng(0)
    tokens = rng.integers(50, 100, 40)
    base = rng.normal(3.0, 0.1, 40) * tokens
    tables = {"a0": base, "a1": base, "b0": base - 0.05 * tokens, "b1": base + 0.03 * tokens}
    monkeypatch.setattr(bootstrap, "read_per_article", lambda d: {
        "id": np.arange(40).astype(object), "tokens": tokens, "nll_sum": tables[str(d)]})
    pooled = mechanism.paired([Path("a0"), Path("a1")], [Path("b0"), Path("b1")], 500)
    expected = bootstrap.seeded_paired_interval(np.stack([base, base]), np.stack([tables["b0"], tables["b1"]]),
                                                tokens, num_samples=500)
    assert pooled == pytest.approx(expected)
    assert pooled["ci_low"] < 0 < pooled["ci_high"]
    one_seed = mechanism.paired([Path("a0")], [Path("b0")], 500)
    assert one_seed["ci_high"] < 0  # one seed: over articles alone
