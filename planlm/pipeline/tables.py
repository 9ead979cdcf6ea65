"""The run report's Markdown: the results table beside the paper's Table 1, the paired contrasts and their decisions,
where plans act, the planners, the sweeps, the writing actions and the stages, each section a list of lines. A
section that shows a figure draws or copies it into the report's ``figures/`` (``planlm.pipeline.figures``)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from planlm.pipeline.figures import copy_figure, paths_per_boundary, planner_accuracy
from planlm.pipeline.layout import RunLayout
from planlm.pipeline.results import INFORMATION_SPLIT, decision, read_csv, read_json, undecidable


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


def _fmt_ci(value: Optional[float], low: Optional[float], high: Optional[float], digits: int = 2) -> str:
    if value is None:
        return "n/a"
    if low is None or high is None:
        return f"{value:.{digits}f}"
    return f"{value:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


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


def fmt_share(r: dict) -> str:
    """The share of the oracle's gain in percent, with its interval (unbounded where the oracle's gain is not
    distinguishable from 0)."""
    if r.get("oracle_share") is None:
        return ""
    if r["oracle_share_ci_low"] is None:
        return f"{r['oracle_share']:.0%} [unbounded]"
    return f"{r['oracle_share']:.0%} [{r['oracle_share_ci_low']:.0%}, {r['oracle_share_ci_high']:.0%}]"


def _fmt_bin(one: dict) -> str:
    """A bin's difference in nats per token with its interval and, with seeds, each seed's value."""
    if one["diff"] is None:
        return "no tokens"
    seeds = one.get("seed_diffs") or {}
    each = " (seeds: " + ", ".join(f"{d:+.4f}" for d in seeds.values()) + ")" if len(seeds) > 1 else ""
    if one["ci_low"] is None:
        return f"{one['diff']:+.4f} (one document: no interval){each}"
    return f"{one['diff']:+.4f} [{one['ci_low']:+.4f}, {one['ci_high']:+.4f}]{each}"


def _csv_ci(row: dict, value: str, interval: str, digits: int = 2) -> str:
    """A CSV row's ``value`` with its ``<interval>_low`` / ``<interval>_high`` bounds."""
    return _fmt_ci(float(row[value]), float(row[f"{interval}_low"]), float(row[f"{interval}_high"]), digits)


def _short(value: str) -> str:
    try:
        number = float(value)
    except ValueError:
        return value
    return f"{number:.4g}"


def header(run_name: str, rows: list[dict]) -> list[str]:
    """The report's title and what its numbers are."""
    protocol = next((r["protocol"] for r in rows if r["protocol"]), "n/a")
    return [f"# planlm report: {run_name}", "",
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


def corpus_line(numbers: Optional[dict]) -> list[str]:
    """What the evaluated articles leave to a planner (``planlm.pipeline.results.corpus_numbers``)."""
    if numbers is None:
        return []
    return [f"Corpus: {numbers['articles']} {numbers['split']} articles, median {numbers['median_tokens']} tokens, "
            f"read through a {numbers['window']}-token window: **{numbers['beyond_window']:.1%} of their tokens have "
            f"context beyond the window**, the only tokens for which a plan can carry what the LM does not see.", ""]


def table_notes(rows: list[dict]) -> list[str]:
    """The notes of the paired column, and the conditions that failed."""
    lines = [f"\nNote: {note}." for note in sorted({r["paired_note"] for r in rows if r.get("paired_note")})]
    failed = [r for r in rows if r["status"] == "failed"]
    if failed:
        lines += ["", "Failed conditions (the others ran; see logs/):"]
        lines += [f"- {r['name']}: {r['error']}" for r in failed]
    return lines + [""]


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


def contrasts_section(contrasts: list[dict]) -> list[str]:
    """The configured contrasts B - A (``planlm.pipeline.results.contrast_rows``) with their decisions."""
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


def positions_section(positions: list[dict]) -> list[str]:
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


def planner_section(summaries: dict[str, dict], figures: Path) -> list[str]:
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
    planner_accuracy(summary, figures / "planner_accuracy.png")
    return lines + ["", "![planner accuracy](figures/planner_accuracy.png)", ""]


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


def sweeps_section(layout: RunLayout, seeded: Optional[list[dict]] = None) -> list[str]:
    """The sweeps at inference: those run on every seed (``seeded``: ``planlm.pipeline.results.seeded_sweeps``), then
    each sweep's table and figure, the compute sweep's with where its paths went."""
    sweeps, figures = layout.sweeps, layout.figures
    if not sweeps.is_dir():
        return []
    lines = ["## Sweeps at inference", ""] + _seeded_sweeps_section(layout, seeded or [])
    for csv_path in sorted(sweeps.glob("*/sweep_*.csv")):
        rows = read_csv(csv_path)
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


def _sweep_figure(csv_path: Path, figures: Path, alt: str) -> list[str]:
    """Copy a sweep's PNG (next to its CSV) into the report's figures; the Markdown lines that show it."""
    png = csv_path.with_suffix(".png")
    figure = f"{csv_path.parent.name}-{png.name}"
    if not copy_figure(png, figures / figure):
        return []
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
    went = read_json(Path(adaptive[0]["eval_dir"]) / "where_paths_went.json") if adaptive else None
    if went:
        lines += ["", *_where_paths_went(went, adaptive[0]["value"], figures / f"{name}-paths.png")]
    return lines + [""]


def _where_paths_went(went: dict, label: str, png: Path) -> list[str]:
    """Histogram of paths per boundary and the boundaries with the most and the fewest paths."""
    paths_per_boundary(went, label, png)
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


def actions_section(described: dict, shown: int, figure: bool) -> list[str]:
    """The largest ``shown`` writing actions with their nearest sentences (``described``: the actions.json of
    ``planlm.data.actions.describe_actions``), and their sizes' figure when the report has it."""
    lines = ["## A few writing actions and their nearest sentences", "",
             f"The largest {shown} of {described.get('num_actions')} actions (all of them: "
             f"[actions/actions.md](actions/actions.md)).", ""]
    for item in described["actions"][:shown]:
        texts = " / ".join(f"\u201c{' '.join(n['text'].split())[:140]}\u201d" for n in item["nearest"])
        lines.append(f"- **action {item['action']}** ({item['size']} train sentences): {texts}")
    if figure:
        lines += ["", "![cluster sizes](figures/cluster_sizes.png)"]
    return lines + [""]


def stages_section(stages: dict) -> list[str]:
    """Each stage's status and wall time (the run state's ``stages``)."""
    if not stages:
        return []
    return (["## Stages", "", "| stage | status | wall time |", "|---|---|---|"]
            + [f"| {name} | {info.get('status')} | {info.get('wall_time_s', '')} s |" for name, info in stages.items()])
