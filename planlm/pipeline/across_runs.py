"""`planlm across-runs`: several run folders side by side, against each run's LM training compute.

For a sweep of `planlm run` configs that change the LM (its width and depth, its epochs, its text), this reads each
run folder (``planlm.pipeline.layout``) and writes one table, ``across_runs.md`` and ``across_runs.csv``, and one
figure, ``across_runs.png``, into ``out_dir`` (with everything in ``across_runs.json``):

- per run, its LM training compute C = 6 x N x D: N the LM's non-embedding parameters (from the trained model's
  ``lm/config.json``: every parameter but the token and position embeddings and an untied output projection), D the
  tokens the LM processed in training (the run's base LM, when its conditions start from it, plus one condition's
  own training: the windows of the prepared training split, ``train.context_length`` and ``train.stride``, times the
  epochs its ``global_step`` covers; from the ``train-lm`` manifests);
- per run and contrast [b, a], ppl(b) - ppl(a) paired on the same test articles and seed by seed, in perplexity and
  in % of ppl(a), with the interval of ``planlm compare`` (seed noise and documents), and every seed's value;
- per run, the share of the oracle's gain (``oracle_gain_share``: Fieller's interval) and every seed's share;
- across the runs, the least-squares slope of each quantity (the contrasts in %, the share) against log10 C, with
  an interval that carries both sources of noise: the seeds' spread within each run (t on the Welch-Satterthwaite
  degrees of freedom of the runs' seed variances) in quadrature with the test documents, resampled whole and, when
  the runs score the same documents, with one draw shared by every run (so their shared document noise is not
  counted as if independent). It is the interval of the slope through these runs' means: seed and document noise,
  not how far a straight line in log C is from the truth (each run's residual is in the JSON).

A run whose LM starts from a pretrained model (``lm.model.name_or_path``) counts only the training in its folder
(its pretraining happened elsewhere): it is drawn hollow and left out of the fit unless ``fit_pretrained``.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from planlm.errors import PlanlmError
from planlm.evaluate.bootstrap import (CONFIDENCE, evaluation_arrays, oracle_gain_share, paired_bootstrap, seed_folders,
                                       seeded_interval, seeded_paired_interval, slope_half_width)
from planlm.pipeline.layout import BASE_LM, RunLayout

# --------------------------------------------------------------------------------------------- compute of a run
@dataclass(frozen=True)
class TrainingCompute:
    """The LM training compute of one run: 6 x non-embedding parameters x tokens processed in training."""

    model: str  # e.g. "gpt2 2 x 128" or the pretrained model's name
    non_embedding_parameters: int
    base_tokens: int  # the run's base LM, when the condition starts from it (0 otherwise)
    condition_tokens: int
    pretrained: bool  # the LM starts from weights trained elsewhere, whose compute is not counted

    @property
    def tokens(self) -> int:
        return self.base_tokens + self.condition_tokens

    @property
    def flops(self) -> float:
        return 6.0 * self.non_embedding_parameters * self.tokens


def non_embedding_parameters(lm_folder: Path) -> tuple[int, str]:
    """(parameters of the causal LM saved in ``lm_folder`` (its ``config.json``) less its embeddings, a short
    description): the token and position embeddings and an untied output projection are left out, as in the
    6 N D rule. The model is built on the meta device: no weights are read."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    path = lm_folder / "config.json"
    if not path.is_file():
        raise PlanlmError(f"{path}: missing; give run folders whose train-lm stages finished (`planlm run`)")
    config = AutoConfig.from_pretrained(str(lm_folder))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    seen, left_out = set(), 0
    embeddings = [m.weight for m in model.modules() if isinstance(m, torch.nn.Embedding)]
    output = model.get_output_embeddings()
    for weight in embeddings + ([output.weight] if output is not None else []):
        if id(weight) not in seen:
            seen.add(id(weight))
            left_out += weight.numel()
    total = sum(p.numel() for p in model.parameters())
    layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", None)
    width = getattr(config, "hidden_size", None) or getattr(config, "n_embd", None)
    return total - left_out, f"{config.model_type} {layers} x {width}"


