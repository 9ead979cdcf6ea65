"""The run report: ``report.md`` + PNG figures + machine-readable ``results.json`` / ``results.csv``.

It only reads what the stages wrote (``eval/<condition>/metrics.json``, ``edit/<condition>/metrics.json``,
``planner/summary.json``, ``sweeps/``, ``prepared/``: the folders of ``planlm.pipeline.layout``), so it can be
rebuilt at any time with ``python -m planlm.pipeline.report RUN_DIR``.
"""

from __future__ import annotations

import csv
import json
import shutil
import sys
from pathlib import Path
from typing import Optional

from planlm.evaluate.metrics import EditDistanceMetrics, PerplexityMetrics, PlanUsage
from planlm.pipeline.layout import RunLayout
from planlm.plans.registry import kind_flag

# Table 1 of the paper (GPT-2 small, Wikipedia, test set): (perplexity, edit distance).
PAPER_TABLE: dict[str, tuple[float, float]] = {
    "Fixed": (26.67, 4.67),
    "Cornille et al. (T=1, K=1)": (25.54, 4.48),
    "Ours T=1, K=10": (25.56, 4.53),
    "Ours T=5, K=1": (25.88, 4.47),
    "Ours T=5, K=5": (25.44, 4.52),
    "Ours T=5, K=10": (25.35, 4.47),
    "Ours T=10, K=1": (25.76, 4.51),
    "Ours T=10, K=5": (25.40, 4.41),
    "Ours T=10, K=10": (25.32, 4.45),
    "Ablation T=5, K=10: Project and Avg": (25.49, 4.44),
    "Ablation T=5, K=10: no ReZero": (25.78, 4.30),
}


def _read_json(path: Path) -> Optional[dict]:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _fmt_ci(value: Optional[float], low: Optional[float], high: Optional[float], digits: int = 2) -> str:
    if value is None:
        return "n/a"
    if low is None or high is None:
        return f"{value:.{digits}f}"
    return f"{value:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def _seed_numbers(layout: RunLayout, name: str, seed: Optional[int]) -> dict:
    """One trained model's numbers: perplexity, plan usage, edit distance and the learned ReZero scalars."""
    metrics = PerplexityMetrics.from_dict(_read_json(layout.evaluation(name, seed) / "metrics.json") or {})
    usage = metrics.plan_usage or PlanUsage.from_dict({})
    edit = EditDistanceMetrics.from_dict(_read_json(layout.edit_distance(name, seed) / "metrics.json") or {})
    trained = _read_json(layout.lm(name, seed) / "manifest.json") or {}
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


def _contrasts_section(contrasts: list[dict]) -> list[str]:
    if not contrasts:
        return []
    lines = ["## Paired contrasts", "",
             "ppl(B) - ppl(A) on the same articles (negative: B is better), the interval as in the paired column; "
             "relative: the difference of the seed-mean NLL's perplexities over A's; decided: the interval excludes "
             "0, from at least 2 seeds and 2 source documents and an interval of some width (else the row says what "
             "is missing).", "",
             "| B - A | PPL difference [95% CI] | relative | decided | interval over | alpha_1 / alpha_2 of B | of A |",
             "|---|---|---|---|---|---|---|"]
    for c in contrasts:
        if c["diff"] is None:
            lines.append(f"| {c['b']} - {c['a']} | n/a {c.get('error', '(not evaluated)')} | | | | | |")
            continue
        seeds = _fmt_seed_diffs({"paired_seed_diffs": c["seed_diffs"]})
        lines.append(f"| {c['b']} - {c['a']} | {_fmt_ci(c['diff'], c['ci_low'], c['ci_high'])}{seeds} | "
                     f"{100 * c['relative']:+.2f}% | {decision(c)} | {c['interval']} | "
                     f"{_fmt_alphas(c['alphas_b'])} | {_fmt_alphas(c['alphas_a'])} |")
    measured = [c for c in contrasts if c["diff"] is not None]
    decided = [f"{c['b']} - {c['a']}" for c in measured if decision(c).endswith(" better")]
    cannot = [c for c in measured if undecidable(c)]
    whys = "; ".join(dict.fromkeys(undecidable(c) for c in cannot))
    lines += ["", f"This run decides {len(decided)} of its {len(measured)} contrasts"
              + (f" ({', '.join(decided)})" if decided else "")
              + (f"; {len(cannot)} cannot be decided ({whys})" if cannot else "")
              + ". An undecided contrast needs more seeds or documents, not a reading of its sign: the pre-registered "
                "evidence run (`configs/evidence.yaml`, docs/evidence.md) is sized to decide the paper's claims."]
    return lines + [""]


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


