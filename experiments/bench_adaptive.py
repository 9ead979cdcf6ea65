"""Adaptive planning compute: paths only where the planner is unsure, at the perplexity of K = 50 everywhere.

It reads finished runs (their prepared data, planner and trained LMs) and runs only the library's commands:

1. **Compute against perplexity**: ``planlm sweep --kind compute`` on one trained LM: K = 1, 2, 5,
   10, 20, 50 and the entropy policy at a few budgets, all on the same test articles (the converge policy of
   docs/results.md's tables left planlm: lab/removed-options.md names the commit that has it).
   Printed per point: paths per boundary (mean, and the fraction of K = 50's), perplexity, the paired
   difference from K = 50 everywhere with its 95% paired bootstrap interval over articles, wall, planner and
   LM time. Target: an adaptive policy with at most 20% of K = 50's paths whose interval includes 0 or
   lies below it. On two LMs:
   - the offline corpus (``--demo_dir``: ``planlm run --config configs/demo.yaml``, its ``ours`` LM, T = 5,
     K = 5, multipath, seed 0), the issue's target setting;
   - the mechanism corpus (``--mechanism_dir``: ``experiments/bench_mechanism.py``, ``--lag 6``), where the
     LM reads what only the planner can know (``--model``, default the sampled T = 1, K = 10 LM of seed 0).
2. **Where the paths go**: the same policies through ``planlm.plans.kinds.draw_plans`` on the test boundaries
   of the known-answer corpora (each sentence's type is read back from its first word), beside the
   planner's mean first-step entropy per class:
   - ``--control_dir`` (``--lag 0``, a Markov chain over 8 types): after a type with one successor the
     next action is certain (deterministic), after one with two it is a coin flip (ambiguous). Target:
     ambiguous boundaries get at least 3x the paths of deterministic ones.
   - ``--mechanism_dir``: the first 6 sentences of an article are uniform over 8 types, the later ones
     one of the successors of the type 6 back: 2 with ``--lag_successors pairs`` (no deterministic
     boundary: the ratio is printed, unscored), 1 or 2 with ``mixed`` (scored like the control).
3. **Diagnosis**: the K = 50 paths (at every boundary) of part 1 on the mechanism corpus, of which each class of test
   boundaries keeps its first few by the known answer (a plan cache whose ``num_paths`` is set by hand):
   what the best allocation of a budget could reach.

    planlm run --config configs/demo.yaml                                                  # runs/demo
    python experiments/bench_mechanism.py --out_dir runs/bench_mechanism                    # ~22 min
    python experiments/bench_mechanism.py --lag 0 --out_dir runs/bench_mechanism_lag0
    python experiments/bench_adaptive.py
    python experiments/bench_mechanism.py --lag_successors mixed --seeds 0 --out_dir runs/bench_mechanism_mixed
    python experiments/bench_adaptive.py --mechanism_dir runs/bench_mechanism_mixed --mechanism_successors mixed
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

try:  # imported as the package `experiments` (the tests, python -m experiments.bench_adaptive)
    from experiments.bench_mechanism import SUCCESSORS, TYPE_NAMES, TYPES
except ImportError:  # run as a script (python experiments/bench_adaptive.py): its folder is sys.path[0]
    from bench_mechanism import SUCCESSORS, TYPE_NAMES, TYPES  # the corpus's known answer

from planlm.args import Runtime
from planlm.plans.config import PlanConfig

OPENER_TYPE = {opener: index for index, name in enumerate(TYPE_NAMES) for opener in TYPES[name][0]}


def sentence_types(split) -> np.ndarray:
    """(N_sent,) the true type of every sentence, from its first word (each type has openers of its own)."""
    return np.array([OPENER_TYPE[split.sentence_text(s).split()[0]] for s in range(split.num_sentences)])


def policies(args):
    from planlm.plans.policy import PathPolicy

    return [PathPolicy("entropy", 1, budget) for budget in args.entropy_budgets]


def compute_vs_perplexity(args, label: str, folder: str, model_dir: Path, run_dir: Path, context_length: int,
                          stride: int) -> tuple[list[str], bool, str]:
    """Part 1: the compute sweep of one LM (``run_dir`` holds prepared/ and planner/); the table's lines and
    the target's verdict."""
    import csv

    from planlm.evaluate.sweeps import sweep

    out = sweep(str(model_dir), str(run_dir / "prepared"), str(Path(args.out_dir) / folder),
                kind="compute", num_paths=args.num_paths, policies=policies(args), split="test",
                plans=PlanConfig(planner_dir=str(run_dir / "planner")), context_length=context_length, stride=stride,
                max_articles=args.max_articles, batch_size=64, runtime=Runtime(device="cpu"),
                bootstrap_samples=args.bootstrap_samples)
    with open(out / "sweep_compute.csv") as f:
        rows = list(csv.DictReader(f))
    lines = ["", f"## Compute against perplexity: {label} ({model_dir}, test split"
             f"{'' if args.max_articles is None else f', first {args.max_articles} articles'}, stride {stride})", "",
             "| point | paths per boundary | fraction of K=50's | ppl | paired - all K=50 [95% CI] | wall (rel.) | "
             "planner s | LM s |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['value']} | {float(r['paths_mean']):.2f} | {float(r['paths_fraction']):.1%} | "
                     f"{float(r['ppl']):.4f} | {float(r['paired_diff']):+.4f} [{float(r['paired_ci_low']):+.4f}, "
                     f"{float(r['paired_ci_high']):+.4f}] | {float(r['relative_wall_time']):.2f}x | "
                     f"{float(r['planner_time_s']):.1f} | {float(r['lm_time_s']):.1f} |")
    winners = [r for r in rows if r["policy"] != "all" and float(r["paths_fraction"]) <= 0.20
               and float(r["paired_ci_low"]) <= 0.0]
    best = min(winners, key=lambda r: float(r["paths_fraction"]), default=None)
    detail = (f"{label}, {best['value']}: {float(best['paths_fraction']):.1%} of the paths, paired "
              f"{float(best['paired_diff']):+.4f} [{float(best['paired_ci_low']):+.4f}, "
              f"{float(best['paired_ci_high']):+.4f}]" if best else f"{label}: no adaptive point qualifies")
    return lines, best is not None, detail


