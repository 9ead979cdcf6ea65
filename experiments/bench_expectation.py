"""Plans in expectation (``plans.expectation``, beyond the paper) on the mechanism benchmark: one path in
expectation against K sampled paths, paired over seeds.

On the mechanism corpus (``experiments/bench_mechanism.py``, T = 1 plans) a boundary has two likely next types, so a
sampled plan needs many paths to name both; the expected plan, sum_a p(a | context) Emb(a), names both with
one (at T = 1 it is the K -> infinity limit itself, up to the cache's float16 probabilities). For every seed,
from the benchmark's own folders (trained here when missing: corpus, planner, the seed's
base LM and its ``sampled`` condition, Project and Avg trained on K = 10 sampled paths of T = 1):

1. the ``sampled`` LM evaluated on the test split with K = 1, 10, 50 sampled paths and with plans in
   expectation at K = 1 (trained on samples, evaluated in expectation);
2. an ``expected`` LM trained in expectation (K = 1) from the same base LM, evaluated in expectation
   (trained in expectation throughout);
3. each point's perplexity pooled over seeds (every seed's NLL and tokens summed) and its paired difference
   from sampled K = 50 and from sampled K = 1 (``bench_mechanism.paired``): with one seed, a 95% paired
   bootstrap over test documents; with several, the mean of the seeds' differences with the seed-noise
   interval of ``planlm compare``;
4. the evaluation time of expectation K = 1 over sampled K = 1: both evaluated ``--repeats`` times, in turn,
   in this process, on seed 0's model (median wall time: planner, adapter and LM);
5. the diagnosis: per step, how far the expected action embedding (the ``sampled`` LM's own Emb) lies from the
   average of K = 50 sampled embeddings, beside the distance the K = 50 average alone is expected to have from
   its limit (its Monte Carlo standard error); and the plan vectors' relative distance;
6. the compute sweep of seed 0's ``sampled`` LM (``planlm sweep --kind compute --expectation true``): fixed
   K = 1, 10, 50 beside the expected point at its measured planner cost (``<out_dir>/expectation/compute``).

Targets, printed PASS/FAIL: expectation K = 1 within the paired interval of sampled K = 50 or better (its
pooled interval against K = 50 reaches 0 or lies below it); at most 1.2x the evaluation time of sampled K = 1.

Every ``experiments/bench_mechanism.py`` option applies (``--out_dir``, ``--seeds``, ``--quick``, ...; give the options the
folder was made with again). ``--condition ours`` evaluates the multipath LM of T = 3 instead (at T > 1 only
step 1 is exact: steps 2..T take the expectation along the sampled prefix, K paths in expectation average over K
prefixes, and the variance need not be below the sampled plan's; docs/method.md). The report goes to
``<out_dir>/expectation/report-<condition>.md``.

    python experiments/bench_expectation.py --quick --seeds 0 1 2 --out_dir runs/bench_mechanism_quick
    python experiments/bench_expectation.py --out_dir runs/bench_mechanism          # the full benchmark's folders
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

try:  # imported as the package `experiments` (the tests, python -m experiments.bench_expectation)
    from experiments import bench_mechanism as bench
except ImportError:  # run as a script (python experiments/bench_expectation.py): its folder is sys.path[0]
    import bench_mechanism as bench

from planlm.plans.config import TOP_ACTIONS

SAMPLED_K = (1, 10, 50)


def parse_args() -> tuple[argparse.Namespace, argparse.Namespace]:
    """(this script's options, the benchmark's options)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="timed evaluations of each of sampled K = 1 and "
                                                               "expectation K = 1, in turn")
    parser.add_argument("--no_compute_sweep", action="store_true", help="skip part 6")
    parser.add_argument("--condition", choices=["sampled", "ours"], default="sampled",
                        help="the LM evaluated: sampled (Project and Avg, T = 1) or ours (multipath, T = --horizon, "
                             "K = 10; adds expectation K = 10, which averages over sampled prefixes; no LM trained in "
                             "expectation)")
    args, bench_argv = parser.parse_known_args()
    return args, bench.parse_args(bench_argv)


def point_specs(condition: str = "sampled") -> dict:
    """The evaluation points of the ``condition`` LM: the plans overriding its own."""
    from planlm.plans.config import PlanConfig

    points = {f"sampled K={k}": PlanConfig(num_paths=k, expectation=False) for k in SAMPLED_K}
    for num_paths in (1, 10) if condition == "ours" else (1,):  # at T > 1 more paths average over more prefixes
        points[f"expectation K={num_paths}"] = PlanConfig(num_paths=num_paths, expectation=True)
    return points


def model_dir(bench_args, condition: str, seed: int) -> Path:
    return Path(bench_args.out_dir) / bench_args.tag / "lm" / f"{condition}-seed{seed}"


