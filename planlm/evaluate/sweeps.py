"""Inference-time sweeps: perplexity and wall time as K (paths) or tau (planner temperature) changes.

The K sweep is the paper's inference-only experiment (the model is trained with one K and evaluated
with others); the temperature sweep is its appendix. Each point is a full ``planlm evaluate`` in
``<out_dir>/<kind>-<value>/`` (reused when complete), and the sweep writes ``sweep_<kind>.csv``
and ``sweep_<kind>.png``. The effects are small beside the spread of perplexity over articles, so
each point is shown as its *paired* difference from a reference point (K = 1; tau = 1, evaluated
too when not in the list) on the same articles, with its paired bootstrap interval
(``planlm.evaluate.bootstrap``), beside the wall time relative to the first point.
"""

from __future__ import annotations

import csv
from dataclasses import replace
from pathlib import Path
from typing import Literal, Optional

from planlm.args import Runtime
from planlm.errors import PlanlmError
from planlm.evaluate.compute_sweep import DEFAULT_POLICIES, compute_points, compute_rows, write_compute_outputs
from planlm.evaluate.loading import evaluation_inputs
from planlm.evaluate.metrics import PerplexityMetrics
from planlm.evaluate.perplexity import evaluate
from planlm.jsonio import to_jsonable
from planlm.plans.config import PlanConfig, PlanSettings
from planlm.plans.policy import PathPolicy
from planlm.stage import StageDir

COLUMNS = ("value", "ppl", "ci_low", "ci_high", "reference", "paired_diff", "paired_ci_low", "paired_ci_high",
           "wall_time_s", "relative_wall_time", "plan_time_s", "lm_time_s",
           "tokens_per_s", "tokens", "articles", "conditioning", "K", "T", "tau", "eval_dir")


def plot_sweep(rows: list[dict], kind: str, path: str | Path, title: str = "") -> None:
    """Each point's paired perplexity difference from the reference point (with its CI error bars), and
    the wall time relative to the first point, against the swept value."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    values = [float(r["value"]) for r in rows]
    diffs = [r["paired_diff"] for r in rows]
    errors = [[r["paired_diff"] - r["paired_ci_low"] for r in rows],
              [r["paired_ci_high"] - r["paired_diff"] for r in rows]]
    symbol = "K" if kind == "num_paths" else "tau"
    fig, left = plt.subplots(figsize=(6, 4))
    left.axhline(0.0, color="grey", linewidth=0.8)
    left.errorbar(values, diffs, yerr=errors, marker="o", capsize=3, color="tab:blue",
                  label="paired difference (95% CI)")
    left.set_xlabel("K (sampled paths)" if kind == "num_paths" else "tau (planner temperature)")
    left.set_ylabel(f"perplexity - perplexity at {symbol} = {rows[0]['reference']:g} (paired)", color="tab:blue")
    if kind == "num_paths" and min(values) > 0 and max(values) / min(values) >= 10:
        left.set_xscale("log")
    right = left.twinx()
    right.plot(values, [r["relative_wall_time"] for r in rows], marker="s", linestyle="--", color="tab:red",
               label="wall time (relative)")
    right.set_ylabel(f"wall time relative to {rows[0]['value']:g}", color="tab:red")
    left.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def add_paired_differences(rows: list[dict], reference: float, bootstrap_samples: int) -> None:
    """paired_diff / paired_ci_* of each row: its perplexity minus the reference row's on the same articles."""
    from planlm.evaluate.bootstrap import compare_evaluations

    base = next(r for r in rows if r["value"] == reference)
    for row in rows:
        result = compare_evaluations(base["eval_dir"], row["eval_dir"], num_samples=bootstrap_samples)
        row.update(reference=reference, paired_diff=result["diff"], paired_ci_low=result["ci_low"],
                   paired_ci_high=result["ci_high"])