def _fmt_bin(one: dict) -> str:
    """A bin's difference in nats per token with its interval and, with seeds, each seed's value."""
    if one["diff"] is None:
        return "no tokens"
    seeds = one.get("seed_diffs") or {}
    each = " (seeds: " + ", ".join(f"{d:+.4f}" for d in seeds.values()) + ")" if len(seeds) > 1 else ""
    if one["ci_low"] is None:
        return f"{one['diff']:+.4f} (one document: no interval){each}"
    return f"{one['diff']:+.4f} [{one['ci_low']:+.4f}, {one['ci_high']:+.4f}]{each}"


def _positions_section(positions: list[dict]) -> list[str]:
    """"Where plans act": one row per pair, one column per bin (``planlm.evaluate.positions.BINS``)."""
    from planlm.evaluate.positions import BEYOND, BINS, POSITIONS

    if not positions:
        return []
    shown = next((p for p in positions if "bins" in p), None)
    lines = ["## Where plans act", "",
             "B - A in mean NLL per token (nats; negative: B is better; a difference d is a perplexity ratio "
             "exp(d)), by where the scored token sits: its position in its sentence, and how much of its article "
             "before it the LM's window no longer shows (none / under a window's length / a window's length or "
             "more). A plan tells the LM about the next sentence, so its effect should sit in a sentence's first "
             "tokens and where context has fallen out of the window. Paired over the same articles, the mean over "
             "seeds with each seed's value beside it, and the 95% interval of the paired column (t on S - 1 "
             "degrees of freedom for the seeds in quadrature with the bootstrap over documents; over documents "
             "alone with one seed), over the documents with tokens in the bin.", ""]
    if shown:
        share = {name: f"{column} ({shown['bins'][name]['share']:.1%})" for name, column, _ in BINS}
        window = (f"window of W = {shown['context_length']} tokens" if shown.get("context_length")
                  else "window (W tokens)")
        lines += [f"Columns, with their share of the scored tokens: the token's position in its sentence, "
                  f"{', '.join(share[name] for name, _ in POSITIONS)}; how many tokens of its article before it the "
                  f"{window} does not show, "
                  f"{', '.join(share[name] for name, _ in BEYOND)}.", ""]
    lines += ["| B - A | " + " | ".join(column for _, column, _ in BINS) + " |", "|---" * (len(BINS) + 1) + "|"]
    for p in positions:
        if "bins" in p:
            lines.append(f"| {p['b']} - {p['a']} | " + " | ".join(_fmt_bin(p["bins"][name]) for name, *_ in BINS)
                         + " |")
        elif "missing" in p:
            lines.append(f"| {p['b']} - {p['a']} | n/a: {', '.join(p['missing'])} evaluated before the position "
                         f"table; remove {'it' if len(p['missing']) == 1 else 'them'} and rerun to add it"
                         + " |" * len(BINS))
        else:
            lines.append(f"| {p['b']} - {p['a']} | n/a: {p['error']}" + " |" * len(BINS))
    return lines + [""]


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


def fmt_share(r: dict) -> str:
    """The share of the oracle's gain in percent, with its interval (unbounded where the oracle's gain is not
    distinguishable from 0)."""
    if r.get("oracle_share") is None:
        return ""
    if r["oracle_share_ci_low"] is None:
        return f"{r['oracle_share']:.0%} [unbounded]"
    return f"{r['oracle_share']:.0%} [{r['oracle_share_ci_low']:.0%}, {r['oracle_share_ci_high']:.0%}]"


