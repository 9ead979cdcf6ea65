"""experiments/cross_cpu.py: two made-up reports of the same seeds with a known move between them. Milliseconds."""

from __future__ import annotations

import pytest

from experiments import cross_cpu

pytestmark = pytest.mark.lab  # a research script of experiments/: `pytest -m lab`


def _report(ours: str, sweep: str, none_ppl: str) -> str:
    return f"""# planlm report: x

| Model | conditioning | K | T | PPL mean ± std [min, max] over seeds [0, 1, 2] | more |
|---|---|---|---|---|---|
| No planner (plain LM) | none | 1 | 1 | {none_ppl} ± 0.91 [211.42, 214.19] | x |

| B - A | PPL difference [95% CI] | relative | decided |
|---|---|---|---|
| ours - fixed | {ours} | -0.44% | ours better |

| B - A | all tokens | token 1 |
|---|---|---|
| ours - fixed | -0.0045 [-0.0086, -0.0002] (seeds: -0.0083, -0.0036, +0.0012) | x |

| value | PPL mean over seeds (each seed) | paired PPL - PPL at 1 [95% CI] (seeds) | K | T | tau |
|---|---|---|---|---|---|
| 1 | 213.85 (1, 2, 3) | 0.00 [0.00, 0.00] (seeds: +0.00, +0.00, +0.00) | 1 | 5 | 1 |
| 20 | 212.13 (1, 2, 3) | {sweep} | 20 | 5 | 1 |
"""


def test_moves_decisions_and_conditions(tmp_path):
    first, second = tmp_path / "a.md", tmp_path / "b.md"
    first.write_text(_report("-0.95 [-1.81, -0.05] (seeds: -1.00, -0.50, -1.50)",
                             "-1.72 [-2.09, -1.36] (seeds: -1.70, -2.10, -1.50)", "213.07"))
    second.write_text(_report("-0.50 [-1.40, 0.40] (seeds: -0.80, -0.10, -0.60)",
                              "-1.50 [-2.00, -1.00] (seeds: -1.70, -1.90, -0.90)", "212.07"))
    a, b = cross_cpu.parse(first), cross_cpu.parse(second)
    assert set(a["contrasts"]) == {"ours - fixed", "K = 20 - K = 1"}  # the nats table's row is not a PPL contrast
    assert a["contrasts"]["ours - fixed"]["seeds"] == [-1.0, -0.5, -1.5]
    assert a["conditions"] == {"No planner (plain LM)": 213.07}
    out = cross_cpu.tables(a, b, ("cpu a", "cpu b")).splitlines()
    ours = next(line for line in out if line.startswith("| ours - fixed"))
    # moves +0.20, +0.40, +0.90: mean +0.50, sd 0.36; the decision changes (B better -> not shown)
    assert "| no | +0.20 | +0.40 | +0.90 | +0.50 | 0.36 |" in ours
    sweep = next(line for line in out if line.startswith("| K = 20 - K = 1"))
    assert "| yes | +0.00 | +0.20 | +0.60 | +0.27 |" in sweep
    assert "| No planner (plain LM) | 213.07 | 212.07 | -1.00 |" in out


def test_no_contrasts_is_a_one_line_error(tmp_path):
    empty = tmp_path / "report.md"
    empty.write_text("# planlm report: one seed\n")
    with pytest.raises(SystemExit, match="report.md: no paired contrasts found"):
        cross_cpu.parse(empty)
