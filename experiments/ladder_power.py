"""Seeds and time of the pre-registered LM ladder (docs/ladder.md): the power to decide the slope of ours - Fixed
(in % of perplexity) against log10 of the LM's training compute, and what each number of seeds costs.

    PYTHONPATH=$PWD python experiments/ladder_power.py --out experiments/results/ladder_power.md

Seconds on one core. Inputs, each with its source below: the per-seed values of the larger planner's evidence run
(the ladder's protocol: every codebook and planner reads the rest of sotu's training side), and the stage times
measured on the idle 2-core AMD EPYC with avx512_bf16. The arithmetic of ``experiments/power_analysis.py``:

1. the document SE of ours - Fixed is backed out of its published 7-seed interval by inverting the product's half-width
   (``document_se``), and expressed, like the seed sd, in % of Fixed's perplexity;
2. for S seeds per rung it simulates the ladder as ``planlm across-runs`` evaluates it: at rung r, S per-seed values
   ~ N(a + b x_r, seed_sd) plus a document error ~ N(0, doc_se) shared by the rung's seeds (and, with correlation rho,
   partly by the rungs: the same test documents), the least-squares slope through the rungs' means, and its interval
   sqrt(t_df^2 var_seed + t_{G-1}^2 var_doc) with var_doc = sum_r w_r^2 doc_se^2 (1 - rho) (the bootstrap's estimate,
   taken as exact here) and df Welch-Satterthwaite's (``planlm.evaluate.bootstrap.slope_half_width``, the interval
   of ``planlm across-runs``); the share of intervals that exclude 0 is the power;
3. the time of each rung from the measured stage times, scaled by the LM's per-token matrix work (non-embedding
   parameters plus the output projection, V x d), with an efficiency range for the wider models.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from planlm.evaluate.bootstrap import slope_half_width
from planlm.evaluate.power import document_se

CONFIDENCE = 0.95
DOCUMENTS = 35  # test speeches of the evidence runs' 100 test pieces
VOCAB = 8192  # the ladder's BPE (bpe:8192), as the evidence run's
TOKENS_PER_EPOCH = 0.235e6  # the evidence run's training windows: about 0.7M tokens in 3 epochs per condition

# ours - Fixed of the larger planner's evidence run (experiments/results/evidence_bigplanner_report.md), perplexity.
OURS_FIXED = (-1.08, -1.60, -0.25, -1.29, -0.77, -1.51, -1.62)
OURS_FIXED_CI = (-1.76, -0.56)
FIXED_PPL = 213.27  # its Fixed, mean over seeds
# The evidence run's (docs/results.md), beside it: whole-method seed sd 0.81 for ours - Fixed.
EVIDENCE_OURS_FIXED = (-1.77, -0.77, +0.26, -1.17, -0.50, -2.13, -0.56)
SOURCE = "experiments/results/evidence_bigplanner_report.md (ours - fixed, 7 seeds, 35 test speeches)"


def non_embedding(layers: int, width: int) -> int:
    """A GPT-2's parameters less its token and position embeddings (the output projection is tied to them)."""
    return layers * (12 * width ** 2 + 13 * width) + 2 * width


@dataclass(frozen=True)
class Rung:
    name: str
    layers: int
    width: int
    epochs: int  # per condition, after one base-LM epoch
    text: float = 1.0  # training text relative to the evidence run's 260 pieces
    extra: bool = False  # ours with T = 1 and ours with Project and Avg as well (the top rung)
    where: str = "CPU"

    @property
    def tokens(self) -> float:
        return (1 + self.epochs) * TOKENS_PER_EPOCH * self.text

    @property
    def compute(self) -> float:
        return 6.0 * non_embedding(self.layers, self.width) * self.tokens

    @property
    def work(self) -> float:
        """Per-token matrix work relative to the evidence LM (2 x 128): non-embedding parameters + V x d."""
        def per_token(layers: int, width: int) -> float:
            return non_embedding(layers, width) + VOCAB * width
        return per_token(self.layers, self.width) / per_token(2, 128)


RUNGS = [Rung("ladder-1", 1, 64, 3), Rung("ladder-2", 2, 128, 3), Rung("ladder-3", 2, 128, 6),
         Rung("ladder-4", 4, 256, 3, extra=True)]
GPU_RUNGS = [Rung("ladder-gpu", 12, 768, 6, text=2.3, where="GPU")]  # configs/ladder-gpu.yaml