def training_tokens(manifest: dict, prepared_dir: Path, where: Path) -> int:
    """Tokens one `train-lm` stage processed: the tokens of its training windows per epoch (every window of the
    prepared training split, ``planlm.data.windows.article_windows``) times the epochs its ``global_step`` covers
    (optimiser steps over steps per epoch: windows / (batch_size x devices x num_nodes), cut at
    ``limit_train_batches``, over ``accumulate_grad_batches``)."""
    from planlm.data.artifacts import PreparedDataset
    from planlm.data.windows import article_windows

    train = (manifest.get("config") or {}).get("train") or {}
    step = manifest.get("global_step")
    if step is None or "batch_size" not in train:
        raise PlanlmError(f"{where}: no global_step or train.batch_size in this train-lm manifest; rerun its "
                          f"`planlm run` to finish the stage")
    windows = article_windows(PreparedDataset(str(prepared_dir)).split("train"), train.get("context_length", 128),
                              train.get("stride", 127))
    tokens_per_epoch = int((windows[:, 2] - windows[:, 1]).sum())
    devices = train.get("devices")
    world = (devices if isinstance(devices, int) and devices > 0 else 1) * int(train.get("num_nodes") or 1)
    batches = math.ceil(len(windows) / (train["batch_size"] * world))
    limit = train.get("limit_train_batches")
    if isinstance(limit, int) and not isinstance(limit, bool):
        batches = min(batches, limit)
    elif isinstance(limit, float):
        batches = max(1, int(batches * limit))
    steps_per_epoch = math.ceil(batches / int(train.get("accumulate_grad_batches") or 1))
    return round(tokens_per_epoch * step / steps_per_epoch) if steps_per_epoch else 0


def run_compute(run_dir: Path, condition: str, seed: Optional[int]) -> TrainingCompute:
    """The training compute of ``condition``'s LM of ``seed`` in a run folder (the run's base LM included when the
    condition starts from it)."""
    from planlm.stage.integrity import stage_manifest

    layout = RunLayout(run_dir)
    folder = layout.lm(condition, seed)
    manifest = stage_manifest(folder)
    if manifest is None:
        raise PlanlmError(f"{folder}: no finished train-lm stage (no manifest.json); finish the run with `planlm run`")
    prepared = layout.codebook(seed) if seed is not None and layout.codebook(seed).is_dir() else layout.prepared
    params, model = non_embedding_parameters(folder / "lm")
    spec = (manifest.get("config") or {}).get("model") or {}
    base_tokens = 0
    base = layout.lm(BASE_LM, seed)
    if spec.get("init_from") and Path(spec["init_from"]).name == base.name and (base / "manifest.json").is_file():
        base_tokens = training_tokens(stage_manifest(base), prepared, base)
    pretrained = bool(spec.get("name_or_path"))
    if pretrained:
        model = f"{spec['name_or_path']} ({spec.get('finetune', 'full')})"
    return TrainingCompute(model, params, base_tokens, training_tokens(manifest, prepared, folder), pretrained)


