"""The run report's numbers, read from what the stages wrote in a run folder (``planlm.pipeline.layout``).

Per condition: perplexity with its interval (and its spread over seeds), plan usage, edit distance, the learned
ReZero scalars, timing, the paired difference from the reference condition and the share of the oracle's gain;
the configured contrasts with their decisions; the differences by position in the sentence; the planners'
summaries; the sweeps run on every seed; what the evaluated articles leave to a planner. The intervals are those of
``planlm.evaluate.bootstrap``.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Optional

from planlm.evaluate.metrics import EditDistanceMetrics, PerplexityMetrics, PlanUsage
from planlm.pipeline.layout import RunLayout
from planlm.plans.registry import kind_flag


def read_json(path: Path) -> Optional[dict]:
    """A JSON file's object, or None when it is missing or unreadable."""
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def read_csv(path: Path) -> list[dict]:
    """A CSV file's rows as dicts."""
    with open(path) as f:
        return list(csv.DictReader(f))


def _seed_numbers(layout: RunLayout, name: str, seed: Optional[int]) -> dict:
    """One trained model's numbers: perplexity, plan usage, edit distance and the learned ReZero scalars."""
    metrics = PerplexityMetrics.from_dict(read_json(layout.evaluation(name, seed) / "metrics.json") or {})
    usage = metrics.plan_usage or PlanUsage.from_dict({})
    edit = EditDistanceMetrics.from_dict(read_json(layout.edit_distance(name, seed) / "metrics.json") or {})
    trained = read_json(layout.lm(name, seed) / "manifest.json") or {}
    return {"metrics": metrics, "ppl": metrics.ppl, "ppl_ci_low": metrics.ci_low, "ppl_ci_high": metrics.ci_high,
            "plan_usage_ppl": usage.plan_usage_ppl, "plan_usage_ci_low": usage.plan_usage_ci_low,
            "plan_usage_ci_high": usage.plan_usage_ci_high, "plan_usage_nats": usage.plan_usage_nats,
            "edit": edit.edit_distance, "edit_ci_low": edit.ci_low, "edit_ci_high": edit.ci_high,
            "edit_normalized": edit.normalized, "rezero_alphas": trained.get("rezero_alphas")}


def _over_seeds(layout: RunLayout, name: str, per_seed: dict[int, dict]) -> dict:
    """Mean over the evaluated seeds, the spread of the perplexity, and its interval over articles (of the
    NLL averaged over seeds, so the articles' and the seeds' variance are reported apart)."""
    import numpy as np

    from planlm.evaluate.bootstrap import bootstrap_perplexity, read_per_article

    done = {seed: numbers for seed, numbers in per_seed.items() if numbers["ppl"] is not None}
    if not done:
        return {key: None for key in next(iter(per_seed.values()))} | {"evaluated_seeds": []}

    def mean(key: str) -> Optional[float]:
        values = [n[key] for n in done.values() if n[key] is not None]
        return float(np.mean(values)) if values else None

    ppls = np.array([n["ppl"] for n in done.values()])
    tables = [read_per_article(layout.evaluation(name, seed)) for seed in done]
    pooled = bootstrap_perplexity(np.mean([t["nll_sum"] for t in tables], axis=0), tables[0]["tokens"],
                                  clusters=tables[0]["source"])
    alphas = [n["rezero_alphas"] for n in done.values() if n["rezero_alphas"]]
    return {"metrics": next(iter(done.values()))["metrics"], "evaluated_seeds": list(done), "ppl": float(ppls.mean()),
            "ppl_seed_std": float(ppls.std(ddof=1)) if len(ppls) > 1 else 0.0, "ppl_seed_min": float(ppls.min()),
            "ppl_seed_max": float(ppls.max()), "ppl_seed_mean_nll": pooled["ppl"], "ppl_ci_low": pooled["ci_low"],
            "ppl_ci_high": pooled["ci_high"], "plan_usage_ppl": mean("plan_usage_ppl"),
            "plan_usage_ci_low": None, "plan_usage_ci_high": None, "plan_usage_nats": mean("plan_usage_nats"),
            "edit": mean("edit"), "edit_ci_low": None, "edit_ci_high": None, "edit_normalized": mean("edit_normalized"),
            "rezero_alphas": {k: float(np.mean([a[k] for a in alphas])) for k in alphas[0]} if alphas else None}