def _fmt_seeds(r: dict) -> str:
    if not r.get("seeds"):
        return _fmt_ci(r["ppl"], r["ppl_ci_low"], r["ppl_ci_high"])
    if r["ppl"] is None:
        return "n/a"
    return (f"{r['ppl']:.2f} ± {r['ppl_seed_std']:.2f} [{r['ppl_seed_min']:.2f}, {r['ppl_seed_max']:.2f}] | "
            f"{_fmt_ci(r['ppl_seed_mean_nll'], r['ppl_ci_low'], r['ppl_ci_high'])}")


def _fmt_seed_diffs(r: dict) -> str:
    """Each seed's paired difference, beside the interval that carries their spread."""
    diffs = r.get("paired_seed_diffs")
    if not diffs or len(diffs) < 2:
        return ""
    return " (seeds: " + ", ".join(f"{d:+.2f}" for d in diffs.values()) + ")"


def _fmt_alphas(alphas: Optional[dict]) -> str:
    return "" if not alphas else f"{alphas['alpha_1']:.3g} / {alphas['alpha_2']:.3g}"


def results_table(rows: list[dict]) -> list[str]:
    seeds = next((r["seeds"] for r in rows if r.get("seeds")), None)
    ppl_header = (f"PPL mean ± std [min, max] over seeds {seeds} | PPL of the seed-mean NLL [95% CI over documents]"
                  if seeds else "PPL [95% CI]")
    reference = next((r["paired_reference"] for r in rows if r.get("paired_reference")), None)
    shares = any(r.get("oracle_share") is not None for r in rows)
    columns = ["Model", "conditioning", "K", "T", ppl_header, f"paired PPL - {reference or 'reference'} [95% CI]",
               *(["share of the oracle's gain over Fixed [95% CI]"] if shares else []),
               "plan usage: PPL shuffled - own", "Edit [95% CI]", "alpha_1 / alpha_2", "rel. eval time", "paper PPL",
               "paper Edit"]
    width = len(columns) + (1 if seeds else 0)
    lines = ["| " + " | ".join(columns) + " |", "|---" * width + "|"]
    for r in rows:
        paper = PAPER_TABLE.get(r["paper"] or "")
        if r["status"] == "failed":
            lines.append(f"| {r['label']} | {r['conditioning']} | | | failed" + " |" * (width - 4))
            continue
        rel = "" if r["relative_eval_time"] is None else f"{r['relative_eval_time']:.2f}x"
        usage = "" if r.get("plan_usage_ppl") is None else \
            _fmt_ci(r["plan_usage_ppl"], r.get("plan_usage_ci_low"), r.get("plan_usage_ci_high"))
        paired = "" if r.get("paired_diff") is None else \
            _fmt_ci(r["paired_diff"], r["paired_ci_low"], r["paired_ci_high"]) + _fmt_seed_diffs(r)
        lines.append(
            f"| {r['label']} | {r['conditioning'] or ''} | {r['K'] if r['K'] is not None else ''} | "
            f"{r['T'] if r['T'] is not None else ''} | {_fmt_seeds(r)} | {paired} | "
            f"{fmt_share(r) + ' | ' if shares else ''}{usage} | "
            f"{_fmt_ci(r['edit'], r['edit_ci_low'], r['edit_ci_high'])} | {_fmt_alphas(r.get('rezero_alphas'))} | "
            f"{rel} | {paper[0] if paper else ''} | {paper[1] if paper else ''} |")
    if shares:
        lines.append("\nShare of the oracle's gain: (PPL - PPL of Fixed) / (PPL of the oracle - PPL of Fixed), paired "
                     "over the same documents and seeds; Fieller's interval, unbounded where the oracle's own gain "
                     "over Fixed is not distinguishable from 0 (and wide and unstable near that edge).")
    return lines