# ------------------------------------------------------------------------------------------ one run's numbers
def _ppl(counts: np.ndarray, nll: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """(R, S) perplexity of each seed's per-article NLL ``nll`` (S, N) on each weighting ``counts`` (R, N)."""
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        return np.exp((counts @ nll.T) / (counts @ tokens)[:, None])


@dataclass
class RunNumbers:
    """What one run contributes: its compute, its seeds, and per condition the per-seed NLL of each article."""

    name: str
    compute: TrainingCompute
    seeds: list
    nll: dict[str, np.ndarray]  # condition -> (S, N_art)
    tokens: np.ndarray  # (N_art,)
    sources: np.ndarray  # (N_art,) each article's source document


def read_run(run_dir: Path, conditions: list[str]) -> RunNumbers:
    """A run's per-article test NLL of ``conditions``, paired over the seeds they all have, and its compute."""
    layout = RunLayout(run_dir)
    if not layout.root.is_dir():
        raise PlanlmError(f"{layout.root}: no such run folder; give folders written by `planlm run`")
    missing = [c for c in conditions if not (seed_folders(layout.evaluation(c)) or
                                             (layout.evaluation(c) / "per_article.csv").is_file())]
    if missing:
        found = sorted(p.name for p in (layout.root / "eval").glob("*")) if (layout.root / "eval").is_dir() else []
        raise PlanlmError(f"{layout.root}: no evaluation of {missing} (it has {found}); name conditions the runs have "
                          f"in every run's report.contrasts, or finish the run")
    nlls, tokens, sources, seeds = evaluation_arrays([layout.evaluation(c) for c in conditions])
    compute = run_compute(layout.root, conditions[0], seeds[0])
    return RunNumbers(layout.root.name, compute, list(seeds), dict(zip(conditions, nlls)), np.asarray(tokens, float),
                      np.asarray(sources).astype(str))


def _relative_statistic(nll_a: np.ndarray, nll_b: np.ndarray, tokens: np.ndarray):
    """``seeded_interval``'s statistic: 100 (ppl(b) - ppl(a)) / ppl(a) of seed s on article weights (R, N)."""
    def statistic(weights: np.ndarray, s: int) -> np.ndarray:
        ppl = _ppl(weights, np.stack([nll_a[s], nll_b[s]]), tokens)  # (R, 2)
        return 100.0 * (ppl[:, 1] - ppl[:, 0]) / ppl[:, 0]
    return statistic


def contrast_numbers(run: RunNumbers, b: str, a: str, num_samples: int) -> dict:
    """ppl(b) - ppl(a) of one run in perplexity and in % of ppl(a): mean over seeds, interval, each seed's value."""
    nll_a, nll_b, tokens = run.nll[a], run.nll[b], run.tokens
    ones = np.ones((1, len(tokens)))
    ppl_a, ppl_b = _ppl(ones, nll_a, tokens)[0], _ppl(ones, nll_b, tokens)[0]  # (S,)
    seeds = len(run.seeds)
    if seeds > 1:
        diff = seeded_paired_interval(nll_a, nll_b, tokens, num_samples, CONFIDENCE, 0, clusters=run.sources)
        relative = seeded_interval(_relative_statistic(nll_a, nll_b, tokens), seeds, len(tokens), num_samples,
                                   CONFIDENCE, 0, clusters=run.sources)
        interval = "seeds and documents"
    else:
        diff = paired_bootstrap(nll_a[0], nll_b[0], tokens, num_samples, CONFIDENCE, 0, clusters=run.sources)
        relative = seeded_interval(_relative_statistic(nll_a, nll_b, tokens), 1, len(tokens), num_samples,
                                   CONFIDENCE, 0, clusters=run.sources)
        interval = "documents (one seed: seed noise cannot be estimated)"
    return {"b": b, "a": a, "diff": float(np.mean(ppl_b - ppl_a)), "ci_low": diff["ci_low"],
            "ci_high": diff["ci_high"], "seed_diffs": (ppl_b - ppl_a).tolist(),
            "relative": relative["mean"], "relative_ci_low": relative["ci_low"],
            "relative_ci_high": relative["ci_high"], "seed_relatives": (100 * (ppl_b - ppl_a) / ppl_a).tolist(),
            "ppl_a": float(np.mean(ppl_a)), "interval": interval}


def share_numbers(run: RunNumbers, condition: str, fixed: str, oracle: str, num_samples: int) -> dict:
    """The share of the oracle's gain over ``fixed`` that ``condition`` captures: Fieller's interval, each seed's."""
    result = oracle_gain_share(run.nll[fixed], run.nll[condition], run.nll[oracle], run.tokens, num_samples,
                               CONFIDENCE, 0, clusters=run.sources)
    ones = np.ones((1, len(run.tokens)))
    ppl = {name: _ppl(ones, run.nll[name], run.tokens)[0] for name in (fixed, condition, oracle)}
    gains, oracle_gains = ppl[condition] - ppl[fixed], ppl[oracle] - ppl[fixed]
    with np.errstate(invalid="ignore", divide="ignore"):
        per_seed = np.where(oracle_gains != 0, gains / oracle_gains, np.nan)
    return {"condition": condition, "fixed": fixed, "oracle": oracle, "share": result["share"],
            "ci_low": result["ci_low"], "ci_high": result["ci_high"], "note": result["note"],
            "seed_shares": [None if not np.isfinite(v) else float(v) for v in per_seed]}


# --------------------------------------------------------------------------------------------- the slope
def _document_weights(runs: list[RunNumbers], num_samples: int, seed: int = 0) -> tuple[list[np.ndarray], int]:
    """Per run (R, N_art) article weights of R document resamples, and the number of documents G. Runs that score
    the same source documents share one draw (their document noise is one); otherwise each run draws its own."""
    rng = np.random.default_rng(seed)
    sets = [sorted(set(run.sources.tolist())) for run in runs]
    if all(s == sets[0] for s in sets):
        documents = sets[0]
        drawn = rng.multinomial(len(documents), np.full(len(documents), 1 / len(documents)), size=num_samples)
        position = {doc: i for i, doc in enumerate(documents)}
        return [drawn[:, [position[d] for d in run.sources]] for run in runs], len(documents)
    weights = []
    for run, docs in zip(runs, sets):
        drawn = rng.multinomial(len(docs), np.full(len(docs), 1 / len(docs)), size=num_samples)
        position = {doc: i for i, doc in enumerate(docs)}
        weights.append(drawn[:, [position[d] for d in run.sources]])
    return weights, min(len(s) for s in sets)


def _run_quantity(run: RunNumbers, weights: np.ndarray, quantity: tuple) -> tuple[float, np.ndarray, float]:
    """One run's quantity: (its seed mean (a share: of the seed means of the gains), the same on each document
    resample (R,), the variance of the seed mean over seeds). ``quantity``: ("relative", b, a) or
    ("share", condition, fixed, oracle)."""
    ones = np.ones((1, len(run.tokens)))
    seeds = len(run.seeds)
    if quantity[0] == "relative":
        _, b, a = quantity
        observed = [_ppl(ones, run.nll[n], run.tokens)[0] for n in (a, b)]
        resampled = [_ppl(weights, run.nll[n], run.tokens) for n in (a, b)]  # (R, S)
        per_seed = 100 * (observed[1] - observed[0]) / observed[0]
        on_resamples = (100 * (resampled[1] - resampled[0]) / resampled[0]).mean(1)
        seed_var = float(np.var(per_seed, ddof=1)) / seeds if seeds > 1 else 0.0
        return float(np.mean(per_seed)), on_resamples, seed_var
    _, condition, fixed, oracle = quantity
    observed = {n: _ppl(ones, run.nll[n], run.tokens)[0] for n in (fixed, condition, oracle)}
    resampled = {n: _ppl(weights, run.nll[n], run.tokens) for n in (fixed, condition, oracle)}
    gain, oracle_gain = observed[condition] - observed[fixed], observed[oracle] - observed[fixed]  # (S,)
    with np.errstate(invalid="ignore", divide="ignore"):
        on_resamples = ((resampled[condition] - resampled[fixed]).mean(1)
                        / (resampled[oracle] - resampled[fixed]).mean(1))
    share = gain.mean() / oracle_gain.mean()
    seed_var = 0.0
    if seeds > 1:  # the delta method for a ratio of seed means: var(g - share * o) / o^2, over seeds
        seed_var = float(np.var(gain - share * oracle_gain, ddof=1)) / seeds / oracle_gain.mean() ** 2
    return float(share), on_resamples, seed_var


def _combination(weights: np.ndarray, parts: list, num_seeds: list[int], documents: int,
                 confidence: float) -> dict:
    """A linear combination sum_r w_r y_r of the runs' seed means y_r (the slope, or the line's value at some compute)
    with its interval: +- sqrt(t_df^2 var_seed + t_{G-1}^2 var_doc) (``planlm.evaluate.bootstrap.slope_half_width``).
    ``parts``: per run (seed mean, the same on each document resample (R,), variance of the seed mean)."""
    value = float(weights @ np.array([p[0] for p in parts]))
    resampled = np.stack([p[1] for p in parts], 1) @ weights  # (R,)
    resampled = resampled[np.isfinite(resampled)]
    document_var = float(np.var(resampled, ddof=1)) * documents / max(documents - 1, 1) if len(resampled) > 1 else 0.0
    half, seed_var, dof = slope_half_width(weights, [p[2] for p in parts], num_seeds, document_var, documents,
                                           confidence)
    half, seed_var = float(half), float(seed_var)
    return {"value": value, "ci_low": value - half, "ci_high": value + half, "seed_se": float(np.sqrt(seed_var)),
            "seed_dof": float(dof) if np.isfinite(dof) else None, "document_se": float(np.sqrt(document_var))}


def _check_computes(predict_at: Sequence[float]) -> None:
    """One line for a ``--predict_at`` entry that is no compute (FLOPs > 0)."""
    for flops in predict_at:
        if not (isinstance(flops, (int, float)) and flops > 0):
            raise PlanlmError(f"--predict_at: {flops!r} is not a compute; give FLOPs > 0, e.g. '[1.5e17]'")


def fit_slope(runs: list[RunNumbers], quantity: tuple, num_samples: int = 1000,
              confidence: float = CONFIDENCE, predict_at: Sequence[float] = ()) -> dict:
    """The least-squares slope of a run quantity's seed mean against log10 of the runs' compute, with its interval:
    slope +- sqrt(t_df^2 var_seed + t_{G-1}^2 var_doc). var_seed = sum_r w_r^2 var_r (w_r the least-squares weight of
    run r, var_r the variance of its seed mean), df its Welch-Satterthwaite degrees of freedom; var_doc the variance
    of the slope over document resamples (one draw shared by runs that score the same documents), times G / (G - 1)
    (``planlm.evaluate.bootstrap.slope_half_width``). Needs runs at >= 2 different computes.

    ``predict_at``: computes (FLOPs) at which the fitted line's value is given too (``predictions``), with the
    interval of the same combination of the runs' means (weights 1/n + (log10 C - mean) w_r): the seeds' and the
    documents' noise carried along the line, not whether a straight line holds that far."""
    _check_computes(predict_at)
    x = np.log10([run.compute.flops for run in runs])
    if len(runs) < 2 or np.ptp(x) == 0:
        raise PlanlmError(f"a slope needs runs at two or more training computes (got {len(runs)} run(s) at "
                          f"log10 C = {sorted(set(np.round(x, 3).tolist()))}); add runs of another LM size or length")
    w = (x - x.mean()) / ((x - x.mean()) ** 2).sum()  # (runs,) slope = sum_r w_r y_r
    weights, documents = _document_weights(runs, num_samples)
    parts = [_run_quantity(run, weight, quantity) for run, weight in zip(runs, weights)]
    num_seeds = [len(run.seeds) for run in runs]
    means = np.array([p[0] for p in parts])
    fit = _combination(w, parts, num_seeds, documents, confidence)
    slope = fit.pop("value")
    intercept = float(means.mean() - slope * x.mean())
    result = {"slope": slope, **fit, "intercept": intercept, "documents": documents, "confidence": confidence,
              "runs": [run.name for run in runs], "log10_compute": x.tolist(), "means": means.tolist(),
              "residuals": (means - (intercept + slope * x)).tolist()}
    predictions = []
    for flops in predict_at:
        at = math.log10(flops)
        predictions.append({"flops": float(flops), "log10_compute": at, "decades_past_runs": at - float(x.max()),
                            **_combination(1 / len(runs) + (at - x.mean()) * w, parts, num_seeds, documents,
                                           confidence)})
    if predictions:
        result["predictions"] = predictions
    if fit["seed_se"] == 0:
        result["note"] = "no run has two seeds: the interval is over documents alone"
    return result


# --------------------------------------------------------------------------------------------- the outputs
def _fmt(value: Optional[float], low: Optional[float] = None, high: Optional[float] = None, digits: int = 2,
         percent: bool = False) -> str:
    if value is None or not np.isfinite(value):
        return "n/a"
    scale, unit = (100.0, "%") if percent else (1.0, "")
    text = f"{scale * value:+.{digits}f}{unit}"
    if low is None or high is None:
        return text
    return f"{text} [{scale * low:+.{digits}f}{unit}, {scale * high:+.{digits}f}{unit}]"


def _seeds_text(values: list, digits: int = 2, percent: bool = False) -> str:
    scale = 100.0 if percent else 1.0
    shown = ["n/a" if v is None else f"{scale * v:+.{digits}f}" for v in values]
    return " (seeds: " + ", ".join(shown) + ")" if len(values) > 1 else ""


def _decided(low: Optional[float], high: Optional[float]) -> str:
    if low is None or high is None:
        return "n/a"
    return "yes, > 0" if low > 0 else ("yes, < 0" if high < 0 else "no")


def _markdown(rows: list[dict], fits: list[dict], contrasts: list, shares: list) -> str:
    heads = [f"{b} - {a}: PPL [95% CI] (seeds)" for b, a in contrasts] + \
            [f"{b} - {a}: % of {a} [95% CI] (seeds)" for b, a in contrasts]
    heads += [f"share of {oracle}'s gain over {fixed} ({b}) [95% CI] (seeds)" for b, fixed, oracle in shares]
    lines = ["# Runs against their LM training compute", "",
             "Compute C = 6 x N x D: N the LM's non-embedding parameters, D the tokens it processed in training (the "
             "run's base LM plus one condition's own training). Each contrast is paired on the same test articles and "
             "seed by seed: the mean over seeds, its 95% interval over seeds and documents (as `planlm compare`), and "
             "each seed's value; the share of the oracle's gain with Fieller's interval. A pretrained LM (*) counts "
             "only the training in its run folder.", "",
             "| run | LM | N (non-embedding) | D: base + condition tokens | C (FLOPs) | seeds | " + " | ".join(heads) + " |",
             "|---|---|---|---|---|---|" + "---|" * len(heads)]
    for row in rows:
        c = row["compute"]
        cells = [_fmt(x["diff"], x["ci_low"], x["ci_high"]) + _seeds_text(x["seed_diffs"]) for x in row["contrasts"]]
        cells += [_fmt(x["relative"] / 100, x["relative_ci_low"] / 100, x["relative_ci_high"] / 100, 2, True)
                  + _seeds_text([v / 100 for v in x["seed_relatives"]], 2, True) for x in row["contrasts"]]
        cells += [_fmt(s["share"], s["ci_low"], s["ci_high"], 0, True) + _seeds_text(s["seed_shares"], 0, True)
                  for s in row["shares"]]
        star = " *" if c["pretrained"] else ""
        lines.append(f"| {row['run']}{star} | {c['model']} | {c['non_embedding_parameters']:,} | "
                     f"{c['base_tokens']:,} + {c['condition_tokens']:,} | {c['flops']:.3g} | {len(row['seeds'])} | "
                     + " | ".join(cells) + " |")
    if fits:
        lines += ["", "## The slope against log10 compute", "",
                  "Least squares through the runs' seed means, per tenfold compute; the interval carries the seeds' "
                  "spread within each run (t on the Welch-Satterthwaite degrees of freedom) and the test documents "
                  "(resampled whole, one draw shared by runs that score the same documents), in quadrature. Decided: "
                  "the interval excludes 0.", "",
                  "| quantity | slope per tenfold compute, points of % [95% CI] | seed SE (df) | document SE | runs fitted | decided |",
                  "|---|---|---|---|---|---|"]
        for fit in fits:
            if "error" in fit:
                lines.append(f"| {fit['label']} | n/a: {fit['error']} | | | | |")
                continue
            scale, digits = (100, 1) if fit["kind"] == "share" else (1, 3)  # points of % per tenfold compute
            slope = (f"{scale * fit['slope']:+.{digits}f} [{scale * fit['ci_low']:+.{digits}f}, "
                     f"{scale * fit['ci_high']:+.{digits}f}] points")
            dof = f"{fit['seed_dof']:.1f}" if fit["seed_dof"] else "-"
            lines.append(f"| {fit['label']} | {slope} | {scale * fit['seed_se']:.3f} ({dof}) | "
                         f"{scale * fit['document_se']:.3f} | {len(fit['runs'])} | "
                         f"{_decided(fit['ci_low'], fit['ci_high'])} |")
    predicted = [fit for fit in fits if fit.get("predictions")]
    if predicted:
        lines += ["", "## The fitted line at other computes", "",
                  "The line's value at each compute asked for, with the interval of the seeds' and the documents' noise "
                  "carried along the line. Past the runs' span it is an **extrapolation**: it assumes that the straight "
                  "line in log10 C holds that far, which these runs cannot show.", "",
                  "| quantity | C (FLOPs) | decades past the largest run | the line's value, % [95% CI] | seed SE (df) | "
                  "document SE |", "|---|---|---|---|---|---|"]
        for fit in predicted:
            scale, digits = (100, 1) if fit["kind"] == "share" else (1, 2)
            for p in fit["predictions"]:
                dof = f"{p['seed_dof']:.1f}" if p["seed_dof"] else "-"
                lines.append(f"| {fit['label']} | {p['flops']:.3g} | {p['decades_past_runs']:+.2f} | "
                             f"{scale * p['value']:+.{digits}f}% [{scale * p['ci_low']:+.{digits}f}%, "
                             f"{scale * p['ci_high']:+.{digits}f}%] | {scale * p['seed_se']:.3f} ({dof}) | "
                             f"{scale * p['document_se']:.3f} |")
    return "\n".join(lines) + "\n"


def _csv(path: Path, rows: list[dict], fits: list[dict]) -> None:
    fields = ["run", "kind", "quantity", "model", "non_embedding_parameters", "base_tokens", "condition_tokens",
              "compute_flops", "pretrained", "value", "ci_low", "ci_high", "seeds", "seed_values"]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        for row in rows:
            c = row["compute"]
            common = {"run": row["run"], "model": c["model"], "non_embedding_parameters": c["non_embedding_parameters"],
                      "base_tokens": c["base_tokens"], "condition_tokens": c["condition_tokens"],
                      "compute_flops": c["flops"], "pretrained": c["pretrained"],
                      "seeds": " ".join(str(s) for s in row["seeds"])}
            for x in row["contrasts"]:
                name = f"{x['b']} - {x['a']}"
                writer.writerow({**common, "kind": "ppl", "quantity": name, "value": x["diff"], "ci_low": x["ci_low"],
                                 "ci_high": x["ci_high"], "seed_values": " ".join(f"{v:.6g}" for v in x["seed_diffs"])})
                writer.writerow({**common, "kind": "percent", "quantity": name, "value": x["relative"],
                                 "ci_low": x["relative_ci_low"], "ci_high": x["relative_ci_high"],
                                 "seed_values": " ".join(f"{v:.6g}" for v in x["seed_relatives"])})
            for s in row["shares"]:
                writer.writerow({**common, "kind": "share", "quantity": f"share {s['condition']}", "value": s["share"],
                                 "ci_low": s["ci_low"], "ci_high": s["ci_high"],
                                 "seed_values": " ".join("nan" if v is None else f"{v:.6g}" for v in s["seed_shares"])})
        for fit in fits:
            if "error" in fit:
                continue
            writer.writerow({"run": "slope per log10 compute", "kind": f"{fit['kind']} slope", "quantity": fit["label"],
                             "value": fit["slope"], "ci_low": fit["ci_low"], "ci_high": fit["ci_high"],
                             "seeds": " ".join(fit["runs"])})
            for p in fit.get("predictions", []):
                writer.writerow({"run": "the fitted line", "kind": f"{fit['kind']} predicted", "quantity": fit["label"],
                                 "compute_flops": p["flops"], "value": p["value"], "ci_low": p["ci_low"],
                                 "ci_high": p["ci_high"], "seeds": " ".join(fit["runs"])})


def _figure(path: Path, rows: list[dict], fits: list[dict], contrasts: list, shares: list) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("relative", f"{b} - {a}", f"{b} - {a} (% of {a}'s perplexity)") for b, a in contrasts]
    panels += [("share", f"share {b}", f"share of {oracle}'s gain over {fixed} ({b}, %)") for b, fixed, oracle in shares]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 4.0), squeeze=False)
    for ax, (kind, label, title) in zip(axes[0], panels):
        for i, row in enumerate(rows):
            c = row["compute"]
            if kind == "relative":
                x = next(q for q in row["contrasts"] if f"{q['b']} - {q['a']}" == label)
                mean, low, high, seeds = x["relative"], x["relative_ci_low"], x["relative_ci_high"], x["seed_relatives"]
            else:
                s = next(q for q in row["shares"] if f"share {q['condition']}" == label)
                scale = 100.0
                mean, low, high = (None if v is None else scale * v for v in (s["share"], s["ci_low"], s["ci_high"]))
                seeds = [None if v is None else scale * v for v in s["seed_shares"]]
            color = f"C{i % 10}"
            jitter = np.linspace(-0.04, 0.04, len(seeds)) if len(seeds) > 1 else np.zeros(1)
            shown = [(c["flops"] * 10 ** j, v) for j, v in zip(jitter, seeds) if v is not None and np.isfinite(v)]
            if shown:
                ax.scatter(*zip(*shown), s=12, alpha=0.45, color=color)
            if mean is not None and np.isfinite(mean):
                below = mean - low if low is not None else 0.0
                above = high - mean if high is not None else 0.0
                ax.errorbar([c["flops"]], [mean], yerr=[[below], [above]], fmt="o", capsize=4, color=color,
                            mfc="white" if c["pretrained"] else color, label=row["run"] + (" *" if c["pretrained"] else ""))
        fit = next((f for f in fits if f.get("label") == label and "error" not in f), None)
        if fit is not None:
            xs = np.linspace(min(fit["log10_compute"]), max(fit["log10_compute"]), 20)
            scale = 100.0 if kind == "share" else 1.0
            ax.plot(10 ** xs, scale * (fit["intercept"] + fit["slope"] * xs), color="black", lw=1, ls="--",
                    label=f"slope {scale * fit['slope']:+.2f} [{scale * fit['ci_low']:+.2f}, "
                          f"{scale * fit['ci_high']:+.2f}] per 10x")
            for p in fit.get("predictions", []):  # the line carried to the compute asked for, dotted
                ends = [max(fit["log10_compute"]), p["log10_compute"]] if p["decades_past_runs"] > 0 else \
                    [p["log10_compute"], min(fit["log10_compute"])]
                ends = np.array(ends)
                ax.plot(10 ** ends, scale * (fit["intercept"] + fit["slope"] * ends), color="black", lw=1, ls=":")
                ax.errorbar([p["flops"]], [scale * p["value"]], fmt="s", capsize=4, color="black", mfc="white",
                            yerr=[[scale * (p["value"] - p["ci_low"])], [scale * (p["ci_high"] - p["value"])]],
                            label=f"the line at {p['flops']:.2g} FLOPs"
                                  + (" (extrapolated)" if p["decades_past_runs"] > 0 else ""))
        ax.axhline(0, color="grey", lw=0.6)
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # a decade or two: minor labels overlap
        ax.set_xlabel("LM training compute, 6 N D (FLOPs)")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _run_conditions(run_dir: Path) -> tuple[list[list[str]], dict[str, str]]:
    """(the contrasts [b, a] a run's report shows, {condition: conditioning}) from its ``results.json``."""
    layout = RunLayout(run_dir)
    if not layout.results_json.is_file():
        raise PlanlmError(f"{layout.results_json}: missing; give folders of finished `planlm run`s (or rebuild the "
                          f"report: python -m planlm.pipeline.report {layout.root})")
    try:
        results = json.loads(layout.results_json.read_text())
        pairs = [[c["b"], c["a"]] for c in results.get("contrasts") or []]
        kinds = {c["name"]: c.get("conditioning") for c in results["conditions"]}
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise PlanlmError(f"{layout.results_json}: not a run's results ({e}); rebuild it: "
                          f"python -m planlm.pipeline.report {layout.root}") from e
    return pairs, kinds


