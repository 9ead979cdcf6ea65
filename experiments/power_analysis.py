"""Power analysis for the evidence run: how many seeds each contrast needs for its interval to exclude 0.

    PYTHONPATH=$PWD python experiments/power_analysis.py --out experiments/results/power_analysis.md
    PYTHONPATH=$PWD python -m pytest tests/test_power_analysis.py

Seconds on one core. The inputs are the per-seed paired test-perplexity differences measured so far (the README's
demo table, configs/demo.yaml at 2 seeds; the demo with the 9x planner; two more seeds of the oracle LM), each
listed below with its source. For every contrast the script

1. backs the document standard error out of its published 2-seed interval, by inverting the product's own
   half-width (``planlm.evaluate.power``: sqrt((t_{S-1} s_seed / sqrt(S))^2 + (t_{G-1} se_doc)^2)),
   with the range the 2-decimal rounding of the published numbers allows;
2. takes the seed standard deviation of the per-seed differences (pooled over runs of the same contrast where
   there are several) and inflates it for what an evidence seed also redraws: the planner's training and the
   k-means codebook (the demo shares both across seeds, so its seed spread holds LM-training noise only);
3. for S = 2..16 simulates the evaluation as the product computes it: S per-seed differences drawn from
   N(effect, seed_sd), one document error drawn from N(0, se_doc) shared by all seeds (the test documents are the
   same for every seed), the interval of ``seeded_paired_interval`` (``planlm.evaluate.power.half_width``), and counts how often
   the interval excludes 0; the smallest S with power >= 80% is the contrast's seed need.

The effect is what the runs so far show (the mean of the per-seed values): if the true effect is smaller, the
need is larger. The seed sd of a 2-seed contrast is a 1-degree-of-freedom estimate, hence the pooling and the
conservative choices below, each stated where it is made.
"""

from __future__ import annotations

import argparse
import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from planlm.evaluate import power
from planlm.evaluate.power import SEED_RANGE, TARGET_POWER, seeds_needed

CONFIDENCE = 0.95
DOCUMENTS = 17  # test source documents of the demo corpus: 50 pieces of about 17 speeches (configs/demo.yaml, docs/results.md)
ROUNDING = 0.005  # the published per-seed values and interval ends are rounded to 2 decimals

# --- the data, each with its source -------------------------------------------------------------------------------

README_DEMO = "README demo table (configs/demo.yaml, 2 seeds, experiments/results/demo_report.md)"
README_BIG = "README, the demo with the 9x planner (configs/demo-bigplanner.yaml), run {n}"
ORACLE_SEEDS = "docs/results.md: oracle - Fixed at seeds 2 and 3 (experiments/demo_oracle_seeds.yaml)"


@dataclass(frozen=True)
class Interval:
    """A published paired contrast: its per-seed values and 95% interval (seed noise and documents)."""
    per_seed: tuple[float, ...]
    low: float
    high: float
    source: str


# The planner's retraining shift: the 9x-planner demo run twice with everything equal but the planner's training,
# ours - Fixed -1.03 then -1.74 (each a 2-seed mean; README). The difference of two 2-seed means of the same recipe
# has variance 2 * var_planner + var_lm (each mean carries var_lm / 2 of LM-seed noise), so
# var_planner = (shift^2 - var_lm) / 2.
PLANNER_SHIFT = (-1.03, -1.74, README_BIG.format(n="1 and 2") + ": ours - Fixed, the planner retrained")


@dataclass
class Contrast:
    name: str
    role: str  # "target" (pre-registered to exclude 0) or "reported" (reported whatever it shows)
    intervals: list[Interval]  # the first is the demo's, the effect and the document SE come from it
    extra_seeds: tuple[float, ...] = ()  # more per-seed values of the same contrast, same recipe, LM seeds only
    extra_source: str = ""
    planners: float = 1.0  # how many independently trained planners / codebooks enter: multiples of var_planner
    anchor: Optional[Interval] = None  # a well-conditioned relative for the document SE (seeds that agree)
    anchor_note: str = ""
    documents_only: bool = False  # a 1-seed interval over documents alone (percentile bootstrap)
    notes: list[str] = field(default_factory=list)