def is_one_argmax_path(cond: dict) -> bool:
    """Whether a condition plays Cornille et al.'s role, the baseline of the evaluation times: one argmax path
    (plans kind ``planner_argmax``, K = 1) of a planner trained before the LM."""
    plans = cond.get("plans") or {}
    return (plans.get("kind") == "planner_argmax" and plans.get("num_paths", 1) == 1
            and not (cond.get("train") or {}).get("joint"))


def collect_results(run_dir: Path, conditions: list[dict], state: Optional[dict] = None,
                    seeds: Optional[list[int]] = None) -> list[dict]:
    """One row per condition: its settings, perplexity with CI (and its spread over ``seeds``), plan usage,
    edit distance with CI, the learned ReZero scalars, timing, status."""
    rows = []
    layout = RunLayout(Path(run_dir))
    stages = (state or {}).get("stages", {})
    for cond in conditions:
        name = cond["name"]
        if seeds:
            numbers = _over_seeds(layout, name, {seed: _seed_numbers(layout, name, seed) for seed in seeds})
        else:
            numbers = _seed_numbers(layout, name, None)
        metrics = numbers.pop("metrics") or PerplexityMetrics.from_dict({})
        errors = [f"{stage}: {info.get('error')}" for stage, info in stages.items()
                  if info.get("condition", stage.rsplit(" ", 1)[-1]) == name and info.get("status") != "done"]
        rows.append({
            "name": name, "label": cond.get("label", name), "paper": cond.get("paper"),
            "conditioning": metrics.conditioning or (cond.get("plans") or {}).get("kind"),
            "K": metrics.K, "T": metrics.T, "tau": metrics.tau, "seeds": seeds, **numbers,
            "tokens": metrics.tokens, "articles": metrics.articles, "protocol": metrics.protocol,
            "eval_wall_time_s": metrics.wall_time_s, "tokens_per_s": metrics.tokens_per_s,
            "status": "failed" if errors else ("done" if metrics.ppl is not None else "missing"),
            "error": "; ".join(errors) or None,
        })
    _add_paired_differences(layout, rows)
    _add_oracle_shares(layout, rows)
    # Evaluation time relative to the Cornille et al. baseline (one argmax path), as in the paper.
    reference = [r for r, cond in zip(rows, conditions) if is_one_argmax_path(cond) and r["eval_wall_time_s"]]
    base = next((r["eval_wall_time_s"] for r in reference + rows if r["eval_wall_time_s"]), None)
    for row in rows:
        row["relative_eval_time"] = (row["eval_wall_time_s"] / base) if base and row["eval_wall_time_s"] else None
    return rows


def _paired(layout: RunLayout, a: str, b: str) -> dict:
    """ppl(b) - ppl(a) of two conditions as ``planlm compare`` gives it (seed by seed, with the seed-noise interval
    when the run has seeds): diff, ci_low, ci_high, interval, note, seed_diffs, ppl_a. Raises PlanlmError when they
    cannot be paired (e.g. evaluated on other articles)."""
    from planlm.evaluate.bootstrap import compare_evaluations

    result = compare_evaluations(layout.evaluation(a), layout.evaluation(b))
    return {"diff": result.get("diff_mean", result["diff"]), "ci_low": result["ci_low"], "ci_high": result["ci_high"],
            "interval": result.get("interval", "articles"), "note": result.get("note"), "ppl_a": result["ppl_a"],
            "documents": result.get("documents"),
            "seed_diffs": {s: one["diff"] for s, one in result["seeds"].items()} if "seeds" in result else None}


def _add_paired_differences(layout: RunLayout, rows: list[dict]) -> None:
    """ppl(condition) - ppl(reference) over the same articles (and seed by seed), the reference being the
    `none` condition when there is one, else the first."""
    from planlm.errors import PlanlmError

    done = [r for r in rows if r["ppl"] is not None]
    reference = next((r for r in done if r["name"] == "none"), done[0] if done else None)
    for row in rows:
        row.update(paired_reference=None, paired_diff=None, paired_ci_low=None, paired_ci_high=None,
                   paired_interval=None, paired_seed_diffs=None, paired_note=None)
        if reference is None or row is reference or row["ppl"] is None:
            continue
        try:
            paired = _paired(layout, reference["name"], row["name"])
        except PlanlmError:  # e.g. evaluated on other articles: no paired difference to show
            continue
        row.update(paired_reference=reference["name"], paired_diff=paired["diff"], paired_ci_low=paired["ci_low"],
                   paired_ci_high=paired["ci_high"], paired_interval=paired["interval"], paired_note=paired["note"],
                   paired_seed_diffs=paired["seed_diffs"])