def _choose(run_dirs: list[Path]) -> tuple[list[list[str]], list[tuple[str, str, str]]]:
    """The contrasts every run's report shows (in the first run's order), and the shares of the oracle's gain
    [(condition, fixed, oracle)] of every planner-made condition among their first terms, when every run has the same
    condition of constant plans (Fixed) and of the true future's (the oracle): the kinds' flags say which."""
    from planlm.plans.registry import kind_flag

    read = [_run_conditions(d) for d in run_dirs]
    contrasts = [pair for pair in read[0][0] if all(pair in pairs for pairs, _ in read[1:])]
    if not contrasts:
        raise PlanlmError(f"{run_dirs[0]} and the other runs show no contrast in common (report.contrasts: "
                          f"{[pairs for pairs, _ in read]}); give every run's config the same report.contrasts, e.g. "
                          f"[[ours, fixed], [oracle, fixed]], and rebuild its report: python -m planlm.pipeline.report RUN")

    def named(flag: str) -> Optional[str]:
        found = {next((n for n, kind in kinds.items() if kind_flag(kind, flag)), None) for _, kinds in read}
        return found.pop() if len(found) == 1 else None

    fixed, oracle = named("constant"), named("reads_future")
    shares = []
    if fixed and oracle:
        planned = [b for b, _ in contrasts if all(kind_flag(kinds.get(b), "uses_planner") for _, kinds in read)]
        shares = [(b, fixed, oracle) for b in dict.fromkeys(planned)]
    return contrasts, shares


