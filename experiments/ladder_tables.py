"""The LM ladder's tables for docs/results.md, from `planlm across-runs` and the rungs' run folders (docs/ladder.md).

    planlm across-runs --run_dirs '[runs/ladder-1, runs/ladder-2, runs/ladder-3, runs/ladder-4, runs/ladder-smollm2]' \
        --out_dir runs/ladder-across --predict_at '[1.5e17]'
    PYTHONPATH=$PWD python experiments/ladder_tables.py --across runs/ladder-across \
        --runs runs/ladder-1 runs/ladder-2 runs/ladder-3 runs/ladder-4 runs/ladder-smollm2

Prints, in Markdown: each rung's ours - Fixed and oracle - Fixed in % of Fixed's perplexity with every seed, and the
share of the oracle's gain; the slopes against log10 compute with the pre-registered decision (interval below 0: the
gain grows; above 0: it shrinks; holding 0: no trend shown) and whether each interval excludes -0.84 points per
tenfold compute, the paper-sized slope; the line at the paper's compute (an extrapolation) beside the paper's -4.6%;
the top rung's T = 1 and Project-and-Avg contrasts; and ours - Fixed by how much of its piece the window no longer
shows, per rung.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

PAPER_SLOPE = -0.84  # points of % per tenfold compute: the evidence run's -0.54% to the paper's -4.6% (docs/ladder.md)
PAPER_GAIN = -4.6  # the paper's ours - Fixed, % of perplexity, GPT-2 small finetuned on 300M tokens


def signed(value: float, digits: int = 2) -> str:
    return f"{value:+.{digits}f}"


def interval(mean: float, low: float | None, high: float | None, digits: int = 2, bold: bool = True) -> str:
    if low is None or high is None:  # a bin with one document has no interval
        return f"{signed(mean, digits)} (no interval)"
    text = f"{signed(mean, digits)} [{signed(low, digits)}, {signed(high, digits)}]"
    return f"**{text}**" if bold and (low > 0 or high < 0) else text


def decision(low: float, high: float, share: bool = False) -> str:
    """docs/ladder.md's rule. A contrast in % is a gain when negative, so a slope below 0 means it grows; a share is
    a gain when positive."""
    if high < 0:
        return "the share falls with compute" if share else "the gain grows with compute"
    if low > 0:
        return "the share rises with compute" if share else "the gain shrinks with compute"
    return "no trend shown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--across", required=True, help="the out_dir of planlm across-runs (with --predict_at)")
    parser.add_argument("--runs", nargs="+", required=True,
                        help="the rungs' run folders, in the order of the across-runs command")
    args = parser.parse_args()
    across = json.loads((Path(args.across) / "across_runs.json").read_text())
    results = {Path(r).name: json.loads((Path(r) / "results.json").read_text()) for r in args.runs}

    print("| rung | LM | C (FLOPs) | Fixed PPL | ours - Fixed, % [95% CI] | seeds | oracle - Fixed, % [95% CI] | "
          "seeds | share of the oracle's gain [95% CI] |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in across["runs"]:
        ours, oracle = (next(c for c in row["contrasts"] if (c["b"], c["a"]) == pair)
                        for pair in (("ours", "fixed"), ("oracle", "fixed")))
        share = next(s for s in row["shares"] if s["condition"] == "ours")
        fixed = next(c for c in results[row["run"]]["conditions"] if c["name"] == "fixed")["ppl"]
        print(f"| {row['run']} | {row['compute']['model']} | {row['compute']['flops']:.2g} | {fixed:.2f} | "
              f"{interval(ours['relative'], ours['relative_ci_low'], ours['relative_ci_high'])} | "
              f"{', '.join(signed(v) for v in ours['seed_relatives'])} | "
              f"{interval(oracle['relative'], oracle['relative_ci_low'], oracle['relative_ci_high'])} | "
              f"{', '.join(signed(v) for v in oracle['seed_relatives'])} | "
              f"{100 * share['share']:.0f}% [{100 * share['ci_low']:.0f}%, {100 * share['ci_high']:.0f}%] |")

    print("\n| slope against log10 C, per tenfold compute | points of % [95% CI] | decided | excludes -0.84 |")
    print("|---|---|---|---|")
    for fit in across["fits"]:
        scale = 100 if fit["kind"] == "share" else 1
        low, high = scale * fit["ci_low"], scale * fit["ci_high"]
        print(f"| {fit['label']} | {interval(scale * fit['slope'], low, high)} | "
              f"{decision(low, high, fit['kind'] == 'share')} | "
              + ("n/a |" if fit["kind"] == "share" else f"{'yes' if not low <= PAPER_SLOPE <= high else 'no'} |"))
    for fit in across["fits"]:
        for p in fit.get("predictions", []):
            if fit["kind"] == "relative":
                print(f"\nExtrapolated ({p['decades_past_runs']:.1f} decades past the top rung), {fit['label']} at "
                      f"C = {p['flops']:.2g}: {signed(p['value'])}% [{signed(p['ci_low'])}, {signed(p['ci_high'])}]"
                      + (f"; the paper: {PAPER_GAIN}%" if fit["label"] == "ours - fixed" else ""))

    top_name = [row["run"] for row in across["runs"] if not row["compute"]["pretrained"]][-1]  # the largest fitted
    extra = [c for c in results[top_name]["contrasts"] if c["a"] not in ("fixed", "none")]
    if extra:
        print(f"\nThe top rung ({top_name}):\n\n| B - A | PPL [95% CI] | seeds | decided |\n|---|---|---|---|")
        for c in extra:
            print(f"| {c['b']} - {c['a']} | {interval(c['diff'], c['ci_low'], c['ci_high'])} | "
                  f"{', '.join(signed(v) for v in c['seed_diffs'].values())} | {c['decided']} |")

    print("\nours - Fixed, nats per token, by how much of its piece the window no longer shows:\n")
    print("| rung | all tokens | none out | < W out | >= W out |\n|---|---|---|---|---|")
    for name, result in results.items():
        bins = next(p for p in result["positions"] if (p["b"], p["a"]) == ("ours", "fixed"))["bins"]
        cells = [interval(bins[k]["diff"], bins[k]["ci_low"], bins[k]["ci_high"], 4)
                 for k in ("all", "inside", "near", "far")]  # none / under a window's length / a window or more out
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
