"""Coverage of the seed-noise intervals of a paired perplexity difference, by simulation (issue 36, item 5).

Synthetic per-piece NLL sums with a known answer: documents cut into pieces, and a model pair (A, B) trained
again with every seed. Per-token NLL of piece i of document g under seed s:

    A: beta + difficulty_g + difficulty_i + u_A[s] + w_A[s, g]
    B: the same + delta + doc_g + piece_i + u_B[s] + w_B[s, g]

``doc_g`` (sd ``--doc_sd``) is shared by all pieces of a document: the within-document correlation of the
difference; ``piece_i`` (sd ``--piece_sd``) is a piece's own. ``u`` (sd ``seed_sd``) is the seed noise: each
seed shifts each model, and ``w`` (sd ``--seed_doc_sd``) is a seed's own effect on a document. The difficulty
terms are shared by A and B (they cancel in the pair). The target is the expected difference over seeds of the
population perplexities, exp(beta + seed_sd^2 / 2) * (exp(delta) - 1), which every interval aims at.

Five 95% intervals, from the same data (d_s each seed's difference, s their sd, se_doc the sd of their mean over
document resamples, G documents):
- old: ``seeded_paired_bootstrap`` over pieces, the two-level percentile bootstrap the project reported;
- two-level, documents: the same, resampling documents with their pieces (only the document fix);
- t on S - 1 throughout: mean_s d_s +- t_{S-1} * sqrt(s^2 / S + se_doc^2) (the simplest few-seed interval);
- Welch: the same with the Welch-Satterthwaite degrees of freedom of the sum (S - 1 and G - 1);
- new: ``seeded_paired_interval``, mean_s d_s +- sqrt((t_{S-1} * s / sqrt(S))^2 + (t_{G-1} * se_doc)^2).

    python experiments/sim_interval_coverage.py                  # about 1 minute on one idle core
    python experiments/sim_interval_coverage.py --replicates 2000 --out experiments/results/sim_interval_coverage.txt
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from planlm.evaluate.bootstrap import seeded_paired_bootstrap, seeded_paired_interval

# (name, seed_sd, doc_sd, piece_sd) in nats per token
SCENARIOS = (("seeds dominate", 0.02, 0.01, 0.01), ("balanced", 0.01, 0.02, 0.02),
             ("documents dominate", 0.003, 0.03, 0.02))


def draw_run(rng: np.random.Generator, args, num_seeds: int, seed_sd: float, doc_sd: float, piece_sd: float):
    """One synthetic evaluation of A and B over num_seeds seeds: nll_a, nll_b (S, N), tokens (N,), sources (N,)."""
    pieces = rng.integers(1, 2 * args.pieces_per_document, size=args.documents)  # 1 .. 2m - 1, mean m
    sources = np.repeat(np.arange(args.documents), pieces)  # (N,)
    num_pieces = len(sources)
    tokens = rng.integers(300, 700, size=num_pieces)
    level = args.beta + rng.normal(0, 0.3, args.documents)[sources] + rng.normal(0, 0.1, num_pieces)  # shared
    gain = args.delta + rng.normal(0, doc_sd, args.documents)[sources] + rng.normal(0, piece_sd, num_pieces)

    def seeded(shape_doc_effects: np.ndarray) -> np.ndarray:  # (S, N) seed and seed x document effects
        return rng.normal(0, seed_sd, (num_seeds, 1)) + shape_doc_effects[:, sources]

    nll_a = (level + seeded(rng.normal(0, args.seed_doc_sd, (num_seeds, args.documents)))) * tokens
    nll_b = (level + gain + seeded(rng.normal(0, args.seed_doc_sd, (num_seeds, args.documents)))) * tokens
    return nll_a, nll_b, tokens, sources


def coverage(args, num_seeds: int, scenario: tuple) -> dict:
    from scipy.stats import t

    name, seed_sd, doc_sd, piece_sd = scenario
    truth = np.exp(args.beta + seed_sd ** 2 / 2) * np.expm1(args.delta)
    rng = np.random.default_rng([args.seed, num_seeds, SCENARIOS.index(scenario)])
    keys = ("old", "documents", "t", "welch", "new")
    hits, widths = {k: 0 for k in keys}, {k: [] for k in keys}
    quantile = t.ppf(0.975, num_seeds - 1)
    for replicate in range(args.replicates):
        nll_a, nll_b, tokens, sources = draw_run(rng, args, num_seeds, seed_sd, doc_sd, piece_sd)
        new = seeded_paired_interval(nll_a, nll_b, tokens, args.samples, seed=replicate, clusters=sources)
        half = quantile * np.hypot(new["seed_se"], new["document_se"])
        seed_var, document_var = new["seed_se"] ** 2, new["document_se"] ** 2
        df = (seed_var + document_var) ** 2 / (seed_var ** 2 / (num_seeds - 1) + document_var ** 2 / (new["documents"] - 1))
        welch = t.ppf(0.975, df) * np.sqrt(seed_var + document_var)
        intervals = {"old": seeded_paired_bootstrap(nll_a, nll_b, tokens, args.samples, seed=replicate),
                     "documents": seeded_paired_bootstrap(nll_a, nll_b, tokens, args.samples, seed=replicate,
                                                          clusters=sources),
                     "t": {"ci_low": new["diff"] - half, "ci_high": new["diff"] + half},
                     "welch": {"ci_low": new["diff"] - welch, "ci_high": new["diff"] + welch}, "new": new}
        for key, interval in intervals.items():
            hits[key] += interval["ci_low"] <= truth <= interval["ci_high"]
            widths[key].append(interval["ci_high"] - interval["ci_low"])
    return {"scenario": name, "seeds": num_seeds, "truth": truth,
            **{f"{k}_coverage": hits[k] / args.replicates for k in hits},
            **{f"{k}_width": float(np.mean(widths[k])) for k in widths}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicates", type=int, default=200, help="simulated runs per cell")
    parser.add_argument("--samples", type=int, default=400, help="bootstrap resamples per interval")
    parser.add_argument("--seeds", type=int, nargs="+", default=[2, 3, 5])
    parser.add_argument("--documents", type=int, default=17, help="test documents (the demo: 50 pieces, 3 each)")
    parser.add_argument("--pieces_per_document", type=int, default=3, help="mean pieces per document")
    parser.add_argument("--beta", type=float, default=float(np.log(30.0)), help="log perplexity of A")
    parser.add_argument("--delta", type=float, default=-0.03, help="B - A in nats per token")
    parser.add_argument("--seed_doc_sd", type=float, default=0.01, help="sd of a seed's own effect on a document")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="also write the table here")
    args = parser.parse_args()
    began = time.perf_counter()
    header = ("| scenario (sd per token: seed / document / piece) | S | old: two-level over pieces | two-level over "
              "documents | t on S - 1 throughout | Welch t | new: t per part, in quadrature | width new / old | "
              "width t on S - 1 / new |")
    lines = [f"Coverage of 95% intervals of ppl(B) - ppl(A) (true {np.exp(args.beta) * np.expm1(args.delta):+.3f} "
             f"at seed sd 0), {args.replicates} simulated runs per row ({args.documents} documents of about "
             f"{args.pieces_per_document} pieces, {args.samples} bootstrap resamples; Monte Carlo sd of a coverage "
             f"near 95%: {np.sqrt(0.95 * 0.05 / args.replicates):.1%}).", "", header, "|---" * 9 + "|"]
    print("\n".join(lines), flush=True)
    for scenario in SCENARIOS:
        for num_seeds in args.seeds:
            row = coverage(args, num_seeds, scenario)
            line = (f"| {scenario[0]} ({scenario[1]:g} / {scenario[2]:g} / {scenario[3]:g}) | {num_seeds} | "
                    f"{row['old_coverage']:.1%} | {row['documents_coverage']:.1%} | {row['t_coverage']:.1%} | "
                    f"{row['welch_coverage']:.1%} | {row['new_coverage']:.1%} | "
                    f"{row['new_width'] / row['old_width']:.2f}x | {row['t_width'] / row['new_width']:.2f}x |")
            lines.append(line)
            print(line, flush=True)
    lines.append(f"\n{time.perf_counter() - began:.0f} s; python experiments/sim_interval_coverage.py "
                 f"--replicates {args.replicates} --samples {args.samples} --seed {args.seed}")
    print(lines[-1])
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
