"""The joint-training run's tables for docs/results.md, from the run folder (docs/evidence.md, "Joint training,
pre-registered").

    planlm run --config configs/evidence.yaml --config configs/evidence-joint.yaml
    PYTHONPATH=$PWD python experiments/joint_tables.py --run runs/evidence-joint

Prints, in Markdown:

1. **contrasts**: the pre-registered contrasts (joint - frozen for ours and for Cornille et al., then the reported
   ones), each with its interval (`planlm compare`'s: seed noise and source documents) and every seed's value;
2. **conditions**: each condition's perplexity over seeds, its paired difference from none and from Fixed, its
   share of the oracle's gain and its plan usage (the run's report);
3. **information**: each planner's information on the test split (which chose no checkpoint), before joint training
   (the frozen planner of the seed) and after it (the planner saved beside each joint LM): step 1 teacher-forced for
   every seed, and for T > 1 the mean over steps 2..T of the free-running information;
4. **cost**: the seconds per training step from each condition's train-lm manifest (its wall time, validation
   included, over its optimizer steps), and its ratio to the frozen condition it is compared with.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

try:  # imported as the package `experiments` (the tests)
    from experiments.evidence_tables import _ci, conditions_table, load, seed_information, verdict
except ImportError:  # run as a script: its folder is sys.path[0]
    from evidence_tables import _ci, conditions_table, load, seed_information, verdict

# (b, a, role): docs/evidence.md's table, in its order
CONTRASTS = [("ours_joint", "ours_expected", "target"), ("cornille_joint", "cornille", "target"),
             ("ours_joint", "ours_joint_st", "reported"), ("ours_joint_w0", "ours_expected", "reported")]
NAMES = {"ours_expected": "ours, frozen", "ours_joint": "ours, joint", "ours_joint_w0": "ours, joint, weight 0",
         "ours_joint_st": "ours, joint, straight-through", "cornille": "Cornille et al., frozen",
         "cornille_joint": "Cornille et al., joint", "fixed": "Fixed", "oracle": "oracle", "none": "none"}
# joint condition -> (the frozen condition it is compared with, the run folder of its frozen planner)
JOINT = {"ours_joint": ("ours_expected", "planner"), "ours_joint_w0": ("ours_expected", "planner"),
         "ours_joint_st": ("ours_expected", "planner"), "cornille_joint": ("cornille", "planners/cornille")}


def contrast_rows(results: dict, contrasts: Sequence[tuple[str, str, str]] = CONTRASTS) -> list[dict]:
    found = {(c["b"], c["a"]): c for c in results["contrasts"]}
    rows = []
    for b, a, role in contrasts:
        if (b, a) not in found:
            raise SystemExit(f"results.json has no contrast {b} - {a}: add it to the run's report.contrasts")
        rows.append({**found[(b, a)], "role": role})
    return rows


def contrasts_table(rows: list[dict]) -> list[str]:
    seeds = list(rows[0]["seed_diffs"])
    lines = ["| B - A | role | mean [95% CI] | " + " | ".join(f"seed {s}" for s in seeds) + " | seeds with B better "
             "| decided |", "|---" * (len(seeds) + 5) + "|"]
    for r in rows:
        each = " | ".join(f"{r['seed_diffs'][s]:+.2f}" for s in seeds)
        better = sum(d < 0 for d in r["seed_diffs"].values())
        lines.append(f"| {NAMES.get(r['b'], r['b'])} - {NAMES.get(r['a'], r['a'])} | {r['role']} | "
                     f"{_ci(r['diff'], r['ci_low'], r['ci_high'])} | {each} | {better} of {len(seeds)} | {verdict(r)} |")
    return lines


def _seeds(run: Path, condition: str) -> list[int]:
    """The seeds whose LM of ``condition`` finished training (its manifest written)."""
    return sorted(int(p.parent.name[4:]) for p in (run / "lm" / condition).glob("seed*/manifest.json")
                  if p.parent.name[4:].isdigit())


def information_rows(run: Path, split: str = "test") -> list[dict]:
    """Per planner (frozen, and each joint condition's): its information on ``split`` for every seed."""
    from planlm.models.planned_lm import JOINT_PLANNER

    rows = []
    frozen_done = set()
    for condition, (_, frozen) in JOINT.items():
        seeds = _seeds(run, condition)
        if not seeds:
            continue
        folders = {}
        if frozen not in frozen_done:
            frozen_done.add(frozen)
            folders[f"frozen ({frozen}/)"] = {s: run / frozen / f"seed{s}" for s in seeds}
        folders[NAMES[condition]] = {s: run / "lm" / condition / f"seed{s}" / JOINT_PLANNER for s in seeds}
        for name, by_seed in folders.items():
            rows.append({"planner": name, "condition": condition,
                         "information": seed_information(run, by_seed, frozen, split)})
    return rows


def information_table(rows: list[dict]) -> list[str]:
    if not rows:
        return []
    seeds = list(rows[0]["information"])
    lines = ["| planner | step 1, teacher-forced: mean | " + " | ".join(f"seed {s}" for s in seeds)
             + " | steps 2..T, free-running: mean |", "|---" * (len(seeds) + 3) + "|"]
    for r in rows:
        first = [r["information"][s]["teacher_forced"]["nats"][0] for s in seeds]
        later = [np.mean(r["information"][s]["free_running"]["nats"][1:]) for s in seeds
                 if len(r["information"][s]["free_running"]["nats"]) > 1]
        tail = f"{np.mean(later):.3f}" if later else ""
        lines.append(f"| {r['planner']} | {np.mean(first):.3f} | " + " | ".join(f"{v:.3f}" for v in first)
                     + f" | {tail} |")
    return lines


RESTORED = "Restoring states from the checkpoint"  # Lightning's line when fit resumes from a checkpoint


def _resumed(run: Path, condition: str, seed: int) -> bool:
    """Whether the condition's training resumed from a checkpoint (its wall time then covers the last start only),
    for a manifest written before train-lm recorded ``resumed_from_step``: from the training's log. A run that
    restarts and reuses the finished stage also writes a `====` header to the log, so the headers alone do not
    tell."""
    log = run / "logs" / f"train-lm_{condition}_seed{seed}.txt"
    return log.is_file() and RESTORED in log.read_text(errors="replace")


def cost_rows(run: Path, conditions: Sequence[str]) -> list[dict]:
    rows = []
    for condition in conditions:
        per_step, resumed = [], []
        for seed in _seeds(run, condition):
            manifest = json.loads((run / "lm" / condition / f"seed{seed}" / "manifest.json").read_text())
            if "resumed_from_step" in manifest:  # the wall time covers the steps trained since the last start
                timed = manifest["global_step"] - manifest["resumed_from_step"]
                if timed > 0:
                    per_step.append(manifest["train_wall_time_s"] / timed)
                continue
            if _resumed(run, condition, seed):
                resumed.append(seed)
                continue
            per_step.append(manifest["train_wall_time_s"] / manifest["global_step"])
        if per_step:
            rows.append({"condition": condition, "per_step": float(np.mean(per_step)), "seeds": len(per_step),
                         "resumed": resumed})
    return rows


def cost_table(rows: list[dict]) -> list[str]:
    if not rows:
        return []
    by_name = {r["condition"]: r for r in rows}
    lines = ["| condition | s per step, mean over seeds (seeds) | against frozen |", "|---|---|---|"]
    for r in rows:
        reference = JOINT.get(r["condition"], (None,))[0]
        ratio = f"{r['per_step'] / by_name[reference]['per_step']:.2f}x {NAMES[reference]}" \
            if reference in by_name else ""
        left = f"; seeds {', '.join(map(str, r['resumed']))} resumed, left out" if r["resumed"] else ""
        lines.append(f"| {NAMES.get(r['condition'], r['condition'])} | {r['per_step']:.3f} ({r['seeds']}{left}) | "
                     f"{ratio} |")
    return lines


def render(run: Path, results: dict, information: bool = True) -> str:
    parts = [("contrasts, every seed", contrasts_table(contrast_rows(results))),
             ("conditions", conditions_table(results))]
    if information:
        parts.append(("planner information on the test split, before and after joint training",
                      information_table(information_rows(run))))
    names = [c["name"] for c in results["conditions"]] or sorted(p.name for p in (run / "lm").glob("[!_]*"))
    parts.append(("cost of a training step", cost_table(cost_rows(run, names))))
    return "\n".join(f"### {title}\n\n" + "\n".join(lines) + "\n" for title, lines in parts if lines)


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, default=Path("runs/evidence-joint"), help="the joint run's folder")
    parser.add_argument("--no_information", action="store_true", help="skip the planners' information (seconds each)")
    args = parser.parse_args(argv)
    print(render(args.run, load(args.run), not args.no_information))


if __name__ == "__main__":
    main()