def evaluate_points(bench_args, seed: int, prepared_dir: str, planner_dir: str, condition: str = "sampled") -> dict:
    """Evaluation folders of one seed: every point of the ``condition`` LM and (sampled) the ``expected`` LM's
    own."""
    from planlm.evaluate.perplexity import evaluate

    root = Path(bench_args.out_dir) / bench_args.tag
    base = bench.train_base(bench_args, seed, prepared_dir, bench.Clock())
    bench.train_condition(bench_args, condition, seed, prepared_dir, planner_dir, base, bench.Clock())
    eval_dirs = {}
    for name, plans in point_specs(condition).items():
        folder = root / "expectation" / "eval" / f"{condition}-{name.replace(' ', '-')}-seed{seed}"
        evaluate(model_dir=str(model_dir(bench_args, condition, seed)), prepared_dir=prepared_dir, out_dir=str(folder),
                 split="test", batch_size=64, plans=plans, bootstrap_samples=bench_args.bootstrap_samples,
                 **bench.lm_window(bench_args))
        eval_dirs[name] = folder
    if condition != "sampled":
        return eval_dirs
    eval_dirs["trained in expectation"] = bench.train_condition(bench_args, "expected", seed, prepared_dir,
                                                                planner_dir, base, bench.Clock())[0]
    return eval_dirs


def paired_table(bench_args, eval_dirs: list[dict]) -> tuple[list[str], dict]:
    """Pooled perplexity of every point with its paired differences from sampled K = 50 and K = 1."""
    from planlm.evaluate.bootstrap import read_per_article

    lines = ["| plans | pooled ppl | - sampled K=50 (paired) | - sampled K=1 (paired) |", "|---|---|---|---|"]
    against = {}
    for name in eval_dirs[0]:
        dirs = [d[name] for d in eval_dirs]
        tables = [read_per_article(d) for d in dirs]
        ppl = float(np.exp(sum(t["nll_sum"].sum() for t in tables) / sum(t["tokens"].sum() for t in tables)))
        k50 = bench.paired([d["sampled K=50"] for d in eval_dirs], dirs, bench_args.bootstrap_samples)
        k1 = bench.paired([d["sampled K=1"] for d in eval_dirs], dirs, bench_args.bootstrap_samples)
        against[name] = k50
        lines.append(f"| {name} | {ppl:.4f} | {bench.fmt_diff(k50)} | {bench.fmt_diff(k1)} |")
    return lines, against


def timing(bench_args, seed: int, prepared_dir: str, repeats: int, condition: str = "sampled") -> dict:
    """Median evaluation wall time (planner, adapter, LM) of sampled K = 1 and expectation K = 1, timed in turn."""
    import torch

    from planlm.data.artifacts import PreparedDataset
    from planlm.evaluate.perplexity import evaluate_split
    from planlm.models.planned_lm import PlannedLM
    from planlm.plans.config import evaluation_plans

    folder = model_dir(bench_args, condition, seed)
    model, prepared = PlannedLM.from_pretrained(folder), PreparedDataset(prepared_dir)
    split = prepared["test"]
    points = {name: evaluation_plans(plans, model, str(folder)) for name, plans in point_specs().items()
              if name in ("sampled K=1", "expectation K=1")}
    times = {name: [] for name in points}
    window = bench.lm_window(bench_args)
    for _ in range(repeats):
        for name, plans in points.items():
            result = evaluate_split(model, prepared, split, plans, split.num_articles, window["stride"],
                                    window["context_length"], batch_size=64, device=torch.device("cpu"),
                                    precision="fp32")
            times[name].append((result["wall_time_s"], result["planner_time_s"]))
    return {name: {"wall": statistics.median(t[0] for t in rows), "planner": statistics.median(t[1] for t in rows)}
            for name, rows in times.items()}


