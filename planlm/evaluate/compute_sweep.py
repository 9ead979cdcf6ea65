"""Compute against perplexity: K at every boundary beside the adaptive path policies (``planlm sweep --kind
compute``).

Every point is a full ``planlm evaluate`` of the same LM on the same articles, in ``<out_dir>/<point>/``: ``all-K``,
K at every boundary (the path policy all), for K = 1, 2, 5, 10, 20, 50, and each adaptive policy
(``planlm.plans.policy``) at the budgets given (its max_paths, entropy_high). Each row records the paths sampled per
boundary (mean and fraction of K_max), perplexity, its paired difference from ``all-K_max`` (the largest K) with the
paired bootstrap interval over articles (``planlm.evaluate.bootstrap``), and the wall,
planner and LM time. Written: ``sweep_compute.csv``, ``sweep_compute.png`` (perplexity against mean
paths per boundary and against wall time) and, per adaptive point, ``<point>/where_paths_went.json``: the
histogram of paths per boundary and the boundaries that got the most and the fewest paths, with the
planner's top first actions and the sentence that followed. With ``expectation``, one more point,
``expected-1``: plans in expectation at K = 1 (``PlanConfig.expectation``; beyond the paper), at its measured
planner cost (one sampled path; its ``paths_mean`` is 1).
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Optional

import numpy as np

from planlm.errors import PlanlmError
from planlm.evaluate.metrics import PerplexityMetrics
from planlm.jsonio import write_json
from planlm.plans.policy import PathPolicy

COMPUTE_COLUMNS = ("value", "policy", "K", "paths_mean", "paths_fraction", "ppl", "ci_low", "ci_high", "reference",
                   "paired_diff", "paired_ci_low", "paired_ci_high", "wall_time_s", "relative_wall_time",
                   "planner_time_s", "lm_time_s", "tokens_per_s", "tokens", "articles", "T", "tau", "eval_dir")
DEFAULT_POLICIES = [PathPolicy("entropy", 1, 10), PathPolicy("entropy", 1, 50)]


EXPECTED_POINT = "expected-1"
"""The compute sweep's point of plans in expectation at K = 1."""


def compute_points(num_paths: list[int], policies: list[PathPolicy],
                   expectation: bool = False) -> list[tuple[str, int, PathPolicy]]:
    """(folder name, K_max, policy) of every point: K at every boundary, the adaptive policies, then
    (``expectation``) ``EXPECTED_POINT``."""
    if not num_paths or min(num_paths) < 1:
        raise PlanlmError(f"--num_paths {num_paths}: the compute sweep needs K values (each given to every "
                          f"boundary), each >= 1")
    largest = max(num_paths)
    points = [(f"all-{k}", k, PathPolicy().resolve(k)) for k in sorted(set(num_paths))]
    for policy in policies:
        if not policy.adaptive:
            raise PlanlmError(f"--policies: {policy.label()} gives every boundary K; list such K in --num_paths and "
                              f"adaptive policies (entropy) in --policies")
        resolved = policy.resolve(largest)
        name = resolved.label().replace(" ", "-")
        if name in {p[0] for p in points}:
            raise PlanlmError(f"--policies lists {resolved.label()} twice; give each budget once")
        points.append((name, resolved.max_paths, resolved))
    if expectation:
        points.append((EXPECTED_POINT, 1, PathPolicy().resolve(1)))
    return points


def point_kind(name: str, policy: PathPolicy) -> str:
    """all, entropy or expected: the column ``policy`` and the marker of a point."""
    return "expected" if name == EXPECTED_POINT else policy.kind


def compute_rows(points: list[tuple[str, int, PathPolicy]], metrics: list[PerplexityMetrics],
                 out: Path) -> list[dict]:
    """One CSV row per point (paired columns are filled by the caller)."""
    reference = f"all-{max(k for _, k, policy in points if not policy.adaptive)}"  # all-K_max
    rows = []
    for (name, max_paths, policy), m in zip(points, metrics):
        rows.append({"value": name, "policy": point_kind(name, policy), "K": max_paths,
                     "paths_mean": m.paths.paths_mean, "ppl": m.ppl, "ci_low": m.ci_low, "ci_high": m.ci_high,
                     "wall_time_s": m.wall_time_s, "planner_time_s": m.planner_time_s, "lm_time_s": m.lm_time_s,
                     "tokens_per_s": m.tokens_per_s, "tokens": m.tokens, "articles": m.articles, "T": m.T, "tau": m.tau,
                     "eval_dir": str(out / name)})
    base = next(r for r in rows if r["value"] == reference)
    for row in rows:
        row["paths_fraction"] = row["paths_mean"] / base["paths_mean"] if base["paths_mean"] else float("nan")
        row["relative_wall_time"] = row["wall_time_s"] / base["wall_time_s"] if base["wall_time_s"] else float("nan")
    return rows


