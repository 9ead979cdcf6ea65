"""The report of bench_lookahead.py: the paper's Table 1 with the ideal-LM optima, paired targets, K sweeps,
diagnostics against the known answer, and the figure of perplexity against K for each T."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

try:  # imported as the package `experiments` (the tests, python -m experiments.bench_lookahead)
    from experiments import bench_mechanism as bench
except ImportError:  # imported by bench_lookahead.py run as a script: its folder is sys.path[0]
    import bench_mechanism as bench


def _pooled(dirs: list[Path]) -> float:
    from planlm.evaluate.bootstrap import read_per_article

    tables = [read_per_article(d) for d in dirs]
    return float(np.exp(sum(t["nll_sum"].sum() for t in tables) / sum(t["tokens"].sum() for t in tables)))


def optimum_of(name: str, row: dict, optima: dict) -> str:
    """The ideal-LM perplexity a row aims at: no information, the ideal planner's T steps, the true T actions."""
    plans = row["plans"]
    key = {"fixed": ("none", 1), "cornille": ("planner", 1), "oracle": ("oracle", plans.horizon)}.get(
        name, ("planner", plans.horizon))
    return f"{np.exp(optima[key]):.4f}" if key in optima else ""


def planner_lines(args, prepared, say, horizons: list[int]) -> None:
    """Each planner's teacher-forced NLL per step beside the Bayes optimum (actions are the true types)."""
    split = prepared.split("test")
    types = np.asarray(split.actions)
    for horizon in horizons:
        summary = json.loads((Path(args.out_dir) / f"planner-h{horizon}" / "summary.json").read_text())["metrics"]
        planner = summary["planner_teacher_forced"]
        optimum = bench.bayes_optimum(split, types, np.eye(8), horizon, args.lag)
        say(f"\nPlanner of horizon {horizon} (test boundaries, teacher-forced):\n")
        say("| step | planner top-1 | optimum top-1 | planner NLL | optimum NLL | planner / optimum |")
        say("|---|---|---|---|---|---|")
        for step in range(horizon):
            say(f"| {step + 1} | {planner['top1'][step]:.4f} | {optimum['top1'][step]:.4f} | "
                f"{planner['nll'][step]:.4f} | {optimum['nll'][step]:.4f} | "
                f"{planner['nll'][step] / optimum['nll'][step]:.3f} |")


def report(args, prepared, types: dict, rows: dict, clock, planner_horizons: list[int]) -> None:
    from experiments.lookahead_corpus import ideal_split_nll

    out, seeds, lines, targets = Path(args.out_dir), args.seeds, [], []
    say = lines.append
    n = prepared.manifest["counts"]
    say(f"# Lookahead benchmark ({args.out_dir})\n")
    say(f"corpus: 8 types, lag {args.lag}, each sentence's last 3 words announce bits of types i+1..i+3; "
        f"{n['train']['articles']}/{n['validation']['articles']}/{n['test']['articles']} train/val/test articles, "
        f"{n['train']['tokens']} train tokens; LM window {args.context_length} tokens; GPT-2 {args.n_layer} x "
        f"{args.n_embd}; {args.base_epochs} base epochs, then {args.epochs} per condition, lr {args.lr:g}, "
        f"multipath_lr_scale {args.multipath_lr_scale:g}")
    planner_lines(args, prepared, say, planner_horizons)
    optima = ideal_split_nll(prepared.split("test"), types, args.context_length, args.lag)
    say("\n## Ideal LM on the test split (exact; perplexity, NLL per token)\n")
    say("| plan | perplexity | NLL |")
    say("|---|---|---|")
    for (plan, horizon), nll in optima.items():
        text = {"none": "no plan", "oracle": f"true next {horizon} action(s)",
                "planner": f"ideal planner's posterior, T={horizon} (K -> inf)"}[plan]
        say(f"| {text} | {np.exp(nll):.4f} | {nll:.4f} |")
    gain = optima[("oracle", 1)] - optima[("oracle", 3)]
    targets.append(("ideal gain from T=1 to T=3 >= 0.05 nats per token", gain >= 0.05, f"{gain:.4f}"))

    eval_dirs = {name: [out / "eval" / f"{name}-seed{s}" for s in seeds] for name in rows}
    metrics = {name: [json.loads((d / "metrics.json").read_text()) for d in dirs]
               for name, dirs in eval_dirs.items()}
    say(f"\n## Table 1: test perplexity, {len(seeds)} seed(s), each condition from its seed's base LM\n")
    say("| row | " + " | ".join(f"seed {s}" for s in seeds) + " | pooled | ideal LM | plan usage (nats) | alphas |")
    say("|---" * (len(seeds) + 5) + "|")
    for name, row in rows.items():
        usage = [m.get("plan_usage_nats") for m in metrics[name]]
        alphas = [json.loads((out / "lm" / f"{name}-seed{s}" / "manifest.json").read_text()).get("rezero_alphas")
                  for s in seeds]
        alpha_text = "; ".join(f"{a['alpha_1']:+.3f}/{a['alpha_2']:+.3f}" for a in alphas if a) or "-"
        usage_text = ", ".join(f"{u:.3f}" for u in usage if u is not None) or "-"
        say(f"| {row['label']} | " + " | ".join(f"{m['ppl']:.4f}" for m in metrics[name]) +
            f" | {_pooled(eval_dirs[name]):.4f} | {optimum_of(name, row, optima)} | {usage_text} | {alpha_text} |")

    k_max, t_abl = max(args.num_paths), args.ablation_horizon
    pairs = [("fixed", "cornille", None)]
    pairs += [(f"ours-T{a}-K{k_max}", f"ours-T{b}-K{k_max}", "T") for a, b in zip(args.horizons, args.horizons[1:])]
    if 1 in args.horizons and 3 in args.horizons and args.horizons.index(3) > 1:
        pairs.append((f"ours-T1-K{k_max}", f"ours-T3-K{k_max}", "T"))
    pairs += [(f"avg-T{t_abl}-K{k_max}", f"ours-T{t_abl}-K{k_max}", "multipath"),
              (f"norezero-T{t_abl}-K{k_max}", f"ours-T{t_abl}-K{k_max}", "rezero")]
    pairs += [(f"ours-T{t}-K{min(args.num_paths)}", f"ours-T{t}-K{k_max}", "K") for t in args.horizons
              if min(args.num_paths) < k_max]
    pairs += [("cornille", f"ours-T{t_abl}-K{k_max}", None), (f"ours-T{max(args.horizons)}-K{k_max}", "oracle", None)]
    pairs = [p for p in pairs if p[0] in rows and p[1] in rows]
    say(f"\n## Paired differences (ppl B - A, negative: B better; {bench.PAIRED_INTERVALS})\n")
    say("| B - A | " + " | ".join(f"seed {s}" for s in seeds) + " | pooled |")
    say("|---" * (len(seeds) + 2) + "|")
    for a, b, target in pairs:
        per_seed = [bench.paired([eval_dirs[a][i]], [eval_dirs[b][i]], args.bootstrap_samples)
                    for i in range(len(seeds))]
        pooled = bench.paired(eval_dirs[a], eval_dirs[b], args.bootstrap_samples)
        say(f"| {b} - {a} | " + " | ".join(bench.fmt_diff(r) for r in per_seed) + f" | {bench.fmt_diff(pooled)} |")
        if target:
            targets.append((f"{b} < {a} ({target}), every seed's interval below 0",
                            all(r["ci_high"] < 0 for r in per_seed), f"pooled {bench.fmt_diff(pooled)}"))

    sweep_lines(args, say, targets, rows)
    bench.close_report(targets, lines, say, clock, args.workers, 40, out / "report.md")


