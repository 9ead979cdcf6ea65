"""Coverage of the seed-noise interval of a paired perplexity difference, by simulation, within and beyond the
normal model.

Synthetic per-piece NLL sums with a known answer: documents cut into pieces, and a model pair (A, B) trained
again with every seed. Per-token NLL of piece i of document g under seed s:

    A: beta + difficulty_g + difficulty_i + u_A[s] + w_A[s, g]
    B: the same + delta + doc_g + piece_i + u_B[s] + w_B[s, g] + divergence_B[s]

``doc_g`` (sd "document") is shared by all pieces of a document: the within-document correlation of the
difference; ``piece_i`` (sd "piece") is a piece's own. ``u`` (sd "seed") is the seed noise: each seed shifts each
model, and ``w`` (sd "seed x document") is a seed's own effect on a document. The difficulty terms are shared by
A and B (they cancel in the pair). Beyond the normal model:

- divergent seeds: with probability ``--divergence_rate`` a seed's B diverges, its NLL shifted up by
  ``--divergence`` seed sds (one divergent seed in about seven: the per-seed differences are skewed);
- skewed documents: ``doc_g`` is a lognormal of shape ``--skew``, centred and scaled to sd "document", with the
  sign that makes a few documents gain much more than the rest (skewness 6.2 at shape 1); "alone": with little
  normal noise per piece and per seed and document beside it, so the document term is nearly all skew.

The target is the expected difference over seeds of the population perplexities, exp(beta + seed_sd^2 / 2) *
(exp(delta) * E[exp(divergence_B)] - 1), which every interval aims at (doc_g has mean 0 in either model).

The default table (``--out experiments/results/interval_coverage.md``) gives, per scenario, number of documents G
and seeds S, the coverage of 95% intervals with its Monte Carlo standard error and how the misses fall (truth below
the interval / above it), for:

- normal theory: mean_s d_s +- sqrt((t_{S-1} * s / sqrt(S))^2 + (t_{G-1} * se_doc)^2), d_s each seed's difference,
  s their sd, se_doc the sd of their mean over document resamples (from ``seeded_paired_interval``'s own
  ``seed_se`` and ``document_se``): the interval before the documents' skew entered it;
- the interval: ``planlm.evaluate.bootstrap.seeded_paired_interval`` itself, whose document part is lengthened on
  the side of the documents' skew (a bootstrap-t over documents, docs/evaluation.md);
- wider seed quantile: the interval with its seed part at t_{S-1} of 1 - alpha / 4 instead of 1 - alpha / 2 (an
  option measured here, not used by planlm: what one would pay to cover unseen divergent seeds).

``--alternatives`` gives instead the comparison of five intervals under the normal model that chose the
normal-theory one (same draws as when it was written; columns: the old two-level bootstrap over pieces, the same
over documents, t on S - 1 throughout, Welch-Satterthwaite degrees of freedom, and the normal-theory interval).

    python experiments/sim_interval_coverage.py --replicates 40                     # a quick look
    python experiments/sim_interval_coverage.py --documents 17 --seeds 2 4 --out experiments/results/interval_coverage.md
    python experiments/sim_interval_coverage.py --documents 17 --seeds 6 8 --append --out ...   # and so on
    python experiments/sim_interval_coverage.py --alternatives --seeds 2 3 5 --documents 17 --replicates 1000 \\
        --out experiments/results/sim_interval_coverage.txt
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

try:
    from experiments.two_level_bootstrap import seeded_paired_bootstrap
except ImportError:  # run as a script (python experiments/sim_interval_coverage.py): its folder is sys.path[0]
    from two_level_bootstrap import seeded_paired_bootstrap
from planlm.evaluate.bootstrap import t_quantiles, seeded_paired_interval

# (name, seed_sd, doc_sd, piece_sd, seed_doc_sd in nats per token, seed noise, document gains)
NORMAL = (("seeds dominate", 0.02, 0.01, 0.01, 0.01, "normal", "normal"),
          ("balanced", 0.01, 0.02, 0.02, 0.01, "normal", "normal"),
          ("documents dominate", 0.003, 0.03, 0.02, 0.01, "normal", "normal"))
SCENARIOS = NORMAL + (("divergent seeds", 0.02, 0.01, 0.01, 0.01, "divergent", "normal"),
                      ("skewed documents", 0.003, 0.03, 0.02, 0.01, "normal", "skewed"),
                      ("skewed documents, alone", 0.003, 0.03, 0.005, 0.002, "normal", "skewed"),
                      ("divergent seeds and skewed documents", 0.01, 0.02, 0.02, 0.01, "divergent", "skewed"))


def document_gains(rng: np.random.Generator, kind: str, sd: float, documents: int, skew: float) -> np.ndarray:
    """(G,) each document's own gain, mean 0 and sd ``sd``: normal, or a negated lognormal of shape ``skew`` (a few
    documents gain much more than the rest)."""
    if kind == "normal":
        return rng.normal(0, sd, documents)
    lognormal = np.exp(skew * rng.normal(size=documents))
    mean, var = np.exp(skew ** 2 / 2), np.expm1(skew ** 2) * np.exp(skew ** 2)
    return -sd * (lognormal - mean) / np.sqrt(var)


def draw_run(rng: np.random.Generator, args, num_seeds: int, scenario: tuple, documents: int):
    """One synthetic evaluation of A and B over num_seeds seeds: nll_a, nll_b (S, N), tokens (N,), sources (N,)."""
    _, seed_sd, doc_sd, piece_sd, seed_doc_sd, seed_kind, document_kind = scenario
    pieces = rng.integers(1, 2 * args.pieces_per_document, size=documents)  # 1 .. 2m - 1, mean m
    sources = np.repeat(np.arange(documents), pieces)  # (N,)
    num_pieces = len(sources)
    tokens = rng.integers(300, 700, size=num_pieces)
    level = args.beta + rng.normal(0, 0.3, documents)[sources] + rng.normal(0, 0.1, num_pieces)  # shared
    gain = (args.delta + document_gains(rng, document_kind, doc_sd, documents, args.skew)[sources]
            + rng.normal(0, piece_sd, num_pieces))

    def seeded(shape_doc_effects: np.ndarray) -> np.ndarray:  # (S, N) seed and seed x document effects
        return rng.normal(0, seed_sd, (num_seeds, 1)) + shape_doc_effects[:, sources]

    nll_a = (level + seeded(rng.normal(0, seed_doc_sd, (num_seeds, documents)))) * tokens
    nll_b = (level + gain + seeded(rng.normal(0, seed_doc_sd, (num_seeds, documents)))) * tokens
    if seed_kind == "divergent":  # drawn last: the normal scenarios' draws stay what they were
        nll_b = nll_b + args.divergence * seed_sd * (rng.random((num_seeds, 1)) < args.divergence_rate) * tokens
    return nll_a, nll_b, tokens, sources


def truth(args, scenario: tuple) -> float:
    """The expected difference over seeds of the population perplexities."""
    _, seed_sd, _, _, _, seed_kind, _ = scenario
    rate = args.divergence_rate if seed_kind == "divergent" else 0.0
    diverged = 1 - rate + rate * np.exp(args.divergence * seed_sd)  # E[exp(divergence_B)]
    return float(np.exp(args.beta + seed_sd ** 2 / 2) * (np.exp(args.delta) * diverged - 1))


def coverage(args, num_seeds: int, scenario: tuple, documents: int) -> dict:
    """Coverage, misses below / above and mean width of the three intervals of the default table in one cell."""
    target = truth(args, scenario)
    rng = np.random.default_rng([args.seed, num_seeds, SCENARIOS.index(scenario), documents])
    keys = ("normal", "interval", "wider")
    below, above, widths = ({k: 0 for k in keys}, {k: 0 for k in keys}, {k: [] for k in keys})
    for replicate in range(args.replicates):
        nll_a, nll_b, tokens, sources = draw_run(rng, args, num_seeds, scenario, documents)
        result = seeded_paired_interval(nll_a, nll_b, tokens, args.samples, seed=replicate, clusters=sources)
        diff, seed_se, document_se = result["diff"], result["seed_se"], result["document_se"]
        seed_t, document_t = t_quantiles(0.95, num_seeds, result["documents"])
        half = np.hypot(seed_t * seed_se, document_t * document_se)
        wider_t = t_quantiles(0.975, num_seeds, result["documents"])[0]
        # the interval's document parts, side by side, with the seed part at the wider quantile
        parts = [np.sqrt(max(h ** 2 - (seed_t * seed_se) ** 2, 0.0))
                 for h in (diff - result["ci_low"], result["ci_high"] - diff)]
        intervals = {"normal": (diff - half, diff + half), "interval": (result["ci_low"], result["ci_high"]),
                     "wider": (diff - np.hypot(wider_t * seed_se, parts[0]),
                               diff + np.hypot(wider_t * seed_se, parts[1]))}
        for key, (low, high) in intervals.items():
            below[key] += target < low
            above[key] += target > high
            widths[key].append(high - low)
    n = args.replicates
    out = {"scenario": scenario[0], "seeds": num_seeds, "documents": documents, "truth": target}
    for key in keys:
        hit = 1 - (below[key] + above[key]) / n
        out.update({f"{key}_coverage": hit, f"{key}_se": float(np.sqrt(hit * (1 - hit) / n)),
                    f"{key}_below": below[key] / n, f"{key}_above": above[key] / n,
                    f"{key}_width": float(np.mean(widths[key]))})
    return out


def coverage_table(args) -> list[str]:
    def cell(row: dict, key: str) -> str:
        return (f"{row[f'{key}_coverage']:.1%} ± {row[f'{key}_se']:.1%} "
                f"({row[f'{key}_below']:.1%} / {row[f'{key}_above']:.1%})")

    title = [] if args.append else [
        "# Coverage of the seed-noise interval, within and beyond the normal model", "",
        "Written by `experiments/sim_interval_coverage.py` (its docstring gives the model), one table per command. "
        "Each coverage of a 95% interval is given ± its Monte Carlo standard error, and (in brackets) the share of "
        "runs whose truth lies below / above the interval (2.5% each for an exact interval). Normal theory: the "
        "t quantiles per part in quadrature, symmetric; the interval: `seeded_paired_interval`, its document part "
        "lengthened on the side of the documents' skew; wider seed quantile: the interval with t_{S-1} at "
        "1 - alpha / 4 (not used by planlm).", ""]
    lines = title + [
             f"`python experiments/sim_interval_coverage.py {' '.join(args.argv)}`: {args.replicates} simulated "
             f"runs per row, {args.samples} bootstrap resamples per interval, documents of about "
             f"{args.pieces_per_document} pieces; divergent seeds: B diverges with probability "
             f"{args.divergence_rate:g}, by {args.divergence:g} seed sds; skewed documents: lognormal of shape "
             f"{args.skew:g}.", "",
             "| scenario (sd per token: seed / document / piece / seed x document) | G | S | normal theory | the interval "
             "(`seeded_paired_interval`) | width: interval / normal theory | wider seed quantile (not used) | "
             "width: wider / interval |", "|---" * 8 + "|"]
    print("\n".join(lines), flush=True)
    for documents in args.documents:
        for scenario in SCENARIOS:
            for num_seeds in args.seeds:
                row = coverage(args, num_seeds, scenario, documents)
                line = (f"| {scenario[0]} ({' / '.join(f'{x:g}' for x in scenario[1:5])}) | {documents} | "
                        f"{num_seeds} | {cell(row, 'normal')} | {cell(row, 'interval')} | "
                        f"{row['interval_width'] / row['normal_width']:.2f}x | {cell(row, 'wider')} | "
                        f"{row['wider_width'] / row['interval_width']:.2f}x |")
                lines.append(line)
                print(line, flush=True)
    return lines


def alternatives(rng: np.random.Generator, args, num_seeds: int, scenario: tuple) -> dict:
    """The comparison of five intervals under the normal model (``--alternatives``)."""
    from scipy.stats import t

    documents = args.documents[0]
    target = truth(args, scenario)
    keys = ("old", "documents", "t", "welch", "new")
    hits, widths = {k: 0 for k in keys}, {k: [] for k in keys}
    quantile = t.ppf(0.975, num_seeds - 1)
    for replicate in range(args.replicates):
        nll_a, nll_b, tokens, sources = draw_run(rng, args, num_seeds, scenario, documents)
        new = seeded_paired_interval(nll_a, nll_b, tokens, args.samples, seed=replicate, clusters=sources)
        seed_var, document_var = new["seed_se"] ** 2, new["document_se"] ** 2
        half = quantile * np.sqrt(seed_var + document_var)
        df = ((seed_var + document_var) ** 2
              / (seed_var ** 2 / (num_seeds - 1) + document_var ** 2 / (new["documents"] - 1)))
        welch = t.ppf(0.975, df) * np.sqrt(seed_var + document_var)
        seed_t, document_t = t_quantiles(0.95, num_seeds, new["documents"])
        normal = np.hypot(seed_t * new["seed_se"], document_t * new["document_se"])
        intervals = {"old": seeded_paired_bootstrap(nll_a, nll_b, tokens, args.samples, seed=replicate),
                     "documents": seeded_paired_bootstrap(nll_a, nll_b, tokens, args.samples, seed=replicate,
                                                          clusters=sources),
                     "t": {"ci_low": new["diff"] - half, "ci_high": new["diff"] + half},
                     "welch": {"ci_low": new["diff"] - welch, "ci_high": new["diff"] + welch},
                     "new": {"ci_low": new["diff"] - normal, "ci_high": new["diff"] + normal}}
        for key, interval in intervals.items():
            hits[key] += interval["ci_low"] <= target <= interval["ci_high"]
            widths[key].append(interval["ci_high"] - interval["ci_low"])
    return {**{f"{k}_coverage": hits[k] / args.replicates for k in hits},
            **{f"{k}_width": float(np.mean(widths[k])) for k in widths}}


def alternatives_table(args) -> list[str]:
    header = ("| scenario (sd per token: seed / document / piece) | S | old: two-level over pieces | two-level over "
              "documents | t on S - 1 throughout | Welch t | new: t per part, in quadrature | width new / old | "
              "width t on S - 1 / new |")
    lines = [f"Coverage of 95% intervals of ppl(B) - ppl(A) (true {np.exp(args.beta) * np.expm1(args.delta):+.3f} "
             f"at seed sd 0), {args.replicates} simulated runs per row ({args.documents[0]} documents of about "
             f"{args.pieces_per_document} pieces, {args.samples} bootstrap resamples; Monte Carlo sd of a coverage "
             f"near 95%: {np.sqrt(0.95 * 0.05 / args.replicates):.1%}).", "", header, "|---" * 9 + "|"]
    print("\n".join(lines), flush=True)
    for scenario in NORMAL:
        for num_seeds in args.seeds:
            rng = np.random.default_rng([args.seed, num_seeds, SCENARIOS.index(scenario)])
            row = alternatives(rng, args, num_seeds, scenario)
            line = (f"| {scenario[0]} ({scenario[1]:g} / {scenario[2]:g} / {scenario[3]:g}) | {num_seeds} | "
                    f"{row['old_coverage']:.1%} | {row['documents_coverage']:.1%} | {row['t_coverage']:.1%} | "
                    f"{row['welch_coverage']:.1%} | {row['new_coverage']:.1%} | "
                    f"{row['new_width'] / row['old_width']:.2f}x | {row['t_width'] / row['new_width']:.2f}x |")
            lines.append(line)
            print(line, flush=True)
    return lines


def main(argv: list[str] | None = None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicates", type=int, default=1000, help="simulated runs per row")
    parser.add_argument("--samples", type=int, default=400, help="bootstrap resamples per interval")
    parser.add_argument("--seeds", type=int, nargs="+", default=[2, 4, 6, 8])
    parser.add_argument("--documents", type=int, nargs="+", default=[17, 50],
                        help="test documents (the demo's test split: about 17 of about 3 pieces)")
    parser.add_argument("--pieces_per_document", type=int, default=3, help="mean pieces per document")
    parser.add_argument("--beta", type=float, default=float(np.log(30.0)), help="log perplexity of A")
    parser.add_argument("--delta", type=float, default=-0.03, help="B - A in nats per token")
    parser.add_argument("--divergence_rate", type=float, default=0.15, help="probability that a seed's B diverges")
    parser.add_argument("--divergence", type=float, default=6.0, help="a divergent B's shift, in seed sds")
    parser.add_argument("--skew", type=float, default=1.0, help="lognormal shape of skewed document gains")
    parser.add_argument("--alternatives", action="store_true",
                        help="the five-interval comparison under the normal model instead (first --documents)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="also write the table here")
    parser.add_argument("--append", action="store_true", help="add the table to --out instead of replacing it")
    args = parser.parse_args(argv)
    args.argv = list(argv) if argv is not None else sys.argv[1:]
    lines = alternatives_table(args) if args.alternatives else coverage_table(args)
    if args.alternatives:
        lines.append(f"\npython experiments/sim_interval_coverage.py {' '.join(args.argv)}")
        print(lines[-1])
    if args.out:
        with open(args.out, "a" if args.append else "w") as f:
            f.write(("\n" if args.append else "") + "\n".join(lines) + "\n")
    return lines


if __name__ == "__main__":
    main()