def paths_by_class(folder: Path, planner_dir: Path, policy, classes: dict[str, np.ndarray], split, seed: int = 0):
    """Mean paths per boundary of each class of test boundaries under ``policy``."""
    from planlm.models.planner import Planner
    from planlm.plans.draws import draw_plans

    planner = Planner.from_pretrained(planner_dir)
    plans = PlanConfig(kind="planner_sampled", num_paths=policy.max_paths or 50, horizon=planner.config.horizon,
                       temperature=1.0, seed=seed, path_policy=policy).resolve()
    counts = draw_plans(planner, split, plans).counts
    return {name: float(counts[mask].mean()) for name, mask in classes.items()}


def first_step_entropy(planner_dir: Path, split, batch_size: int = 512) -> np.ndarray:
    """(N_sent,) entropy in nats of the planner's first-step distribution at every boundary (what the entropy
    policy reads)."""
    import torch

    from planlm.models.planner import Planner
    from planlm.plans.contexts import boundary_contexts

    planner = Planner.from_pretrained(planner_dir).eval()
    out = np.zeros(split.num_sentences)
    for start in range(0, split.num_sentences, batch_size):
        sentences = np.arange(start, min(start + batch_size, split.num_sentences))
        log_probs = torch.log_softmax(planner.first_step_logits(*boundary_contexts(
            split, sentences, planner.config.max_sentences)).float(), -1)  # (B, A)
        out[sentences] = -(log_probs.exp() * log_probs).sum(-1).numpy()
    return out


def control_classes(split) -> dict[str, np.ndarray]:
    """lag 0: boundaries after a type with one successor (deterministic) or two (ambiguous); article starts apart."""
    types = sentence_types(split)
    first = np.zeros(split.num_sentences, dtype=bool)
    first[np.asarray(split.sentence_offsets[:-1])] = True
    previous = types[np.maximum(np.arange(split.num_sentences) - 1, 0)]
    branching = np.array([len(SUCCESSORS[int(t)]) for t in previous])
    return {"deterministic": ~first & (branching == 1), "ambiguous": ~first & (branching == 2), "article start": first}


def lag_classes(split, successors: str = "pairs", lag: int = 6) -> dict[str, np.ndarray]:
    """lag 6: the first ``lag`` sentences of an article (8 equally likely types) and the later ones (the
    successors of the type ``lag`` back: 2, or with ``mixed`` successor sets 1 or 2)."""
    local = np.arange(split.num_sentences) - np.asarray(split.sentence_offsets)[split.sentence_article]
    if successors == "pairs":
        return {"2 candidates": local >= lag, "8 candidates": local < lag}
    back = sentence_types(split)[np.maximum(np.arange(split.num_sentences) - lag, 0)]
    branching = np.array([len(SUCCESSORS[int(t)]) for t in back])
    return {"1 candidate": (local >= lag) & (branching == 1), "2 candidates": (local >= lag) & (branching == 2),
            "8 candidates": local < lag}