def swept_horizons(args, rows: dict) -> list[int]:
    """The T whose ours at the largest K is in the table: their K sweeps."""
    return [t for t in args.horizons if f"ours-T{t}-K{max(args.num_paths)}" in rows]


def sweep_lines(args, say, targets, rows: dict) -> None:
    """K at inference for ours at K = max, per T: pooled perplexity, paired steps, and the figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out, k_max = Path(args.out_dir), max(args.num_paths)
    say(f"\n## K at inference (ours trained with K = {k_max}), pooled over seeds, paired\n")
    say("| T | K | pooled ppl | - K=1 | - previous K |")
    say("|---|---|---|---|---|")
    figure, axis = plt.subplots(figsize=(5, 3.5))
    for horizon in swept_horizons(args, rows):
        dirs = {k: [out / "sweeps" / f"ours-T{horizon}-K{k_max}-seed{s}" / f"num_paths-{k:g}" for s in args.seeds]
                for k in args.k_sweep}
        ppls, worse = [_pooled(dirs[k]) for k in args.k_sweep], []
        for i, k in enumerate(args.k_sweep):
            if i == 0:
                say(f"| {horizon} | {k} | {ppls[i]:.4f} | | |")
                continue
            first = bench.paired(dirs[args.k_sweep[0]], dirs[k], args.bootstrap_samples)
            step = bench.paired(dirs[args.k_sweep[i - 1]], dirs[k], args.bootstrap_samples)
            worse += [f"K={args.k_sweep[i - 1]}->{k} {bench.fmt_diff(step)}"] if step["ci_low"] > 0 else []
            say(f"| {horizon} | {k} | {ppls[i]:.4f} | {bench.fmt_diff(first)} | {bench.fmt_diff(step)} |")
        targets.append((f"T={horizon}: the K sweep never significantly worse from one K to the next",
                        not worse, "; ".join(worse) or "no step's pooled interval lies above 0"))
        axis.plot(args.k_sweep, ppls, marker="o", label=f"T = {horizon}")
    axis.set_xscale("log")
    axis.set_xlabel("K (sampled paths at inference)")
    axis.set_ylabel("test perplexity (pooled over seeds)")
    axis.set_title(f"ours trained with K = {k_max}")
    axis.legend()
    figure.tight_layout()
    figure.savefig(out / "ppl_vs_k.png", dpi=120)
    plt.close(figure)
    say(f"\nFigure: {out / 'ppl_vs_k.png'}")