# Measured stage times, seconds, on the idle 2-core AMD EPYC with avx512_bf16 (configs/demo.yaml's header: the demo
# fresh, 19 min 24 s; docs/benchmarks.md): (low, high).
BASE_EPOCH = (24.0, 27.0)  # the base LM, one epoch, 2 x 128
CONDITION_3 = (69.0, 85.0)  # none, Fixed or oracle: three epochs
OURS_3 = (90.0, 135.0)  # ours (T = 5, K = 5, multipath): three epochs
EVALUATION = (6.0, 24.0)  # one evaluation at stride 64: 3-12 s on 50 test pieces, doubled for 100
PLANNER = (100.0, 140.0)  # a seed's codebook and causal-g planner, 3 epochs on the whole training side (117 s measured)
PREPARE = (300.0, 420.0)  # prepare with the rest of the training side: the demo's 61 s plus the larger planner's excess
EFFICIENCY = (0.8, 1.0)  # wider matrices run this much of the 2 x 128 LM's time per unit of work (OFFLINE.md: 0.77-0.93)
# SmolLM2-135M, LoRA + adapter, bf16 (configs/pretrained-offline.yaml's header): one training of 90 pieces 5.4-6.3 min,
# an evaluation of 30 pieces 38-95 s; scaled by pieces.
SMOL_TRAIN_PER_PIECE = (5.4 * 60 / 90, 6.3 * 60 / 90)
SMOL_EVAL_PER_PIECE = (38.0 / 30, 95.0 / 30)


def work_scale(work: float, end: int) -> float:
    """Time relative to the 2 x 128 LM's for ``work`` times its per-token work: at the low end (0) a wider LM runs at
    EFFICIENCY[0] and a smaller one takes at least half the time (fixed costs per step); at the high end (1) a wider
    LM takes its whole work ratio and a smaller one no less time than the 2 x 128."""
    if work >= 1:
        return work * EFFICIENCY[end]
    return max(work, 0.5) if end == 0 else 1.0


def rung_seconds(rung: Rung, seeds: int) -> tuple[float, float]:
    """(low, high) seconds of one rung at ``seeds`` seeds: prepare, and per seed the planner, the base LM, the four
    conditions (six on the top rung) and their evaluations."""
    out = []
    for i in (0, 1):
        scale = work_scale(rung.work, i) * rung.text
        per_epoch = (3 * CONDITION_3[i] + OURS_3[i] * (3 if rung.extra else 1)) / 3
        lm = scale * (BASE_EPOCH[i] + rung.epochs * per_epoch)
        evaluations = (6 if rung.extra else 4) * EVALUATION[i] * work_scale(rung.work, i)
        out.append(PREPARE[i] + seeds * (PLANNER[i] + lm + evaluations))
    return out[0], out[1]


def smol_seconds(seeds: int, pieces: int = 260, test_pieces: int = 100) -> tuple[float, float]:
    """(low, high) seconds of the SmolLM2 rung: four LoRA trainings of one epoch and their evaluations per seed."""
    return tuple(PREPARE[i] + seeds * (PLANNER[i] + 4 * pieces * SMOL_TRAIN_PER_PIECE[i]
                                       + 4 * test_pieces * SMOL_EVAL_PER_PIECE[i]) for i in (0, 1))


def inputs() -> dict:
    """Seed sd and document SE of ours - Fixed in % of Fixed's perplexity, from the larger planner's run."""
    values = np.array(OURS_FIXED)
    doc = document_se(tuple(values), *OURS_FIXED_CI, documents=DOCUMENTS)
    return {"mean": float(values.mean()) / FIXED_PPL * 100, "seed_sd": float(values.std(ddof=1)) / FIXED_PPL * 100,
            "doc_se": doc / FIXED_PPL * 100,
            "evidence_seed_sd": float(np.std(EVIDENCE_OURS_FIXED, ddof=1)) / FIXED_PPL * 100}


def slope_power(x: Sequence[float], slope: float, seed_sd: float, doc_se: float, seeds: int, rho: float = 0.0,
                draws: int = 10000, documents: int = DOCUMENTS, rng_seed: int = 0) -> dict:
    """The share of simulated ladders whose slope interval excludes 0, and the mean half-width."""
    rng = np.random.default_rng(rng_seed)
    x = np.asarray(x, float)
    w = (x - x.mean()) / ((x - x.mean()) ** 2).sum()
    runs = len(x)
    per_seed = rng.normal(0.0, seed_sd, size=(draws, runs, seeds)) + slope * x[None, :, None]
    shared = rng.normal(0.0, doc_se, size=(draws, 1))
    own = rng.normal(0.0, doc_se, size=(draws, runs))
    document = math.sqrt(rho) * shared + math.sqrt(1 - rho) * own  # each rung's document error, correlation rho
    means = per_seed.mean(2) + document
    estimate = means @ w
    half, _, _ = slope_half_width(w, per_seed.var(2, ddof=1) / seeds, np.full(runs, seeds),
                                  (w ** 2).sum() * doc_se ** 2 * (1 - rho), documents, CONFIDENCE)  # (draws,)
    return {"power": float(np.mean(np.abs(estimate) > half)), "half_width": float(half.mean()),
            "coverage": float(np.mean(np.abs(estimate - slope) <= half))}


