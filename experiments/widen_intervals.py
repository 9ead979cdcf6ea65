"""How much a run's report intervals widen: the old intervals against the new ones, from the run's own files.

For every condition of a run folder, its paired difference from the report's reference (`none`, else the first
condition) and, with a `fixed` condition, from Fixed:

- old: the interval the report showed before the seed-noise interval: with seeds, the two-level percentile bootstrap over seeds
  and articles, each article resampled alone (``seeded_paired_bootstrap`` without clusters); with one seed, the
  paired bootstrap over articles;
- documents: the same, resampling source documents with all their pieces (only the document fix);
- new: the report's interval now (``compare_evaluations``: the seed-noise interval, documents resampled).

It reads only eval/<condition>/[seed<N>/]per_article.csv, so it runs in seconds on a finished run:

    python experiments/widen_intervals.py runs/demo [--out experiments/results/demo_intervals_widen.md]

Without a run folder, ``--report`` reads a stored report.md's per-seed differences ("(seeds: a, b)") and gives
what the seed part alone implies, a lower bound on the new interval (its document part only adds to it):

    python experiments/widen_intervals.py --report lab/results/demo_report_3seeds.md
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import numpy as np

from planlm.evaluate.bootstrap import compare_evaluations, evaluation_arrays, paired_bootstrap

try:
    from experiments.two_level_bootstrap import seeded_paired_bootstrap
except ImportError:  # run as a script (python experiments/widen_intervals.py): its folder is sys.path[0]
    from two_level_bootstrap import seeded_paired_bootstrap
from planlm.pipeline.layout import RunLayout


def _old_intervals(dir_a: Path, dir_b: Path, samples: int) -> tuple[dict, dict]:
    """The old interval (articles resampled alone) and the same with documents resampled."""
    (nll_a, nll_b), tokens, sources, seeds = evaluation_arrays([dir_a, dir_b])
    if len(seeds) > 1:
        return (seeded_paired_bootstrap(nll_a, nll_b, tokens, samples),
                seeded_paired_bootstrap(nll_a, nll_b, tokens, samples, clusters=sources))
    return (paired_bootstrap(nll_a[0], nll_b[0], tokens, samples),
            paired_bootstrap(nll_a[0], nll_b[0], tokens, samples, clusters=sources))


def widening(run_dir: str | Path, samples: int = 1000) -> list[dict]:
    """One row per (reference, condition) pair: old, documents-only and new intervals and their widths."""
    layout = RunLayout(Path(run_dir))
    names = sorted(p.name for p in layout.root.joinpath("eval").iterdir() if p.is_dir())
    references = [n for n in ("none", "fixed") if n in names] or names[:1]
    rows = []
    for i, reference in enumerate(references):
        for name in names:
            if name in references[:i + 1]:  # none - fixed is fixed - none turned around
                continue
            dir_a, dir_b = layout.evaluation(reference), layout.evaluation(name)
            old, documents = _old_intervals(dir_a, dir_b, samples)
            new = compare_evaluations(dir_a, dir_b, num_samples=samples)
            rows.append({"pair": f"{name} - {reference}", "diff": new["diff"], "old": old, "documents": documents,
                         "new": new, "widening": (new["ci_high"] - new["ci_low"]) / (old["ci_high"] - old["ci_low"])})
    return rows


def seed_part_bounds(report_md: str | Path, confidence: float = 0.95) -> list[str]:
    """From a report's per-seed paired differences: each condition's difference from the reference and from Fixed,
    the old interval as printed, and the half-width of the new interval's seed part, t_{S-1} * s / sqrt(S)."""
    from scipy.stats import t

    rows = {}
    for line in Path(report_md).read_text().splitlines():
        cells = [c.strip() for c in line.split("|")]
        match = next((re.search(r"^([-+\d.]+) \[([-+\d.]+), ([-+\d.]+)\] \(seeds: ([^)]*)\)", c) for c in cells
                      if "(seeds:" in c), None)
        if match:
            rows[cells[2]] = (float(match[2]), float(match[3]), np.array([float(x) for x in match[4].split(",")]))
    lines = ["| B - A | mean over seeds | seed sd | old interval | seed part alone: the new interval contains | "
             "new width / old, at least |", "|---|---|---|---|---|---|"]
    for reference in ("none", "fixed"):
        for kind, (low, high, diffs) in rows.items():
            if kind == reference:
                continue
            if reference == "fixed":
                if "fixed" not in rows:
                    break
                diffs, low, high = diffs - rows["fixed"][2], None, None
            half = t.ppf(0.5 + confidence / 2, len(diffs) - 1) * diffs.std(ddof=1) / np.sqrt(len(diffs))
            mean = diffs.mean()
            old = "" if low is None else f"[{low:+.2f}, {high:+.2f}]"
            ratio = "" if low is None else f"{2 * half / (high - low):.1f}x"
            lines.append(f"| {kind} - {reference} | {mean:+.2f} | {diffs.std(ddof=1):.2f} | {old} | "
                         f"[{mean - half:+.2f}, {mean + half:+.2f}] | {ratio} |")
    return lines


def _fmt(result: dict) -> str:
    return f"[{result['ci_low']:+.2f}, {result['ci_high']:+.2f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", nargs="?")
    parser.add_argument("--report", type=Path, default=None, help="a stored report.md instead of a run folder")
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.report:
        lines = [f"{args.report}: per-seed paired differences, and the seed part of the new 95% interval "
                 f"(t on S - 1 degrees of freedom) alone; the document part adds in quadrature.", "",
                 *seed_part_bounds(args.report)]
        print("\n".join(lines))
        if args.out:
            args.out.write_text("\n".join(lines) + "\n")
        return
    rows = widening(args.run_dir, args.samples)
    lines = [f"Paired differences of {args.run_dir}: 95% intervals old (articles alone; with seeds the two-level "
             f"percentile bootstrap), with documents resampled, and new (the report's now).", "",
             "| B - A | difference (mean over seeds) | old | documents | new | new width / old |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['pair']} | {r['diff']:+.2f} | {_fmt(r['old'])} | {_fmt(r['documents'])} | {_fmt(r['new'])} | "
              f"{r['widening']:.2f}x |" for r in rows]
    if rows:
        lines.append(f"\nMedian widening {np.median([r['widening'] for r in rows]):.2f}x over {len(rows)} pairs.")
    print("\n".join(lines))
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
