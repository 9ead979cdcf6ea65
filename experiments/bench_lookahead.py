"""The paper's Table 1 on a corpus with a known answer where the future shapes the present.

The corpus (``experiments/lookahead_corpus.py``): 8 sentence types under the mechanism benchmark's lag rule (the type
of sentence j is t + 1 or t + 2 of the type t of sentence j - 6, beyond the LM's window), and every sentence
ends in three words chosen by the types of the next three sentences (one Gray-code bit each of types i + 1,
i + 2, i + 3). Only a plan of T >= 2, 3, 4 steps tells those words; the planner knows each bit 3 times in 4
(A, B) or 1 in 2 (C), and sampled paths show which. The Bayes-optimal NLL of an LM with its window and no
plan, the true next T actions (T = 1, 2, 3, 5) or the ideal planner's posterior (T = 1, 3, 5) is exact, and
printed beside the measured rows.

Everything after the corpus goes through the real stages, each reused when finished (an interrupted run
resumes): ``train-planner`` (one planner of horizon --planner_horizon for ours and the ablations, one of
horizon 1 for Cornille et al.; shared by the seeds), per seed a base LM (``train-lm``) and from it every
condition (``train-lm``, same seed: paired), ``evaluate`` on the test split, and ``sweep`` of K at inference
for ours at K = 10 and every T. Conditions of all seeds run side by side in --workers processes.

Rows: Fixed; Cornille et al. (argmax, T = K = 1, Project and Avg, its own horizon-1 planner); ours
(multipath) at every T in --horizons x K in --num_paths; the ablations at --ablation_horizon, K = max:
Project and Avg, and multipath without ReZero; oracle (true next max(T) actions, multipath).

Targets, each a paired difference over test articles whose per-seed intervals all exclude 0: ours T = 3 <
ours T = 1 (K = 10); multipath < Project and Avg; full < no ReZero; K = 10 < K = 1 for every T; and the K
sweep never significantly worse from one K to the next. Diagnostics: the planners against the Bayes optimum
per step, plan usage (validation) and ReZero scalars per row. Output: ``<out_dir>/report.md`` and
``<out_dir>/ppl_vs_k.png``.

    python experiments/bench_lookahead.py                                  # the full grid (3 seeds)
    python experiments/bench_lookahead.py --quick --out_dir /tmp/look      # minutes: small corpus, 1 seed, 4 rows
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

try:  # imported as the package `experiments` (the tests, python -m experiments.bench_lookahead)
    from experiments import bench_mechanism as bench
    from experiments.lookahead_report import report, swept_horizons
except ImportError:  # run as a script (python experiments/bench_lookahead.py): its folder is sys.path[0]
    import bench_mechanism as bench
    from lookahead_report import report, swept_horizons


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out_dir", default="runs/bench_lookahead")
    parser.add_argument("--quick", action="store_true", help="a check in minutes: 150 train articles, seed 0, "
                        "1 + 1 epochs, 5 planner epochs, rows Fixed, Cornille et al., ours T in {1, 3} at K = 10 "
                        "(options given explicitly win)")
    parser.add_argument("--rows", nargs="+", default=None, help="train and report only these rows (default: all; "
                        "names as in <out_dir>/lm: fixed, cornille, ours-T3-K10, avg-T3-K10, norezero-T3-K10, oracle)")
    parser.add_argument("--train_articles", type=int, default=600)
    parser.add_argument("--validation_articles", type=int, default=50)
    parser.add_argument("--test_articles", type=int, default=150)
    parser.add_argument("--sentences", type=int, nargs=2, default=[12, 20], metavar=("MIN", "MAX"))
    parser.add_argument("--lag", type=int, default=6)
    parser.add_argument("--context_length", type=int, default=None, help="default: the longest the lag allows")
    parser.add_argument("--corpus_seed", type=int, default=0)
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="default 0 1 2 (--quick: 0)")
    parser.add_argument("--horizons", type=int, nargs="+", default=[1, 3, 5], help="T of ours")
    parser.add_argument("--num_paths", type=int, nargs="+", default=[1, 5, 10], help="K of ours")
    parser.add_argument("--ablation_horizon", type=int, default=3, help="T of the two ablations (K = max K)")
    parser.add_argument("--k_sweep", type=int, nargs="+", default=[1, 2, 5, 10, 20, 50])
    parser.add_argument("--planner_horizon", type=int, default=None, help="default: the largest T")
    parser.add_argument("--planner_epochs", type=int, default=20)
    parser.add_argument("--planner_d_model", type=int, default=64)
    parser.add_argument("--planner_lr", type=float, default=5e-3)
    parser.add_argument("--n_layer", type=int, default=2)
    parser.add_argument("--n_embd", type=int, default=64)
    parser.add_argument("--base_epochs", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--multipath_lr_scale", type=float, default=0.2)
    parser.add_argument("--clip", type=float, default=1.0)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--bootstrap_samples", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    if args.quick:
        parser.set_defaults(train_articles=150, validation_articles=20, test_articles=40, seeds=[0], base_epochs=1,
                            epochs=1, planner_epochs=5, horizons=[1, 3], k_sweep=[1, 10],
                            rows=["fixed", "cornille", "ours-T1-K10", "ours-T3-K10"])
        args = parser.parse_args(argv)
    from experiments.lookahead_corpus import max_context_length

    args.tag = ""
    args.seeds = args.seeds or [0, 1, 2]
    args.planner_horizon = args.planner_horizon or max(args.horizons)
    args.context_length = args.context_length or max_context_length(args.lag)
    bad = [t for t in args.horizons + [args.ablation_horizon] if not 1 <= t <= args.planner_horizon]
    if bad:
        parser.error(f"--horizons/--ablation_horizon {bad}: T must be in [1, --planner_horizon "
                     f"{args.planner_horizon}]; raise --planner_horizon or drop those T")
    if min(args.num_paths + args.k_sweep) < 1:
        parser.error(f"--num_paths {args.num_paths} / --k_sweep {args.k_sweep}: K must be >= 1")
    if args.ablation_horizon not in args.horizons:
        parser.error(f"--ablation_horizon {args.ablation_horizon} must be one of --horizons {args.horizons} (the "
                     f"ablations are paired with ours at that T)")
    unknown = sorted(set(args.rows or []) - set(grid(args, every_row=True)))
    if unknown:
        parser.error(f"--rows {unknown}: no such row in this grid; choose from "
                     f"{', '.join(grid(args, every_row=True))}")
    return args


def grid(args, every_row: bool = False) -> dict[str, dict]:
    """{row name: {plans, adapter, label}} of the table, in order (--rows only, unless ``every_row``)."""
    from planlm.models.adapter import AdapterSettings
    from planlm.plans.config import PlanConfig

    out, k_max = Path(args.out_dir), max(args.num_paths)
    ours_planner, own_planner = str(out / f"planner-h{args.planner_horizon}"), str(out / "planner-h1")

    def sampled(t: int, k: int) -> PlanConfig:
        return PlanConfig(kind="planner_sampled", num_paths=k, horizon=t, temperature=1.0, planner_dir=ours_planner)
    rows = {"fixed": {"plans": PlanConfig(kind="fixed"), "adapter": AdapterSettings(kind="project_avg"),
                      "label": "Fixed"},
            "cornille": {"plans": PlanConfig(kind="planner_argmax", num_paths=1, horizon=1, planner_dir=own_planner),
                         "adapter": AdapterSettings(kind="project_avg"),
                         "label": "Cornille et al. (argmax, Project and Avg, horizon-1 planner)"}}
    for t in args.horizons:
        for k in args.num_paths:
            rows[f"ours-T{t}-K{k}"] = {"plans": sampled(t, k), "adapter": AdapterSettings(kind="multipath"),
                                       "label": f"ours, T={t}, K={k}"}
    t = args.ablation_horizon
    rows[f"avg-T{t}-K{k_max}"] = {"plans": sampled(t, k_max), "adapter": AdapterSettings(kind="project_avg"),
                                  "label": f"ours with Project and Avg, T={t}, K={k_max}"}
    rows[f"norezero-T{t}-K{k_max}"] = {"plans": sampled(t, k_max),
                                       "adapter": AdapterSettings(kind="multipath", rezero=False),
                                       "label": f"ours without ReZero, T={t}, K={k_max}"}
    rows["oracle"] = {"plans": PlanConfig(kind="oracle", num_paths=1, horizon=max(args.horizons)),
                      "adapter": AdapterSettings(kind="multipath"),
                      "label": f"oracle (true next {max(args.horizons)} actions)"}
    return rows if every_row or not args.rows else {name: row for name, row in rows.items() if name in args.rows}


def prepare(args, out: Path) -> tuple[str, dict]:
    """The corpus as a prepared folder (rewritten only when its settings change): (folder, true types by id)."""
    from experiments.lookahead_corpus import make_lookahead_prepared

    folder = out / "prepared"
    counts = {"train": args.train_articles, "validation": args.validation_articles, "test": args.test_articles}
    config = {"source": "lookahead", "lag": args.lag, "num_articles": counts, "sentences": list(args.sentences),
              "embedding_dim": 16, "noise": 0.05, "seed": args.corpus_seed}
    manifest = folder / "manifest.json"
    if not (manifest.is_file() and json.loads(manifest.read_text())["config"] == config):
        make_lookahead_prepared(folder, counts, tuple(args.sentences), args.lag, seed=args.corpus_seed)
    return str(folder), json.loads((folder / "test" / "types.json").read_text())


def planner_horizons(args) -> list[int]:
    """Ours (--planner_horizon), and 1 for Cornille et al. when its row is in the table."""
    return sorted({args.planner_horizon} | ({1} if "cornille" in grid(args) else set()))


def train_planners(args, prepared_dir: str) -> None:
    """The planners, side by side (each reused when finished)."""
    horizons = planner_horizons(args)
    run_jobs(args, [(train_planner, (args, prepared_dir, h)) for h in horizons])


def train_planner(args, prepared_dir: str, horizon: int) -> None:
    """A planner that reads the last --lag sentences (all it needs: they decide the next --lag types' candidates,
    at fixed positions) with the causal dynamics (all T steps trained in one pass). Measured (10 epochs, lr 2e-3,
    600 articles): step-1 NLL 1.13 x the optimum with 6 sentences, 1.51 x with 32."""
    from planlm.models.planner import PlannerSettings
    from planlm.train.planner import PlannerTrainArgs, train_planner as train

    d = args.planner_d_model
    train(prepared_dir=prepared_dir, out_dir=str(Path(args.out_dir) / f"planner-h{horizon}"),
          model=PlannerSettings(d_model=d, num_heads=2, dim_feedforward=2 * d, num_layers=1, horizon=horizon,
                             max_sentences=args.lag, dynamics="causal"),
          train=PlannerTrainArgs(batch_size=128, lr=args.planner_lr, max_epochs=args.planner_epochs, seed=0))


def run_jobs(args, jobs: list[tuple]) -> list:
    """Run (function, arguments) jobs in --workers processes of --threads torch threads each, results in order."""
    if args.workers <= 1 or len(jobs) <= 1:
        return [run_job(args.threads, fn, job_args) for fn, job_args in jobs]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(min(args.workers, len(jobs)), mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(pool.map(run_job, *zip(*[(args.threads, fn, job_args) for fn, job_args in jobs])))


def run_job(threads: int, fn, job_args: tuple):
    import torch

    torch.set_num_threads(threads)
    return fn(*job_args)


def train_rows(args, seed: int, prepared_dir: str, names: list[str]) -> dict:
    """Conditions of one seed that share a plan cache, in turn (two processes never write one cache)."""
    clock, rows = bench.Clock(), grid(args)
    base_dir = Path(args.out_dir) / "lm" / f"_base-seed{seed}"
    for name in names:
        condition = {"plans": _seeded(rows[name]["plans"], seed), "adapter": rows[name]["adapter"]}
        bench.train_condition(args, name, seed, prepared_dir, "", base_dir, clock, condition=condition)
    return clock.stages


def _seeded(plans, seed: int):
    from dataclasses import replace

    return replace(plans, seed=seed) if plans.plan_kind.samples_paths else plans  # the seed draws the sampled paths


def train_base(args, seed: int, prepared_dir: str) -> dict:
    clock = bench.Clock()
    bench.train_base(args, seed, prepared_dir, clock)
    return clock.stages


def sweep_k(args, seed: int, prepared_dir: str, horizon: int) -> dict:
    from planlm.evaluate.sweeps import sweep

    clock, out, k = bench.Clock(), Path(args.out_dir), max(args.num_paths)
    clock("sweep", sweep, model_dir=str(out / "lm" / f"ours-T{horizon}-K{k}-seed{seed}"), prepared_dir=prepared_dir,
          out_dir=str(out / "sweeps" / f"ours-T{horizon}-K{k}-seed{seed}"), kind="num_paths",
          num_paths=args.k_sweep, split="test", **bench.lm_window(args), batch_size=64,
          bootstrap_samples=args.bootstrap_samples)
    return clock.stages


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    from planlm.data.artifacts import PreparedDataset
    from planlm.train.lm import _training_plans

    out, clock = Path(args.out_dir), bench.Clock()
    out.mkdir(parents=True, exist_ok=True)
    prepared_dir, types = clock("prepare", prepare, args, out)
    prepared = PreparedDataset(prepared_dir)
    clock("train-planner", train_planners, args, prepared_dir)
    rows = grid(args)
    # the argmax cache has no seed: every seed reads one, built here before the seeds run side by side
    if "cornille" in rows:
        clock("sample-plans", _training_plans, rows["cornille"]["plans"].resolve(), prepared, ["train", "validation"])
    stages = run_jobs(args, [(train_base, (args, seed, prepared_dir)) for seed in args.seeds])
    groups: dict[tuple, list[str]] = {}
    for name, row in rows.items():
        for seed in args.seeds:
            key = (seed, json.dumps(_seeded(row["plans"], seed).cache_key(), sort_keys=True, default=str))
            groups.setdefault(key, []).append(name)
    jobs = sorted(((train_rows, (args, key[0], prepared_dir, names)) for key, names in groups.items()),
                  key=lambda job: -len(job[1][3]))  # longest first
    stages += run_jobs(args, jobs)
    stages += run_jobs(args, [(sweep_k, (args, seed, prepared_dir, t)) for t in swept_horizons(args, rows)
                              for seed in args.seeds])
    for job_stages in stages:
        for stage, seconds in job_stages.items():
            clock.stages[stage] = clock.stages.get(stage, 0.0) + seconds
    report(args, prepared, types, rows, clock, planner_horizons(args))


if __name__ == "__main__":
    main()