def where_paths_go(args) -> tuple[list[str], bool, str]:
    from planlm.data.artifacts import PreparedDataset

    lines, ratios = [], {}
    mixed = args.mechanism_successors == "mixed"
    corpora = [("--lag 0 control (Markov chain)", Path(args.control_dir), control_classes,
                ("ambiguous", "deterministic")),
               (f"--lag 6 corpus ({args.mechanism_successors} successors)", Path(args.mechanism_dir),
                lambda split: lag_classes(split, args.mechanism_successors),
                ("2 candidates", "1 candidate") if mixed else ("8 candidates", "2 candidates"))]
    for label, folder, classes_of, pair in corpora:
        if not (folder / "planner" / "model.safetensors").is_file():
            lines.append(f"{label}: {folder} has no planner; run bench_mechanism.py for it first")
            continue
        split = PreparedDataset(folder / "prepared").split("test")
        classes = classes_of(split)
        sizes = ", ".join(f"{name} {int(mask.sum())}" for name, mask in classes.items())
        lines += ["", f"## Where the paths go: {label}, {split.num_sentences} test boundaries ({sizes})", "",
                  "| policy | " + " | ".join(f"paths: {name}" for name in classes) + f" | {pair[0]} / {pair[1]} |",
                  "|---" * (len(classes) + 2) + "|"]
        entropy = first_step_entropy(folder / "planner", split)
        lines.append("| planner first-step entropy, nats (log 8 = 2.08) | " +
                     " | ".join(f"{entropy[mask].mean():.3f}" for mask in classes.values()) + " | |")
        for policy in policies(args):
            means = paths_by_class(folder, folder / "planner", policy.resolve(args.max_paths), classes, split)
            ratio = means[pair[0]] / means[pair[1]]
            ratios[(label, policy.label())] = ratio
            lines.append(f"| {policy.resolve(args.max_paths).label()} | " +
                         " | ".join(f"{means[name]:.2f}" for name in classes) + f" | {ratio:.2f}x |")
    verdicts, details = [], []
    for label in [corpora[0][0]] + ([corpora[1][0]] if mixed else []):  # the corpora with deterministic boundaries
        measured = {k[1]: v for k, v in ratios.items() if k[0] == label}
        best = max(measured.items(), key=lambda kv: kv[1], default=None)
        verdicts.append(bool(best and best[1] >= 3.0))
        details.append(f"{label}: best {best[0]} {best[1]:.2f}x" if best else f"{label}: not measured")
    return lines, all(verdicts), "; ".join(details)


