"""experiments/power_analysis.py: the seed power analysis of the evidence plan (docs/evidence.md). Its arithmetic is
``planlm.evaluate.power`` (tests/evaluate/test_power.py, in the default suite); here, the script itself. Seconds."""

from __future__ import annotations

import pytest

from experiments import power_analysis
from planlm.evaluate import power

pytestmark = pytest.mark.lab  # a research script of experiments/: `pytest -m lab`


def test_the_script_s_curves_are_the_package_s_at_the_demo_s_documents():
    assert power_analysis.power_curve(-1.0, 0.5, 0.4, draws=300) == power.power_curve(
        -1.0, 0.5, 0.4, power_analysis.DOCUMENTS, draws=300)
    interval = power_analysis.CONTRASTS[1].intervals[0]
    assert power_analysis.document_se(interval.per_seed, interval.low, interval.high) == power.document_se(
        interval.per_seed, interval.low, interval.high, power_analysis.DOCUMENTS)


def test_the_script_writes_its_tables(tmp_path):
    out = tmp_path / "power.md"
    power_analysis.main(["--draws", "200", "--larger_test", "34", "--out", str(out)])
    text = out.read_text()
    assert "## Inputs" in text and "S for 80%" in text and "a test set of 34 documents" in text
    assert all(f"| {c.name} ({c.role}) |" in text for c in power_analysis.CONTRASTS)