CONTRASTS = [
    Contrast("oracle - Fixed", "target",
             [Interval((-7.88, -5.64), -21.05, 7.53, README_DEMO)],
             extra_seeds=(-4.05, -7.11), extra_source=ORACLE_SEEDS,
             anchor=Interval((-7.42, -6.59), -12.54, -1.47, README_DEMO + ": oracle - none"),
             anchor_note="oracle - none"),
    Contrast("ours - Fixed", "target",
             [Interval((-0.87, -1.26), -3.60, 1.48, README_DEMO),
              Interval((-1.02, -1.04), -1.85, -0.21, README_BIG.format(n=1)),
              Interval((-1.65, -1.82), -3.11, -0.36, README_BIG.format(n=2))],
             anchor=Interval((-1.02, -1.04), -1.85, -0.21, README_BIG.format(n=1)),
             anchor_note="ours - Fixed, 9x planner, run 1"),
    Contrast("Cornille et al. - Fixed", "target",
             [Interval((-2.34, -0.70), -11.98, 8.93, README_DEMO)],
             anchor=Interval((-1.88, -1.65), -3.52, -0.01, README_DEMO + ": Cornille et al. - none"),
             anchor_note="Cornille et al. - none"),
    Contrast("K = 20 - K = 1 (ours)", "target",
             [Interval((-1.49,), -1.83, -1.10, README_DEMO + ": ours' K sweep, seed 0, documents only")],
             documents_only=True,
             notes=["one seed: its seed sd is taken as ours - Fixed's (the same model at two K; an upper-side guess)"]),
    Contrast("ours - ours with T = 1", "reported",
             [Interval((-1.74, -0.13), -11.17, 9.29, README_DEMO)]),
    Contrast("ours - ours with Project and Avg", "reported",
             [Interval((0.00, 0.01), -0.08, 0.10, README_DEMO)], planners=0.0,
             notes=["same plans, only the adapter differs: no planner inflation"]),
    Contrast("ours - Cornille et al.", "reported",
             [Interval((1.47, -0.55), -12.42, 13.33, README_DEMO)], planners=2.0,
             notes=["two planners trained independently: twice the planner variance"]),
]

# --- the pieces ---------------------------------------------------------------------------------------------------


def document_se(per_seed: Sequence[float], low: float, high: float, documents: int = DOCUMENTS,
                confidence: float = CONFIDENCE, documents_only: bool = False) -> float:
    """The document SE that the product's half-width turns into this interval (``planlm.evaluate.power``), at the
    demo's G unless told."""
    return power.document_se(per_seed, low, high, documents, confidence, documents_only)


def document_se_range(interval: Interval, documents: int = DOCUMENTS, documents_only: bool = False) -> tuple[float, float]:
    """The smallest and largest document SE over the rounding of every published number (+- 0.005)."""
    values = []
    for shifts in itertools.product((-ROUNDING, ROUNDING), repeat=len(interval.per_seed) + 2):
        per_seed = tuple(v + d for v, d in zip(interval.per_seed, shifts))
        values.append(document_se(per_seed, interval.low + shifts[-2], interval.high + shifts[-1], documents,
                                  documents_only=documents_only))
    return min(values), max(values)


def planner_variance(shift: tuple[float, float, str], lm_var: float) -> float:
    """var_planner from two 2-seed means of the same recipe whose planners were trained apart (see PLANNER_SHIFT)."""
    return max((shift[0] - shift[1]) ** 2 - lm_var, 0.0) / 2


def power_curve(effect: float, seed_sd: float, doc_se: float, documents: int = DOCUMENTS,
                seeds: Sequence[int] = SEED_RANGE, draws: int = 4000, confidence: float = CONFIDENCE,
                rng_seed: int = 0) -> list[dict]:
    """``planlm.evaluate.power.power_curve`` at the demo's G unless told: for each S the expected half-width and
    the probability that the interval excludes 0."""
    return power.power_curve(effect, seed_sd, doc_se, documents, seeds, draws, confidence, rng_seed)