def sweep(model_dir: str, prepared_dir: str, out_dir: str,
          kind: Literal["num_paths", "temperature", "compute"] = "num_paths",
          num_paths: list[int] = [1, 2, 5, 10, 20, 50], temperatures: list[float] = [0.25, 0.5, 1.0, 2.0, 4.0],
          policies: list[PathPolicy] = DEFAULT_POLICIES,
          plans: PlanSettings = PlanSettings(kind="planner_sampled"),
          split: str = "test", stride: int = 1, context_length: int = 128,
          max_articles: Optional[int] = None, batch_size: int = 32, bootstrap_samples: int = 1000,
          expectation: bool = False, runtime: Runtime = Runtime()) -> Path:
    """Sweep K (sampled paths), tau (planner temperature) or planning compute at inference: perplexity, its
    paired difference from a reference point on the same articles, and wall time per point.

    The compute sweep evaluates K at every boundary (``num_paths``) and each adaptive path policy (``policies``)
    on the same articles; its reference is all-K_max (the largest K at every boundary), and it plots perplexity
    against mean paths per boundary and against wall time (planlm.evaluate.compute_sweep).

    Args:
        model_dir: Folder of a finished ``planlm train-lm``.
        prepared_dir: Prepared corpus.
        out_dir: Sweep folder (one evaluation folder per point, plus CSV and PNG).
        kind: num_paths (the K sweep), temperature (the tau sweep) or compute (K at every boundary beside adaptive
            policies).
        num_paths: K values of the K sweep (K = 1, the reference of the paired differences, is added if missing);
            of the compute sweep: its points with K at every boundary (the largest is K_max, the reference).
        temperatures: tau values of the temperature sweep (tau = 1, the reference, is added if missing).
        policies: compute sweep: the adaptive path policies at their budgets (max_paths unset: K_max), e.g.
            [{kind: entropy, max_paths: 10}, {kind: entropy, min_paths: 2}].
        plans: The plans of every point, but for the swept value (kind planner_sampled; num_paths: K of the
            temperature sweep, temperature: tau of the K sweep, horizon, planner_dir); unset: the model's.
        split: Split to evaluate.
        stride: Perplexity protocol (1 = reference).
        context_length: Window length in tokens.
        max_articles: Evaluate only the first N articles.
        batch_size: Windows per LM forward pass.
        bootstrap_samples: Bootstrap resamples of each interval.
        expectation: compute sweep: one more point, plans in expectation at K = 1 (``expected-1``; the other
            points sample their paths whatever the model was trained with).
        runtime: The device and precision of every point (see `planlm evaluate --help`).

    Returns:
        The sweep folder.
    """
    if kind not in ("num_paths", "temperature", "compute"):
        raise PlanlmError(f"--kind {kind!r}: choose num_paths, temperature or compute")
    plans = PlanConfig.of(plans)
    protocol = dict(split=split, stride=stride, context_length=context_length, max_articles=max_articles,
                    batch_size=batch_size, bootstrap_samples=bootstrap_samples, runtime=runtime)
    if kind == "compute":
        return compute_sweep(model_dir, prepared_dir, out_dir, num_paths, policies, plans, protocol, expectation)
    values, reference = _swept_values(kind, num_paths, temperatures)
    with StageDir(out_dir, _sweep_key(model_dir, prepared_dir, plans, protocol, kind=kind, values=values),
                  keep_partial=True) as stage:  # keep_partial: finished points are reused
        if stage.reused:
            return stage.path
        rows = _evaluate_points(model_dir, prepared_dir, stage.path, kind, values, plans, protocol)
        add_paired_differences(rows, reference, bootstrap_samples)
        _write_table(rows, stage.path / f"sweep_{kind}.csv")
        plot_sweep(rows, kind, stage.path / f"sweep_{kind}.png",
                   title=f"{Path(model_dir).name}: {plans.kind or 'its own plans'}, {kind} sweep")
        stage.finish(rows=rows)
    _print_table(rows, kind, reference)
    return stage.path


def _sweep_key(model_dir: str, prepared_dir: str, plans: PlanConfig, protocol: dict, **swept) -> dict:
    """A sweep folder's reuse key: the folders (their paths and what they hold: a retrained model or planner keeps its
    path), the plans, the evaluation protocol of every point (``protocol``; of its runtime, the device and the
    precision as given) and what is swept (``swept``)."""
    runtime = protocol["runtime"]
    protocol = {**{name: value for name, value in protocol.items() if name != "runtime"},
                "device": runtime.device, "precision": runtime.precision}
    return {"model_dir": str(Path(model_dir).resolve()), "prepared_dir": str(Path(prepared_dir).resolve()),
            "plans": to_jsonable(plans), **protocol, **swept,
            **evaluation_inputs(model_dir, prepared_dir, plans.planner_dir or _recorded_planner(model_dir))}


def _swept_values(kind: str, num_paths: list[int], temperatures: list[float]) -> tuple[list, float]:
    """The values of a K or tau sweep, with its reference point (K = 1 or tau = 1) added when missing."""
    values = list(num_paths if kind == "num_paths" else temperatures)
    reference = 1 if kind == "num_paths" else 1.0  # K = 1: one sampled path; tau = 1: the planner's distribution
    if values and reference not in values:
        values = sorted(values + [reference])
    if not values:
        raise PlanlmError(f"--{'num_paths' if kind == 'num_paths' else 'temperatures'} is empty: give values to sweep")
    if kind == "num_paths" and min(values) < 1:
        raise PlanlmError(f"--num_paths {values}: every K must be >= 1")
    if kind == "temperature" and min(values) < 0:
        raise PlanlmError(f"--temperatures {values}: every tau must be >= 0")
    return values, reference