def _add_oracle_shares(layout: RunLayout, rows: list[dict]) -> None:
    """For every condition whose plans a planner makes, when the run has a condition of constant plans (Fixed) and
    one whose plans read the true future (the oracle): the share of the oracle's gain it captures,
    (ppl - ppl_fixed) / (ppl_oracle - ppl_fixed), with the Fieller interval of
    ``planlm.evaluate.bootstrap.oracle_gain_share`` (seeds and documents, as the paired column). The kinds' flags
    (``planlm.plans.kinds``) say which condition is which."""
    from planlm.errors import PlanlmError
    from planlm.evaluate.bootstrap import evaluation_arrays, oracle_gain_share

    done = [r for r in rows if r["ppl"] is not None]
    fixed = next((r for r in done if kind_flag(r["conditioning"], "constant")), None)
    oracle = next((r for r in done if kind_flag(r["conditioning"], "reads_future")), None)
    for row in rows:
        row.update(oracle_share=None, oracle_share_ci_low=None, oracle_share_ci_high=None, oracle_share_note=None)
        planned = kind_flag(row["conditioning"], "uses_planner")
        if fixed is None or oracle is None or row["ppl"] is None or not planned:
            continue
        try:
            nlls, tokens, sources, _ = evaluation_arrays([layout.evaluation(r["name"]) for r in (fixed, row, oracle)])
        except PlanlmError as e:  # e.g. evaluated on other articles: no share to show
            row["oracle_share_note"] = str(e)
            continue
        share = oracle_gain_share(*nlls, tokens, clusters=sources)
        row.update(oracle_share=share["share"], oracle_share_ci_low=share["ci_low"],
                   oracle_share_ci_high=share["ci_high"], oracle_share_note=share["note"],
                   oracle_share_of=[fixed["name"], oracle["name"]])


def check_contrasts(contrasts: list, names: list[str], where: str) -> None:
    """Each contrast is a pair [b, a] of condition ``names``: a one-line error naming the pair otherwise."""
    from planlm.errors import PlanlmError

    for pair in contrasts:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2 or not all(n in names for n in pair):
            raise PlanlmError(f"{where}: {pair!r} is not a pair [b, a] of condition names "
                              f"({', '.join(map(str, names))}); write e.g. [ours, cornille] for ours - cornille")


def contrast_rows(layout: RunLayout, rows: list[dict], contrasts: list[list[str]]) -> list[dict]:
    """ppl(b) - ppl(a) for each configured pair [b, a] of conditions, paired over the same articles and, with
    seeds, seed by seed with the seed-noise interval of ``planlm compare``; beside each side's ReZero scalars."""
    from planlm.errors import PlanlmError

    by_name = {r["name"]: r for r in rows}
    check_contrasts(contrasts, list(by_name), where="report.contrasts")
    out = []
    for b, a in contrasts:
        row = {"b": b, "a": a, "diff": None, "ci_low": None, "ci_high": None, "interval": None, "seed_diffs": None,
               "documents": None, "relative": None, "alphas_b": by_name[b].get("rezero_alphas"),
               "alphas_a": by_name[a].get("rezero_alphas")}
        if by_name[a]["ppl"] is not None and by_name[b]["ppl"] is not None:
            try:
                paired = _paired(layout, a, b)
            except PlanlmError as e:
                row["error"] = str(e)
            else:
                row.update({k: paired[k] for k in ("diff", "ci_low", "ci_high", "interval", "seed_diffs", "documents")},
                           relative=paired["diff"] / paired["ppl_a"])
            row["decided"] = decision(row) if row["diff"] is not None else None
        out.append(row)
    return out


def undecidable(contrast: dict) -> Optional[str]:
    """Why a contrast's interval cannot decide it, or None: one seed leaves the seed noise unmeasured, one source
    document the document noise, and an interval of zero width carries no noise at all."""
    seeds = len(contrast.get("seed_diffs") or {}) or 1  # a run without seed<N>/ folders is one seed
    documents = contrast.get("documents")
    why = []
    if seeds < 2:
        why.append("1 seed, so no seed noise")
    if documents is not None and documents < 2:
        why.append(f"{documents} source document{'' if documents == 1 else 's'}, so no document noise")
    if not contrast["ci_high"] > contrast["ci_low"]:
        why.append("an interval of zero width")
    return "; ".join(why) or None