def paper_slope(mean_percent: float, base_compute: float) -> tuple[float, float]:
    """The slope of a straight line in log10 compute from the measured ours - Fixed at the evidence LM to the paper's
    -4.6% (Table 1: 25.44 against 26.67) at GPT-2 small finetuned on 300M tokens (6 x 85M x 300M FLOPs, its
    pretraining not counted), and that compute."""
    paper_compute = 6.0 * non_embedding(12, 768) * 300e6
    return (-4.6 - mean_percent) / math.log10(paper_compute / base_compute), paper_compute


def render(draws: int) -> str:
    data = inputs()
    x = [math.log10(r.compute / RUNGS[0].compute) for r in RUNGS]
    evidence = RUNGS[1]  # the evidence run's LM and recipe: 2 x 128, 3 epochs
    steep, paper_compute = paper_slope(data["mean"], evidence.compute)
    slopes = [steep, steep / 2]
    lines = ["# Seeds and time of the LM ladder", "",
             "`PYTHONPATH=$PWD python experiments/ladder_power.py --out experiments/results/ladder_power.md`", "",
             f"Inputs ({SOURCE}): ours - Fixed {data['mean']:+.3f}% of Fixed's perplexity, seed sd "
             f"{data['seed_sd']:.3f}% (the first evidence run's: {data['evidence_seed_sd']:.3f}%), document SE "
             f"{data['doc_se']:.3f}% (backed out of the interval [{OURS_FIXED_CI[0]}, {OURS_FIXED_CI[1]}], "
             f"G = {DOCUMENTS}). Training tokens per epoch {TOKENS_PER_EPOCH:,.0f}.", "",
             "## The rungs", "",
             "| rung | LM | epochs per condition (+1 base) | text | non-embedding N | tokens D | C = 6 N D | C / rung 1 | "
             "log10 | work per token / rung 1 | where |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in RUNGS + GPU_RUNGS:
        lines.append(f"| {r.name} | {r.layers} x {r.width} | {r.epochs} | {r.text:g}x | "
                     f"{non_embedding(r.layers, r.width):,} | {r.tokens / 1e6:.2f}M | {r.compute:.3g} | "
                     f"{r.compute / RUNGS[0].compute:.1f}x | {math.log10(r.compute / RUNGS[0].compute):.2f} | "
                     f"{r.work:.2f}x | {r.where} |")
    lines += ["", f"The paper's point for the extrapolation: GPT-2 small (N = {non_embedding(12, 768):,}) finetuned on "
                  f"300M tokens, C = {paper_compute:.3g} (its pretraining not counted), "
                  f"{math.log10(paper_compute / evidence.compute):.2f} decades above {evidence.name} (the evidence run's LM). A "
                  f"straight line from its measured {data['mean']:+.2f}% to the paper's -4.6% there has slope {steep:+.3f} points "
                  f"per decade: the 'paper-sized' slope below; half of it, {steep / 2:+.3f}, the 'half' one.", "",
              "## Power to decide the slope (interval excludes 0), by seeds per rung", "",
              "rho: the correlation of a rung's document error with another's (the same 35 test speeches); 0 is "
              "the conservative end (a shared document error cancels in a slope).", "",
              "| seeds per rung | slope | rho | power | mean half-width | coverage | CPU time, low - high |",
              "|---|---|---|---|---|---|---|"]
    for seeds in range(3, 9):
        low = sum(rung_seconds(r, seeds)[0] for r in RUNGS) + smol_seconds(2)[0]
        high = sum(rung_seconds(r, seeds)[1] for r in RUNGS) + smol_seconds(2)[1]
        for slope in slopes:
            for rho in (0.0, 0.5):
                p = slope_power(x, slope, data["seed_sd"], data["doc_se"], seeds, rho, draws)
                lines.append(f"| {seeds} | {slope:+.3f} | {rho:g} | {p['power']:.0%} | {p['half_width']:.3f} | "
                             f"{p['coverage']:.1%} | {low / 3600:.1f} - {high / 3600:.1f} h |")
    lines += ["", "CPU time: the four rungs at that many seeds plus the SmolLM2 rung at 2 seeds; per rung below.", "",
              "## Time per rung (idle 2-core AMD EPYC with avx512_bf16)", "",
              "| rung | seeds | low | high |", "|---|---|---|---|"]
    for r in RUNGS:
        low, high = rung_seconds(r, 4)
        lines.append(f"| {r.name} | 4 | {low / 60:.0f} min | {high / 60:.0f} min |")
    low, high = smol_seconds(2)
    lines.append(f"| ladder-smollm2 (260 pieces, 1 epoch) | 2 | {low / 60:.0f} min | {high / 60:.0f} min |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=10000)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    text = render(args.draws)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)


if __name__ == "__main__":
    main()