def diagnosis(bench_args, seed: int, prepared_dir: str, condition: str = "sampled",
              num_paths: int = 50) -> list[str]:
    """Per step: the expected action embedding's distance from the K = 50 average, beside that average's own
    Monte Carlo error, in the sampled LM's action-embedding space; and the plan vectors' relative distance."""
    import torch

    from planlm.data.artifacts import PreparedDataset
    from planlm.models.planned_lm import PlannedLM
    from planlm.plans.config import PlanConfig, evaluation_plans
    from planlm.plans.registry import plan_source

    folder = model_dir(bench_args, condition, seed)
    model, prepared = PlannedLM.from_pretrained(folder).eval(), PreparedDataset(prepared_dir)
    split = prepared["test"]
    sentences = np.arange(split.num_sentences)
    sources = {expectation: plan_source(evaluation_plans(PlanConfig(num_paths=1 if expectation else num_paths,
                                                                    expectation=expectation),
                                                        model, str(folder)), prepared, split, sentences=sentences)
               for expectation in (True, False)}
    adapter = model.adapter
    with torch.no_grad():
        expected, sampled = sources[True](sentences), sources[False](sentences)
        mean_embeds = adapter.step_embeddings(expected.action_paths, expected.action_probs)[:, 0]  # (N, T, E)
        draws = adapter.step_embeddings(sampled.action_paths)  # (N, K, T, E)
        average = draws.mean(1)  # (N, T, E)
        standard_error = (draws.var(1, unbiased=True).sum(-1) / num_paths).sqrt()  # (N, T)
        vectors = {name: model.plan_vectors(*plans) for name, plans in (("expected", expected), ("sampled", sampled))}
    lines = [f"| step | mean distance expected - K={num_paths} average | K={num_paths} average's standard error | "
             f"ratio |", "|---|---|---|---|"]
    distance = (mean_embeds - average).norm(dim=-1)  # (N, T)
    for step in range(distance.shape[1]):
        lines.append(f"| {step + 1} | {distance[:, step].mean():.4f} | {standard_error[:, step].mean():.4f} | "
                     f"{distance[:, step].mean() / standard_error[:, step].mean():.2f} |")
    relative = ((vectors["expected"] - vectors["sampled"]).norm(dim=-1) / vectors["sampled"].norm(dim=-1)).mean()
    lines.append(f"\nplan vectors (seed {seed}): mean |c_expected - c_K={num_paths}| / |c_K={num_paths}| = "
                 f"{float(relative):.4f}")
    return lines


def main() -> None:
    args, bench_args = parse_args()
    import torch

    torch.set_num_threads(bench_args.threads)
    from planlm.data.resources import use_offline_mode_if_no_hub

    use_offline_mode_if_no_hub()
    began, clock = time.time(), bench.Clock()
    out = Path(bench_args.out_dir)
    prepared_dir, _ = bench.prepare_corpus(bench_args, out, clock)
    planner_dir = bench.train_mechanism_planner(bench_args, prepared_dir, clock)
    condition = args.condition
    eval_dirs = [evaluate_points(bench_args, seed, prepared_dir, planner_dir, condition)
                 for seed in bench_args.seeds]
    lines = [f"# Plans in expectation on the mechanism benchmark ({out}, the {condition} LM, seeds "
             f"{bench_args.seeds}, top {TOP_ACTIONS} actions)", "",
             f"## Test perplexity, pooled over seeds (negative: better; {bench.PAIRED_INTERVALS})", ""]
    table, against = paired_table(bench_args, eval_dirs)
    seed = bench_args.seeds[0]
    times = timing(bench_args, seed, prepared_dir, args.repeats, condition)
    ratio = times["expectation K=1"]["wall"] / times["sampled K=1"]["wall"]
    lines += table + ["", f"## Evaluation time, seed {seed}'s {condition} LM, median of {args.repeats} in turn (CPU)", "",
                      "| plans | wall s | planner s |", "|---|---|---|"]
    lines += [f"| {name} | {t['wall']:.2f} | {t['planner']:.2f} |" for name, t in times.items()]
    lines += ["", "## Diagnosis: the expected embedding against the K = 50 average", ""]
    lines += diagnosis(bench_args, seed, prepared_dir, condition)
    if not args.no_compute_sweep:
        from planlm.evaluate.sweeps import sweep

        root = out / bench_args.tag
        sweep(str(model_dir(bench_args, condition, seed)), prepared_dir, str(root / "expectation" / f"compute-{condition}"),
              kind="compute", num_paths=list(SAMPLED_K), policies=[], split="test", batch_size=64,
              bootstrap_samples=bench_args.bootstrap_samples, expectation=True, **bench.lm_window(bench_args))
        lines += ["", f"compute sweep with the expected point: {root / 'expectation' / f'compute-{condition}'}/"
                      f"sweep_compute.png"]
    within = against["expectation K=1"]["ci_low"] <= 0
    lines += ["", "## Targets", "",
              f"- {'PASS' if within else 'FAIL'}: expectation K=1 within the paired interval of sampled K=50 or "
              f"better: {bench.fmt_diff(against['expectation K=1'])}",
              f"- {'PASS' if ratio <= 1.2 else 'FAIL'}: at most 1.2x the evaluation time of sampled K=1: {ratio:.2f}x",
              "", f"({(time.time() - began) / 60:.1f} min in this invocation)"]
    print("\n".join(lines))
    (out / bench_args.tag / "expectation").mkdir(parents=True, exist_ok=True)
    (out / bench_args.tag / "expectation" / f"report-{condition}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