def decision(contrast: dict) -> str:
    """Whether a contrast's interval excludes 0, and which side it favours: "B better", "A better", "no", or
    "cannot: <why>" when the interval cannot decide (``undecidable``)."""
    why = undecidable(contrast)
    if why:
        return f"cannot: {why}"
    if contrast["ci_high"] < 0:
        return f"{contrast['b']} better"
    if contrast["ci_low"] > 0:
        return f"{contrast['a']} better"
    return "no"


def position_contrasts(rows: list[dict], contrasts: list[dict]) -> list[tuple[str, str]]:
    """The pairs (b, a) the "Where plans act" section shows: every condition with plans that carry information (not
    none, not a constant plan) against Fixed and against the paired column's reference, then the configured
    contrasts; each pair once."""
    done = {r["name"]: r for r in rows if r["ppl"] is not None}
    fixed = next((r["name"] for r in done.values() if kind_flag(r["conditioning"], "constant")), None)
    pairs = []
    for row in done.values():
        informed = row["conditioning"] not in (None, "none") and not kind_flag(row["conditioning"], "constant")
        if informed:
            pairs += [(row["name"], a) for a in (fixed, row.get("paired_reference")) if a and a != row["name"]]
    pairs += [(c["b"], c["a"]) for c in contrasts if c["b"] in done and c["a"] in done]
    return list(dict.fromkeys(pairs))


def position_rows(layout: RunLayout, rows: list[dict], contrasts: list[dict]) -> list[dict]:
    """Each pair of ``position_contrasts``: B - A in mean NLL per token by position in the sentence and by the
    context fallen out of the window (``planlm.evaluate.positions.paired_positions``), or why it has none."""
    from planlm.errors import PlanlmError
    from planlm.evaluate.positions import paired_positions

    out = []
    for b, a in position_contrasts(rows, contrasts):
        try:
            paired = paired_positions(layout.evaluation(a), layout.evaluation(b))
        except PlanlmError as e:  # e.g. evaluated on other articles: no paired difference to show
            out.append({"b": b, "a": a, "error": str(e)})
            continue
        if "missing" in paired:
            paired["missing"] = [_relative(Path(m), layout.root) for m in paired["missing"]]
        out.append({"b": b, "a": a, **paired})
    return out


