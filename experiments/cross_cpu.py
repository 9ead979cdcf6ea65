"""The same pre-registered run on two CPU types: how far its contrasts move, seed by seed, and whether each decision
holds. Reads two `planlm run` reports (report.md) of the same config and seeds.

    PYTHONPATH=$PWD python experiments/cross_cpu.py experiments/results/evidence_report.md runs/evidence/report.md

A seed's numbers repeat exactly on one kind of CPU but not across kinds: `precision: native` runs bf16 where the CPU
has it and fp32 elsewhere, and other arithmetic gives other sentence embeddings, another codebook and other
training. Prints, in Markdown, for each contrast of both reports (and the K sweep's largest K minus K = 1): each
report's mean [95% CI] and decision, every seed's value in the second minus the first, and the mean and sd of that
per-seed move; then each condition's perplexity, the mean over seeds in each report.
"""

from __future__ import annotations

import argparse
import re
import statistics
from pathlib import Path

NUMBER = r"[-+]?\d+(?:\.\d+)?"
CONTRAST = re.compile(rf"^\| (\S+) - (\S+) \| ({NUMBER}) \[({NUMBER}), ({NUMBER})\] \(seeds: ([^)]*)\) \|")
CONDITION = re.compile(rf"^\| ([^|]+?) \| [^|]+ \| \d+ \| \d+ \| ({NUMBER}) ± ({NUMBER}) \[")
SWEEP = re.compile(rf"^\| (\d+) \| [^|]+ \| ({NUMBER}) \[({NUMBER}), ({NUMBER})\] \(seeds: ([^)]*)\) \|")


def parse(report: Path) -> dict:
    """The contrasts of a report's paired table, its K sweep's rows and its conditions' seed-mean perplexities."""
    contrasts, sweep, conditions = {}, {}, {}
    in_ppl_table = False
    for line in report.read_text().splitlines():
        if line.startswith("| B - A |"):
            in_ppl_table = "PPL difference" in line  # the nats-per-token tables have the same row shape
        m = CONTRAST.match(line)
        if m and in_ppl_table:
            contrasts[f"{m[1]} - {m[2]}"] = _row(m[3], m[4], m[5], m[6])
            continue
        m = SWEEP.match(line)
        if m:
            sweep[int(m[1])] = _row(m[2], m[3], m[4], m[5])
            continue
        m = CONDITION.match(line)
        if m:
            conditions[m[1].strip()] = float(m[2])
    if sweep:
        contrasts[f"K = {max(sweep)} - K = 1"] = sweep[max(sweep)]
    if not contrasts:
        raise SystemExit(f"{report}: no paired contrasts found; pass the report.md of a `planlm run` with seeds")
    return {"contrasts": contrasts, "conditions": conditions}


def _row(mean: str, low: str, high: str, seeds: str) -> dict:
    return {"mean": float(mean), "low": float(low), "high": float(high),
            "seeds": [float(s) for s in seeds.split(",")]}


def decision(row: dict) -> str:
    if row["high"] < 0:
        return "B better"
    return "A better" if row["low"] > 0 else "not shown"


def tables(first: dict, second: dict, names: tuple[str, str]) -> str:
    shared = [c for c in first["contrasts"] if c in second["contrasts"]]
    seeds = len(first["contrasts"][shared[0]]["seeds"]) if shared else 0
    head = (f"| B - A | {names[0]} | {names[1]} | same decision | "
            + " | ".join(f"seed {s}" for s in range(seeds)) + " | mean move | sd of the move |")
    lines = [head, "|" + "---|" * (6 + seeds)]
    for name in shared:
        a, b = first["contrasts"][name], second["contrasts"][name]
        if len(a["seeds"]) != len(b["seeds"]):
            raise SystemExit(f"{name}: {len(a['seeds'])} seeds in one report, {len(b['seeds'])} in the other; "
                             "compare runs of the same seeds")
        moves = [y - x for x, y in zip(a["seeds"], b["seeds"])]
        sd = statistics.stdev(moves) if len(moves) > 1 else float("nan")
        lines.append(f"| {name} | {_cell(a)} | {_cell(b)} | {'yes' if decision(a) == decision(b) else 'no'} | "
                     + " | ".join(f"{m:+.2f}" for m in moves) + f" | {statistics.fmean(moves):+.2f} | {sd:.2f} |")
    lines += ["", f"| condition | PPL, mean over seeds: {names[0]} | {names[1]} | move |", "|---|---|---|---|"]
    for name, ppl in first["conditions"].items():
        if name in second["conditions"]:
            lines.append(f"| {name} | {ppl:.2f} | {second['conditions'][name]:.2f} | "
                         f"{second['conditions'][name] - ppl:+.2f} |")
    return "\n".join(lines)


def _cell(row: dict) -> str:
    return f"{row['mean']:+.2f} [{row['low']:+.2f}, {row['high']:+.2f}] ({decision(row)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first", type=Path, help="report.md of the run on the first CPU")
    parser.add_argument("second", type=Path, help="report.md of the same config and seeds on the second CPU")
    parser.add_argument("--names", nargs=2, default=["first", "second"], help="the two CPUs' names for the columns")
    args = parser.parse_args()
    print(tables(parse(args.first), parse(args.second), tuple(args.names)))


if __name__ == "__main__":
    main()
