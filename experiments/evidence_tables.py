"""The evidence run's tables for README.md and docs/results.md, from the run's own results.json.

    planlm run --config configs/evidence.yaml
    PYTHONPATH=$PWD python experiments/evidence_tables.py --run runs/evidence

Prints, in Markdown:

1. **claims**: the pre-registered contrasts (docs/evidence.md) as README's table: the mean over seeds with the
   interval of `planlm compare` (seed noise and source documents), how many seeds are below 0, and whether the
   interval decides the claim;
2. **contrasts**: the same contrasts with every seed's value;
3. **conditions**: each condition's perplexity over seeds, its paired difference from none and from Fixed, its
   share of the oracle's gain and its plan usage;
4. **sweep**: ours' K sweep over seeds, each K minus K = 1;
5. **positions**: where plans act, B - A in nats per token by the token's position in its sentence and by the
   context fallen out of the window, for the target contrasts;
6. **spread**: where the seed-to-seed spread of each contrast comes from. The run's seeds redraw the codebook, the
   planners and the LMs; the earlier runs that `experiments/power_analysis.py` lists redrew only the LMs. The
   difference of the two variances estimates the codebook's and planners' part;
7. **needs**: for each target whose interval includes 0, its power at the run's S and the S that would reach 80%, at
   the measured effect, seed sd and document SE, with this test set and with twice the test documents.

``--overlay RUN`` adds, per contrast, the same contrast in a second run of the same seeds and test set (the larger
planner's twin), the cross-run difference of each condition, paired seed by seed, and both runs' planners'
information on the test split.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

try:  # imported as the package `experiments` (the tests)
    from experiments import power_analysis
except ImportError:  # run as a script: its folder is sys.path[0]
    import power_analysis

# (label, b, a, role, the power_analysis contrast that holds its LM-only seed values)
CLAIMS = [
    ("a plan the LM can use helps it (upper bound)", "oracle", "fixed", "target", "oracle - Fixed"),
    ("the paper's method helps over a content-free plan", "ours", "fixed", "target", "ours - Fixed"),
    ("the prior method helps over a content-free plan", "cornille", "fixed", "target", "Cornille et al. - Fixed"),
    ("more sampled paths help at inference", "K=20", "K=1", "target", "K = 20 - K = 1 (ours)"),
    ("planning T steps ahead helps", "ours", "ours_t1", "reported", "ours - ours with T = 1"),
    ("the multipath adapter helps", "ours", "ours_pa", "reported", "ours - ours with Project and Avg"),
    ("ours beats the prior method", "ours", "cornille", "reported", "ours - Cornille et al."),
]
NAMES = {"oracle": "oracle", "fixed": "Fixed", "cornille": "Cornille et al.", "ours": "ours", "ours_t1": "ours, T = 1",
         "ours_pa": "ours, Project and Avg", "none": "none", "K=20": "ours at K = 20", "K=1": "ours at K = 1"}
README_CLAIMS = 6  # README's table: every claim but the multipath adapter's (results.md has all seven)


def load(run: Path) -> dict:
    path = Path(run) / "results.json"
    if not path.is_file():
        raise SystemExit(f"{path}: no results.json; finish the run first (planlm run --config ...)")
    return json.loads(path.read_text())


def claim_rows(results: dict) -> list[dict]:
    """Each claim's contrast: mean, interval and per-seed values, from the run's contrasts and its K sweep."""
    contrasts = {(c["b"], c["a"]): c for c in results["contrasts"]}
    rows = []
    for label, b, a, role, source in CLAIMS:
        if b.startswith("K="):
            sweep = next(s for s in results.get("sweeps", []) if s["kind"] == "num_paths")
            point = next(p for p in sweep["points"] if float(p["value"]) == float(b[2:]))
            found = {"diff": point["diff"], "ci_low": point["ci_low"], "ci_high": point["ci_high"],
                     "seed_diffs": point["seed_diffs"]}
        else:
            found = contrasts.get((b, a))
            if found is None:
                raise SystemExit(f"results.json has no contrast {b} - {a}: add it to the run's report.contrasts")
        rows.append({"label": label, "b": b, "a": a, "role": role, "source": source, **found})
    return rows


def verdict(row: dict) -> str:
    if row["ci_high"] < 0:
        return "yes" if row["role"] == "target" else "yes (B better)"
    if row["ci_low"] > 0:
        return "no: A better"
    return "not shown" if row["role"] == "target" else "no difference shown"


def _ci(diff: float, low: float, high: float, digits: int = 2) -> str:
    text = f"{diff:+.{digits}f} [{low:+.{digits}f}, {high:+.{digits}f}]"
    return f"**{text}**" if high < 0 or low > 0 else text


def claims_table(rows: list[dict], limit: Optional[int] = None) -> list[str]:
    shown = [r for r in rows if not (limit and r["a"] == "ours_pa")][:limit]
    seeds = len(rows[0]["seed_diffs"])
    lines = [f"| claim | B - A | mean over {seeds} seeds [95% CI] | seeds with B better | decided |",
             "|---|---|---|---|---|"]
    for r in shown:
        better = sum(d < 0 for d in r["seed_diffs"].values())
        lines.append(f"| {r['label']} | {NAMES[r['b']]} - {NAMES[r['a']]} | {_ci(r['diff'], r['ci_low'], r['ci_high'])} "
                     f"| {better} of {seeds} | {verdict(r)} |")
    return lines


def contrasts_table(rows: list[dict]) -> list[str]:
    seeds = list(rows[0]["seed_diffs"])
    lines = ["| B - A | role | mean [95% CI] | " + " | ".join(f"seed {s}" for s in seeds) + " | decided |",
             "|---" * (len(seeds) + 4) + "|"]
    for r in rows:
        each = " | ".join(f"{r['seed_diffs'][s]:+.2f}" for s in seeds)
        lines.append(f"| {NAMES[r['b']]} - {NAMES[r['a']]} | {r['role']} | {_ci(r['diff'], r['ci_low'], r['ci_high'])} "
                     f"| {each} | {verdict(r)} |")
    return lines


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def conditions_table(results: dict) -> list[str]:
    """Per condition: PPL mean over seeds [min, max], paired - none (the report's paired column), - Fixed, the
    share of the oracle's gain and plan usage."""
    if not results["conditions"]:
        return []
    contrasts = {(c["b"], c["a"]): c for c in results["contrasts"]}
    # the report pairs every condition with its first one (none, or Fixed in a run without none)
    reference = next((c["paired_reference"] for c in results["conditions"] if c.get("paired_reference")), "none")
    name = "Fixed" if reference == "fixed" else reference
    fixed_column = reference != "fixed"  # paired with Fixed already: no second column for it
    header = ["model", "PPL, mean over seeds [min, max]", f"- {name} [95% CI]"]
    header += ["- Fixed [95% CI]"] if fixed_column else []
    header += ["share of the oracle's gain [95% CI]", "plan usage"]
    lines = [_row(header), "|---" * len(header) + "|"]
    for c in results["conditions"]:
        minus_reference = (_ci(c["paired_diff"], c["paired_ci_low"], c["paired_ci_high"])
                           if c.get("paired_diff") is not None else "")
        cells = [c["label"], f"{c['ppl']:.2f} [{c['ppl_seed_min']:.2f}, {c['ppl_seed_max']:.2f}]", minus_reference]
        if fixed_column:
            fixed = contrasts.get((c["name"], "fixed"))
            cells.append(_ci(fixed["diff"], fixed["ci_low"], fixed["ci_high"]) if fixed else "")
        share = ""
        if c.get("oracle_share") is not None:
            low, high = c.get("oracle_share_ci_low"), c.get("oracle_share_ci_high")
            bounds = f"[{low:.0%}, {high:.0%}]" if low is not None and high is not None else "[unbounded]"
            share = f"{c['oracle_share']:.0%} {bounds}"
        cells += [share, f"{c['plan_usage_ppl']:.2f}" if c.get("plan_usage_ppl") is not None else ""]
        lines.append(_row(cells))
    return lines


def sweep_table(results: dict) -> list[str]:
    sweep = next((s for s in results.get("sweeps", []) if s["kind"] == "num_paths"), None)
    if sweep is None:
        return []
    lines = ["| K | PPL, mean over seeds | K - K = 1 [95% CI] | seeds with K better |", "|---|---|---|---|"]
    for p in sweep["points"]:
        better = sum(d < 0 for d in p["seed_diffs"].values())
        diff = "" if float(p["value"]) == float(sweep["reference"]) else (
            f"{_ci(p['diff'], p['ci_low'], p['ci_high'])} | {better} of {len(p['seed_diffs'])}")
        lines.append(f"| {int(float(p['value']))} | {p['ppl']:.2f} | {diff or ' | '} |")
    return lines


def positions_table(results: dict, pairs: Sequence[tuple[str, str]] = (("oracle", "fixed"), ("ours", "fixed"),
                                                                        ("cornille", "fixed"))) -> list[str]:
    from planlm.evaluate.positions import BINS

    found = {(p["b"], p["a"]): p for p in results.get("positions", []) if "bins" in p}
    shown = [found[pair] for pair in pairs if pair in found]
    if not shown:
        return []
    share = {name: shown[0]["bins"][name]["share"] for name, *_ in BINS}
    lines = ["| B - A | " + " | ".join(f"{column} ({share[name]:.0%})" for name, column, _ in BINS) + " |",
             "|---" * (len(BINS) + 1) + "|"]
    for p in shown:
        cells = []
        for name, *_ in BINS:
            one = p["bins"][name]
            cells.append("no tokens" if one["diff"] is None else _ci(one["diff"], one["ci_low"], one["ci_high"], 4))
        lines.append(f"| {NAMES[p['b']]} - {NAMES[p['a']]} | " + " | ".join(cells) + " |")
    return lines


def spread_rows(rows: list[dict]) -> list[dict]:
    """Per contrast: the sd of the whole-method seeds (this run) against the LM-only seed sd of the earlier runs
    (power_analysis's inputs, pooled over their runs); the codebook's and planners' part is the difference of the
    variances, floored at 0."""
    known = {c.name: c for c in power_analysis.CONTRASTS}
    out = []
    for r in rows:
        values = list(r["seed_diffs"].values())
        method_sd = float(np.std(values, ddof=1))
        contrast = known[r["source"]]
        if contrast.documents_only:
            out.append({**r, "method_sd": method_sd, "lm_sd": None, "lm_df": 0})
            continue
        lm_var, df = power_analysis.lm_seed_variance(contrast)
        out.append({**r, "method_sd": method_sd, "lm_sd": math.sqrt(lm_var), "lm_df": df,
                    "planner_sd": math.sqrt(max(method_sd ** 2 - lm_var, 0.0)),
                    "planner_share": max(method_sd ** 2 - lm_var, 0.0) / method_sd ** 2 if method_sd > 0 else 0.0})
    return out


def spread_table(rows: list[dict]) -> list[str]:
    seeds = len(rows[0]["seed_diffs"])
    lines = [f"| B - A | sd over {seeds} seeds of the whole method | LM-only sd, earlier runs (df) | codebook and "
             f"planners: sd (share of the variance) |", "|---|---|---|---|"]
    for r in spread_rows(rows):
        if r["lm_sd"] is None:
            lines.append(f"| {NAMES[r['b']]} - {NAMES[r['a']]} | {r['method_sd']:.2f} | not measured (one seed) | |")
            continue
        lines.append(f"| {NAMES[r['b']]} - {NAMES[r['a']]} | {r['method_sd']:.2f} | {r['lm_sd']:.2f} ({r['lm_df']}) | "
                     f"{r['planner_sd']:.2f} ({r['planner_share']:.0%}) |")
    return lines


def cross_run_table(run: Path, other_run: Path, conditions: Sequence[str] = ("none", "fixed", "cornille", "ours",
                                                                           "oracle")) -> list[str]:
    """Each condition in the second run minus the first, paired seed by seed on the same test pieces
    (``planlm compare RUN/eval/<condition> OTHER/eval/<condition>``)."""
    from planlm.evaluate.bootstrap import compare_evaluations

    lines = ["| condition | other run - this run [95% CI] | seeds |", "|---|---|---|"]
    for name in conditions:
        result = compare_evaluations(str(Path(run) / "eval" / name), str(Path(other_run) / "eval" / name), 1000)
        each = ", ".join(f"{d['diff']:+.2f}" for d in result.get("seeds", {}).values())
        lines.append(f"| {NAMES[name]} | {_ci(result['diff'], result['ci_low'], result['ci_high'])} | {each} |")
    return lines


PLANNERS = {"ours' planner": "planner", "Cornille et al.'s planner": "planners/cornille"}


def seed_information(run: Path, planner_dirs: dict[int, Path], trained: str, split: str = "test") -> dict[int, dict]:
    """Each seed's planner (``planner_dirs``) measured on ``split`` against that seed's own codebook
    (``planlm.train.planner_metrics.held_out_information``), its baselines fitted on the split that
    ``RUN/<trained>/seed<s>``'s train-planner trained on."""
    from planlm.train.planner_metrics import held_out_information

    out = {}
    for seed, folder in planner_dirs.items():
        summary = json.loads((Path(run) / trained / f"seed{seed}" / "summary.json").read_text())
        out[seed] = held_out_information(folder, Path(run) / "codebooks" / f"seed{seed}", split,
                                         summary.get("train_split"))
    return out


def planner_information(run: Path, split: str = "test") -> dict[str, dict[int, dict]]:
    """Per planner of the run (ours' and Cornille et al.'s), ``seed_information`` for every seed it trained."""
    out = {}
    for name, folder in PLANNERS.items():
        seeds = sorted(int(p.parent.name[4:]) for p in (Path(run) / folder).glob("seed*/summary.json"))
        out[name] = seed_information(run, {s: Path(run) / folder / f"seed{s}" for s in seeds}, folder, split)
    return out


def information_table(runs: dict[str, dict[str, dict[int, dict]]]) -> list[str]:
    """``planner_information`` of each run side by side: step 1 (teacher-forced) with every seed, and the last step
    free-running, each the mean over seeds; the unigram NLL is the codebook's (each run's own)."""
    lines = []
    for run_name, planners in runs.items():
        for name, by_seed in planners.items():
            if not by_seed:
                continue
            seeds = sorted(by_seed)
            first = [by_seed[s]["teacher_forced"]["nats"][0] for s in seeds]
            last = [by_seed[s]["free_running"]["nats"][-1] for s in seeds]
            unigram = np.mean([by_seed[s]["unigram_nll"][0] for s in seeds])
            horizon = len(by_seed[seeds[0]]["free_running"]["nats"])
            lines.append(f"| {run_name} | {name} | {unigram:.3f} | **{np.mean(first):.3f}** "
                         f"({', '.join(f'{v:.3f}' for v in first)}) | {np.mean(last):.3f} (step {horizon}) |")
    if not lines:
        return []
    return ["| run | planner | unigram NLL, step 1 | information, step 1 (seeds) | information, last step "
            "free-running |", "|---|---|---|---|---|"] + lines


def needs_table(run: Path, rows: list[dict], seeds: Sequence[int] = tuple(range(2, 33)), draws: int = 4000) -> list[str]:
    """For each target whose interval includes 0: the power of the run's own S at the measured effect, seed sd and
    document SE (``planlm compare``'s), and the S that would reach 80% (power_analysis.power_curve), with this
    test set and with twice as many test documents (the document SE over sqrt(2))."""
    from planlm.evaluate.bootstrap import compare_evaluations

    lines = []
    if not (Path(run) / "eval").is_dir():  # a results.json alone: no per-article tables to take the SEs from
        return []
    for r in rows:
        if r["role"] != "target" or r["ci_high"] < 0 or r["b"].startswith("K="):
            continue
        result = compare_evaluations(str(Path(run) / "eval" / r["a"]), str(Path(run) / "eval" / r["b"]), 1000)
        sd, doc_se, documents = result["diff_std"], result["document_se"], result["documents"]
        cells = []
        for factor in (1, 2):
            curve = power_analysis.power_curve(r["diff"], sd, doc_se / math.sqrt(factor), documents * factor,
                                               seeds=seeds, draws=draws)
            own = next(row["power"] for row in curve if row["seeds"] == len(r["seed_diffs"]))
            need = power_analysis.seeds_needed(curve)
            cells += [f"{own:.0%}", str(need) if need else f"none up to {max(seeds)} ({max(c['power'] for c in curve):.1%})"]
        lines.append(f"| {NAMES[r['b']]} - {NAMES[r['a']]} | {r['diff']:+.2f} | {sd:.2f} | {doc_se:.2f} ({documents}) | "
                     + " | ".join(cells) + " |")
    if not lines:
        return []
    return ["| target not shown | effect | seed sd | document SE (documents) | power at this S | S for 80% | power at "
            "this S, 2x documents | S for 80%, 2x documents |", "|---|---|---|---|---|---|---|---|"] + lines


def overlay_tables(results: dict, other: dict, rows: list[dict]) -> list[str]:
    """The claims in a second run beside the first (same seeds and test pieces)."""
    other_rows = {(r["b"], r["a"]): r for r in claim_rows(other)}
    lines = ["| B - A | this run [95% CI] | other run [95% CI] | other run, seeds |", "|---|---|---|---|"]
    for r in rows:
        o = other_rows[(r["b"], r["a"])]
        each = ", ".join(f"{d:+.2f}" for d in o["seed_diffs"].values())
        lines.append(f"| {NAMES[r['b']]} - {NAMES[r['a']]} | {_ci(r['diff'], r['ci_low'], r['ci_high'])} | "
                     f"{_ci(o['diff'], o['ci_low'], o['ci_high'])} | {each} |")
    return lines


def render(results: dict, other: Optional[dict] = None, runs: Optional[tuple[Path, Optional[Path]]] = None) -> str:
    rows = claim_rows(results)
    parts = [("claims (README)", claims_table(rows, README_CLAIMS)), ("contrasts, every seed", contrasts_table(rows)),
             ("conditions", conditions_table(results)), ("K sweep", sweep_table(results)),
             ("where plans act", positions_table(results)), ("seed spread", spread_table(rows))]
    if runs is not None:
        parts.append(("what the targets not shown would need", needs_table(runs[0], rows)))
    if other is not None:
        parts.append(("the other run", overlay_tables(results, other, rows)))
        parts.append(("the other run, condition by condition", cross_run_table(*runs)))
        parts.append(("the planners' information (test split)",
                      information_table({str(run): planner_information(run) for run in runs})))
    return "\n".join(f"### {title}\n\n" + "\n".join(lines) + "\n" for title, lines in parts if lines)


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, default=Path("runs/evidence"), help="the evidence run's folder")
    parser.add_argument("--overlay", type=Path, default=None, help="a second run of the same seeds and test set")
    args = parser.parse_args(argv)
    other = load(args.overlay) if args.overlay else None
    print(render(load(args.run), other, (args.run, args.overlay)))


if __name__ == "__main__":
    main()