def _relative(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def corpus_numbers(layout: RunLayout, rows: list[dict]) -> Optional[dict]:
    """What the evaluated articles leave to a planner: how many of which split, their median length in tokens, the
    LM's window, and the share of their tokens with more of the article before them than the window holds (the
    planner's possible edge); None when the run's evaluation or prepared corpus does not say."""
    import numpy as np

    from planlm.data.windows import beyond_window_share

    row = next((r for r in rows if r["ppl"] is not None), None)
    if row is None:
        return None
    seed = (row.get("evaluated_seeds") or row.get("seeds") or [None])[0]
    config = (read_json(layout.evaluation(row["name"], seed) / "manifest.json") or {}).get("config") or {}
    split, window, articles = config.get("split"), config.get("context_length"), config.get("articles")
    if not (split and window and articles and (layout.prepared / split / "token_offsets.npy").is_file()):
        return None
    offsets = np.load(layout.prepared / split / "token_offsets.npy")[:articles + 1]
    return {"articles": articles, "split": split, "window": window, "median_tokens": int(np.median(np.diff(offsets))),
            "beyond_window": beyond_window_share(offsets, window)}


INFORMATION_SPLIT = "test"
"""The split the report measures each planner's information on: not the validation split, which chose the
planner's checkpoint."""


def _first_seed_folder(folder: Path) -> tuple[Path, Optional[int]]:
    """``folder`` itself when it holds a planner, else its lowest ``seed<N>/`` folder that does (the planners of
    a run with ``seed_draws: method``), with that seed."""
    if (folder / "summary.json").is_file():
        return folder, None
    seeds = sorted(int(p.name[4:]) for p in folder.glob("seed*")
                   if p.name[4:].isdigit() and (p / "summary.json").is_file())
    return (folder / f"seed{seeds[0]}", seeds[0]) if seeds else (folder, None)


def planner_summaries(layout: RunLayout) -> dict[str, dict]:
    """{name: summary.json} of the run's planners: ``shared`` (planner/) and each condition's own
    (planners/<condition>/), with the planner's information per step measured on ``INFORMATION_SPLIT`` (a
    summary without its planner's weights or corpus keeps its own, on the split it names). In a run whose seeds
    train their own planners (``seed<N>/`` folders) each is the first seed's, ``seed`` naming it."""
    from planlm.train.planner_metrics import held_out_information, planner_information

    folders = {"shared": layout.planner, **{p.name: p for p in sorted((layout.root / "planners").glob("*"))}}
    summaries = {}
    for name, folder in folders.items():
        folder, seed = _first_seed_folder(folder)
        summary = read_json(folder / "summary.json")
        if not summary:
            continue
        if seed is not None:
            summary["seed"] = seed
        prepared = layout.prepared if seed is None else layout.codebook(seed)  # the planner's own codebook
        if not (prepared / "manifest.json").is_file():
            prepared = Path(summary.get("prepared_dir", ""))
        if (folder / "model.safetensors").is_file() and (prepared / INFORMATION_SPLIT / "actions.npy").is_file():
            information = held_out_information(folder, prepared, INFORMATION_SPLIT, summary.get("train_split"))
            split = INFORMATION_SPLIT
        else:
            information, split = summary.get("information") or planner_information(summary["metrics"]), \
                summary.get("eval_split")
        summaries[name] = {**summary, "information": information, "information_split": split}
    return summaries


def seeded_sweeps(layout: RunLayout, num_samples: int = 1000) -> list[dict]:
    """The K and tau sweeps run on every seed (``seed_draws: method``: sweeps/<condition>-<kind>/seed<N>/): each
    point's perplexity per seed and its paired difference from the reference point (K = 1; tau = 1), the mean
    over seeds with the seed-noise interval of the contrasts (``seeded_paired_interval``: seeds and documents)
    when two or more seeds were swept, else the first seed's interval over documents alone."""
    from planlm.evaluate.bootstrap import check_seeds_scored_alike, read_per_article, seeded_paired_interval

    found = []
    for folder in sorted(layout.sweeps.glob("*")) if layout.sweeps.is_dir() else []:
        seed_dirs = {int(p.name[4:]): p for p in sorted(folder.glob("seed*")) if p.name[4:].isdigit()}
        names = sorted({c.name for p in seed_dirs.values() for c in p.glob("sweep_*.csv")} - {"sweep_compute.csv"})
        for csv_name in names:
            tables = {s: read_csv(d / csv_name) for s, d in sorted(seed_dirs.items()) if (d / csv_name).is_file()}
            tables = {s: rows for s, rows in tables.items() if rows}
            if not tables:
                continue
            seeds, kind = list(tables), csv_name[len("sweep_"):-len(".csv")]
            first = tables[seeds[0]]
            reference = first[0]["reference"]
            sweep = {"sweep": folder.name, "kind": kind, "seeds": seeds, "reference": reference,
                     "interval": "seeds and articles" if len(seeds) > 1 else "articles", "points": []}
            for row in first:
                value = row["value"]
                each = {s: next((r for r in rows if r["value"] == value), None) for s, rows in tables.items()}
                if any(r is None for r in each.values()):
                    continue
                point = {"value": value, "K": row["K"], "T": row["T"], "tau": row["tau"],
                         "seed_ppls": {s: float(r["ppl"]) for s, r in each.items()},
                         "seed_diffs": {s: float(r["paired_diff"]) for s, r in each.items()}}
                point["ppl"] = sum(point["seed_ppls"].values()) / len(seeds)
                if len(seeds) == 1:
                    point.update(diff=float(row["paired_diff"]), ci_low=float(row["paired_ci_low"]),
                                 ci_high=float(row["paired_ci_high"]))
                elif float(value) == float(reference):
                    point.update(diff=0.0, ci_low=0.0, ci_high=0.0)
                else:
                    dirs = {s: (seed_dirs[s] / f"{kind}-{float(reference):g}", seed_dirs[s] / f"{kind}-{float(value):g}")
                            for s in seeds}
                    ref_tables = [read_per_article(a) for a, _ in dirs.values()]
                    point_tables = [read_per_article(b) for _, b in dirs.values()]
                    check_seeds_scored_alike({s: a for s, (a, _) in dirs.items()}, ref_tables)
                    check_seeds_scored_alike({s: b for s, (_, b) in dirs.items()}, point_tables)
                    result = seeded_paired_interval(
                        [t["nll_sum"] for t in ref_tables], [t["nll_sum"] for t in point_tables],
                        ref_tables[0]["tokens"], num_samples, clusters=ref_tables[0]["source"])
                    point.update(diff=result["diff"], ci_low=result["ci_low"], ci_high=result["ci_high"],
                                 p_value=result["p_value"])
                sweep["points"].append(point)
            found.append(sweep)
    return found