def known_answer_allocation(args, sweep_dir: Path) -> list[str]:
    """Diagnosis of part 1: the K = 50 paths (at every boundary), of which each --lag 6 test boundary keeps the first
    ``high`` (2 candidates: the plan is informative) or ``low`` (8 candidates: uniform, the plan says nothing)
    by the known answer, evaluated from a plan cache; paired against K = 50 everywhere."""
    import shutil

    from planlm.data.artifacts import PreparedDataset
    from planlm.evaluate.bootstrap import compare_evaluations
    from planlm.evaluate.perplexity import evaluate
    from planlm.plans.sampling import sample_plans

    mech, out = Path(args.mechanism_dir), Path(args.out_dir)
    plans = json.loads((mech / "lm" / args.model / "planned_lm.json").read_text())["plans"]
    cache = sample_plans(str(mech / "prepared"), PlanConfig(planner_dir=str(mech / "planner"), num_paths=args.max_paths,
                                                         horizon=plans["horizon"], temperature=plans["temperature"],
                                                         seed=plans["seed"]),
                         splits=["test"], out_dir=str(out / "cache-K50"), runtime=Runtime(device="cpu"))
    classes = lag_classes(PreparedDataset(mech / "prepared").split("test"), args.mechanism_successors)
    allotments = ([{"1 candidate": 1, "2 candidates": k, "8 candidates": k} for k in (10, 20)]
                  + [{"1 candidate": 1, "2 candidates": 20, "8 candidates": 10}]
                  if args.mechanism_successors == "mixed" else
                  [{"2 candidates": 10, "8 candidates": 1}, {"2 candidates": 15, "8 candidates": 1},
                   {"2 candidates": 10, "8 candidates": 5}])
    lines = ["", f"## Diagnosis: paths allotted by the known answer ({args.model}, the K=50 paths of part 1, "
             "the first few kept per boundary)", "", "| " + " | ".join(f"{c} keep" for c in classes) +
             " | paths per boundary | fraction of K=50's | paired - all K=50 [95% CI] |", "|---" * (len(classes) + 3) + "|"]
    for keep in allotments:
        name = "-".join(str(keep[c]) for c in classes)
        folder = out / f"cache-K50-keep{name}"
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(cache, folder)
        counts = sum(np.where(mask, keep[c], 0) for c, mask in classes.items()).astype(np.int64)
        np.save(folder / "test.num_paths.npy", counts)
        metrics = evaluate(str(mech / "lm" / args.model), str(mech / "prepared"), str(out / f"eval-keep{name}"),
                           plans=PlanConfig(plans_dir=str(folder)), context_length=args.context_length,
                           stride=args.context_length - 1, max_articles=args.max_articles, batch_size=64,
                           runtime=Runtime(device="cpu"), plan_usage=False, bootstrap_samples=args.bootstrap_samples)
        diff = compare_evaluations(sweep_dir / "all-50", out / f"eval-keep{name}", num_samples=args.bootstrap_samples)
        lines.append("| " + " | ".join(str(keep[c]) for c in classes) + f" | {metrics.paths.paths_mean:.2f} | "
                     f"{metrics.paths.paths_mean / args.max_paths:.1%} | "
                     f"{diff['diff']:+.4f} [{diff['ci_low']:+.4f}, {diff['ci_high']:+.4f}] |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mechanism_dir", default="runs/bench_mechanism", help="bench_mechanism.py --lag 6 out_dir")
    parser.add_argument("--control_dir", default="runs/bench_mechanism_lag0", help="bench_mechanism.py --lag 0 out_dir")
    parser.add_argument("--out_dir", default="runs/bench_adaptive")
    parser.add_argument("--demo_dir", default="runs/demo", help="a finished `planlm run --config configs/demo.yaml` "
                        "(the offline corpus; skipped when its model is missing)")
    parser.add_argument("--demo_model", default="ours/seed0", help="LM folder under <demo_dir>/lm")
    parser.add_argument("--demo_stride", type=int, default=64, help="the demo's evaluation stride")
    parser.add_argument("--model", default="sampled-seed0", help="LM folder under <mechanism_dir>/lm")
    parser.add_argument("--mechanism_successors", choices=["pairs", "mixed"], default="pairs",
                        help="the --lag_successors of the bench_mechanism.py run in --mechanism_dir")
    parser.add_argument("--context_length", type=int, default=37, help="the mechanism LM's window (bench_mechanism)")
    parser.add_argument("--max_articles", type=int, default=None, help="test articles evaluated (default: all)")
    parser.add_argument("--num_paths", type=int, nargs="+", default=[1, 2, 5, 10, 20, 50],
                        help="K of the points that give every boundary K (the path policy all)")
    parser.add_argument("--max_paths", type=int, default=50)
    parser.add_argument("--entropy_budgets", type=int, nargs="+", default=[5, 10, 50], help="max_paths of entropy")
    parser.add_argument("--bootstrap_samples", type=int, default=1000)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    began = time.time()
    lines, verdicts = [f"# Adaptive planning compute (bench_adaptive.py)"], []
    demo = Path(args.demo_dir) if args.demo_dir else None
    if demo is not None and (demo / "lm" / args.demo_model).is_dir():
        part, ok, detail = compute_vs_perplexity(args, "offline corpus (the demo run)", "compute-demo",
                                                 demo / "lm" / args.demo_model,
                                                 demo, 128, args.demo_stride)
        lines += part
        verdicts.append((ok, detail))
    mech = Path(args.mechanism_dir)
    part, ok, detail = compute_vs_perplexity(args, f"mechanism corpus ({args.mechanism_successors})",
                                             "compute-mechanism", mech / "lm" / args.model, mech, args.context_length, args.context_length - 1)
    lines += part
    verdicts.append((ok, detail))
    more, ratio_ok, ratio_detail = where_paths_go(args)
    lines += more + known_answer_allocation(args, Path(args.out_dir) / "compute-mechanism")
    lines += ["", "## Targets", ""]
    for ok, detail in verdicts:
        lines.append(f"- {'PASS' if ok else 'FAIL'}: an adaptive policy with <= 20% of all K=50's paths and a "
                     f"paired interval that includes 0 or favours it: {detail}")
    lines.append(f"- {'PASS' if ratio_ok else 'FAIL'}: ambiguous boundaries get >= 3x the paths of deterministic "
                 f"ones: {ratio_detail}")
    lines.append(f"\n{(time.time() - began) / 60:.1f} min wall")
    print("\n".join(lines))
    (Path(args.out_dir) / "report.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