def _corpus_line(layout: RunLayout, rows: list[dict]) -> list[str]:
    """What the evaluated articles leave to a planner: their length against the LM's window, and the share of
    their tokens with more of the article before them than the window holds (the planner's possible edge)."""
    import numpy as np

    from planlm.data.windows import beyond_window_share

    row = next((r for r in rows if r["ppl"] is not None), None)
    if row is None:
        return []
    seed = (row.get("evaluated_seeds") or row.get("seeds") or [None])[0]
    config = (_read_json(layout.evaluation(row["name"], seed) / "manifest.json") or {}).get("config") or {}
    split, window, articles = config.get("split"), config.get("context_length"), config.get("articles")
    if not (split and window and articles and (layout.prepared / split / "token_offsets.npy").is_file()):
        return []
    offsets = np.load(layout.prepared / split / "token_offsets.npy")[:articles + 1]
    lengths = np.diff(offsets)
    return [f"Corpus: {articles} {split} articles, median {int(np.median(lengths))} tokens, read through a "
            f"{window}-token window: **{beyond_window_share(offsets, window):.1%} of their tokens have context beyond "
            f"the window**, the only tokens for which a plan can carry what the LM does not see.", ""]


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
        summary = _read_json(folder / "summary.json")
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


def _information_section(summaries: dict[str, dict]) -> list[str]:
    """Each planner's information per step: what it knows about the action beyond its frequencies."""
    from planlm.train.planner_metrics import information_lines

    lines = ["## Planner information per horizon step", "",
             f"Information = unigram NLL - planner NLL (nats) on the boundaries of the {INFORMATION_SPLIT} split (not "
             "the validation split, which chose the planner's checkpoint): what the planner knows about each step's "
             "action beyond the action frequencies; share: its fraction of the unigram NLL. "
             "Teacher-forced: the true actions fed to g; free-running: the planner's own argmax actions.", ""]
    for name, summary in summaries.items():
        if summary.get("information"):
            seed = f"seed {summary['seed']}'s, " if summary.get("seed") is not None else ""
            lines += [f"Planner `{name}` ({seed}horizon {summary['horizon']}, {summary.get('dynamics', 'recurrent')} g; "
                      f"on the {summary['information_split']} split):",
                      "", *information_lines(summary["information"]), ""]
    return lines


def _planner_section(layout: RunLayout, summaries: dict[str, dict]) -> list[str]:
    """The planners' information per step and the shared planner's accuracy (``summaries``: planner_summaries)."""
    info = _information_section(summaries) if summaries else []
    summary = summaries.get("shared")
    if not summary:
        return info
    metrics = summary["metrics"]
    names = list(metrics)
    seed = f"Seed {summary['seed']}'s planner: " if summary.get("seed") is not None else ""
    lines = info + ["## Planner: next-action accuracy per horizon step", "",
             f"{seed}{summary.get('num_boundaries')} boundaries of the {summary.get('eval_split')} split, "
             f"{summary.get('num_actions')} actions, {summary.get('dynamics', 'recurrent')} dynamics g; baselines "
             f"fitted on {summary.get('train_split')}.", "",
             "| step | " + " | ".join(f"{n} top-1" for n in names) + " |", "|---" * (len(names) + 1) + "|"]
    for step in range(summary["horizon"]):
        cells = ["n/a" if metrics[n].get("top1") is None else f"{metrics[n]['top1'][step]:.3f}" for n in names]
        lines.append(f"| {step + 1} | " + " | ".join(cells) + " |")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    steps = list(range(1, summary["horizon"] + 1))
    for n in names:
        if metrics[n].get("top1") is not None:
            ax.plot(steps, metrics[n]["top1"], marker="o", label=n)
    ax.set_xticks(steps)
    ax.set_xlabel("horizon step")
    ax.set_ylabel("top-1 accuracy")
    ax.set_title("Planner vs baselines")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(layout.figures / "planner_accuracy.png", dpi=120)
    plt.close(fig)
    return lines + ["", "![planner accuracy](figures/planner_accuracy.png)", ""]


