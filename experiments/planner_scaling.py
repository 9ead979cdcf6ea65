"""The planner's information against the text it reads, and its recipe measured on the larger set.

One prepared folder whose planner split holds more documents than the LM's (``prepare.planner_corpus``, e.g.
``configs/demo-bigplanner.yaml``'s ``runs/demo-bigplanner/prepared``): its ``planner_train`` split starts with the
LM's training articles, then the rest. A planner is trained on the first N articles of it
(``train-planner --train.max_train_articles``) for every size and seed, always with the same codebook and the same
validation split, with the demo's planner recipe (``configs/demo.yaml``'s planner section) or a variant of it.
What is compared is the validation information per horizon step (unigram NLL - planner NLL, teacher-forced and
free-running: ``planlm.train.planner_metrics.planner_information``).

    python experiments/planner_scaling.py --prepared runs/demo-bigplanner/prepared \\
        --out_dir runs/planner_scaling --sizes 260 500 1000 0 --seeds 0 1 --seeds_at_ends_only
    python experiments/planner_scaling.py --prepared ... --sizes 0 --variant encoder=article \\
        --variant max_epochs=12 --variant d_model=256,dim_feedforward=512

``--sizes 0`` is every article of the planner split. A ``--variant`` overrides model (``PlannerSettings``) or train
(``PlannerTrainArgs``) fields of the recipe, by name; each variant is trained at every size and seed. Writes
``scaling.json``, ``scaling.md`` (one row per variant and size: information per step, mean and each seed) and
``scaling.png`` (information at step 1 and step T against training articles) in ``--out_dir``, with the rows of
earlier invocations into the same folder (other sizes or seeds); finished planners are reused.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import fields
from pathlib import Path

import numpy as np
import yaml

from planlm.args import Runtime
from planlm.data.artifacts import PreparedDataset
from planlm.models.planner import PlannerSettings
from planlm.train.planner import PlannerTrainArgs, train_planner

ROOT = Path(__file__).resolve().parents[1]


def parse_variant(text: str) -> dict[str, object]:
    """``key=value,key=value`` -> {key: value} with YAML-typed values (``d_model=256`` -> 256)."""
    if text == "recipe":
        return {}
    pairs = [item.split("=", 1) for item in text.split(",")]
    if any(len(pair) != 2 for pair in pairs):
        raise SystemExit(f"--variant {text!r}: write key=value[,key=value...] or 'recipe'")
    return {key: yaml.safe_load(value) for key, value in pairs}


def recipe(config: Path, variant: dict) -> tuple[PlannerSettings, dict, Runtime]:
    """The demo config's planner model and train sections with ``variant``'s fields put in their section, and its
    runtime section (the precision the planners train in)."""
    section = yaml.safe_load(config.read_text())["planner"]
    model, train = dict(section.get("model") or {}), dict(section.get("train") or {})
    settings_fields = {f.name for f in fields(PlannerSettings)}
    train_fields = {f.name for f in fields(PlannerTrainArgs)}
    for key, value in variant.items():
        if key in settings_fields:
            model[key] = value
        elif key in train_fields:
            train[key] = value
        else:
            raise SystemExit(f"--variant: {key!r} is neither a PlannerSettings nor a PlannerTrainArgs field")
    return PlannerSettings(**model), train, Runtime(**(section.get("runtime") or {}))


def train_one(prepared: Path, out: Path, shape: PlannerSettings, train: dict, runtime: Runtime, size: int,
              seed: int) -> dict:
    """Train (or reuse) one planner on the first ``size`` planner-split articles; its information and time."""
    start = time.perf_counter()
    folder = train_planner(str(prepared), str(out), shape,
                           PlannerTrainArgs(**{**train, "seed": seed,
                                               "max_train_articles": size or None}), runtime)
    wall = time.perf_counter() - start
    summary = json.loads((folder / "summary.json").read_text())
    timing = out / "wall_time_s.json"
    if not timing.is_file() or wall > 5:  # a reused folder keeps the time it was trained in
        timing.write_text(json.dumps(wall))
    return {"information": summary["information"], "wall_time_s": json.loads(timing.read_text()),
            "planner_nll": summary["metrics"]["planner_teacher_forced"]["nll"]}


def table(results: list[dict]) -> list[str]:
    """One markdown row per variant and size: information per step (mean over seeds; each seed at step 1)."""
    horizon = len(results[0]["runs"][0]["information"]["teacher_forced"]["nats"])
    lines = ["| variant | articles | seeds | unigram NLL (step 1) | information step 1, teacher-forced (seeds) | "
             + " | ".join(f"step {t + 1} free-running" for t in range(1, horizon)) + " | train time (s) |",
             "|---" * (5 + horizon) + "|"]
    for row in results:
        runs = row["runs"]
        step1 = [r["information"]["teacher_forced"]["nats"][0] for r in runs]
        free = np.mean([r["information"]["free_running"]["nats"] for r in runs], axis=0)
        seeds = ", ".join(f"{v:+.3f}" for v in step1)
        lines.append(f"| {row['variant']} | {row['articles']} | {len(runs)} | "
                     f"{runs[0]['information']['unigram_nll'][0]:.3f} | {np.mean(step1):+.3f} ({seeds}) | "
                     + " | ".join(f"{v:+.3f}" for v in free[1:]) + f" | {_mean_time(runs)} |")
    return lines


def _mean_time(runs: list[dict]) -> str:
    times = [r["wall_time_s"] for r in runs if r.get("wall_time_s") is not None]
    return f"{np.mean(times):.0f}" if times else "n/a"


def figure(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.8))
    for variant in dict.fromkeys(r["variant"] for r in results):
        rows = sorted((r for r in results if r["variant"] == variant), key=lambda r: r["articles"])
        sizes = [r["articles"] for r in rows]
        for rollout, step, style in (("teacher_forced", 0, "o-"), ("free_running", -1, "s--")):
            values = [[run["information"][rollout]["nats"][step] for run in r["runs"]] for r in rows]
            label = f"{variant}: step 1" if step == 0 else f"{variant}: step T free-running"
            ax.errorbar(sizes, [np.mean(v) for v in values], yerr=[np.ptp(v) / 2 for v in values], fmt=style,
                        capsize=3, label=label)
    ax.set_xscale("log")
    ax.set_xlabel("planner training articles (pieces)")
    ax.set_ylabel("information (nats): unigram NLL - planner NLL")
    ax.set_title("Planner information against the text it reads")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def merged(path: Path, results: list[dict]) -> list[dict]:
    """The rows of an earlier invocation's ``scaling.json`` in ``path`` with this one's, a (variant, size) row of
    this invocation replacing the earlier one: a table grown over several invocations (other sizes or seeds)."""
    earlier = json.loads(path.read_text()) if path.is_file() else []
    rows = {(r["variant"], r["articles"]): r for r in earlier + results}
    return sorted(rows.values(), key=lambda r: (r["variant"], r["articles"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prepared", required=True, help="a folder written by `planlm prepare` (with planner_corpus)")
    parser.add_argument("--out_dir", default="runs/planner_scaling")
    parser.add_argument("--config", default=str(ROOT / "configs" / "demo.yaml"), help="its planner section is the recipe")
    parser.add_argument("--sizes", type=int, nargs="+", default=[260, 500, 1000, 0], help="0: every article")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--seeds_at_ends_only", action="store_true",
                        help="every seed at the smallest and the largest size, the first seed between")
    parser.add_argument("--variant", action="append", default=None, help="key=value[,key=value] or 'recipe'")
    parser.add_argument("--add", action="append", default=[], metavar="DIR",
                        help="a planner trained elsewhere on this prepared folder with the recipe (e.g. a run's "
                             "planner/), added as a 'recipe' row at the size of its training split")
    args = parser.parse_args()
    prepared, out = Path(args.prepared), Path(args.out_dir)
    total = PreparedDataset(prepared).split(PreparedDataset(prepared).planner_split).num_articles
    sizes = sorted({min(size or total, total) for size in args.sizes})
    results = []
    for text in args.variant or ["recipe"]:
        shape, train, runtime = recipe(Path(args.config), parse_variant(text))
        for size in sizes:
            seeds = args.seeds if not args.seeds_at_ends_only or size in (sizes[0], sizes[-1]) else args.seeds[:1]
            name = text.replace("=", "-").replace(",", "_")
            runs = [train_one(prepared, out / name / f"n{size}-seed{seed}", shape, train, runtime, size, seed)
                    for seed in seeds]
            results.append({"variant": text, "articles": size, "seeds": seeds, "runs": runs})
            print(table(results)[-1], flush=True)
    for folder in args.add:
        summary = json.loads((Path(folder) / "summary.json").read_text())
        size = PreparedDataset(prepared).split(summary["train_split"]).num_articles
        run = {"information": summary["information"], "wall_time_s": None, "from": str(folder),
               "planner_nll": summary["metrics"]["planner_teacher_forced"]["nll"]}
        results.append({"variant": "recipe", "articles": size, "seeds": [0], "runs": [run]})
    out.mkdir(parents=True, exist_ok=True)
    results = merged(out / "scaling.json", results)
    (out / "scaling.json").write_text(json.dumps(results, indent=2))
    (out / "scaling.md").write_text("\n".join([f"# Planner information against training articles ({prepared})", "",
                                               *table(results), "", "![scaling](scaling.png)", ""]))
    figure(results, out / "scaling.png")
    print(f"wrote {out / 'scaling.md'}")


if __name__ == "__main__":
    main()