def lm_seed_variance(contrast: Contrast) -> tuple[float, int]:
    """The LM-seed variance of a contrast's per-seed values and its degrees of freedom, pooled over its runs (the
    extra seeds join the first run's)."""
    groups = [list(iv.per_seed) for iv in contrast.intervals]
    groups[0] += list(contrast.extra_seeds)
    dof = sum(len(g) - 1 for g in groups)
    return sum((len(g) - 1) * float(np.var(g, ddof=1)) for g in groups) / dof, dof


def plan_inputs(contrast: Contrast, lm_sd_fallback: float, var_planner: float) -> dict:
    """Effect, seed sd (LM part, inflated) and document SE of one contrast, with how each was chosen."""
    first = contrast.intervals[0]
    values = list(first.per_seed) + list(contrast.extra_seeds)
    effect = float(np.mean(values))
    if contrast.documents_only:
        lm_var, lm_how = lm_sd_fallback ** 2, "ours - Fixed's (one seed measured)"
    else:
        lm_var, dof = lm_seed_variance(contrast)
        runs = len(contrast.intervals)
        lm_how = f"pooled over {runs} run(s), {dof} df" if runs > 1 else f"{dof} df"
    seed_sd = float(np.sqrt(lm_var + contrast.planners * var_planner))
    own = document_se(first.per_seed, first.low, first.high, documents_only=contrast.documents_only)
    own_low, own_high = document_se_range(first, documents_only=contrast.documents_only)
    if contrast.anchor is not None:
        anchor = document_se(contrast.anchor.per_seed, contrast.anchor.low, contrast.anchor.high)
        doc_se, doc_how = max(own, anchor), f"max(own, {contrast.anchor_note} {anchor:.2f})"
    elif own_high > 2 * max(own, 1e-9) and not contrast.documents_only:
        doc_se, doc_how = own_high, "own, upper rounding end (ill-conditioned)"
    else:
        doc_se, doc_how = own, "own"
    return {"effect": effect, "lm_sd": float(np.sqrt(lm_var)), "lm_how": lm_how, "seed_sd": seed_sd,
            "doc_own": own, "doc_range": (own_low, own_high), "doc_se": doc_se, "doc_how": doc_how,
            "n_values": len(values)}


def analyse(draws: int = 4000, documents: int = DOCUMENTS) -> tuple[dict, list[dict]]:
    """Every contrast's inputs and power curve; ``documents`` other than the demo's: a test set of that many
    documents, the document SE scaled by sqrt(DOCUMENTS / documents) (a mean over more documents)."""
    ours_fixed = next(c for c in CONTRASTS if c.name == "ours - Fixed")
    groups = [iv.per_seed for iv in ours_fixed.intervals]
    lm_var_ours = float(np.mean([np.var(g, ddof=1) for g in groups]))
    var_planner = planner_variance(PLANNER_SHIFT, lm_var_ours)
    common = {"var_planner": var_planner, "sd_planner": float(np.sqrt(var_planner)), "lm_var_ours": lm_var_ours}
    rows = []
    for contrast in CONTRASTS:
        inputs = plan_inputs(contrast, float(np.sqrt(lm_var_ours)), var_planner)
        inputs["doc_se"] *= float(np.sqrt(DOCUMENTS / documents))
        curve = power_curve(inputs["effect"], inputs["seed_sd"], inputs["doc_se"], documents=documents, draws=draws)
        rows.append({"contrast": contrast, **inputs, "curve": curve, "needed": seeds_needed(curve)})
    return common, rows


