"""The paper's grid on one device, summed from measured rates (not a timed run).

The grid: 12 LM conditions, each one LM epoch on the paper's corpus (300M tokens) plus K = 10 plans for its training
split (10M boundaries), and 3 planner horizons, each 20 planner epochs (10M boundaries an epoch). The LM's rate is
the multipath adapter's training tokens/s, read from a ``bench_lm.py`` log (its ``multipath`` row) or given; the
planner's rates default to the causal g's on the H200 (docs/benchmarks.md).

    python benchmarks/grid_sum.py --lm_log runs/gpu-checks/lm_compiled.txt
    python benchmarks/grid_sum.py --lm_tokens_per_s 132353
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

PAPER_TOKENS, PAPER_BOUNDARIES = 300e6, 10e6
LM_CONDITIONS, PLANNER_HORIZONS, PLANNER_EPOCHS = 12, 3, 20


def multipath_rate(log: Path) -> float:
    """tokens/s of the ``multipath`` row of a bench_lm.py table (its fourth column); the fastest of the log's tables
    (compiled, CUDA graphs)."""
    rates = []
    for line in log.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) > 3 and cells[0] == "multipath":
            rates.append(float(re.sub(r"[^0-9.]", "", cells[3])))
    if not rates:
        raise SystemExit(f"{log}: no multipath row (a bench_lm.py table); give --lm_tokens_per_s")
    return max(rates)


def grid_hours(lm_tokens_per_s: float, planner_boundaries_per_s: float, plans_boundaries_per_s: float) -> dict:
    """Hours per LM condition, per planner horizon and for the whole grid."""
    lm = PAPER_TOKENS / lm_tokens_per_s / 3600 + PAPER_BOUNDARIES / plans_boundaries_per_s / 3600
    planner = PLANNER_EPOCHS * PAPER_BOUNDARIES / planner_boundaries_per_s / 3600
    return {"per LM condition": lm, "per planner horizon": planner,
            "grid": LM_CONDITIONS * lm + PLANNER_HORIZONS * planner}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lm_log", type=Path, help="a bench_lm.py log: its multipath row's tokens/s")
    parser.add_argument("--lm_tokens_per_s", type=float, help="the multipath LM's training tokens/s")
    parser.add_argument("--planner_boundaries_per_s", type=float, default=16_151,
                        help="planner training, boundaries/s (H200, causal g: 16,151)")
    parser.add_argument("--plans_boundaries_per_s", type=float, default=9_187,
                        help="K = 10 sampling, boundaries/s (H200, causal g: 9,187)")
    args = parser.parse_args()
    rate = args.lm_tokens_per_s or (multipath_rate(args.lm_log) if args.lm_log else None)
    if rate is None:
        raise SystemExit("give --lm_log or --lm_tokens_per_s")
    hours = grid_hours(rate, args.planner_boundaries_per_s, args.plans_boundaries_per_s)
    print(f"the paper's grid from LM {rate:,.0f} tokens/s, planner {args.planner_boundaries_per_s:,.0f} and K = 10 "
          f"plans {args.plans_boundaries_per_s:,.0f} boundaries/s: {LM_CONDITIONS} x {hours['per LM condition']:.2f} h "
          f"+ {PLANNER_HORIZONS} x {hours['per planner horizon']:.2f} h = {hours['grid']:.1f} h (target: under 24 h)")


if __name__ == "__main__":
    main()