def write_compute_outputs(rows: list[dict], out: Path, title: str) -> None:
    with open(out / "sweep_compute.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COMPUTE_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    plot_compute(rows, out / "sweep_compute.png", title)
    print(f"{'point':>24} {'paths/boundary':>14} {'ppl':>9} {'paired - ' + rows[0]['reference']:>18} {'95% CI':>21} "
          f"{'wall (rel.)':>11}")
    for row in rows:
        print(f"{row['value']:>24} {row['paths_mean']:>14.2f} {row['ppl']:>9.3f} {row['paired_diff']:>+18.3f} "
              f"[{row['paired_ci_low']:>+8.3f}, {row['paired_ci_high']:>+8.3f}] {row['relative_wall_time']:>10.2f}x")


def plot_compute(rows: list[dict], path: Path, title: str = "") -> None:
    """Perplexity (the reference's plus each point's paired difference, with its paired interval) against mean
    paths per boundary (left) and against wall time (right); K at every boundary joined by a line, each policy its
    marker."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = next(r for r in rows if r["value"] == r["reference"])
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, x_key, x_label in ((axes[0], "paths_mean", "mean paths sampled per boundary"),
                               (axes[1], "wall_time_s", "evaluation wall time (s)")):
        for kind, marker in (("all", "o"), ("entropy", "^"), ("expected", "*")):
            group = sorted((r for r in rows if r["policy"] == kind), key=lambda r: r[x_key])
            if not group:
                continue
            x = [r[x_key] for r in group]
            y = [base["ppl"] + r["paired_diff"] for r in group]
            errors = [[r["paired_diff"] - r["paired_ci_low"] for r in group],
                      [r["paired_ci_high"] - r["paired_diff"] for r in group]]
            ax.errorbar(x, y, yerr=errors, marker=marker, capsize=3, linestyle="-" if kind == "all" else "none",
                        label={"all": "K at every boundary", "expected": "in expectation, K = 1"}.get(kind, kind))
        ax.set_xlabel(x_label)
        if x_key == "paths_mean" and min(r["paths_mean"] for r in rows) > 0:
            ax.set_xscale("log")
    axes[0].set_ylabel(f"perplexity (95% paired CI vs {base['value']})")
    axes[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def where_paths_went(eval_dir: Path, planner_dir: Optional[str], prepared_dir: str, split: str,
                     examples: int = 3, top_actions: int = 3) -> dict:
    """How an adaptive evaluation spent its paths: histogram over boundaries and the ``examples`` boundaries
    with the most and the fewest paths, each with the planner's top first actions and the following sentence."""
    from planlm.data.artifacts import PreparedDataset
    from planlm.device import resolve_device
    from planlm.models.planner import Planner
    from planlm.plans.contexts import boundary_contexts
    from planlm.stage.integrity import fix_for, load_npy

    counts = load_npy(eval_dir / "num_paths.npy", fix_for(eval_dir), mmap_mode=None)  # (N_sent evaluated,)
    split_view = PreparedDataset(prepared_dir).split(split)
    order = np.argsort(-counts, kind="stable")
    chosen = {"most": order[:examples], "fewest": order[::-1][:examples]}
    report = {"hist": {int(k): int(c) for k, c in zip(*np.unique(counts, return_counts=True))},
              "paths_mean": float(counts.mean()), "boundaries": int(len(counts))}
    planner = Planner.for_corpus(planner_dir, PreparedDataset(prepared_dir), resolve_device("cpu")) if planner_dir else None
    for group, sentences in chosen.items():
        items = []
        probs = None
        if planner is not None:
            context, mask = boundary_contexts(split_view, sentences, planner.config.max_sentences)
            probs = planner.first_step_logits(context, mask).float().softmax(-1).numpy()  # (B, A)
        for i, sentence in enumerate(sentences):
            item = {"sentence": int(sentence), "paths": int(counts[sentence]),
                    "true_action": int(split_view.actions[sentence]), "text": split_view.sentence_text(int(sentence))}
            if probs is not None:
                top = np.argsort(-probs[i])[:top_actions]
                item["top_actions"] = [[int(a), float(probs[i, a])] for a in top]
            items.append(item)
        report[group] = items
    write_json(eval_dir / "where_paths_went.json", report)
    return report