def render(common: dict, rows: list[dict], draws: int, larger: Optional[tuple[int, list[dict]]] = None) -> str:
    out = ["# Power analysis for the evidence run", "",
           "`PYTHONPATH=$PWD python experiments/power_analysis.py --out experiments/results/power_analysis.md`", "",
           f"95% intervals as `seeded_paired_interval` computes them, G = {DOCUMENTS} test documents, {draws} "
           "simulated evaluations per S (common random numbers across S). Effect: the mean of the per-seed "
           "values so far. Seed sd: the LM-seed sd of the per-seed differences, in quadrature with the planner / "
           "codebook variance an evidence seed also redraws. Document SE: backed out of the published interval "
           "by inverting the product's half-width (`planlm.evaluate.power`).", "",
           f"Planner variance: the 9x-planner demo retrained with only the planner's training changed moved ours - "
           f"Fixed from {PLANNER_SHIFT[0]:+.2f} to {PLANNER_SHIFT[1]:+.2f}; with 2-seed means, "
           f"var_planner = (shift^2 - var_lm) / 2 = {common['var_planner']:.3f} (sd {common['sd_planner']:.2f}), "
           f"var_lm = {common['lm_var_ours']:.3f} (ours - Fixed, pooled over its 3 runs). It is added once per "
           "independently trained planner a contrast reads (twice for ours - Cornille et al., not for ours - "
           "Project and Avg), and once for oracle - Fixed as the stand-in for the k-means codebook's draw "
           "(unmeasured).", "",
           "## Inputs", "",
           "| contrast | role | per-seed values (n) | effect | LM-seed sd | seed sd used (inflated) | document SE: own [rounding range] | used |",
           "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        c = row["contrast"]
        per_seed = ", ".join(f"{v:+.2f}" for v in list(c.intervals[0].per_seed) + list(c.extra_seeds))
        low, high = row["doc_range"]
        out.append(f"| {c.name} | {c.role} | {per_seed} ({row['n_values']}) | {row['effect']:+.2f} | "
                   f"{row['lm_sd']:.2f} ({row['lm_how']}) | {row['seed_sd']:.2f} | {row['doc_own']:.2f} "
                   f"[{low:.2f}, {high:.2f}] | {row['doc_se']:.2f} ({row['doc_how']}) |")
    out += ["", "## Expected half-width / power to exclude 0, by number of seeds S", "",
            "| contrast | " + " | ".join(f"S={s}" for s in SEED_RANGE) + " | S for 80% |",
            "|---|" + "---|" * len(SEED_RANGE) + "---|"]
    for row in rows:
        cells = [f"{r['half_width']:.2f} / {r['power']:.0%}" for r in row["curve"]]
        need = row["needed"] if row["needed"] is not None else f"> {SEED_RANGE[-1]}"
        out.append(f"| {row['contrast'].name} ({row['contrast'].role}) | " + " | ".join(cells) + f" | {need} |")
    out += ["", "Cells: the mean half-width of the simulated intervals (perplexity points) / the share of them that "
            "exclude 0. The document error is shared by every seed (the same test documents), so the power "
            "levels off as S grows: at most P(|effect + e_doc| > t_{G-1} se_doc), the ceiling that only more test "
            "documents raise."]
    if larger is not None:
        documents, big = larger
        out += ["", f"## The same with a test set of {documents} documents (document SE x sqrt({DOCUMENTS}/{documents}))",
                "", "| contrast | " + " | ".join(f"S={s}" for s in SEED_RANGE) + " | S for 80% |",
                "|---|" + "---|" * len(SEED_RANGE) + "---|"]
        for row in big:
            cells = [f"{r['half_width']:.2f} / {r['power']:.0%}" for r in row["curve"]]
            need = row["needed"] if row["needed"] is not None else f"> {SEED_RANGE[-1]}"
            out.append(f"| {row['contrast'].name} ({row['contrast'].role}) | " + " | ".join(cells) + f" | {need} |")
    out += ["", "## Sources", ""]
    sources = sorted({iv.source for row in rows for iv in row["contrast"].intervals}
                     | {row["contrast"].extra_source for row in rows if row["contrast"].extra_source}
                     | {row["contrast"].anchor.source for row in rows if row["contrast"].anchor}
                     | {PLANNER_SHIFT[2]})
    out += [f"- {s}" for s in sources]
    notes = [f"- {row['contrast'].name}: {n}" for row in rows for n in row["contrast"].notes]
    if notes:
        out += ["", "## Notes", ""] + notes
    return "\n".join(out) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=4000)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--larger_test", type=int, default=34,
                        help="also tabulate a test set of this many documents (0: skip); the demo's is 17")
    args = parser.parse_args(argv)
    common, rows = analyse(args.draws)
    larger = (args.larger_test, analyse(args.draws, args.larger_test)[1]) if args.larger_test else None
    text = render(common, rows, args.draws, larger)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)


if __name__ == "__main__":
    main()