def _read_csv(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


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
            tables = {s: _read_csv(d / csv_name) for s, d in sorted(seed_dirs.items()) if (d / csv_name).is_file()}
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


def _seeded_sweeps_section(layout: RunLayout, sweeps: list[dict]) -> list[str]:
    """The sweeps run on every seed: per point, the mean over seeds and the paired difference from the reference
    with the interval of the contrasts; each seed's compute sweep is named where it lies."""
    lines = []
    for sweep in sweeps:
        reference, seeds = _short(sweep["reference"]), sweep["seeds"]
        lines += [f"### {sweep['sweep']}: sweep {sweep['kind'].replace('_', ' ')} over seeds {seeds}", "",
                  f"Paired: each point minus {reference} on the same articles, seed by seed (each seed's difference "
                  f"in brackets), the interval over {sweep['interval']} as in the contrasts.", "",
                  f"| value | PPL mean over seeds (each seed) | paired PPL - PPL at {reference} [95% CI] (seeds) | "
                  f"K | T | tau |", "|---|---|---|---|---|---|"]
        for p in sweep["points"]:
            each = ", ".join(f"{v:.2f}" for v in p["seed_ppls"].values())
            diffs = _fmt_seed_diffs({"paired_seed_diffs": p["seed_diffs"]})
            lines.append(f"| {_short(p['value'])} | {p['ppl']:.2f} ({each}) | "
                         f"{_fmt_ci(p['diff'], p['ci_low'], p['ci_high'])}{diffs} | {p['K']} | {p['T']} | "
                         f"{_short(p['tau'])} |")
        lines.append("")
    for compute in sorted(layout.sweeps.glob("*/seed*/sweep_compute.csv")):
        lines += [f"Compute sweep of {compute.parent.parent.name}, {compute.parent.name}: "
                  f"{compute.relative_to(layout.root)} (per seed, not pooled here).", ""]
    return lines


def _sweeps_section(layout: RunLayout, seeded: Optional[list[dict]] = None) -> list[str]:
    sweeps, figures = layout.sweeps, layout.figures
    if not sweeps.is_dir():
        return []
    lines = ["## Sweeps at inference", ""] + _seeded_sweeps_section(layout, seeded or [])
    for csv_path in sorted(sweeps.glob("*/sweep_*.csv")):
        rows = _read_csv(csv_path)
        if not rows:
            continue
        if csv_path.name == "sweep_compute.csv":
            lines += _compute_section(csv_path, rows, figures)
            continue
        reference = _short(rows[0].get("reference") or "")
        lines += [f"### {csv_path.parent.name}: {csv_path.stem.replace('_', ' ')}", "",
                  f"| value | PPL [95% CI] | paired PPL - PPL at {reference} [95% CI] | wall time (rel. to first) | "
                  f"tokens/s | K | T | tau |", "|---|---|---|---|---|---|---|---|"]
        for row in rows:
            paired = _csv_ci(row, "paired_diff", "paired_ci") if row.get("paired_diff") else ""
            lines.append(f"| {_short(row['value'])} | {_csv_ci(row, 'ppl', 'ci')} | {paired} | "
                         f"{float(row['relative_wall_time']):.2f}x | {float(row['tokens_per_s']):.0f} | "
                         f"{row['K']} | {row['T']} | {_short(row['tau'])} |")
        lines += _sweep_figure(csv_path, figures, csv_path.stem) + [""]
    return lines


def _csv_ci(row: dict, value: str, interval: str, digits: int = 2) -> str:
    """A CSV row's ``value`` with its ``<interval>_low`` / ``<interval>_high`` bounds."""
    return _fmt_ci(float(row[value]), float(row[f"{interval}_low"]), float(row[f"{interval}_high"]), digits)


def _sweep_figure(csv_path: Path, figures: Path, alt: str) -> list[str]:
    """Copy a sweep's PNG (next to its CSV) into the report's figures; the Markdown lines that show it."""
    png = csv_path.with_suffix(".png")
    if not png.is_file():
        return []
    figure = f"{csv_path.parent.name}-{png.name}"
    shutil.copyfile(png, figures / figure)
    return ["", f"![{alt}](figures/{figure})"]


def _compute_section(csv_path: Path, rows: list[dict], figures: Path) -> list[str]:
    """The compute sweep: perplexity against paths per boundary, and where an adaptive policy's paths went."""
    name = csv_path.parent.name
    reference = rows[0]["reference"]
    lines = [f"### {name}: planning compute against perplexity", "",
             f"Fixed K beside the adaptive path policies on the same articles; paired: each point minus {reference} "
             f"(95% paired bootstrap over articles). Paths: mean sampled per boundary, and as a fraction of "
             f"{reference}'s.", "",
             f"| point | paths per boundary | fraction of {reference} | PPL [95% CI] | paired PPL - {reference} "
             f"[95% CI] | wall time (rel.) | planner s | LM s |", "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['value']} | {float(row['paths_mean']):.2f} | {float(row['paths_fraction']):.1%} | "
                     f"{_csv_ci(row, 'ppl', 'ci')} | {_csv_ci(row, 'paired_diff', 'paired_ci', 3)} | "
                     f"{float(row['relative_wall_time']):.2f}x | {float(row['planner_time_s']):.1f} | "
                     f"{float(row['lm_time_s']):.1f} |")
    lines += _sweep_figure(csv_path, figures, "compute vs perplexity")
    adaptive = [r for r in rows if r["policy"] not in ("all", "expected")]  # expected-1: plans in expectation
    went = _read_json(Path(adaptive[0]["eval_dir"]) / "where_paths_went.json") if adaptive else None
    if went:
        lines += ["", *_where_paths_went(went, adaptive[0]["value"], figures / f"{name}-paths.png")]
    return lines + [""]


def _where_paths_went(went: dict, label: str, png: Path) -> list[str]:
    """Histogram of paths per boundary and the boundaries with the most and the fewest paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.bar([int(k) for k in went["hist"]], list(went["hist"].values()))
    ax.set_xlabel("paths sampled at the boundary")
    ax.set_ylabel("boundaries")
    ax.set_title(f"{label}: paths per boundary (mean {went['paths_mean']:.2f})")
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)
    lines = [f"#### Where the paths went ({label}, {went['boundaries']} boundaries)", "",
             f"![paths per boundary](figures/{png.name})", "",
             "| boundary | paths | planner's top first actions (p) | true next action | the sentence that followed |",
             "|---|---|---|---|---|"]
    for group in ("most", "fewest"):
        for item in went[group]:
            top = ", ".join(f"{a} ({p:.2f})" for a, p in item.get("top_actions", []))
            text = " ".join(item["text"].split())[:120].replace("|", "/")
            lines.append(f"| {item['sentence']} ({group}) | {item['paths']} | {top} | {item['true_action']} | {text} |")
    return lines


def _short(value: str) -> str:
    try:
        number = float(value)
    except ValueError:
        return value
    return f"{number:.4g}"


def _actions_section(layout: RunLayout, actions_shown: int) -> list[str]:
    prepared, figures = layout.prepared, layout.figures
    if not (prepared / "manifest.json").is_file() or actions_shown <= 0:
        return []
    import contextlib
    import io

    from planlm.data.actions import describe_actions

    with contextlib.redirect_stdout(io.StringIO()):  # the report shows them; the terminal need not
        folder = describe_actions(str(prepared), out_dir=str(layout.actions), num_nearest=3, max_print=0)
    described = _read_json(folder / "actions.json") or {"actions": []}
    lines = ["## A few writing actions and their nearest sentences", "",
             f"The largest {actions_shown} of {described.get('num_actions')} actions (all of them: "
             f"[actions/actions.md](actions/actions.md)).", ""]
    for item in described["actions"][:actions_shown]:
        texts = " / ".join(f"\u201c{' '.join(n['text'].split())[:140]}\u201d" for n in item["nearest"])
        lines.append(f"- **action {item['action']}** ({item['size']} train sentences): {texts}")
    if (folder / "cluster_sizes.png").is_file():
        shutil.copyfile(folder / "cluster_sizes.png", figures / "cluster_sizes.png")
        lines += ["", "![cluster sizes](figures/cluster_sizes.png)"]
    return lines + [""]


def write_report(run_dir: str | Path, *, conditions: list[dict], state: Optional[dict] = None,
                 seeds: Optional[list[int]] = None, actions_shown: int = 5,
                 contrasts: Optional[list[list[str]]] = None) -> Path:
    """Write report.md, results.json, results.csv and figures/ in ``run_dir``; return report.md's path.

    ``contrasts``: pairs [b, a] of condition names whose paired difference ppl(b) - ppl(a) gets a row of its own
    (e.g. [ours, ours_t1] for the paper's claim that planning T steps ahead helps)."""
    layout = RunLayout(Path(run_dir))
    layout.figures.mkdir(parents=True, exist_ok=True)
    rows = collect_results(layout.root, conditions, state, seeds)
    paired = contrast_rows(layout, rows, contrasts or [])
    positions = position_rows(layout, rows, paired)
    summaries = planner_summaries(layout)
    seeded = seeded_sweeps(layout)
    planners = {name: {"horizon": summary["horizon"], "information": summary["information"],
                       "information_split": summary["information_split"],
                       **({"seed": summary["seed"]} if summary.get("seed") is not None else {})}
                for name, summary in summaries.items()}
    layout.results_json.write_text(json.dumps({"conditions": rows, "contrasts": paired, "positions": positions,
                                               "planners": planners, "paper": PAPER_TABLE,
                                               "stages": (state or {}).get("stages", {}),
                                               **({"sweeps": seeded} if seeded else {})}, indent=2))
    with open(layout.results_csv, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)) or ["name"])
        writer.writeheader()
        writer.writerows(rows)
    protocol = next((r["protocol"] for r in rows if r["protocol"]), "n/a")
    lines = [f"# planlm report: {layout.root.name}", "",
             f"Test perplexity ({protocol}; 95% bootstrap intervals over source documents, each resampled with "
             "all its pieces) and action edit distance. "
             "Paired: each condition minus the reference on the same articles (and, with seeds, seed by seed: "
             "the mean over seeds and each seed's difference, with an interval that carries seed noise: a t "
             "quantile on S - 1 degrees of freedom for the spread over seeds, added in quadrature to the bootstrap "
             "over documents, so it holds its coverage at 2-3 seeds; with one seed, over documents alone). "
             "Plan usage: the same LM's "
             "perplexity with its plans shuffled across the test sentences minus with its own (0: it ignores "
             "them). alpha_1 / alpha_2: the multipath adapter's learned ReZero scalars. "
             "The paper's GPT-2-small numbers are shown beside ours for orientation only: a different model "
             "size, corpus and budget.", ""]
    lines += _corpus_line(layout, rows)
    lines += results_table(rows)
    notes = sorted({r["paired_note"] for r in rows if r.get("paired_note")})
    lines += [f"\nNote: {note}." for note in notes]
    failed = [r for r in rows if r["status"] == "failed"]
    if failed:
        lines += ["", "Failed conditions (the others ran; see logs/):"]
        lines += [f"- {r['name']}: {r['error']}" for r in failed]
    lines.append("")
    lines += _contrasts_section(paired)
    lines += _positions_section(positions)
    lines += _planner_section(layout, summaries)
    lines += _sweeps_section(layout, seeded)
    lines += _actions_section(layout, actions_shown)
    stage_info = (state or {}).get("stages", {})
    if stage_info:
        lines += ["## Stages", "", "| stage | status | wall time |", "|---|---|---|"]
        lines += [f"| {name} | {info.get('status')} | {info.get('wall_time_s', '')} s |"
                  for name, info in stage_info.items()]
    layout.report.write_text("\n".join(lines) + "\n")
    return layout.report


if __name__ == "__main__":  # rebuild a report: python -m planlm.pipeline.report RUN_DIR
    run = RunLayout(Path(sys.argv[1]))
    state = _read_json(run.state) or {}
    config = state.get("config") or {}
    print(write_report(run.root, conditions=config.get("conditions") or [], state=state, seeds=config.get("seeds"),
                       **(config.get("report") or {})))