BOOTSTRAP_SAMPLES = 1000
"""Document resamples of every interval (seeded: the same output every time), as the run report's."""


def across_runs(run_dirs: list[str], out_dir: str, predict_at: Optional[list[float]] = None) -> Path:
    """Several run folders side by side against their LM training compute: one table and one figure.

    Writes ``across_runs.md``, ``across_runs.csv``, ``across_runs.png`` and ``across_runs.json`` into ``out_dir``.
    Per run: its compute C = 6 x non-embedding parameters x training tokens (from its train-lm manifests); each
    contrast that every run's report shows (``report.contrasts`` of their configs), in perplexity and in % of the
    second term, with its interval over seeds and documents and every seed's value; and, when the runs have a Fixed
    and an oracle condition, the share of the oracle's gain of each planner-made condition among the contrasts
    (Fieller's interval, every seed's). Across the runs: the least-squares slope of each contrast in % and of each
    share against log10 C, with an interval that carries the seeds' and the documents' noise. Runs whose LM starts
    from a pretrained model count only their own training; they are left out of the slope when two or more other
    runs differ in compute. Works on any sweep of `planlm run` configs evaluated on the same test split.

    Args:
        run_dirs: Folders of finished `planlm run`s (e.g. [runs/ladder-1, runs/ladder-2, runs/ladder-3]); two or
            more at different computes for a slope.
        out_dir: Where to write the table, the figure and the JSON.
        predict_at: Computes (FLOPs, e.g. [1.5e17]) at which to give each fitted line's value with its interval,
            in the table and on the figure; past the runs' span, labelled an extrapolation.
    """
    if not run_dirs:
        raise PlanlmError("--run_dirs is empty; give the run folders to set side by side, e.g. "
                          "--run_dirs '[runs/ladder-1, runs/ladder-2]'")
    _check_computes(predict_at or ())  # before anything is read or written (each fit's own errors are kept)
    folders = [Path(d) for d in run_dirs]
    for folder in folders:
        if not folder.is_dir():
            raise PlanlmError(f"{folder}: no such run folder; give folders written by `planlm run`")
    if len({f.name for f in folders}) != len(folders):
        raise PlanlmError(f"--run_dirs: two run folders share a name ({[f.name for f in folders]}); the table names "
                          f"runs by their folder's name")
    contrasts, shares = _choose(folders)
    names = list(dict.fromkeys([contrasts[0][1]] + [n for pair in contrasts for n in pair]
                               + [n for share in shares for n in share]))
    runs = [read_run(folder, names) for folder in folders]
    rows = []
    for run in runs:
        rows.append({"run": run.name, "seeds": run.seeds,
                     "compute": {**run.compute.__dict__, "tokens": run.compute.tokens, "flops": run.compute.flops},
                     "contrasts": [contrast_numbers(run, b, a, BOOTSTRAP_SAMPLES) for b, a in contrasts],
                     "shares": [share_numbers(run, *share, BOOTSTRAP_SAMPLES) for share in shares]})
    scratch = [run for run in runs if not run.compute.pretrained]
    fitted = scratch if len({run.compute.flops for run in scratch}) >= 2 else runs
    quantities = [("relative", f"{b} - {a}", ("relative", b, a)) for b, a in contrasts]
    quantities += [("share", f"share {share[0]}", ("share", *share)) for share in shares]
    fits = []
    for kind, label, quantity in quantities:
        try:
            fits.append({"kind": kind, "label": label,
                         **fit_slope(fitted, quantity, BOOTSTRAP_SAMPLES, predict_at=predict_at or ())})
        except PlanlmError as e:
            fits.append({"kind": kind, "label": label, "error": str(e)})
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "across_runs.json").write_text(json.dumps({"runs": rows, "fits": fits}, indent=2, default=float))
    (out / "across_runs.md").write_text(_markdown(rows, fits, contrasts, shares)
                                        + "\n![runs against compute](across_runs.png)\n")
    _csv(out / "across_runs.csv", rows, fits)
    _figure(out / "across_runs.png", rows, fits, contrasts, shares)
    print(f"across runs: {out / 'across_runs.md'} ({len(runs)} runs, {len(fitted)} fitted; figure "
          f"{out / 'across_runs.png'})")
    return out / "across_runs.md"
