"""Planner throughput: training (boundaries/s) and path sampling for K = 1, 10, 50 at T = 10.

Prints one table per dynamics function (the paper's recurrent g and the cached prefix-causal g); every
sampling row is compared with K = 1 of the same planner measured in the same run (per-boundary cost
ratio; the issue's target is K = 50 <= 3x K = 1 on CPU). Uses a synthetic prepared corpus shaped
like the offline default (384-d embeddings, 128 actions, articles of 2-15 sentences) unless
``--prepared_dir`` is given.

    python benchmarks/bench_planner.py [--prepared_dir DIR [--planner_dir DIR]] [--d_model 256] [--boundaries 256]
        [--dynamics recurrent causal]

``--encoders`` prints instead the article-level encoder's table: one training epoch (the real
``train-planner`` loader, forward, backward, AdamW) and ``sample-plans``' work on a split (K = 5, T = 5, with the
argmax paths), each row against the current code (the paper's per-boundary encoder and recurrent g) timed in
the same run, on the demo's planner shape and articles of ``--article_sentences`` sentences:

    python benchmarks/bench_planner.py --encoders [--epoch_articles 10 (quick) | 260 (the demo)] [--article_sentences 30]

A fresh planner is near-uniform over actions (the worst case for sampling: K paths share no
prefix); ``--planner_dir`` times a trained one (paths share prefixes, and so states, more often).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from planlm.data.artifacts import PreparedDataset
from planlm.device import autocast
from planlm.models.planner import Planner, PlannerConfig
from planlm.plans.config import PlanConfig
from planlm.plans.contexts import boundary_contexts
from planlm.plans.draws import DrawArrays, draw_plans, draw_split, in_memory
from planlm.testing.synthetic import make_synthetic_prepared
from planlm.train.boundaries import BoundaryCollate
from planlm.train.planner_module import LightningPlanner


def timed(fn, repeats: int) -> float:
    fn()  # warm-up
    sync()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    sync()
    return (time.perf_counter() - start) / repeats


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prepared_dir", default=None)
    parser.add_argument("--planner_dir", default=None, help="a trained planner for the sampling rows")
    parser.add_argument("--d_model", type=int, default=256)
    parser.add_argument("--num_heads", type=int, default=4)
    parser.add_argument("--dim_feedforward", type=int, default=1024)
    parser.add_argument("--horizon", type=int, default=10)
    parser.add_argument("--dynamics", nargs="+", default=["recurrent", "causal"], choices=["recurrent", "causal"],
                        help="dynamics functions to time (ignored for the sampling rows of --planner_dir)")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                        help="autocast of the sampling rows, and of --encoders' training epoch (bf16: AMX on recent x86 CPUs, "
                             "tensor cores on GPUs)")
    parser.add_argument("--batch_size", type=int, default=512, help="training batch (boundaries)")
    parser.add_argument("--boundaries", type=int, default=256, help="boundaries sampled per timing")
    parser.add_argument("--sample_batch_size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cpu or cuda: where the planner trains and samples")
    parser.add_argument("--latency_boundaries", type=int, default=32,
                        help="boundaries re-planned one at a time (B = 1, as during generation)")
    parser.add_argument("--encoders", action="store_true",
                        help="only the article-level encoder's table: epoch and sample-plans against the current code")
    parser.add_argument("--epoch_articles", type=int, default=10,
                        help="--encoders: training articles (10: the quick setting; the demo has 260)")
    parser.add_argument("--article_sentences", type=int, default=30, help="--encoders: sentences per article")
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.encoders:
        time_encoders(args)
        return

    with tempfile.TemporaryDirectory() as tmp:
        prepared_dir = args.prepared_dir or make_synthetic_prepared(
            Path(tmp) / "bench", num_actions=16, rule="random", embedding_dim=384, min_sentences=2,
            max_sentences=15, num_articles={"train": 300, "validation": 10, "test": 10}, seed=0)
        prepared = PreparedDataset(prepared_dir)
        split = prepared["train"]
        tables = []
        for dynamics in args.dynamics:
            config = PlannerConfig(num_actions=prepared.num_actions, embedding_dim=prepared.embedding_dim,
                                   d_model=args.d_model, num_heads=args.num_heads,
                                   dim_feedforward=args.dim_feedforward, horizon=args.horizon, dropout=0.1,
                                   dynamics=dynamics)
            torch.manual_seed(0)
            planner = Planner(config, codebook=prepared.codebook).to(args.device)
            trained = Planner.from_pretrained(args.planner_dir).to(args.device) if args.planner_dir else None
            tables.append((dynamics, time_planner(planner, trained, split, args)))
            if trained is not None:
                break  # the trained planner's sampling rows would repeat

    print(f"d_model={args.d_model} heads={args.num_heads} ff={args.dim_feedforward} T={args.horizon}; sampling "
          f"({args.precision}): "
          f"{'trained ' + args.planner_dir if args.planner_dir else 'fresh'}; torch threads={torch.get_num_threads()}; "
          f"corpus={args.prepared_dir or 'synthetic'}; device={args.device}")
    for dynamics, rows in tables:
        print()
        print(f"dynamics={dynamics}")
        print(f"{'what':48s} {'boundaries':>10s} {'seconds':>9s} {'boundaries/s':>13s} {'cost vs K=1':>12s}")
        for name, count, seconds, reference in rows:
            ratio = "" if reference is None else f"{seconds / reference:.2f}x"
            print(f"{name:48s} {count:10d} {seconds:9.3f} {count / seconds:13.1f} {ratio:>12s}")


def time_planner(planner: Planner, trained: Planner | None, split, args) -> list[tuple]:
    """Rows (what, boundaries, seconds, K = 1 seconds or None) for one planner shape."""
    rng = np.random.default_rng(0)
    config = planner.config

    # Training: collate + forward + backward + AdamW step on one batch of boundaries.
    module = LightningPlanner(planner)
    optimizer = module.configure_optimizers()
    collate = BoundaryCollate(split.path, config.horizon, config.max_sentences)
    batch_size = min(args.batch_size, split.num_sentences)

    def train_step():
        batch = collate(rng.choice(split.num_sentences, batch_size, replace=False).tolist())
        batch = {k: v.to(args.device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        loss = module.model_step(batch)[0]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    planner.train()
    train_time = timed(train_step, args.repeats)
    rows = [("train step (teacher forcing, fwd+bwd+AdamW)", batch_size, train_time, None)]

    # Sampling: K paths of T steps for the same boundaries, through draw_plans (contexts included).
    planner = (trained or planner).eval()
    sentences = rng.choice(split.num_sentences, min(args.boundaries, split.num_sentences), replace=False)
    sentences.sort()

    def sample(num_paths: int, temperature: float = 1.0):
        plans = PlanConfig(kind="planner_sampled", num_paths=num_paths, horizon=args.horizon,
                           temperature=temperature).resolve()
        return lambda: draw_plans(planner, split, plans, sentences, batch_size=args.sample_batch_size,
                                  precision=args.precision, device=args.device)

    base = timed(sample(1), args.repeats)
    rows.append(("argmax path (T=%d)" % args.horizon, len(sentences), timed(sample(1, 0.0), args.repeats), base))
    for num_paths in (1, 10, 50):
        seconds = base if num_paths == 1 else timed(sample(num_paths), args.repeats)
        rows.append((f"sample K={num_paths} (T={args.horizon})", len(sentences), seconds, base))
    context_only = timed(lambda: boundary_contexts(split, sentences, config.max_sentences), args.repeats)
    rows.append(("contexts only (gather embeddings)", len(sentences), context_only, base))

    # Latency: one boundary per call (B = 1), as when generation re-plans at a generated sentence end.
    # The K paths of one boundary run as one batch.
    single = sentences[: args.latency_boundaries]
    contexts = [tuple(t.to(args.device) for t in boundary_contexts(split, np.array([s]), config.max_sentences))
                for s in single]

    def replan(num_paths: int):
        def go():
            with torch.no_grad(), autocast(torch.device(args.device), args.precision):
                for context_embeds, context_mask in contexts:
                    planner.sample_paths(context_embeds, context_mask, num_paths, args.horizon, 1.0,
                                         generator=torch.Generator(args.device).manual_seed(0))
        return go

    latency_base = timed(replan(1), args.repeats)
    for num_paths in (1, 10, 50):
        seconds = latency_base if num_paths == 1 else timed(replan(num_paths), args.repeats)
        rows.append((f"re-plan one boundary (B=1), K={num_paths}", len(single), seconds, latency_base))
    return rows


ENCODERS = (("boundary encoder, recurrent g (current)", "boundary", "recurrent"),
            ("boundary encoder, causal g", "boundary", "causal"),
            ("article encoder, causal g", "article", "causal"))


def time_encoders(args) -> None:
    """The article-level encoder against the current code, on the demo's planner recipe (d_model 128, 1 layer,
    T = 5, batch 128) and a synthetic corpus of equal-length articles: one epoch of training, and the plans of
    the training split at K = 5, T = 5 as ``sample-plans`` computes them (sampled and argmax paths)."""
    from planlm.train.planner import PlannerTrainArgs, _loader

    with tempfile.TemporaryDirectory() as tmp:
        prepared_dir = args.prepared_dir or make_synthetic_prepared(
            Path(tmp) / "articles", num_actions=16, rule="random", embedding_dim=384,
            min_sentences=args.article_sentences, max_sentences=args.article_sentences,
            num_articles={"train": args.epoch_articles, "validation": 4, "test": 4}, seed=0)
        prepared = PreparedDataset(prepared_dir)
        split = prepared["train"]
        train = PlannerTrainArgs(batch_size=128, lr=1e-3)
        rows = []
        for label, encoder, dynamics in ENCODERS:
            config = PlannerConfig(num_actions=prepared.num_actions, embedding_dim=prepared.embedding_dim, d_model=128,
                                   num_heads=2, num_layers=1, dim_feedforward=256, horizon=5, dynamics=dynamics,
                                   encoder=encoder)
            torch.manual_seed(0)
            planner = Planner(config, codebook=prepared.codebook).to(args.device)
            module = LightningPlanner(planner)
            optimizer = module.configure_optimizers()
            loader = _loader(split, config, train, shuffle=True)

            def epoch():
                planner.train()
                for batch in loader:
                    batch = {k: v.to(args.device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
                    with autocast(torch.device(args.device), args.precision):  # as train-planner's bf16-mixed
                        loss = module.model_step(batch)[0]
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()

            def plans():  # the greedy and the sampled paths in one walk, as sample-plans draws them
                planner.eval()
                draws = []
                for kind in ("planner_argmax", "planner_sampled"):
                    config = PlanConfig(kind=kind, num_paths=5, horizon=5).resolve()
                    arrays = DrawArrays.allocate(config.plan_kind, config, prepared.num_actions, split.num_sentences,
                                                 in_memory)
                    draws.append((config.plan_kind, config, arrays))
                draw_split(planner, split, np.arange(split.num_sentences), draws, torch.device(args.device),
                           args.precision, 256)

            rows.append((label, timed(epoch, 1), timed(plans, 1)))
    print(f"{args.epoch_articles} articles of {args.article_sentences} sentences ({split.num_sentences} boundaries), "
          f"d_model=128 T=5 batch 128, torch threads={torch.get_num_threads()}, device={args.device}, "
          f"training and sampling {args.precision}")
    print(f"{'planner':40s} {'epoch s':>9s} {'vs current':>11s} {'plans K=5 s':>12s} {'vs current':>11s}")
    epoch_base, plans_base = rows[0][1], rows[0][2]
    for label, epoch_s, plans_s in rows:
        print(f"{label:40s} {epoch_s:9.2f} {epoch_base / epoch_s:10.2f}x {plans_s:12.2f} {plans_base / plans_s:10.2f}x")


if __name__ == "__main__":
    main()
