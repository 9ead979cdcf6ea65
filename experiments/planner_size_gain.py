"""How the LM's gain follows the planner's information: the same demo run with planners of two sizes.

Two (or more) finished ``planlm run`` folders of one recipe that differ only in what their planners read, e.g.
``configs/demo.yaml`` (planners on the LM's 260 training pieces) and ``configs/demo.yaml`` +
``configs/demo-bigplanner.yaml`` (planners and codebook on the whole training side of the corpus). Both runs
score the same test pieces with the same seeds, so a condition can be paired across runs, seed by seed and
document by document, as ``planlm compare`` does.

For each run and planned condition: the step-1 information of the planner it samples from, its paired
difference from Fixed, the oracle's, and the share of the oracle's gain (all from the run's results.json, the
report's numbers). Across runs: each condition of the second run minus the same condition of the first.

    python experiments/planner_size_gain.py small=runs/demo big=runs/demo-bigplanner \\
        --out experiments/results/planner_size_gain

Writes ``<out>.md`` (the tables) and ``<out>.png`` (gain over Fixed against step-1 information).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from planlm.evaluate.bootstrap import compare_evaluations
from planlm.pipeline.tables import fmt_share

PLANNED = {"cornille": "cornille", "ours": "shared", "ours_t1": "shared", "ours_pa": "shared"}  # condition: planner


def read_run(folder: Path) -> dict:
    """results.json's rows by name, its contrasts by (b, a) and its planners' step-1 information."""
    results = json.loads((folder / "results.json").read_text())
    rows = {r["name"]: r for r in results["conditions"]}
    contrasts = {(c["b"], c["a"]): c for c in results.get("contrasts") or []}
    info = {name: p["information"]["teacher_forced"]["nats"][0]
            for name, p in (results.get("planners") or {}).items() if p.get("information")}
    return {"rows": rows, "contrasts": contrasts, "info": info}


def versus_fixed(folder: Path, name: str) -> dict:
    """ppl(name) - ppl(fixed) of one run, paired over seeds and documents."""
    return compare_evaluations(folder / "eval" / "fixed", folder / "eval" / name)


def _ci(result: dict) -> str:
    return f"{result['diff']:+.2f} [{result['ci_low']:+.2f}, {result['ci_high']:+.2f}]"


def within_run_lines(runs: dict[str, Path]) -> tuple[list[str], list[dict]]:
    lines = ["| run | condition | planner step-1 information (nats) | PPL | - Fixed [95% CI] | share of the oracle's gain |",
             "|---|---|---|---|---|---|"]
    points = []
    for label, folder in runs.items():
        run = read_run(folder)
        oracle = versus_fixed(folder, "oracle")
        lines.append(f"| {label} | oracle | | {run['rows']['oracle']['ppl']:.2f} | {_ci(oracle)} | 100% |")
        for name, planner in PLANNED.items():
            row = run["rows"].get(name)
            if not row or row["ppl"] is None:
                continue
            diff = versus_fixed(folder, name)
            share = fmt_share(row) or "n/a"
            info = run["info"].get(planner)
            lines.append(f"| {label} | {name} | {info:.3f} | {row['ppl']:.2f} | {_ci(diff)} | {share} |")
            points.append({"run": label, "condition": name, "info": info, **{k: diff[k] for k in ("diff", "ci_low", "ci_high")}})
    return lines, points


def across_run_lines(runs: dict[str, Path]) -> list[str]:
    (first, a), *rest = runs.items()
    lines = ["| condition | " + " | ".join(f"{label} - {first} [95% CI] (per seed)" for label, _ in rest) + " |",
             "|---|" + "---|" * len(rest)]
    for name in ("none", "fixed", "oracle", *PLANNED):
        if not (a / "eval" / name).exists():
            continue
        cells = []
        for _, b in rest:
            result = compare_evaluations(a / "eval" / name, b / "eval" / name)
            seeds = ", ".join(f"{s['diff']:+.2f}" for s in result.get("seeds", {}).values())
            cells.append(f"{_ci(result)} ({seeds})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def figure(points: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name in PLANNED:
        mine = sorted((p for p in points if p["condition"] == name), key=lambda p: p["info"])
        if mine:
            ax.errorbar([p["info"] for p in mine], [p["diff"] for p in mine], capsize=3, marker="o", label=name,
                        yerr=[[p["diff"] - p["ci_low"] for p in mine], [p["ci_high"] - p["diff"] for p in mine]])
    ax.axhline(0, color="grey", lw=0.8)
    ax.set(xlabel="planner step-1 information (nats, validation)", ylabel="PPL - Fixed (test, 95% CI)",
           title="LM gain against the planner's information")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="label=run_dir, the first is the reference of the cross-run table")
    parser.add_argument("--out", default="experiments/results/planner_size_gain")
    args = parser.parse_args()
    runs = {label: Path(folder) for label, folder in (item.split("=", 1) for item in args.runs)}
    within, points = within_run_lines(runs)
    lines = ["# The LM's gain against the planner's information", "", "Within each run (test split, seeds paired):", "",
             *within, "", "Across runs (the same condition, the same test pieces and seeds):", "",
             *across_run_lines(runs), ""]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text("\n".join(lines))
    figure(points, out.with_suffix(".png"))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
