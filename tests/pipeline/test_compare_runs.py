"""benchmarks/compare_runs.py: the behaviour check between two run folders."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def fake_run(folder: Path, ppl: float, weights: bytes, wall_time: float) -> Path:
    """A run folder with one evaluation (metrics.json, per_article.csv) and one model's weights."""
    (folder / "eval" / "ours" / "seed0").mkdir(parents=True)
    (folder / "lm" / "ours" / "seed0" / "lm").mkdir(parents=True)
    (folder / "eval" / "ours" / "seed0" / "metrics.json").write_text(
        json.dumps({"ppl": ppl, "nll": 6.6, "wall_time_s": wall_time, "model_dir": str(folder)}))
    (folder / "eval" / "ours" / "seed0" / "per_article.csv").write_text("article,nll\n0,6.6\n")
    (folder / "lm" / "ours" / "seed0" / "lm" / "model.safetensors").write_bytes(weights)
    return folder


def compare(a: Path, b: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "compare_runs.py"), str(a), str(b)],
                          capture_output=True, text=True)


def test_timings_and_paths_are_ignored_numbers_and_weights_are_not(tmp_path):
    before = fake_run(tmp_path / "before", 779.3412, b"w1", wall_time=10.0)
    same = compare(before, fake_run(tmp_path / "same", 779.3412, b"w1", wall_time=99.0))
    assert same.returncode == 0 and "3 files compared; 0 differences" in same.stdout

    drift = compare(before, fake_run(tmp_path / "drift", 779.3413, b"w2", wall_time=10.0))
    assert drift.returncode == 0  # 779.34 either way: the printed perplexity is equal
    assert "2 differences" in drift.stdout and "weights" in drift.stdout and "relative 1.3e-07" in drift.stdout

    moved = compare(before, fake_run(tmp_path / "moved", 779.3512, b"w1", wall_time=10.0))
    assert moved.returncode == 1 and "NO" in moved.stdout


def test_a_renamed_recorded_name_is_the_same_value(tmp_path):
    """The path policy that gives every boundary K is recorded as all, formerly fixed: the same value; another
    policy is a difference."""
    def with_policy(folder: Path, kind: str) -> Path:
        run = fake_run(folder, 779.3412, b"w1", wall_time=10.0)
        metrics = run / "eval" / "ours" / "seed0" / "metrics.json"
        metrics.write_text(json.dumps({**json.loads(metrics.read_text()), "path_policy": {"kind": kind}}))
        return run

    before = with_policy(tmp_path / "before", "fixed")
    assert "0 differences" in compare(before, with_policy(tmp_path / "renamed", "all")).stdout
    assert "1 differences" in compare(before, with_policy(tmp_path / "other", "entropy")).stdout
