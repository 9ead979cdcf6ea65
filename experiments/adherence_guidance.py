"""Does plan guidance make the demo's LMs write to their outline? Chosen on validation, measured on test.

1. More seeds of the oracle LM: ``configs/demo.yaml`` with ``experiments/demo_oracle_seeds.yaml`` (oracle and Fixed
   only), seeds 2 and 3, in ``<run>-seeds`` beside the finished demo run (its prepared corpus and planner linked),
   so the oracle LM has four seeds (``<out_dir>/oracle-models/seed{0..3}``).
2. Validation: ``planlm adherence`` of the oracle LM on the validation split (all pieces, 3 outlines of 2 sentences
   each, outline and shuffled) at every ``--weights`` w. The rule, fixed before the test split is read: **w is the
   weight with the most requested sentences realised** (hits over sentences asked, a sentence left unfinished
   counting as a miss, so that guidance cannot win by writing fewer sentences), averaged over seeds.
3. Test: the oracle LM (4 seeds), ours and Cornille et al. (the run's 2 seeds) at the chosen w and at w = 1, all
   four conditions, 2 outlines of 2 sentences from each test piece; then each model's paired w - 1 difference per
   condition (``planlm.evaluate.adherence.paired_difference``: documents resampled together, seeds' spread).

    python experiments/adherence_guidance.py --run runs/demo --out_dir runs/adherence-guidance

Each adherence folder is reused when finished. Prints the tables and writes ``summary.json`` in ``--out_dir``;
``--tables`` prints the results page's tables, every seed's value included, from a finished ``--out_dir``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from planlm.args import Runtime
from planlm.evaluate.adherence import AdherenceMetrics, adherence, paired_difference, table
from planlm.plans.config import PlanSettings

ROOT = Path(__file__).resolve().parents[1]
COMMON = dict(outline_length=2, tokens_per_sentence=48, bootstrap_samples=2000, runtime=Runtime(precision="fp32"))


def oracle_models(run: Path, out_dir: Path, extra_seeds: list[int]) -> Path:
    """The oracle LM's seed folders, the run's and ``extra_seeds`` trained beside it, linked in one folder."""
    seeds_run = run.parent / f"{run.name}-seeds"
    seeds_run.mkdir(parents=True, exist_ok=True)
    for stage in ("prepared", "planner"):
        link = seeds_run / stage
        if not link.exists():
            link.symlink_to(Path("..") / run.name / stage)
    subprocess.run([sys.executable, "-m", "planlm.cli", "run", "--config", str(ROOT / "configs/demo.yaml"),
                    "--config", str(ROOT / "experiments/demo_oracle_seeds.yaml"), "--out_dir", str(seeds_run),
                    "--seeds", json.dumps(extra_seeds)], check=True)
    models = out_dir / "oracle-models"
    models.mkdir(parents=True, exist_ok=True)
    extra = [seeds_run / f"lm/oracle/seed{s}" for s in extra_seeds]
    for seed_dir in [*sorted((run / "lm/oracle").glob("seed*")), *extra]:
        link = models / seed_dir.name
        if not link.exists():
            link.symlink_to(seed_dir.resolve())
    return models


def requested_realised(metrics: AdherenceMetrics, condition: str = "outline") -> float:
    """Hits over sentences asked (an unfinished sentence is a miss), the mean over seeds: the validation rule."""
    c = metrics.conditions[condition]
    return sum(a * n / c.sentences_asked for a, n in zip(c.adherence.seeds, c.sentences)) / len(c.sentences)


def choose_weight(models: Path, prepared: str, out_dir: Path, weights: list[float]) -> tuple[float, dict]:
    """Step 2: the validation sweep and the chosen w."""
    scores = {}
    for w in weights:
        metrics = adherence(str(models), prepared, str(out_dir / f"val-w{w:g}"), split="validation", max_articles=30,
                            outlines_per_article=3, conditions=["outline", "shuffled"], plan_guidance=w, **COMMON)
        scores[w] = requested_realised(metrics)
    best = max(weights, key=lambda w: (round(scores[w], 6), -w))  # ties: the smaller weight
    print("validation, outline sentences realised per sentence asked: "
          + ", ".join(f"w={w:g} {100 * s:.1f}%" for w, s in scores.items()) + f"; chosen w = {best:g}")
    return best, scores


def measure_test(name: str, model_dir: str, prepared: str, out_dir: Path, weights: list[float],
                 plans: PlanSettings) -> dict:
    """Step 3 for one model: the test split at each weight, then the paired (first - last) differences."""
    folders = {}
    for w in weights:
        folders[w] = out_dir / f"test-{name}-w{w:g}"
        metrics = adherence(model_dir, prepared, str(folders[w]), max_articles=50, outlines_per_article=2,
                            conditions=["outline", "own", "fixed", "shuffled"], plans=plans,
                            plan_guidance=w, **COMMON)
        print(f"{name}, w = {w:g}:\n{table(metrics)}")
    difference = paired_difference(folders[weights[0]], folders[weights[-1]], prepared)
    for condition, stats in difference.items():
        print(f"{name} {condition}: w={weights[0]:g} - w={weights[-1]:g}: adherence "
              f"{100 * stats['adherence']['mean']:+.1f} [{100 * stats['adherence']['ci_low']:+.1f}, "
              f"{100 * stats['adherence']['ci_high']:+.1f}] points")
    return {"folders": {f"{w:g}": str(f) for w, f in folders.items()}, "difference": difference}


ROWS = {"outline": "outline", "own": "own planner", "fixed": "Fixed",
        "shuffled": "shuffled outline (scored on the true one)",
        "shuffled_asked": "shuffled outline (scored on the one it was given)"}


def _cell(stat: dict, scale: float = 100.0, unit: str = "%", digits: int = 1) -> str:
    each = " / ".join(f"{scale * v:.{digits}f}" for v in stat["seeds"])
    return (f"{scale * stat['mean']:.{digits}f}{unit} [{scale * stat['ci_low']:.{digits}f}, "
            f"{scale * stat['ci_high']:.{digits}f}] ({each})")


def results_tables(out_dir: Path) -> str:
    """The results page's tables from a finished ``--out_dir``: the validation sweep, then each test folder's rows
    with every seed's value, then each model's paired chosen w - 1."""
    summary = json.loads((out_dir / "summary.json").read_text())
    lines = ["validation, requested sentences realised (4 seeds): " + ", ".join(
        f"w = {w}: {100 * v:.1f}%" for w, v in summary["validation"].items()) + f"; chosen w = {summary['chosen']:g}", "",
        "| model | w | plans | adherence [95% CI] (seeds) | of asked, unfinished a miss [95% CI] (seeds) | top-5 | "
        "chance | adherence / chance [95% CI] (seeds) | sentences scored (per seed) |", "|---|---|---|---|---|---|---|---|---|"]
    differences = []
    for name, result in summary["test"].items():
        for w, folder in sorted(result["folders"].items(), key=lambda item: float(item[0])):
            metrics = json.loads((Path(folder) / "metrics.json").read_text())
            for condition, label in ROWS.items():
                if condition not in metrics:
                    continue
                m = metrics[condition]
                sentences = " / ".join(map(str, m["sentences"]))
                lines.append(f"| {name} | {w} | {label} | {_cell(m['adherence'])} | {_cell(m['of_asked'])} | "
                             f"{100 * m['top5']['mean']:.1f}% | {100 * m['chance']['mean']:.1f}% | "
                             f"{_cell(m['over_chance'], 1.0, 'x')} | {sentences} of {m['sentences_asked']} |")
        for condition, stats in result["difference"].items():
            a, o = stats["adherence"], stats["of_asked"]
            differences.append(f"| {name} | {ROWS.get(condition, condition)} | {100 * a['mean']:+.1f} "
                               f"[{100 * a['ci_low']:+.1f}, {100 * a['ci_high']:+.1f}] | {100 * o['mean']:+.1f} "
                               f"[{100 * o['ci_low']:+.1f}, {100 * o['ci_high']:+.1f}] |")
    if differences:
        lines += ["", f"| model | plans | adherence, w = {summary['chosen']:g} - w = 1 (points) | of asked, w = "
                      f"{summary['chosen']:g} - w = 1 (points) |", "|---|---|---|---|"] + differences
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", default="runs/demo", help="a finished `planlm run --config configs/demo.yaml`")
    parser.add_argument("--out_dir", default="runs/adherence-guidance")
    parser.add_argument("--extra_seeds", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--weights", type=float, nargs="+", default=[1.0, 1.5, 2.0, 3.0, 5.0])
    parser.add_argument("--tables", action="store_true", help="print the results page's tables of a finished --out_dir")
    args = parser.parse_args()
    run, out_dir = Path(args.run), Path(args.out_dir)
    if args.tables:
        print(results_tables(out_dir))
        return
    prepared = str(run / "prepared")
    models = oracle_models(run, out_dir, args.extra_seeds)
    best, scores = choose_weight(models, prepared, out_dir, args.weights)
    weights = [best, 1.0] if best != 1 else [1.0]
    planner = PlanSettings(kind="planner_sampled", planner_dir=str(run / "planner"), num_paths=1, horizon=1)
    results = {
        "oracle": measure_test("oracle", str(models), prepared, out_dir, weights, planner),
        "ours": measure_test("ours", str(run / "lm/ours"), prepared, out_dir, weights,
                             PlanSettings(planner_dir=str(run / "planner"))),
        "cornille": measure_test("cornille", str(run / "lm/cornille"), prepared, out_dir, weights,
                                 PlanSettings(planner_dir=str(run / "planners/cornille"))),
    }
    summary = {"validation": {f"{w:g}": s for w, s in scores.items()}, "chosen": best, "test": results}
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