def _evaluate_points(model_dir: str, prepared_dir: str, out: Path, kind: str, values: list, plans: PlanConfig,
                     protocol: dict) -> list[dict]:
    """One ``evaluate`` per swept value in ``<out>/<kind>-<value>`` (``protocol``: its other arguments) -> the
    table's rows, with the wall time relative to the first point."""
    rows = []
    for value in values:
        point = out / f"{kind}-{value:g}"
        swept = {"num_paths": int(value)} if kind == "num_paths" else {"temperature": float(value)}
        metrics = evaluate(model_dir, prepared_dir, str(point), plans=replace(plans, **swept), plan_usage=False,
                           **protocol)
        rows.append({"value": value, **_row(metrics), "eval_dir": str(point)})
    base = rows[0]["wall_time_s"]
    for row in rows:
        row["relative_wall_time"] = row["wall_time_s"] / base if base > 0 else float("nan")
    return rows


def _row(m: PerplexityMetrics) -> dict:
    """The columns of a sweep table that one evaluation gives."""
    return {"ppl": m.ppl, "ci_low": m.ci_low, "ci_high": m.ci_high, "wall_time_s": m.wall_time_s,
            "plan_time_s": m.plan_time_s, "lm_time_s": m.lm_time_s, "tokens_per_s": m.tokens_per_s, "tokens": m.tokens,
            "articles": m.articles, "conditioning": m.conditioning, "K": m.K, "T": m.T, "tau": m.tau}


def _write_table(rows: list[dict], path: Path) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


def _print_table(rows: list[dict], kind: str, reference: float) -> None:
    label = "K" if kind == "num_paths" else "tau"
    print(f"{label:>6} {'ppl':>9} {'95% CI':>21} {f'paired - {label}={reference:g}':>16} {'95% CI':>21} "
          f"{'time (rel.)':>12}")
    for row in rows:
        print(f"{row['value']:>6g} {row['ppl']:>9.3f} [{row['ci_low']:>8.3f}, {row['ci_high']:>8.3f}] "
              f"{row['paired_diff']:>+16.3f} [{row['paired_ci_low']:>+8.3f}, {row['paired_ci_high']:>+8.3f}] "
              f"{row['relative_wall_time']:>11.2f}x")


def compute_sweep(model_dir: str, prepared_dir: str, out_dir: str, num_paths: list[int], policies: list[PathPolicy],
                  plans: PlanConfig, protocol: dict, expectation: bool = False) -> Path:
    """The compute sweep of ``sweep``: K at every boundary, adaptive policies (and plans in expectation) on the same
    LM and articles (``protocol``: the evaluation arguments of every point)."""
    from dataclasses import asdict

    from planlm.evaluate.compute_sweep import EXPECTED_POINT, where_paths_went

    points = compute_points(list(num_paths), list(policies), expectation)
    key = _sweep_key(model_dir, prepared_dir, plans, protocol, kind="compute",
                     points=[(name, asdict(policy)) for name, _, policy in points])
    with StageDir(out_dir, key, keep_partial=True) as stage:  # finished points are reused
        if stage.reused:
            return stage.path
        metrics = []
        for name, max_paths, policy in points:
            point_plans = replace(plans, num_paths=max_paths, path_policy=policy, expectation=name == EXPECTED_POINT)
            metrics.append(evaluate(model_dir, prepared_dir, str(stage.path / name), plans=point_plans,
                                    plan_usage=False, **protocol))
            if policy.adaptive:
                where_paths_went(stage.path / name, metrics[-1].planner_dir, prepared_dir, protocol["split"])
        rows = compute_rows(points, metrics, stage.path)
        add_paired_differences(rows, f"all-{max(num_paths)}", protocol["bootstrap_samples"])  # all-K_max
        write_compute_outputs(rows, stage.path,
                              title=f"{'/'.join(Path(model_dir).parts[-2:])}: planning compute vs perplexity")
        stage.finish(rows=rows)
    return stage.path


def _recorded_planner(model_dir: str) -> str | None:
    """The planner folder a planned-LM folder records (the one its evaluations use by default)."""
    from planlm.models.planned_lm import recorded_plan_folders
    from planlm.stage.integrity import fix_for, reading

    config = Path(model_dir) / "planned_lm.json"
    if not config.is_file():
        return None
    with reading(Path(model_dir) / "README.md", fix_for(model_dir)):
        return recorded_plan_folders(model_dir).get("planner_dir")
